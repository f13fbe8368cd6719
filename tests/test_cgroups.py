"""S10: where cgroups observe MEMORY and PIDS, and how the hierarchy is chosen."""

from __future__ import annotations

import os

import pytest

from steward import cgroups

V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2 = "30 23 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
PROC_V1 = "9:name=systemd:/\n8:pids:/\n4:memory:/job/42\n0::/\n"


def test_cgroup_v2_with_both_controllers_is_preferred():
    chosen = cgroups.choose(V2, "0::/user.slice\n", lambda point: ["cpu", "memory", "pids"])
    assert chosen == cgroups.Hierarchy(2, "/sys/fs/cgroup/casebox", "/sys/fs/cgroup/casebox")


def test_cgroup_v1_nests_under_the_starters_own_cgroups():
    """An empty cgroup2 mount (this host's) falls back to the v1 memory and pids hierarchies."""
    chosen = cgroups.choose(V1, PROC_V1, lambda point: [])
    assert chosen == cgroups.Hierarchy(1, "/sys/fs/cgroup/memory/job/42", "/sys/fs/cgroup/pids")


def test_no_controllers_means_no_observation():
    assert cgroups.choose(V2, "0::/\n", lambda point: ["cpu"]) is None
    assert cgroups.choose("", "", lambda point: []) is None


@pytest.mark.root
def test_a_sandbox_cgroup_counts_a_refused_fork_and_is_removed():
    """S10: pids.events counts the forks refused at pids.max; that counter names PIDS."""
    hierarchy = cgroups.detect()
    if hierarchy is None:
        pytest.skip("this host has no memory and pids controllers")
    group = cgroups.SandboxCgroup.create(hierarchy, f"casebox-test-{os.getpid()}", memory_bytes=64 << 20, pids_max=1)
    try:
        assert group.counters() == cgroups.Counters(0, 0, 0)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(read_end, 1)
            try:
                os._exit(0 if os.fork() else 0)
            except OSError:
                os._exit(3)
        group.attach(pid)
        os.write(write_end, b"x")
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
        assert group.counters().pids_refused == 1
    finally:
        group.remove()
    assert all(not os.path.exists(directory) for directory in group.directories)


@pytest.mark.root
def test_a_mount_point_that_is_not_utf8_does_not_stop_detection(tmp_path):
    """S11: the host's mount table is read whatever bytes its paths hold; a mount at a non-UTF-8 path (in a
    private mount namespace here) leaves detection, and so every sandbox start, working."""
    from launcher import syscalls as sc

    expected = cgroups.detect()
    point = os.path.join(os.fsencode(tmp_path), b"\xff\xfe")
    os.mkdir(point)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            sc.unshare(sc.CLONE_NEWNS)
            sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
            sc.mount("casebox-test", point.decode("utf-8", "surrogateescape"), "tmpfs", 0, "size=64k")
            os.write(write_end, b"1" if cgroups.detect() == expected else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"


def _cgroup_v2() -> bool:
    hierarchy = cgroups.detect()
    return hierarchy is not None and hierarchy.version == 2


@pytest.mark.root
@pytest.mark.cgroup2
@pytest.mark.skipif(not _cgroup_v2(), reason="needs cgroup v2 with memory and pids; this host is v1")
@pytest.mark.parametrize("place", [cgroups.INIT, cgroups.OPS])
def test_on_cgroup_v2_removal_kills_what_is_left_with_cgroup_kill(place):
    """S10 on v2: a process still in a sandbox's cgroup at teardown (its init or its ops) is killed through
    cgroup.kill, and the cgroup is then removed; without cgroup.kill the rmdir would fail busy."""
    hierarchy = cgroups.detect()
    group = cgroups.SandboxCgroup.create(hierarchy, f"casebox-test-kill-{os.getpid()}", memory_bytes=64 << 20, pids_max=8)
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", "600"])
    try:
        target = group.sandbox[0] if place == cgroups.INIT else group.ops
        with open(os.path.join(target, "cgroup.procs"), "w") as file:
            file.write(str(pid))
        group.remove()
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        status = os.waitpid(pid, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
    assert all(not os.path.exists(directory) for directory in group.directories)
