"""The syscall layer: every binding runs for real as root.

A call that changes mounts runs in a forked child that first takes its own
mount namespace with private propagation, so the host mount table never moves.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import traceback

import pytest

from ffi_support import serialized
from launcher import syscalls as sc
from sandbox_support import mount_table
from steward import cgroups

root = pytest.mark.root


def in_child(function, *, own_mounts: bool = False):
    """Run ``function`` in a forked child; its JSON-able result (or error text) comes back."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            if own_mounts:
                sc.unshare(sc.CLONE_NEWNS)
                sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
            reply = {"ok": function()}
        except BaseException as error:  # the child reports everything
            reply = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
        os.write(write_end, json.dumps(reply).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    reply = json.loads(data)
    assert "error" not in reply, reply.get("trace")
    return reply["ok"]


@pytest.fixture
def host_mounts_unchanged(tmp_path):
    """The test's mounts stay in its child's own namespace: none appears at or below its tmp_path on the host."""
    before = mount_table(str(tmp_path))
    yield
    assert mount_table(str(tmp_path)) == before


def test_serialized_ffi_matches_the_cdef(tmp_path):
    """The ABI blob in syscalls.py is exactly what cffi serializes from CDEF."""
    positional, keywords = serialized(sc.CDEF, "launcher.syscalls", tmp_path)
    assert positional == ("launcher.syscalls",)
    assert keywords["_types"] == sc._FFI_TYPES
    assert keywords["_globals"] == sc._FFI_GLOBALS
    assert keywords["_version"] == sc._FFI_VERSION


@root
def test_unshare_and_setns_move_between_uts_namespaces():
    def body():
        host = os.open("/proc/self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
        host_name = socket.gethostname()
        sc.unshare(sc.CLONE_NEWUTS)
        socket.sethostname("casebox-inner")
        inner = socket.gethostname()
        sc.setns(host, sc.CLONE_NEWUTS)
        return [host_name, inner, socket.gethostname()]

    before = socket.gethostname()
    host_name, inner, back = in_child(body)
    assert (host_name, inner, back) == (before, "casebox-inner", before)
    assert socket.gethostname() == before


@root
def test_mount_and_umount2(tmp_path, host_mounts_unchanged):
    target = str(tmp_path)

    def body():
        sc.mount("casebox-test", target, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "size=1m,mode=0700")
        mounted = any(line.split()[4] == target for line in open("/proc/self/mountinfo"))
        sc.umount2(target, sc.MNT_DETACH)
        still = any(line.split()[4] == target for line in open("/proc/self/mountinfo"))
        return [mounted, still]

    assert in_child(body, own_mounts=True) == [True, False]


@root
def test_pivot_root_then_detach_the_old_root(tmp_path, host_mounts_unchanged):
    new_root = str(tmp_path)

    def body():
        sc.mount("casebox-test", new_root, "tmpfs", 0, "size=1m")
        os.mkdir(os.path.join(new_root, "marker"))
        os.chdir(new_root)
        sc.pivot_root(".", ".")
        sc.umount2(".", sc.MNT_DETACH)
        os.chdir("/")
        return sorted(os.listdir("/"))

    assert in_child(body, own_mounts=True) == ["marker"]


@root
def test_open_tree_mount_setattr_move_mount_make_a_read_only_bind(tmp_path, host_mounts_unchanged):
    source = tmp_path / "source"
    source.mkdir()
    (source / "file").write_text("data")
    target = tmp_path / "target"
    target.mkdir()

    def body():
        directory = os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        tree = sc.open_tree(directory, "", sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC | sc.AT_RECURSIVE | sc.AT_EMPTY_PATH)
        sc.mount_setattr(tree, "", sc.AT_EMPTY_PATH | sc.AT_RECURSIVE, sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID)
        sc.move_mount(tree, "", sc.AT_FDCWD, str(target), sc.MOVE_MOUNT_F_EMPTY_PATH)
        seen = (target / "file").read_text()
        try:
            (target / "new").write_text("x")
            write = "written"
        except OSError as error:
            write = errno.errorcode[error.errno]
        return [seen, write, os.statvfs(target).f_flag & (os.ST_RDONLY | os.ST_NOSUID)]

    assert in_child(body, own_mounts=True) == ["data", "EROFS", os.ST_RDONLY | os.ST_NOSUID]
    assert not (source / "new").exists()


@root
def test_renameat2_noreplace_refuses_an_existing_name(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    directory = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with pytest.raises(FileExistsError, match="renameat2"):
            sc.renameat2(directory, "a", directory, "b", sc.RENAME_NOREPLACE)
        assert (tmp_path / "b").read_text() == "b"
        sc.renameat2(directory, "a", directory, "c", sc.RENAME_NOREPLACE)
    finally:
        os.close(directory)
    assert sorted(os.listdir(tmp_path)) == ["b", "c"]


def test_close_range_cloexec_marks_and_plain_close_range_closes():
    first = os.open("/dev/null", os.O_RDONLY)
    second = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(first, True)
    sc.close_range(first, first, sc.CLOSE_RANGE_CLOEXEC)
    assert fcntl.fcntl(first, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    sc.close_range(first, first, 0)
    with pytest.raises(OSError):
        os.fstat(first)
    os.close(second)


def test_execveat_runs_a_descriptor_and_reports_failure(tmp_path):
    program = os.open("/bin/sh", os.O_RDONLY | os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            sc.execveat(program, "", ["sh", "-c", 'exit "$CODE"'], {"CODE": "7"}, sc.AT_EMPTY_PATH)
        finally:
            os._exit(99)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    os.close(program)
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(PermissionError, match="execveat"):
        sc.execveat(sc.AT_FDCWD, str(plain), ["x"], {}, 0)


def test_clone_parent_makes_a_sibling_the_caller_reaps():
    read_end, write_end = os.pipe()
    helper = os.fork()
    if helper == 0:
        pid = sc.clone(sc.CLONE_PARENT)
        if pid == 0:
            os._exit(5)
        os.write(write_end, str(pid).encode())
        os._exit(0)
    os.close(write_end)
    sibling = int(os.read(read_end, 32))
    os.close(read_end)
    assert os.waitpid(helper, 0)[1] == 0
    assert os.waitstatus_to_exitcode(os.waitpid(sibling, 0)[1]) == 5


@root
def test_clone_into_new_namespaces_gives_pid_one():
    read_end, write_end = os.pipe()
    pid = sc.clone(sc.CLONE_NEWPID | sc.CLONE_NEWUTS)
    if pid == 0:
        os.write(write_end, str(os.getpid()).encode())
        os._exit(0)
    os.close(write_end)
    inner = os.read(read_end, 32)
    os.close(read_end)
    assert os.waitpid(pid, 0)[1] == 0
    assert inner == b"1"


def _cgroup2_mount() -> str | None:
    with open("/proc/self/mountinfo", errors="surrogateescape") as file:
        points = [point for point, fstype, _ in cgroups._mounts(file.read()) if fstype == "cgroup2"]
    return points[0] if points else None


@root
@pytest.mark.skipif(_cgroup2_mount() is None, reason="needs a cgroup v2 hierarchy mounted")
@pytest.mark.parametrize("flags", [sc.CLONE_NEWUTS, sc.CLONE_PARENT | sc.CLONE_NEWPID | sc.CLONE_NEWCGROUP])
def test_clone_into_cgroup_gives_a_child_born_in_the_cgroup(flags):
    """S14: clone_into_cgroup's child runs first in the named cgroup v2 directory, not in its parent's, with
    the flags stage 1 clones pid 1 with too (a sibling with CLONE_PARENT, which the caller's parent reaps as it
    reaps a fork). A cgroup v2 mount with no controllers, as on this v1 host, takes the clone as well."""
    place = os.path.join(_cgroup2_mount(), f"casebox-test-clone3-{os.getpid()}")
    os.mkdir(place)
    try:
        directory = os.open(place, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        release_read, release_write = os.pipe()
        report_read, report_write = os.pipe()

        def clone_a_waiting_child() -> int:
            pid = sc.clone_into_cgroup(flags, directory)
            if pid == 0:
                os.read(release_read, 1)
                os._exit(0)
            return pid

        if flags & sc.CLONE_PARENT:
            cloner = os.fork()
            if cloner == 0:
                try:
                    os.write(report_write, str(clone_a_waiting_child()).encode())
                finally:
                    os._exit(0)
            os.close(report_write)
            assert os.waitpid(cloner, 0)[1] == 0
            reported = os.read(report_read, 32)
            assert reported, "the clone failed in the cloner"
            pid = int(reported)
        else:
            pid = clone_a_waiting_child()
        os.close(directory)
        try:
            with open(f"/proc/{pid}/cgroup") as file:
                born_in = next(line for line in file if line.startswith("0::")).strip()
        finally:
            os.write(release_write, b"x")
            assert os.waitpid(pid, 0)[1] == 0
        for fd in (release_read, release_write, report_read, *(() if flags & sc.CLONE_PARENT else (report_write,))):
            os.close(fd)
    finally:
        os.rmdir(place)
    assert born_in == f"0::/{os.path.basename(place)}"


def test_prctl_clears_ambient_capabilities_and_names_itself_on_failure():
    assert sc.prctl(sc.PR_CAP_AMBIENT, sc.PR_CAP_AMBIENT_CLEAR_ALL) == 0
    with pytest.raises(OSError, match="prctl") as caught:
        sc.prctl(-1)
    assert caught.value.errno == errno.EINVAL


def test_syncfs_writes_back_the_filesystem_of_a_descriptor(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sc.syncfs(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sc.unshare(-1), "unshare"),
        (lambda: sc.setns(-1, 0), "setns"),
        (lambda: sc.mount(None, "/nonexistent/casebox", None, 0), "mount"),
        (lambda: sc.umount2("/nonexistent/casebox", 0), "umount2"),
        (lambda: sc.pivot_root("/nonexistent/casebox", "/nonexistent/casebox"), "pivot_root"),
        (lambda: sc.open_tree(-1, "", sc.AT_EMPTY_PATH), "open_tree"),
        (lambda: sc.move_mount(-1, "", -1, "", sc.MOVE_MOUNT_F_EMPTY_PATH), "move_mount"),
        (lambda: sc.mount_setattr(-1, "", sc.AT_EMPTY_PATH, sc.MOUNT_ATTR_RDONLY), "mount_setattr"),
        (lambda: sc.renameat2(sc.AT_FDCWD, "/nonexistent/a", sc.AT_FDCWD, "/nonexistent/b", 0), "renameat2"),
        (lambda: sc.close_range(5, 4, 0), "close_range"),
        (lambda: sc.execveat(-1, "", ["x"], {}, sc.AT_EMPTY_PATH), "execveat"),
        (lambda: sc.syncfs(-1), "syncfs"),
    ],
)
def test_a_failure_raises_oserror_with_the_errno_and_the_call_name(call, name):
    with pytest.raises(OSError) as caught:
        call()
    assert caught.value.errno in (errno.EINVAL, errno.EBADF, errno.ENOENT, errno.EPERM)
    assert str(caught.value.strerror).startswith(f"{name}: ")
