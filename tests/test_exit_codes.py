"""Honest exit codes, by one rule (README.md, "Exit codes"; issue 13): 64 refused input naming the path, 77 a
root-only command without root (the caller's own command line under sudo, --config kept), and nothing created
outside the state root by a flag's side effect."""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile

import pytest
import tarforge
from evidence_support import ATTEMPT, BUNDLE, DESIGNED_RUNS, build_attempt
from test_journal_cli import interpreter_for

from executor.cli.main import main
from executor.plan import plan_from_bytes

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN_JOURNAL = REPO / "golden" / "journal" / "every_kind.bin"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def config(tmp_path, sandbox_ids) -> str:
    path = tmp_path / "my casebox.toml"
    path.write_text(
        f'state_root = "{tmp_path}/state"\nsandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\n'
        f'socket = "{tmp_path}/no-steward.sock"\n'
    )
    return str(path)


ROOT_ONLY = [
    ("demo",),
    ("stage", "list"),
    ("stage", "show", "s-1"),
    ("stage", "recover", "--all"),
    ("steward", "serve"),
    ("sandbox", "run", "--", "true"),
]


@pytest.mark.parametrize("command", ROOT_ONLY, ids=[" ".join(command) for command in ROOT_ONLY])
def test_a_root_only_command_without_root_exits_77_keeping_the_callers_config(capsys, monkeypatch, config, command):
    """EX_NOPERM, issue 13: one sentence on stderr, nothing on stdout, and the command to run is the caller's
    own command line under sudo, so the --config they gave is in it."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, err = cli(capsys, "--config", config, *command)
    assert (code, out) == (77, "")
    assert err.count("\n") == 1 and err.startswith("casebox: ") and err.endswith(".\n") and "Traceback" not in err
    assert f"which needs root; run it as root: {shlex.join(['sudo', 'casebox', '--config', config, *command])}" in err


@pytest.mark.root
def test_a_socket_flag_in_a_directory_that_does_not_exist_creates_nothing(tmp_path, config, casebox):
    """Issue 13: steward serve --socket /nonexistent/s.sock is refused (64) and /nonexistent is never made."""
    socket = tmp_path / "nonexistent" / "s.sock"
    casebox.refused("--config", config, "steward", "serve", "--socket", str(socket), naming=str(socket))
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.root
def test_a_state_root_flag_under_a_missing_parent_creates_nothing(tmp_path, config, casebox):
    """Issue 13: the state root itself may be created, never a directory above it."""
    state = tmp_path / "missing" / "state"
    casebox.refused("--config", config, "steward", "serve", "--state-root", str(state), "--socket", str(tmp_path / "s.sock"),
                    naming=str(state))
    assert not (tmp_path / "missing").exists()


@pytest.mark.root
@pytest.mark.parametrize("command", [("stage", "list"), ("stage", "show", "s-1"), ("doctor",)])
def test_a_state_root_that_is_a_file_is_refused(tmp_path, config, casebox, command):
    """F1, issue 13: stage and doctor never say all is well of a state root that is not a directory."""
    state = tmp_path / "state-file"
    state.write_text("x")
    casebox.refused("--config", config, *command, "--state-root", str(state), naming=str(state))


def test_a_bundle_without_end_of_archive_blocks_is_refused(tmp_path, casebox):
    """T4: a bundle whose members fill its records exactly and stop, with no end-of-archive blocks, is refused
    by bundle check with exit 64; the same bundle closed properly is accepted."""
    whole = tarforge.candidate({tarforge.WHEEL: b"w" * 8192})
    assert whole[10240:] == bytes(len(whole) - 10240), "the members end exactly at the first record"
    path = tmp_path / "no-eoa.tar"
    path.write_bytes(whole[:10240])
    sentence = casebox.refused("bundle", "check", str(path), naming=str(path))
    assert "ends before its end-of-archive blocks" in sentence
    path.write_bytes(whole)
    assert casebox("bundle", "check", str(path)).returncode == 0


# --- outputs that cannot be created, as an unprivileged user ------------------------------------------------


def as_user(sandbox_ids, *argv: str) -> subprocess.CompletedProcess:
    uid, gid = sandbox_ids
    python = interpreter_for(uid, gid)
    program = f"import sys; sys.path.insert(0, {str(REPO)!r}); from executor.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([python, "-I", "-c", program, *argv], capture_output=True, text=True, cwd="/", user=uid,
                          group=gid, extra_groups=[], timeout=60)


@pytest.fixture
def readable():
    """A world-readable demo attempt's evidence (outside pytest's 0700 base), and a directory the test user
    cannot write."""
    base = pathlib.Path(tempfile.mkdtemp())
    os.chmod(base, 0o755)
    directory = build_attempt(base, plan_from_bytes((REPO / "examples/plan.json").read_bytes()), DESIGNED_RUNS)[0]
    for path in [directory, *directory.iterdir()]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    locked = base / "locked"
    locked.mkdir(mode=0o755)
    yield directory, locked
    shutil.rmtree(base)


@pytest.mark.root
def test_an_output_that_cannot_be_created_is_refused_naming_it(sandbox_ids, readable):
    """F1, issue 13: evaluate --report-dir, pack --out and journal replay --html into a directory the user may
    not write are exit 64 with one sentence naming the path, never exit 70 with a PermissionError."""
    directory, locked = readable
    report = as_user(sandbox_ids, "evaluate", "--plan", str(REPO / "examples/plan.json"), "--attempt", ATTEMPT,
                     "--bundle-sha256", BUNDLE, "--evidence", str(directory), "--report-dir", str(locked))
    replay = as_user(sandbox_ids, "journal", "replay", str(directory), "--html", str(locked / "replay.html"))
    wheel = REPO / "golden" / "transport" / "wheels" / "beta-2.0.1-py3-none-any.whl"
    pack = as_user(sandbox_ids, "pack", str(wheel), "--out", str(locked / "candidate.tar"))
    for result, named in ((report, locked / f"report-{ATTEMPT}.json"), (replay, locked / "replay.html"), (pack, locked / "candidate.tar")):
        assert (result.returncode, result.stdout) == (64, ""), result
        assert result.stderr == f"casebox: {named}: cannot be created (Permission denied).\n"
    assert os.listdir(locked) == []


def test_the_readme_exit_table_is_the_one_rule(repo):
    """Docs move with code: README.md's exit table lists exactly the codes executor/cli/frontend.py answers with."""
    import re

    from executor.cli import frontend

    text = (repo / "README.md").read_text()
    section = text[text.index("## Exit codes"):text.index("## In CI")]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert documented == {value for name, value in vars(frontend).items() if name.startswith("EXIT_")}


def test_version_is_the_package_version(casebox, repo):
    """casebox --version prints the version every receipt and report carries, pyproject.toml's."""
    import tomllib

    from executor import VERSION

    result = casebox("--version")
    assert (result.returncode, result.stdout.decode()) == (0, f"casebox {VERSION}\n")
    assert tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"] == VERSION
