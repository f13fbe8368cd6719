"""``casebox sandbox run``: one JSON object for an op that ran, 64 with a sentence for refused input, 70 for a failure."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from executor.cli.main import main
from sandbox_support import contained, state_root  # noqa: F401
from steward import starter

REQUIRED = {
    "class", "wait_status", "exit_code", "signal", "uid", "gid", "stdout", "stderr", "stdout_truncated",
    "stderr_truncated", "descendants_reaped", "wall_ms", "cpu_ms", "max_rss_kib", "memory_peak_bytes",
}


def _cli(capsys, sandbox_ids, state_root, *arguments):
    uid, gid = sandbox_ids
    code = main(["sandbox", "run", "--uid", str(uid), "--gid", str(gid), "--state-root", state_root, *arguments])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(code: int, out: str, err: str) -> str:
    assert code == 64 and out == ""
    assert err.startswith("casebox: ") and err.endswith(".\n") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.root
@pytest.mark.usefixtures("contained")
def test_an_op_that_ran_prints_one_json_object(capsys, sandbox_ids, state_root):
    code, out, err = _cli(capsys, sandbox_ids, state_root, "--env", "GREETING=hi", "--", "/usr/bin/sh", "-c",
                          'printf "%s\\377" "$GREETING"; echo oops >&2; exit 3')
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert set(report) == REQUIRED
    assert report["class"] == "EXIT_NONZERO" and report["exit_code"] == 3 and report["signal"] is None
    assert report["wait_status"] == 3 << 8
    assert (report["uid"], report["gid"]) == sandbox_ids
    assert report["stdout"] == "hi\ufffd" and report["stderr"] == "oops\n"
    assert report["stdout_truncated"] is report["stderr_truncated"] is False
    assert all(type(report[key]) is int for key in ("descendants_reaped", "wall_ms", "cpu_ms", "max_rss_kib", "memory_peak_bytes"))


@pytest.mark.root
@pytest.mark.usefixtures("contained")
def test_a_signalled_op_has_a_signal_and_no_exit_code(capsys, sandbox_ids, state_root):
    code, out, _ = _cli(capsys, sandbox_ids, state_root, "--", "/usr/bin/sh", "-c", "kill -SEGV $$")
    report = json.loads(out)
    assert code == 0 and (report["class"], report["exit_code"], report["signal"]) == ("SIGNALLED", None, 11)


@pytest.mark.root
@pytest.mark.usefixtures("contained")
def test_a_program_that_cannot_start_is_refused(capsys, sandbox_ids, state_root):
    """S7: an op that failed before exec never gets an exit code; the front end says why."""
    err = _refused(*_cli(capsys, sandbox_ids, state_root, "--", "no-such-program"))
    assert "ARGV[0] no-such-program: cannot be started in the sandbox (execve failed: ENOENT" in err


@pytest.mark.parametrize(
    "arguments, complaint",
    [
        (["--env", "GIT_DIR=/x", "--", "true"], "--env GIT_DIR: GIT_* variables and credentials never enter a sandbox"),
        (["--env", "GITHUB_TOKEN=x", "--", "true"], "--env GITHUB_TOKEN"),
        (["--env", "NOEQUALS", "--", "true"], "must be NAME=VALUE"),
        (["--ro", "Bad=/tmp", "--", "true"], "must be NAME=DIR"),
        (["--ro", "x=relative", "--", "true"], "DIR must be an absolute path"),
        (["--ro", "x=/tmp", "--ro", "x=/usr", "--", "true"], "--ro x: names a capability twice"),
        (["--tmp-mb", "0", "--", "true"], "must be an integer from 1 to 65536"),
        (["--timeout-ms", "1e3", "--", "true"], "must be an integer from 1 to 3600000"),
        (["--output-kib", "999", "--", "true"], "must be an integer from 1 to 256"),
        (["--"], "ARGV: is missing"),
    ],
)
def test_bad_input_is_refused_with_one_sentence(capsys, sandbox_ids, state_root, arguments, complaint):
    """F1: exit 64, one sentence naming the flag and the rule, nothing on stdout."""
    assert complaint in _refused(*_cli(capsys, sandbox_ids, state_root, *arguments))


@pytest.mark.root
def test_a_capability_that_is_not_a_directory_is_refused(capsys, sandbox_ids, state_root, tmp_path):
    (tmp_path / "file").write_text("x")
    err = _refused(*_cli(capsys, sandbox_ids, state_root, "--ro", f"x={tmp_path}/file", "--", "true"))
    assert f"--ro x={tmp_path}/file: cannot be opened as a directory" in err


def test_a_capability_holding_git_is_refused_before_anything_starts(capsys, sandbox_ids, state_root, tmp_path):
    """F4: --ro passes the capability boundary; a .git inside is refused with 64 naming it, even without root."""
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / ".git" / "config").write_text("[http]\n\textraheader = AUTHORIZATION: basic token\n")
    err = _refused(*_cli(capsys, sandbox_ids, state_root, "--ro", f"repo={tmp_path}/repo", "--", "true"))
    assert f"--ro repo={tmp_path}/repo at {tmp_path}/repo/.git: is a .git segment" in err


@pytest.mark.root
@pytest.mark.usefixtures("contained")
def test_a_checked_capability_is_readable_at_cap_name(capsys, sandbox_ids, state_root, tmp_path):
    """F4 control: a directory that passes the boundary is the one the op reads at /cap/NAME."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hi from the capability\n")
    os.chmod(tmp_path, 0o755)
    code, out, err = _cli(capsys, sandbox_ids, state_root, "--ro", f"data={data}", "--", "/usr/bin/cat", "/cap/data/hello.txt")
    assert (code, err) == (0, "")
    assert json.loads(out)["stdout"] == "hi from the capability\n"


@pytest.mark.root
def test_a_dedicated_id_in_use_is_refused(capsys, sandbox_ids, state_root):
    """S6: exit 64 when a live process already runs as the sandbox UID."""
    squatter = subprocess.Popen(["/usr/bin/sleep", "30"], user=sandbox_ids[0], group=sandbox_ids[1])
    try:
        err = _refused(*_cli(capsys, sandbox_ids, state_root, "--", "true"))
    finally:
        squatter.kill()
        squatter.wait()
    assert f"process {squatter.pid} (sleep) already runs as it" in err


def test_without_root_it_fails_with_a_sentence(capsys, sandbox_ids, state_root, monkeypatch):
    """S11: never unsandboxed; say why and how to fix it: exit 77 (EX_NOPERM), the same command under sudo."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, err = _cli(capsys, sandbox_ids, state_root, "--", "true")
    assert (code, out) == (77, "")
    assert err.startswith("casebox: casebox sandbox run creates namespaces and mounts, which needs root; run it as root: sudo casebox ")
    assert err.endswith("sudo casebox sandbox run --uid %d --gid %d --state-root %s -- true.\n" % (*sandbox_ids, state_root))


@pytest.mark.root
@pytest.mark.usefixtures("contained")
def test_a_sandbox_failure_exits_70_with_one_sentence(capsys, sandbox_ids, state_root, monkeypatch):
    monkeypatch.setattr(starter, "HOSTNAME", "h" * 100)
    code, out, err = _cli(capsys, sandbox_ids, state_root, "--", "true")
    assert (code, out) == (70, "")
    assert err.startswith("casebox: the sandbox failed: the launcher aborted during bootstrap: ") and err.count("\n") == 1
    assert "sudo casebox doctor" in err and "Traceback" not in err
