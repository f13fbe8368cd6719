"""Crash consistency of a whole session (DESIGN "Crash consistency"; J1, J4, C5): SIGKILL at each named point.

A child process runs one session (an output filled and sealed, two
sandboxes, ops, cleanup, retirement, export) through the real steward and
SIGKILLs itself at one named kill point. It prints every journal head the
moment the writer acknowledges it. Then ``casebox stage recover --all``
runs, and after it:

- the stage and its tombstone are never both present, and never both absent
  once GENESIS was acknowledged;
- it is a sealed tombstone, or a preserved stage whose journal is TORN; a stage
  whose journal was never begun (UNBORN: no record at all) is removed;
- every acknowledged record is in the journal;
- no process of the dedicated UID and no mount under the state root is left;
- a second recovery changes nothing.

The power-loss variants then drop what was not fsynced (the rename, the
journal's unsynced tail) before recovering.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from journal.files import JOURNAL_NAME
from journal.reader import read_journal
from journal.writer import (
    AFTER_FSYNC, AFTER_WRITE, BETWEEN_HEADER_AND_PAYLOAD, GENESIS_AFTER_DIR_FSYNC, GENESIS_AFTER_FSYNC,
    GENESIS_AFTER_WRITE, GENESIS_BEFORE_WRITE, KILL_POINTS,
)
from sandbox_support import processes_of
from steward import recovery, retirement
from steward.session import (
    AFTER_CLEANUP_EVIDENCE, AFTER_MOUNT_INTENT, AFTER_PROCESS_INTENT, AFTER_STAGE_DIRECTORY, SESSION_KILL_POINTS, Steward,
)
from steward.stateroot import STAGES, STAGING, TOMBSTONES
from steward_support import accept_all, settings

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = pathlib.Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from journal.writer import JournalWriter
    from steward.session import Steward
    from steward_support import ENV, TRUE, accept_all, settings

    state, point, occurrence, uid, gid, evidence = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    passed = {{}}

    def hook(name):
        passed[name] = passed.get(name, 0) + 1
        if name == point and passed[name] == occurrence:
            os.kill(os.getpid(), signal.SIGKILL)

    append, create = JournalWriter.append, JournalWriter.create.__func__

    def acknowledged_append(self, kind, fields):
        head = append(self, kind, fields)
        print(head, flush=True)
        return head

    def acknowledged_create(cls, *args, **kwargs):
        writer = create(cls, *args, **kwargs)
        print(writer.head, flush=True)
        return writer

    JournalWriter.append = acknowledged_append
    JournalWriter.create = classmethod(acknowledged_create)
    steward = Steward(settings(state, (uid, gid)), capability_check=accept_all, hook=hook)
    session = steward.open_session("attempt-1")
    session.create_output("out", max_bytes=1 << 20)
    session.start_sandbox(write=["out"])
    session.run(["/bin/sh", "-c", "echo x > /out/out/f"], env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    session.close_sandbox()
    session.seal_output("out")
    session.start_sandbox(read=["out"])
    session.run(TRUE, env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    fd = os.open(evidence, os.O_RDONLY | os.O_DIRECTORY)
    session.close(fd)
    print("DONE", flush=True)
    """
)

# (point, occurrence): every named point of the writer, the session and retirement, through the whole path.
KILLS = [
    (AFTER_STAGE_DIRECTORY, 1),
    (GENESIS_BEFORE_WRITE, 1),
    (GENESIS_AFTER_WRITE, 1),
    (GENESIS_AFTER_FSYNC, 1),
    (GENESIS_AFTER_DIR_FSYNC, 1),
    (AFTER_MOUNT_INTENT, 1),            # the output's host tmpfs, before it is mounted
    (BETWEEN_HEADER_AND_PAYLOAD, 1),
    (AFTER_WRITE, 2),
    (AFTER_FSYNC, 3),
    (AFTER_PROCESS_INTENT, 1),          # stage 1, before its nonce releases it
    (AFTER_MOUNT_INTENT, 2),            # inside the sandbox, before the ACK permits the mount
    (AFTER_PROCESS_INTENT, 2),          # pid 1, before its release
    (AFTER_PROCESS_INTENT, 3),          # the op, before its release
    (BETWEEN_HEADER_AND_PAYLOAD, 20),
    (AFTER_WRITE, 30),
    (AFTER_FSYNC, 45),
    (AFTER_PROCESS_INTENT, 7),          # the helper, before its request releases it
    ("helper_after_intent", 1),
    ("helper_after_attempt", 1),
    (AFTER_CLEANUP_EVIDENCE, 1),
    *[(point, 1) for point in retirement.KILL_POINTS],
]


def _run_child(tmp_path, sandbox_ids, point: str, occurrence: int) -> tuple[str, list[str]]:
    state = str(tmp_path / "state")
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    script = CHILD.format(repo=str(REPO), tests=str(REPO / "tests"))
    result = subprocess.run(
        [sys.executable, "-c", script, state, point, str(occurrence), str(sandbox_ids[0]), str(sandbox_ids[1]), str(evidence)],
        capture_output=True, timeout=120,
    )
    assert result.returncode == -signal.SIGKILL, f"the child was not killed at {point} #{occurrence}: {result.stderr.decode()[-2000:]}"
    return state, result.stdout.decode().split()


def _recover_cli(casebox, state: str, sandbox_ids, tmp_path) -> subprocess.CompletedProcess:
    config = tmp_path / "casebox.toml"
    config.write_text(f"sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\n")
    return casebox("--config", str(config), "stage", "recover", "--all", "--state-root", state)


def _wait_for_no_processes(sandbox_ids) -> list[int]:
    deadline = time.monotonic() + 5
    while (left := processes_of(*sandbox_ids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _journal_of(state: str, stage_id: str) -> bytes | None:
    for area in (TOMBSTONES, STAGES):
        path = pathlib.Path(state) / area / stage_id / JOURNAL_NAME
        if path.exists():
            return path.read_bytes()
    return None


def _check_converged(state: str, acknowledged: list[str], sandbox_ids) -> None:
    root = pathlib.Path(state)
    found = sorted({*os.listdir(root / STAGES), *os.listdir(root / TOMBSTONES)})
    if not found:
        assert [head for head in acknowledged if head != "DONE"] == [], "a stage with acknowledged records is gone"
        assert _wait_for_no_processes(sandbox_ids) == []
        return
    (stage_id,) = found
    in_stages, in_tombstones = (root / STAGES / stage_id).exists(), (root / TOMBSTONES / stage_id).exists()
    assert in_stages != in_tombstones, "the stage and its tombstone are both present or both absent"
    with Steward(settings(state, sandbox_ids), capability_check=accept_all) as steward:
        assessment = retirement.assess(steward.root, stage_id)
        if in_tombstones:
            assert assessment.state == retirement.SEALED, assessment
        else:
            assert assessment.state == retirement.PRESERVED and assessment.verdict == "TORN", assessment
            assert assessment.reading.records, "a stage whose journal holds no record is UNBORN, and removed"
        data = _journal_of(state, stage_id)
        digests = {record.digest for record in read_journal(data).records} if data is not None else set()
        lost = [head for head in acknowledged if head != "DONE" and head not in digests]
        assert not lost, f"acknowledged records are missing: {lost}"
        assert _wait_for_no_processes(sandbox_ids) == [], "a process of the dedicated UID survived recovery"
        with open("/proc/self/mountinfo") as mountinfo:
            left = [line.split(" ")[4] for line in mountinfo if line.split(" ")[4].startswith(state)]
        assert left == [], f"mounts under the state root survived recovery: {left}"
        assert not [name for name in os.listdir(root / STAGING) if name.startswith(("launcher-", "rendezvous-"))]
        twice = recovery.Recovery(steward.root, steward.settings).recover(stage_id)
        assert twice.ok and twice.after == assessment.state
        assert _journal_of(state, stage_id) == data, "a second recovery changed the journal"


def test_every_named_kill_point_is_killed_at():
    """J1, C5: every kill point the writer, the session and retirement name is in KILLS, so a new point
    added to the path cannot go untested."""
    named = set(KILL_POINTS) | set(SESSION_KILL_POINTS) | set(retirement.KILL_POINTS) | {"helper_after_intent", "helper_after_attempt"}
    assert named == {point for point, _ in KILLS}


@pytest.mark.parametrize("point, occurrence", KILLS, ids=[f"{point}-{occurrence}" for point, occurrence in KILLS])
def test_a_steward_killed_anywhere_converges(tmp_path, sandbox_ids, casebox, point, occurrence):
    """J1, J4, C5: SIGKILL at each named point, then `casebox stage recover --all` converges and loses nothing."""
    state, acknowledged = _run_child(tmp_path, sandbox_ids, point, occurrence)
    result = _recover_cli(casebox, state, sandbox_ids, tmp_path)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    _check_converged(state, acknowledged, sandbox_ids)


def test_power_loss_after_the_rename_before_its_fsync_converges(tmp_path, sandbox_ids, casebox):
    """C5: the rename was not yet durable: as after power loss, the stage is back in stages/ and recovery renames it again."""
    state, acknowledged = _run_child(tmp_path, sandbox_ids, retirement.AFTER_RENAME, 1)
    root = pathlib.Path(state)
    (stage_id,) = os.listdir(root / TOMBSTONES)
    os.rename(root / TOMBSTONES / stage_id, root / STAGES / stage_id)
    result = _recover_cli(casebox, state, sandbox_ids, tmp_path)
    assert result.returncode == 0, result.stdout.decode()
    _check_converged(state, acknowledged, sandbox_ids)


def test_power_loss_drops_an_unsynced_record_and_recovery_converges(tmp_path, sandbox_ids, casebox):
    """J1: a record written but never fsynced (never acknowledged) may vanish; every acknowledged one stays."""
    state, acknowledged = _run_child(tmp_path, sandbox_ids, AFTER_WRITE, 30)
    root = pathlib.Path(state)
    (stage_id,) = os.listdir(root / STAGES)
    journal = root / STAGES / stage_id / JOURNAL_NAME
    reading = read_journal(journal.read_bytes())
    keep = next(record for record in reading.records if record.digest == acknowledged[-1]).end
    with open(journal, "r+b") as file:
        file.truncate(keep)
    result = _recover_cli(casebox, state, sandbox_ids, tmp_path)
    assert result.returncode == 0, result.stdout.decode()
    _check_converged(state, acknowledged, sandbox_ids)
