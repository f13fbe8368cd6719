"""Load: 200 sessions in a row, one `true` op each; nothing accumulates and every tombstone verifies."""

from __future__ import annotations

import os

import pytest

from sandbox_support import mount_table, processes_of
from steward import procfs, retirement
from steward_support import fd_count, one_session, sealed_reading, state_path, steward  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.slow]
SESSIONS = 200


def test_two_hundred_sessions_leave_nothing_behind(steward, state_path, sandbox_ids):
    """J1, C4, C5, S1: the steward's descriptors, the mount table and the process table are as before."""
    one_session(steward, "warm-up")
    fds, mounts = fd_count(), mount_table(state_path)
    closed = [one_session(steward, f"attempt-{index}")[2] for index in range(SESSIONS)]
    assert fd_count() == fds, "the steward leaked descriptors"
    assert mount_table(state_path) == mounts, "the host mount table changed"
    assert processes_of(*sandbox_ids) == [], "a process of the dedicated UID outlived its session"
    assert procfs.children(os.getpid()) == [], "a child of the steward was left unreaped"
    assert os.listdir(os.path.join(state_path, "stages")) == []
    assert os.listdir(os.path.join(state_path, "staging")) == []
    for result in closed:
        assert (result.cleanup, result.diagnostic) == ("CLEANED", "VERIFIED")
        reading = sealed_reading(state_path, result.stage_id)
        assert reading.verdict == "VALID" and reading.head == result.head
        assert retirement.assess(steward.root, result.stage_id).state == retirement.SEALED
