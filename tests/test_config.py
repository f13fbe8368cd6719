"""Host configuration (/etc/casebox/casebox.toml): closed like every input (D1, F1); flags override it."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from executor.cli import config
from executor.cli.config import Config
from journal.errors import Refused

EXAMPLE_PLAN = "examples/plan.json"


def write(tmp_path, text: str | bytes):
    path = tmp_path / "casebox.toml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def refusal(path) -> Refused:
    with pytest.raises(Refused) as caught:
        config.load(str(path))
    return caught.value


def test_a_full_file_is_read(tmp_path):
    """D1: every known setting is read with its type, and the source is recorded."""
    path = write(
        tmp_path,
        'state_root = "/srv/casebox/"\nsocket = "/run/cb.sock"\nsandbox_uid = 3000000000\n'
        "sandbox_gid = 3000000001\nclient_uids = [0, 1000]\nidle_seconds = 5\nmax_connections = 4\n"
        "max_connections_per_uid = 2\nstop_seconds = 30\n",
    )
    loaded = config.load(str(path))
    assert loaded == Config(
        state_root="/srv/casebox",
        socket="/run/cb.sock",
        sandbox_uid=3_000_000_000,
        sandbox_gid=3_000_000_001,
        client_uids=(0, 1000),
        idle_seconds=5,
        max_connections=4,
        max_connections_per_uid=2,
        stop_seconds=30,
        source=str(path),
    )
    assert loaded.as_dict()["client_uids"] == [0, 1000]


def test_sandboxes_ahead_is_read_and_reaches_the_stewards_settings(tmp_path):
    """sandboxes_ahead: 0 turns starting ahead off, and the steward's sessions get what the file says."""
    from executor.cli.sessions import settings_from

    loaded = config.load(str(write(tmp_path, "sandboxes_ahead = 0\n")))
    assert loaded.sandboxes_ahead == 0 and settings_from(loaded).ahead == 0
    assert settings_from(config.load(str(write(tmp_path, "sandboxes_ahead = 3\n")))).ahead == 3


def test_index_file_hosts_are_read_normalized_and_may_be_empty(tmp_path):
    """The forwarder's file hosts (issue 16): HOST or HOST:PORT, normalized to host:port; [] allows the index alone."""
    path = write(tmp_path, 'index_file_hosts = ["Files.PythonHosted.org", "mirror.example.org:8443", "[2001:db8::1]"]\n')
    loaded = config.load(str(path))
    assert loaded.index_file_hosts == ("files.pythonhosted.org:443", "mirror.example.org:8443", "[2001:db8::1]:443")
    assert loaded.as_dict()["index_file_hosts"] == list(loaded.index_file_hosts)
    assert config.load(str(write(tmp_path, "index_file_hosts = []\n"))).index_file_hosts == ()


def test_defaults_when_the_default_file_is_absent(tmp_path, monkeypatch):
    """F1: with no --config and no /etc/casebox/casebox.toml, the built-in defaults apply."""
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    assert config.load() == Config()


def test_the_default_file_is_read_when_present(tmp_path, monkeypatch):
    """F1: without --config, the default path is read when it exists."""
    path = write(tmp_path, "sandbox_uid = 1234\n")
    monkeypatch.setattr(config, "DEFAULT_PATH", str(path))
    assert config.load().sandbox_uid == 1234
    assert config.load().source == str(path)


def test_a_bad_default_file_is_refused_not_ignored(tmp_path, monkeypatch):
    """D1: a default file that exists is as closed as a named one."""
    monkeypatch.setattr(config, "DEFAULT_PATH", str(write(tmp_path, "sandbox_uid = true\n")))
    with pytest.raises(Refused, match="sandbox_uid"):
        config.load()


@pytest.mark.parametrize(
    ("text", "key", "rule"),
    [
        ("colour = 1\n", "colour", "is not a known setting"),
        ('source = "/x"\n', "source", "is not a known setting"),
        ("[sandbox]\nuid = 1\n", "sandbox", "is not a known setting"),
        ("sandbox_uid = true\n", "sandbox_uid", "must be an integer"),
        ('sandbox_uid = "2000000000"\n', "sandbox_uid", "must be an integer"),
        ("sandbox_uid = 0\n", "sandbox_uid", "must be an integer from 1"),
        ("sandbox_gid = 4294967295\n", "sandbox_gid", "must be an integer from 1 to 4294967294"),
        ("sandbox_gid = 1.5\n", "sandbox_gid", "must be an integer"),
        ('state_root = "relative/dir"\n', "state_root", "must be an absolute path"),
        ('socket = "/run/a\\u0000b"\n', "socket", "must be an absolute path"),
        ("state_root = 5\n", "state_root", "must be an absolute path"),
        ("client_uids = []\n", "client_uids", "must be a non-empty list"),
        ("client_uids = [true]\n", "client_uids", "must be a non-empty list"),
        ('client_uids = ["0"]\n', "client_uids", "must be a non-empty list"),
        ("client_uids = 0\n", "client_uids", "must be a non-empty list"),
        ("idle_seconds = 0\n", "idle_seconds", "must be an integer from 1 to 86400"),
        ("idle_seconds = 1.5\n", "idle_seconds", "must be an integer"),
        ("max_connections = true\n", "max_connections", "must be an integer from 1 to 4096"),
        ("max_connections_per_uid = 4097\n", "max_connections_per_uid", "must be an integer from 1 to 4096"),
        ('stop_seconds = "75"\n', "stop_seconds", "must be an integer from 1 to 3600"),
        ("sandboxes_ahead = 4\n", "sandboxes_ahead", "must be an integer from 0 to 3"),
        ("sandboxes_ahead = true\n", "sandboxes_ahead", "must be an integer from 0 to 3"),
        ('index_file_hosts = "files.pythonhosted.org"\n', "index_file_hosts", "must be a list of at most 16"),
        (f"index_file_hosts = {[f'h{n}.example.org' for n in range(17)]}\n", "index_file_hosts", "must be a list of at most 16"),
        ('index_file_hosts = ["user@files.example.org"]\n', "index_file_hosts", "must be a list of HOST or HOST:PORT"),
        ('index_file_hosts = ["files.example.org:0"]\n', "index_file_hosts", "must be a list of HOST or HOST:PORT"),
        ("index_file_hosts = [443]\n", "index_file_hosts", "must be a list of HOST or HOST:PORT"),
    ],
)
def test_unknown_keys_and_wrong_types_are_refused_naming_the_key(tmp_path, text, key, rule):
    """D1/F1: an unknown key or a wrong type is refused, naming the file and the key."""
    path = write(tmp_path, text)
    error = refusal(path)
    assert error.where == f"{path}: {key}"
    assert rule in error.rule


@pytest.mark.parametrize(
    ("content", "rule"),
    [
        ("sandbox_uid = \n", "is not valid TOML"),
        ("sandbox_uid = 1\nsandbox_uid = 2\n", "is not valid TOML"),
        ('state_root = "/a\n', "is not valid TOML"),
        (b"sandbox_uid = 1 # \xff\n", "is not valid UTF-8"),
        ("# " + "x" * config.CONFIG_MAX_BYTES + "\n", "larger than its 65536-byte cap"),
    ],
)
def test_bad_toml_is_refused_naming_the_file(tmp_path, content, rule):
    """F1: a file that is not TOML, not UTF-8 or over its cap is refused, naming the file."""
    path = write(tmp_path, content)
    error = refusal(path)
    assert error.where == str(path)
    assert rule in error.rule


def test_flags_override_the_file(tmp_path):
    """F1: a flag that was given takes precedence; one left at None does not."""
    loaded = config.load(str(write(tmp_path, "sandbox_uid = 1234\nsandbox_gid = 1234\n")))
    overridden = loaded.overridden(sandbox_uid=5678, sandbox_gid=None, state_root="/tmp/state/")
    assert (overridden.sandbox_uid, overridden.sandbox_gid) == (5678, 1234)
    assert overridden.state_root == "/tmp/state"
    assert overridden.source == loaded.source
    assert loaded.overridden(sandbox_uid=None) is loaded


def test_flags_are_checked_like_the_file():
    """D1/F1: a flag value breaks the same rules as the file and is refused naming the flag."""
    with pytest.raises(Refused) as caught:
        Config().overridden(sandbox_uid=0)
    assert caught.value.where == "--sandbox-uid"
    with pytest.raises(Refused, match="is not a known setting"):
        Config().overridden(source="/elsewhere")
    assert Config().overridden(client_uids=[0, 7]).client_uids == (0, 7)


@pytest.mark.parametrize("key", ["sandbox_uid", "sandbox_gid"])
def test_neither_sandbox_id_is_ever_root(tmp_path, key):
    """S6: the dedicated ids are never root's: 0 as the sandbox uid or gid is refused from the file and from a
    flag, so no sandbox is ever configured to run as root or in root's group."""
    path = write(tmp_path, f"{key} = 0\n")
    error = refusal(path)
    assert (error.where, error.rule) == (f"{path}: {key}", f"must be an integer from 1 to {config.MAX_ID}")
    with pytest.raises(Refused) as caught:
        Config().overridden(**{key: 0})
    assert caught.value.where == f"--{key.replace('_', '-')}"


def test_an_explicit_missing_config_is_refused_by_every_command(casebox, tmp_path):
    """F1: --config naming a file that does not exist is exit 64 naming it, not a silent fallback."""
    missing = tmp_path / "nope.toml"
    sentence = casebox.refused("--config", str(missing), "plan", "check", EXAMPLE_PLAN, naming=str(missing))
    assert sentence == f"{missing}: cannot be read (No such file or directory)."


def test_a_bad_explicit_config_is_refused_from_outside(casebox, tmp_path):
    """F1: an unknown key in a named file is exit 64 naming the file and the key."""
    path = write(tmp_path, "sandbox_uid = 1\ncolour = 1\n")
    casebox.refused("--config", str(path), "plan", "check", EXAMPLE_PLAN, naming=f"{path}: colour: is not a known setting")


def test_a_good_explicit_config_is_accepted(casebox, tmp_path):
    """F1: a valid named file lets the command run."""
    result = casebox("--config", str(write(tmp_path, "sandbox_uid = 1234\n")), "plan", "check", EXAMPLE_PLAN)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("cores", "ahead"), [(1, 1), (2, 2), (3, 3), (4, 3), (64, 3)])
def test_the_sandboxes_started_ahead_follow_the_cores_up_to_three(monkeypatch, cores, ahead):
    """Issue 14: the default depth is one sandbox started ahead per core this process may run on, at most
    three; one core starts one ahead too (a start is mostly waiting, docs/pipeline.md)."""
    import os

    from steward.api import ahead_for_host

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert ahead_for_host() == ahead


def test_the_documented_keys_and_example_match_the_code(repo, tmp_path):
    """docs/configuration.md lists every setting with its default, and its example is a valid file; a default
    the host decides is documented as its rule."""
    from steward.api import ahead_for_host

    computed = {"sandboxes_ahead": "as many as the cores the process may run on, at most 3"}
    assert Config().sandboxes_ahead == ahead_for_host()
    text = (repo / "docs" / "configuration.md").read_text()
    for field in dataclasses.fields(Config):
        if field.name != "source":
            row = re.search(rf"^\| `{field.name}` \|[^|]*\| `?([^|`]*)`? \|", text, re.MULTILINE)
            assert row, field.name
            default = computed.get(field.name, field.default)
            assert row.group(1) == (json.dumps(list(default)).replace(" ", "") if isinstance(default, tuple) else str(default))
    example = re.search(r"```toml\n(.*?)```", text, re.DOTALL).group(1)
    assert config.load(str(write(tmp_path, example))).client_uids == (0, 1001)
