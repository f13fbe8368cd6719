"""The trusted-side subprocess environment (F2, seed 002): built from an allowlist,
no GIT_* variable and no token ever reaches a child."""

from __future__ import annotations

import subprocess
import sys

import pytest

from executor.environ import SAFE_PATH, forbidden_variable, trusted_env

# seed 002: the variables that retarget git despite an explicit working directory.
GIT_RETARGETING = {
    "GIT_DIR": "/tmp/evil/.git",
    "GIT_WORK_TREE": "/tmp/evil",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "touch /tmp/pwned",
    "GIT_CONFIG_PARAMETERS": "'core.hooksPath'='/tmp/evil'",
    "GIT_CONFIG_GLOBAL": "/tmp/evil/gitconfig",
    "GIT_INDEX_FILE": "/tmp/evil/index",
    "GIT_OBJECT_DIRECTORY": "/tmp/evil/objects",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES": "/tmp/evil/alt",
    "GIT_NAMESPACE": "evil",
    "GIT_CEILING_DIRECTORIES": "/",
    "GIT_LITERAL_PATHSPECS": "1",
}
TOKENS = {
    "GITHUB_TOKEN": "ghs_secret",
    "ACTIONS_RUNTIME_TOKEN": "secret",
    "ACTIONS_ID_TOKEN_REQUEST_URL": "https://example.invalid",
    "ACTIONS_CACHE_URL": "https://example.invalid",  # the runner's services, reached with its token
    "ACTIONS_RESULTS_URL": "https://example.invalid",
    "NPM_TOKEN": "secret",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "PYPI_API_KEY": "secret",
    "DOCKER_PASSWORD": "secret",
    "SSH_AUTH_SOCK": "/tmp/agent.sock",
}
HARMLESS_BUT_HOST = {"HOME": "/root", "PYTHONPATH": "/tmp/evil", "LD_PRELOAD": "/tmp/evil.so", "PIP_INDEX_URL": "x"}

CHILD_DUMPS_ENVIRON = "import os, sys; sys.stdout.write('\\0'.join(f'{k}={v}' for k, v in os.environ.items()))"


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment a real child process sees when spawned with ``env``."""
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", CHILD_DUMPS_ENVIRON], env=env, capture_output=True, check=True, timeout=60
    )
    pairs = [item.split("=", 1) for item in result.stdout.decode().split("\0") if item]
    return dict(pairs)


def test_git_variables_and_tokens_never_reach_a_child(monkeypatch):
    """F2: with GIT_DIR, GIT_CONFIG_KEY_0/VALUE_0, GIT_INDEX_FILE, GIT_OBJECT_DIRECTORY and tokens set in
    the parent, a real child spawned with trusted_env() sees none of them."""
    for name, value in {**GIT_RETARGETING, **TOKENS, **HARMLESS_BUT_HOST}.items():
        monkeypatch.setenv(name, value)
    seen = child_environment(trusted_env())
    leaked = sorted(name for name in seen if name in GIT_RETARGETING or name in TOKENS or name in HARMLESS_BUT_HOST)
    assert leaked == []
    assert not any(name.startswith("GIT_") for name in seen)
    assert seen["PATH"] == SAFE_PATH


def test_only_the_allowlist_passes(monkeypatch):
    """F2: the child's environment is exactly the fixed base plus the pass-through names present."""
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("UNRELATED", "1")
    assert trusted_env() == {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm", "TZ": "UTC"}


def test_an_explicit_parent_mapping_is_filtered_the_same_way():
    """F2: a caller-supplied parent environment is allowlisted too, never copied."""
    env = trusted_env(parent={**GIT_RETARGETING, **TOKENS, "TERM": "dumb"})
    assert env == {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb"}


@pytest.mark.parametrize("name", [*GIT_RETARGETING, *TOKENS, "git_dir", "Some_Token", "MY_SESSION_ID", "X_AUTH"])
def test_forbidden_names_are_refused_even_when_asked_for(name):
    """F2: a caller cannot pass a GIT_* or credential-like variable, even explicitly."""
    assert forbidden_variable(name)
    with pytest.raises(ValueError, match="may not be passed"):
        trusted_env({name: "x"})


def test_overrides_are_added_and_reach_the_child():
    """F2: an explicitly allowed variable (e.g. PIP_NO_INDEX for pip) does reach the child."""
    env = trusted_env({"PIP_NO_INDEX": "1", "HOME": "/nonexistent"})
    seen = child_environment(env)
    assert seen["PIP_NO_INDEX"] == "1" and seen["HOME"] == "/nonexistent"


@pytest.mark.parametrize("entry", [("", "x"), ("A=B", "x"), ("A\0B", "x"), ("A", "x\0y")])
def test_malformed_entries_are_refused(entry):
    """F2: an empty name, '=' or NUL in a name, or NUL in a value is refused before exec sees it."""
    name, value = entry
    with pytest.raises(ValueError, match="not a valid environment entry"):
        trusted_env({name: value})


@pytest.mark.parametrize("name", ["GIT_DIR", "git_config_key_0", "GITHUB_TOKEN", "ACTIONS_RUNTIME_URL", "Npm_Auth"])
def test_the_starter_refuses_a_git_variable_or_a_credential_in_any_op(tmp_path, name):
    """S7: whoever built an op's environment (the case service, a daemon client, sandbox run), the starter
    refuses GIT_* and credential names before anything is sent to the sandbox."""
    from journal.errors import Refused
    from steward.ledger import RecordingLedger
    from steward.starter import Sandbox, Spec

    sandbox = Sandbox(Spec(2, 2), RecordingLedger(), str(tmp_path))
    with pytest.raises(Refused, match=f"op environment {name}: GIT_\\* variables and credentials never enter a sandbox"):
        sandbox.run(["/usr/bin/true"], env={"PATH": "/usr/bin", name: "x"}, timeout_ms=1000, stdout_cap=0, stderr_cap=0)
