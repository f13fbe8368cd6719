"""A state root with no room left, filled before and during a session, through the daemon and embedded alike.

The state root is a small tmpfs the test mounts itself (tests/disk_support.py). What must hold:

- nothing is ever a PASS, and every failure is one sentence saying the state root is full;
- the stage's journal stays VALID (its cap was reserved when it was created, J2, J5), or the stage's journal
  was never begun and no stage is left (UNBORN, removed at once or by recovery);
- nothing stays mounted or running;
- `casebox stage recover --all` reports every stage, sealed ones included, tries every stage, and exits 1
  (a stage it cannot finish, with the reason), never 70; once there is room, it seals what was left.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import shutil

import pytest
from test_verify import EXAMPLES, packed

from daemon_support import running_daemon
from disk_support import FILLER, fill, small_tmpfs
from journal.files import JOURNAL_NAME
from journal.reader import read_journal
from sandbox_support import contained, mount_table, processes_of  # noqa: F401
from steward import client, retirement
from steward.failure import SandboxFailure
from steward.session import Steward
from steward_support import ENV, accept_all, one_session, settings

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]
MODES = ("embedded", "daemon")
FULL = "the steward's state root {state} is full"


@pytest.fixture
def disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", 8 << 20) as made:
        yield made


@contextlib.contextmanager
def stewards(mode: str, tmp_path, state: pathlib.Path, sandbox_ids):
    """A function that opens a session on ``state``: an embedded steward's, or the daemon's over its socket."""
    if mode == "embedded":
        with Steward(settings(str(state), sandbox_ids), capability_check=accept_all) as steward:
            yield steward.open_session
    else:
        with running_daemon(tmp_path, sandbox_ids, state=str(state)) as daemon:
            yield lambda attempt: client.connect(daemon.socket).open_session(attempt)


def _recover(casebox, tmp_path, state, sandbox_ids):
    config = tmp_path / "recover.toml"
    config.write_text(f"sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\n")
    return casebox("--config", str(config), "stage", "recover", "--all", "--state-root", str(state))


@pytest.mark.parametrize("mode", MODES)
def test_a_full_state_root_opens_no_session_and_says_how_much_it_needs(mode, tmp_path, disk, sandbox_ids):
    """J5: a stage's journal whose cap cannot be reserved is never begun: the session is refused with one
    sentence naming the bytes needed, and no stage is left behind (no empty journal that would read TORN)."""
    state = disk / "state"
    with stewards(mode, tmp_path, state, sandbox_ids) as open_session:
        fill(disk)
        with pytest.raises(SandboxFailure) as raised:
            open_session("attempt-1")
    assert str(raised.value) == (
        f"{FULL.format(state=state)}: a stage's journal needs 262,144 bytes reserved on disk and 0 are free "
        "(No space left on device); free space there"
    )
    assert os.listdir(state / "stages") == [] and os.listdir(state / "tombstones") == []


@pytest.mark.parametrize("mode", MODES)
def test_a_state_root_that_fills_during_a_session_fails_it_with_a_sentence_and_recovery_finishes_it(
    mode, tmp_path, disk, sandbox_ids, casebox,
):
    """J2, J4, C5: the disk fills mid-session: sealing, storing evidence and closing each fail with the one
    sentence, the journal stays VALID, the output's tmpfs is unmounted and nothing runs; recovery reports every
    stage (the sealed one too) and exits 1 while the disk is full, then seals the stage once there is room."""
    state = disk / "state"
    with stewards(mode, tmp_path, state, sandbox_ids) as open_session:
        earlier = open_session("attempt-0")
        earlier.start_sandbox()
        earlier.run(["/usr/bin/true"], env=ENV, timeout_ms=10_000, stdout_cap=64, stderr_cap=64)
        earlier.close_sandbox()
        assert earlier.close().diagnostic == "VERIFIED"
        session = open_session("attempt-1")
        session.create_output("out", max_bytes=1 << 20)
        session.start_sandbox(write=["out"])
        written = session.run(["/bin/sh", "-c", "echo x > /out/out/f"], env=ENV, timeout_ms=10_000, stdout_cap=64, stderr_cap=64)
        assert written.exit_code == 0
        session.close_sandbox()
        fill(disk)
        full = FULL.format(state=state)
        with pytest.raises(SandboxFailure, match=full):
            session.seal_output("out")
        with pytest.raises(SandboxFailure, match=full):
            session.publish("attempt-1.case.receipt.json", b"{}")
        with pytest.raises(SandboxFailure, match=full):
            session.close()
        stage = state / "stages" / session.stage_id
        assert read_journal((stage / JOURNAL_NAME).read_bytes(), expect_stage_id=session.stage_id).verdict == "VALID"
        assert [line for line in mount_table(str(state)) if str(state) in line] == []
        assert processes_of(*sandbox_ids) == []

        result = _recover(casebox, tmp_path, state, sandbox_ids)
        out = result.stdout.decode()
        assert (result.returncode, result.stderr) == (1, b""), out
        assert f"ok   {earlier.stage_id}: SEALED -> SEALED (VERIFIED): already sealed" in out
        assert f"FAIL {session.stage_id}: ACTIVE -> ACTIVE: not finished: {full}" in out

        os.unlink(disk / FILLER)
        result = _recover(casebox, tmp_path, state, sandbox_ids)
        assert result.returncode == 0, result.stdout.decode()
        assert f"ok   {session.stage_id}: ACTIVE -> SEALED" in result.stdout.decode()


def test_a_stage_whose_journal_was_never_begun_is_removed_by_recovery_on_a_full_disk(tmp_path, disk, sandbox_ids, casebox):
    """J1, J4: a steward killed between the stage directory and its reserved journal leaves an UNBORN stage (an
    empty journal, no record): recovery proves nothing of it is on the host and removes it, even on a full
    disk, instead of preserving a TORN stage for good; every other stage is still reported."""
    state = disk / "state"
    with Steward(settings(str(state), sandbox_ids), capability_check=accept_all) as steward:
        _, _, sealed_one = one_session(steward, "attempt-0")
    unborn = state / "stages" / "00unborn00000000"
    unborn.mkdir(mode=0o700)
    (unborn / JOURNAL_NAME).write_bytes(b"")
    fill(disk)
    result = _recover(casebox, tmp_path, state, sandbox_ids)
    out = result.stdout.decode()
    assert result.returncode == 0, out
    assert "ok   00unborn00000000: UNBORN -> REMOVED: its journal was never begun (TORN, no record)" in out
    assert f"ok   {sealed_one.stage_id}: SEALED -> SEALED" in out
    assert not unborn.exists()


def _verify(casebox, config: pathlib.Path, work: pathlib.Path, attempt: str):
    bundle, sha256 = packed(work)
    return casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256, "--plan", str(EXAMPLES / "plan.json"),
        "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(EXAMPLES / "index"), "--attempt", attempt,
        "--evidence", str(work / "evidence"), "--root", "/", "--quiet", timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", ["before", "during"])
def test_verify_on_a_full_state_root_is_never_a_pass_and_says_why(mode, when, tmp_path, sandbox_ids, casebox):
    """`casebox verify` with the state root full before the session, or filling during it (a tmpfs with room
    for one reserved journal and little more, so the first sandbox's launcher file does not fit): no verdict
    at all, never a PASS; exit 70 and one line saying the state root is full; the stage's journal VALID, or no
    stage; and recovery reports every stage and exits 1, not 70."""
    size = (8 << 20) if when == "before" else (264 << 10)
    with small_tmpfs(tmp_path / "disk", size) as disk:
        state = disk / "state"
        work = tmp_path / "work"
        work.mkdir()
        config = tmp_path / "client.toml"
        lines = f'sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\nstate_root = "{state}"\n'
        with contextlib.ExitStack() as stack:
            if mode == "daemon":
                daemon = stack.enter_context(running_daemon(tmp_path, sandbox_ids, state=str(state)))
                config.write_text(lines + f'socket = "{daemon.socket}"\n')
            else:
                config.write_text(lines + f'socket = "{tmp_path}/none.sock"\n')
                os.makedirs(state, mode=0o700)
            if when == "before":
                fill(disk)
            result = _verify(casebox, config, work, f"full-{when}-1")
        stdout, stderr = result.stdout.decode(), result.stderr.decode()
        assert result.returncode == 70, stdout + stderr
        assert "PASS" not in stdout and "verdict" not in stdout
        assert stderr.count("\n") == 1 and stderr.startswith(f"casebox: {FULL.format(state=state)}"), stderr
        assert "Traceback" not in stderr and "WireError" not in stderr
        stages = os.listdir(state / "stages")
        for stage_id in stages:
            data = (state / "stages" / stage_id / JOURNAL_NAME).read_bytes()
            assert read_journal(data, expect_stage_id=stage_id).verdict == "VALID"
        assert (when == "before") == (stages == [])
        assert processes_of(*sandbox_ids) == []
        if stages:
            result = _recover(casebox, tmp_path, state, sandbox_ids)
            assert (result.returncode, result.stderr) == (1, b""), result.stdout.decode()
            assert all(f"FAIL {stage_id}: ACTIVE -> ACTIVE: not finished" in result.stdout.decode() for stage_id in stages)
        assert not os.path.exists(work / "evidence")
