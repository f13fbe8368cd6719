"""Shared pieces of the steward tests: a steward on a temporary state root, and reading what it left."""

from __future__ import annotations

import gc
import os
import pathlib

import pytest

from journal.files import JOURNAL_NAME
from journal.format import Kind
from journal.reader import Reading, read_journal
from journal.seal import seal_from_bytes
from steward import helperattempts
from steward.session import Settings, Steward

TRUE = ["/usr/bin/true"]
ENV = {"PATH": "/usr/bin:/bin"}
FAST = helperattempts.Timing(response_seconds=10.0, exit_seconds=5.0, kill_seconds=5.0)


def accept_all(fd: int, name: str) -> None:
    """A capability predicate that accepts every directory (the real one is issue 7's F4 check)."""


def settings(state_root: str, sandbox_ids, **overrides) -> Settings:
    uid, gid = sandbox_ids
    return Settings(state_root=state_root, uid=uid, gid=gid, lease_seconds=overrides.pop("lease_seconds", 30.0), timing=FAST, **overrides)


@pytest.fixture
def state_path(tmp_path) -> str:
    return str(tmp_path / "state")


@pytest.fixture
def steward(state_path, sandbox_ids):
    made = Steward(settings(state_path, sandbox_ids), capability_check=accept_all)
    yield made
    made.close()


def run_true(session) -> object:
    return session.run(TRUE, env=ENV, timeout_ms=10_000, stdout_cap=1024, stderr_cap=1024)


def one_session(steward, attempt: str = "attempt-1", evidence_fd: int | None = None):
    session = steward.open_session(attempt)
    session.start_sandbox()
    outcome = run_true(session)
    session.close_sandbox()
    return session, outcome, session.close(evidence_fd)


def tombstone(state_path: str, stage_id: str) -> pathlib.Path:
    return pathlib.Path(state_path) / "tombstones" / stage_id


def read_dir_journal(directory: pathlib.Path, **expect) -> Reading:
    data = (directory / JOURNAL_NAME).read_bytes() if (directory / JOURNAL_NAME).exists() else None
    return read_journal(data, **expect)


def sealed_reading(state_path: str, stage_id: str) -> Reading:
    """The tombstone's journal read against its own seal marker (J4: the head kept outside the file)."""
    directory = tombstone(state_path, stage_id)
    marker = seal_from_bytes((directory / "seal.json").read_bytes())
    return read_dir_journal(directory, expect_stage_id=stage_id, expect_journal_id=marker.journal_id, expect_head=marker.head)


def kinds(reading: Reading) -> list[Kind]:
    return [record.kind for record in reading.records]


def last_of(reading: Reading, kind: Kind):
    found = [record for record in reading.records if record.kind is kind]
    return found[-1] if found else None


def fd_count() -> int:
    """This process's open descriptors, after objects an earlier test dropped have been collected."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))
