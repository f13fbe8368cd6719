"""What the launcher runs on: the real interpreter and the one directory its C modules come from.

The launcher runs with ``python -I -S``, so site-packages is not on its path,
yet it needs python-prctl and cffi's backend. The starter finds the directory
its own interpreter loaded them from (they must share one), opens it, and
checks the opened directory and those files the way a root process must
before importing from them: owned by root and writable by no one else. It
sends that descriptor; the launcher imports through ``/proc/self/fd/N``
before its root switch. The interpreter is opened and checked the same way
and also travels as a descriptor, which stage 1 execs with execveat.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import stat
import sys

from steward.failure import SandboxFailure

LAUNCHER_MODULES = ("_prctl", "_cffi_backend")


@dataclasses.dataclass
class Runtime:
    """Open descriptors for the checked interpreter and import directory; ``close`` releases them."""

    interpreter: str
    interpreter_fd: int
    import_dir: str
    import_dir_fd: int

    def close(self) -> None:
        for fd in (self.interpreter_fd, self.import_dir_fd):
            if fd >= 0:
                os.close(fd)
        self.interpreter_fd = self.import_dir_fd = -1


def _refuse_unless_root_only(info: os.stat_result, path: str, what: str) -> None:
    if info.st_uid != 0 or info.st_mode & 0o022:
        raise SandboxFailure(
            f"the launcher's {what} {path} is owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}; "
            "root must not run code another user can change, so install casebox as root (sudo scripts/bootstrap)"
        )


def _module_directory() -> tuple[str, list[str]]:
    directories, files = set(), []
    for name in LAUNCHER_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            raise SandboxFailure(f"the launcher needs the module {name}, which this interpreter cannot find; run scripts/bootstrap")
        origin = os.path.realpath(spec.origin)
        directories.add(os.path.dirname(origin))
        files.append(os.path.basename(origin))
    if len(directories) != 1:
        raise SandboxFailure(f"the launcher's modules {', '.join(LAUNCHER_MODULES)} must share one directory, not {sorted(directories)}")
    return directories.pop(), files


def launcher_source_problem(package_dir: str) -> str | None:
    """Why the launcher package's sources are not root-only, or None when they are.

    The shipped launcher is built from these files, so whoever can change
    them chooses what root runs. An editable install in a checkout owned by
    an unprivileged user (a CI runner's) is such a case; it is reported, not
    refused, because there that user is an administrator anyway.
    """
    for path in [package_dir, *sorted(str(item) for item in pathlib.Path(package_dir).glob("*.py"))]:
        info = os.stat(path, follow_symlinks=False)
        if info.st_uid != 0 or info.st_mode & 0o022:
            return f"{path} is owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}"
    return None


def open_runtime() -> Runtime:
    """Open and check the interpreter and the import directory."""
    interpreter = os.path.realpath(sys.executable)
    directory, files = _module_directory()
    interpreter_fd = os.open(interpreter, os.O_RDONLY | os.O_CLOEXEC)
    runtime = Runtime(interpreter, interpreter_fd, directory, -1)
    try:
        _refuse_unless_root_only(os.fstat(interpreter_fd), interpreter, "interpreter")
        runtime.import_dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        _refuse_unless_root_only(os.fstat(runtime.import_dir_fd), directory, "module directory")
        for name in files:
            info = os.stat(name, dir_fd=runtime.import_dir_fd, follow_symlinks=False)
            _refuse_unless_root_only(info, os.path.join(directory, name), "module")
    except BaseException:
        runtime.close()
        raise
    return runtime
