"""Crash consistency of the writer (J1, J5): a process killed at each named point, and power loss.

After either kind of crash the reader says VALID or TORN, and every append
that returned before the crash is in the journal, in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import journal.writer
from journal.reader import Verdict, read_journal
from journal.writer import (
    AFTER_FSYNC,
    AFTER_WRITE,
    BETWEEN_HEADER_AND_PAYLOAD,
    GENESIS_AFTER_DIR_FSYNC,
    GENESIS_AFTER_FSYNC,
    GENESIS_AFTER_WRITE,
    GENESIS_BEFORE_WRITE,
    KILL_POINTS,
    JournalWriter,
)
from journal_support import REPO, PowerLoss, PowerLossLayer, clock

KILLED = 77
IDS = dict(journal_id="j-1", stage_id="s-1", attempt_id="a-1")


def ledger_script(writer: JournalWriter, acknowledge) -> None:
    """Six appends, one of each ledger shape; ``acknowledge`` sees each head as its method returns."""
    acknowledge(writer.process_intent("p-1", "launcher", 4242, 99, 4242))
    acknowledge(writer.mount_intent("m-1", "/sandbox/tmp", "tmpfs"))
    acknowledge(writer.mount_done("m-1", "/sandbox/tmp", "tmpfs"))
    acknowledge(writer.process_released("p-1"))
    acknowledge(writer.process_terminal("p-1", 0, "steward"))
    acknowledge(writer.retirement_intent("retiring"))


APPENDS = 6

CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from journal.writer import JournalWriter
    from test_journal_crash import IDS, KILLED, ledger_script
    point, occurrence = sys.argv[2], int(sys.argv[3])
    passed = {{}}

    def hook(name):
        passed[name] = passed.get(name, 0) + 1
        if name == point and passed[name] == occurrence:
            os._exit(KILLED)

    def acknowledge(head):
        print(head, flush=True)

    dir_fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    writer = JournalWriter.create(dir_fd, "journal", hook=hook, **IDS)
    acknowledge(writer.head)
    ledger_script(writer, acknowledge)
    os._exit(0)
    """
)

# (point, occurrence, the verdict and record count the reader must give after a process kill)
KILLS = [
    (GENESIS_BEFORE_WRITE, 1, Verdict.TORN, 0),
    (GENESIS_AFTER_WRITE, 1, Verdict.VALID, 1),
    (GENESIS_AFTER_FSYNC, 1, Verdict.VALID, 1),
    (GENESIS_AFTER_DIR_FSYNC, 1, Verdict.VALID, 1),
    *[(BETWEEN_HEADER_AND_PAYLOAD, n, Verdict.TORN, n) for n in (1, 3, APPENDS)],
    *[(AFTER_WRITE, n, Verdict.VALID, n + 1) for n in (1, 3, APPENDS)],
    *[(AFTER_FSYNC, n, Verdict.VALID, n + 1) for n in (1, 3, APPENDS)],
]


def test_every_kill_point_is_exercised():
    """J5: the crash tests cover every named kill point of the writer."""
    assert {point for point, *_ in KILLS} == set(KILL_POINTS)


@pytest.mark.parametrize(("point", "occurrence", "verdict", "records"), KILLS)
def test_process_killed_at_kill_point(tmp_path, point, occurrence, verdict, records):
    """J1, J5: killed at a kill point, the journal reads VALID or TORN and holds every acknowledged record."""
    child = subprocess.run(
        [sys.executable, "-I", "-c", CHILD.format(repo=str(REPO), tests=str(REPO / "tests")), str(tmp_path), point, str(occurrence)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == KILLED, child.stderr
    acknowledged = child.stdout.split()
    reading = read_journal((tmp_path / "journal").read_bytes(), expect_stage_id="s-1")
    assert (reading.verdict, len(reading.records)) == (verdict, records), reading.reason
    assert [record.digest for record in reading.records[: len(acknowledged)]] == acknowledged


POWER_LOSSES = [
    (GENESIS_BEFORE_WRITE, 1, Verdict.MISSING, 0),
    (GENESIS_AFTER_WRITE, 1, Verdict.MISSING, 0),
    (GENESIS_AFTER_FSYNC, 1, Verdict.MISSING, 0),
    (GENESIS_AFTER_DIR_FSYNC, 1, Verdict.VALID, 1),
    *[(point, n, Verdict.VALID, n) for point in (BETWEEN_HEADER_AND_PAYLOAD, AFTER_WRITE) for n in range(1, APPENDS + 1)],
    *[(AFTER_FSYNC, n, Verdict.VALID, n + 1) for n in range(1, APPENDS + 1)],
]


@pytest.mark.parametrize(("point", "occurrence", "verdict", "records"), POWER_LOSSES)
def test_power_loss_at_kill_point(tmp_path, monkeypatch, point, occurrence, verdict, records):
    """J1, J5: when every write no fsync covered is lost, every acknowledged record survives.

    Before create returns the directory entry may not be durable, so the
    journal may be MISSING then; after create returns it never is.
    """
    layer = PowerLossLayer()
    monkeypatch.setattr(journal.writer, "os", layer)
    passed: dict[str, int] = {}
    acknowledged: list[str] = []

    def hook(name: str) -> None:
        passed[name] = passed.get(name, 0) + 1
        if name == point and passed[name] == occurrence:
            raise PowerLoss(name)

    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(PowerLoss):
            writer = JournalWriter.create(dir_fd, "journal", hook=hook, clock=clock(), **IDS)
            acknowledged.append(writer.head)
            ledger_script(writer, acknowledged.append)
    finally:
        os.close(dir_fd)
    reading = read_journal(layer.image(), expect_stage_id="s-1")
    assert (reading.verdict, len(reading.records)) == (verdict, records), reading.reason
    assert [record.digest for record in reading.records[: len(acknowledged)]] == acknowledged
