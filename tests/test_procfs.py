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


def _child_in_own_group(name: bytes) -> tuple[int, int]:
    """A child that leads its own process group and names itself ``name``; (pid, write end of its release pipe)."""
    read_end, write_end = os.pipe()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        with open("/proc/self/comm", "wb") as comm:
            comm.write(name)
        os.write(ready_write, b"x")
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    os.close(ready_write)
    os.read(ready_read, 1)
    os.close(ready_read)
    return pid, write_end


def test_a_group_scan_finds_exactly_the_members_of_a_group():
    """C3: the descriptor-relative scan of stat finds the group's members and nothing else."""
    pid, release = _child_in_own_group(b"member")
    try:
        assert procfs.group_members(pid) == [pid]
        assert pid not in procfs.group_members(os.getpgrp())
    finally:
        os.write(release, b"x")
        os.close(release)
        os.waitpid(pid, 0)
    assert procfs.group_members(pid) == []


def test_a_scan_survives_a_command_name_that_is_not_utf8():
    """C1, C3: a process may name itself any bytes; the scans still see it, with its identity."""
    pid, release = _child_in_own_group(b"\xff\xfe(x) 1 2")
    try:
        assert procfs.group_members(pid) == [pid]
        entry = next(entry for entry in procfs.scan() if entry.pid == pid)
        assert (entry.ppid, entry.pgid, entry.starttime) == (os.getpid(), pid, procfs.identity(pid).starttime)
    finally:
        os.write(release, b"x")
        os.close(release)
        os.waitpid(pid, 0)


def test_a_handle_and_the_namespace_pids_survive_a_command_name_that_is_not_utf8():
    """C2: a process renamed to any bytes is still identified, and proved absent once reaped."""
    pid, release = _child_in_own_group(b"\xff\xfe")
    reaped = False
    try:
        handle = procfs.ProcessHandle.open(pid, procfs.identity(pid).starttime)
        try:
            assert not handle.gone() and procfs.namespace_pids(pid) == [pid]
            os.write(release, b"x")
            os.waitpid(pid, 0)
            reaped = True
            assert handle.gone()
        finally:
            handle.close()
    finally:
        if not reaped:
            os.write(release, b"x")
            os.waitpid(pid, 0)
        os.close(release)
