"""The Linux system calls casebox needs that the stdlib does not bind.

cffi in out-of-line ABI mode: no compiler, no pycparser at run time. The one
C declaration is ``CDEF``; ``_FFI`` below is what cffi serializes from it
(tests/test_syscalls.py regenerates it and compares), so importing this module
costs only ``_cffi_backend``. Every call goes through ``syscall(2)`` with the
architecture's number, so nothing depends on the glibc version (Ubuntu 22.04's
glibc has no ``open_tree`` wrapper, and no glibc has ``pivot_root``).

A failed call raises ``OSError`` whose errno is the kernel's and whose message
names the call.
"""

import os

import _cffi_backend

CDEF = "long syscall(long number, ...);"
_FFI_VERSION = 0x2601
_FFI_TYPES = b"\x00\x00\x01\x0D\x00\x00\x09\x01\x00\x00\x01\x0F"
_FFI_GLOBALS = (b"\x00\x00\x00\x23syscall", 0)
_FFI = _cffi_backend.FFI("launcher.syscalls", _version=_FFI_VERSION, _types=_FFI_TYPES, _globals=_FFI_GLOBALS)
_LIBC = _FFI.dlopen(None)

_NUMBERS = {
    "x86_64": {
        "clone": 56, "pivot_root": 155, "prctl": 157, "mount": 165, "umount2": 166, "keyctl": 250, "unshare": 272,
        "syncfs": 306, "setns": 308, "renameat2": 316, "seccomp": 317, "execveat": 322, "open_tree": 428, "move_mount": 429,
        "clone3": 435, "close_range": 436, "mount_setattr": 442,
    },
    "aarch64": {
        "umount2": 39, "mount": 40, "pivot_root": 41, "unshare": 97, "prctl": 167, "keyctl": 219, "clone": 220,
        "syncfs": 267, "setns": 268, "renameat2": 276, "seccomp": 277, "execveat": 281, "open_tree": 428, "move_mount": 429,
        "clone3": 435, "close_range": 436, "mount_setattr": 442,
    },
}
MACHINE = os.uname().machine
if MACHINE not in _NUMBERS:
    raise OSError(38, f"casebox binds system calls for x86_64 and aarch64 only, not {MACHINE}")
_NR = _NUMBERS[MACHINE]

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_PARENT = 0x00008000
CLONE_INTO_CGROUP = 0x200000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_SHARED = 0x100000
MNT_DETACH = 0x2

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = 0o2000000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
_MOUNT_ATTR_SIZE_VER0 = 32

RENAME_NOREPLACE = 0x1
CLOSE_RANGE_CLOEXEC = 0x4
CLOSE_RANGE_ALL = 0xFFFFFFFF

_SIGCHLD = 17

PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


def _long(value: int):
    return _FFI.cast("long", value)


def _path(value: str | bytes | None):
    """A NUL-terminated C string (kept alive by the caller's reference), or NULL."""
    if value is None:
        return _FFI.cast("char *", 0)
    return _FFI.new("char[]", os.fsencode(value))


def _call(name: str, *args, filename: str | bytes | None = None) -> int:
    result = _LIBC.syscall(_long(_NR[name]), *args)
    if result == -1:
        error = _FFI.errno
        raise OSError(error, f"{name}: {os.strerror(error)}", filename)
    return result


def unshare(flags: int) -> None:
    _call("unshare", _long(flags))


def setns(fd: int, nstype: int) -> None:
    _call("setns", _long(fd), _long(nstype))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call("mount", _path(source), _path(target), _path(fstype), _long(flags), _path(data), filename=target)


def umount2(target: str, flags: int) -> None:
    _call("umount2", _path(target), _long(flags), filename=target)


def pivot_root(new_root: str, put_old: str) -> None:
    _call("pivot_root", _path(new_root), _path(put_old), filename=new_root)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """A new mount-tree descriptor (with OPEN_TREE_CLONE, a detached copy)."""
    return _call("open_tree", _long(dirfd), _path(path), _long(flags), filename=path or None)


def move_mount(from_dirfd: int, from_path: str, to_dirfd: int, to_path: str, flags: int) -> None:
    _call(
        "move_mount", _long(from_dirfd), _path(from_path), _long(to_dirfd), _path(to_path), _long(flags),
        filename=to_path or None,
    )


def mount_setattr(dirfd: int, path: str, flags: int, attr_set: int, attr_clr: int = 0) -> None:
    """Change mount attributes; ``flags`` may carry AT_EMPTY_PATH and AT_RECURSIVE."""
    attr = _FFI.new("unsigned long long[4]", [attr_set, attr_clr, 0, 0])
    _call(
        "mount_setattr", _long(dirfd), _path(path), _long(flags), _FFI.cast("void *", attr),
        _long(_MOUNT_ATTR_SIZE_VER0), filename=path or None,
    )


def syncfs(fd: int) -> None:
    """Write back every dirty file of the filesystem holding ``fd``; the kernel reports any write-back error."""
    _call("syncfs", _long(fd))


def renameat2(olddirfd: int, oldpath: str, newdirfd: int, newpath: str, flags: int) -> None:
    _call("renameat2", _long(olddirfd), _path(oldpath), _long(newdirfd), _path(newpath), _long(flags), filename=newpath)


def close_range(first: int, last: int, flags: int) -> None:
    _call("close_range", _FFI.cast("unsigned int", first), _FFI.cast("unsigned int", last), _FFI.cast("unsigned int", flags))


def execveat(dirfd: int, path: str, argv: list[str], envp: dict[str, str], flags: int) -> None:
    """Replace this process image; returns only by raising."""
    keep = [_path(item) for item in argv] + [_path(f"{name}={value}") for name, value in envp.items()]
    c_argv = _FFI.new("char *[]", keep[: len(argv)] + [_FFI.NULL])
    c_envp = _FFI.new("char *[]", keep[len(argv):] + [_FFI.NULL])
    _call("execveat", _long(dirfd), _path(path), _FFI.cast("void *", c_argv), _FFI.cast("void *", c_envp), _long(flags))


def clone(flags: int) -> int:
    """fork(2) with clone flags (CLONE_PARENT, new namespaces); 0 in the child.

    The child's exit signal is SIGCHLD, as with fork. It shares the caller's stack copy-on-write, like fork, but no
    Python at-fork hook runs: the caller must be single-threaded and the
    child must only exec or _exit.
    """
    zero = _long(0)
    return _call("clone", _long(flags | _SIGCHLD), zero, zero, zero, zero)


# struct clone_args up to its cgroup field (CLONE_ARGS_SIZE_VER2): eleven u64, flags first, exit_signal the
# fifth, cgroup the last; stack 0 makes the child run on a copy-on-write copy of the caller's stack, as fork does.
_CLONE_ARGS_WORDS = 11
_CLONE_ARGS_EXIT_SIGNAL = 4
_CLONE_ARGS_CGROUP = 10


def clone_into_cgroup(flags: int, cgroup_fd: int) -> int:
    """:func:`clone`, with the child born in the cgroup v2 directory ``cgroup_fd`` (clone3 with
    CLONE_INTO_CGROUP, Linux 5.7), so it never runs a moment in the caller's cgroup; 0 in the child.

    The same rules as :func:`clone` bind the caller and the child. With CLONE_PARENT clone3 refuses any exit
    signal (EINVAL); the sibling then takes the caller's own, SIGCHLD for a process its parent forked.
    """
    arguments = _FFI.new(f"uint64_t[{_CLONE_ARGS_WORDS}]")
    arguments[0] = flags | CLONE_INTO_CGROUP
    arguments[_CLONE_ARGS_EXIT_SIGNAL] = 0 if flags & CLONE_PARENT else _SIGCHLD
    arguments[_CLONE_ARGS_CGROUP] = cgroup_fd
    return _call("clone3", _FFI.cast("void *", arguments), _long(_FFI.sizeof(arguments)))


def keyctl(operation: int, arg2: int = 0, arg3: int = 0) -> int:
    """The raw keyctl(2) (glibc has no wrapper; libkeyutils is not a dependency)."""
    return _call("keyctl", _long(operation), _long(arg2), _long(arg3))


def buffer(data: bytes):
    """A C copy of ``data``, alive while the caller holds it."""
    return _FFI.new("char[]", data)


def address(pointer) -> int:
    return int(_FFI.cast("uintptr_t", pointer))


def seccomp(operation: int, flags: int, argument) -> None:
    """seccomp(2); ``argument`` is a buffer from :func:`buffer`."""
    _call("seccomp", _long(operation), _long(flags), _FFI.cast("void *", argument))


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    """The raw prctl(2), for the options python-prctl does not know (ambient capabilities)."""
    return _call("prctl", _long(option), _long(arg2), _long(arg3), _long(arg4), _long(arg5))
