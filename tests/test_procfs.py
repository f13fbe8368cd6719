"""C1: process identities (pid, start time, pgid) and host-pid translation from procfs."""

from __future__ import annotations

import os

import pytest

from launcher import syscalls as sc
from steward import procfs


def test_parse_stat_survives_a_hostile_command_name():
    """A command name may hold spaces and parentheses; fields are counted after the last ')'."""
    fields = ["S", "41", "42", "43"] + [str(n) for n in range(7, 22)] + ["987654"] + ["0"] * 30
    text = "1234 (a) b (c)) " + " ".join(fields)
    assert procfs.parse_stat(text) == (41, 42, 987654)


def test_identity_of_this_process_matches_procfs():
    found = procfs.identity(os.getpid())
    assert (found.pid, found.pgid, found.ppid) == (os.getpid(), os.getpgrp(), os.getppid())
    assert found.starttime > 0


@pytest.mark.root
def test_a_child_in_a_new_pid_namespace_is_found_by_its_inner_pid():
    read_end, write_end = os.pipe()
    pid = sc.clone(sc.CLONE_NEWPID)
    if pid == 0:
        os.read(read_end, 1)
        os._exit(0)
    try:
        assert procfs.namespace_pids(pid)[-1] == 1
        assert procfs.host_pid_of_child(os.getpid(), 1) == pid
        with pytest.raises(LookupError):
            procfs.host_pid_of_child(os.getpid(), 999_999)
    finally:
        os.write(write_end, b"x")
        os.waitpid(pid, 0)
        os.close(read_end)
        os.close(write_end)


def test_a_process_named_with_bytes_that_are_not_utf_8_is_read_and_scanned():
    """Any local user can name a process with bytes that are not UTF-8 (PR_SET_NAME); reading /proc must not
    fail on it, or every sandbox teardown (the C3 scan) and cleanup inventory would fail with it."""
    import ctypes
    import signal

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        ctypes.CDLL(None).prctl(15, b"\xffcase\xfebox", 0, 0, 0)
        os.write(write_end, b"x")
        signal.pause()
        os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"x"
        assert procfs.identity(pid).pid == pid
        assert pid in [entry.pid for entry in procfs.scan()]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
