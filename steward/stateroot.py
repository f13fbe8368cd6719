"""The steward's state root: opened once as a directory descriptor, every later access relative to it (F3).

Layout (docs/operations.md, "The state root"):

    <root>/              root-owned, 0700
        staging/         launcher files and rendezvous sockets (S1)
        stages/<id>/     active stages: journal, outputs, cleanup evidence
        tombstones/<id>/ retired stages, sealed read-only
        locks/uid-<N>    the lease on a dedicated UID

The root itself is looked up by path once. Everything below it is reached
with ``*at`` calls on descriptors and ``O_NOFOLLOW``: a symlink anywhere
inside is refused, and so is a directory or lock file not owned by root. The
one exception is what a sandbox wrote into a live output mount, which is
untrusted content by design and is only ever read descriptor-relatively to be
copied into a sealed, root-owned tree (steward/outputs.py).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time

from journal.errors import Refused
from journal.writer import Unreserved
from steward.failure import SandboxFailure

STAGING = "staging"
STAGES = "stages"
TOMBSTONES = "tombstones"
LOCKS = "locks"
AREAS = (STAGING, STAGES, TOMBSTONES, LOCKS)
DIRECTORY_MODE = 0o700
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LEASE_POLL_SECONDS = 0.02
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def check_root_owned(fd: int, shown: str, *, private: bool = False) -> os.stat_result:
    """The status of ``fd`` after refusing a foreign owner (and, when ``private``, any group or other access)."""
    info = os.fstat(fd)
    if info.st_uid != 0:
        raise Refused(shown, f"is owned by uid {info.st_uid}; everything in the state root is owned by root")
    if private and info.st_mode & 0o077:
        raise Refused(shown, f"has mode {stat.S_IMODE(info.st_mode):04o}; it must be 0700, with no group or other access")
    return info


def open_directory_at(parent_fd: int, name: str, shown: str, *, private: bool = False) -> int:
    """A descriptor for the root-owned directory ``name`` in ``parent_fd``; a symlink or anything else is refused."""
    if "/" in name or name in ("", ".", ".."):
        raise Refused(shown, "must be one plain path segment")
    try:
        fd = os.open(name, DIRECTORY_FLAGS, dir_fd=parent_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(shown, "is a symlink or not a directory; the state root holds only real directories") from None
        raise
    try:
        check_root_owned(fd, shown, private=private)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_directory_at(parent_fd: int, name: str, shown: str, *, mode: int = DIRECTORY_MODE) -> int:
    """Create ``name`` (it must not exist) with exactly ``mode``, and return its checked descriptor."""
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
    except FileExistsError:
        raise Refused(shown, "already exists; it is created exactly once") from None
    fd = open_directory_at(parent_fd, name, shown)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Lease:
    """An exclusive hold on one dedicated UID: one session's sandboxes and cleanup at a time (S6, C4)."""

    def __init__(self, fd: int, uid: int) -> None:
        self._fd: int | None = fd
        self.uid = uid

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def exists(path: str) -> bool:
    """Whether there is a state root at ``path``; refused (exit 64) when what is there is not a directory."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise Refused(path, f"cannot be looked up as the state root ({os.strerror(error.errno)})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise Refused(path, "is not a directory; the state root must be a directory, or absent to be created")
    return True


class StateRoot:
    """The open state root and its four areas; ``close`` releases the descriptors."""

    def __init__(self, path: str, fd: int, areas: dict[str, int]) -> None:
        self.path = path
        self.fd = fd
        self._areas = areas

    @classmethod
    def open(cls, path: str, *, create: bool = True) -> "StateRoot":
        """Open the state root at the absolute ``path`` and its areas, after every check.

        With ``create`` a missing root or area is made (root-owned, 0700), but
        never its parent; without it a missing root is refused.
        """
        if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
            raise Refused(path, "the state root must be a normalized absolute path other than /")
        if create and not exists(path):
            # The state root itself, never a directory above it: a flag's typo must not build a tree.
            try:
                os.mkdir(path, DIRECTORY_MODE)
            except FileExistsError:
                pass
            except FileNotFoundError:
                raise Refused(path, f"cannot be created: its parent {os.path.dirname(path)} does not exist") from None
        try:
            fd = os.open(path, DIRECTORY_FLAGS)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(path, "is a symlink or not a directory; the state root must be a real directory") from None
            raise Refused(path, f"cannot be opened ({os.strerror(error.errno)})") from None
        areas: dict[str, int] = {}
        try:
            check_root_owned(fd, path, private=True)
            for area in AREAS:
                shown = os.path.join(path, area)
                try:
                    os.mkdir(area, DIRECTORY_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
                areas[area] = open_directory_at(fd, area, shown, private=True)
        except BaseException:
            for area_fd in areas.values():
                os.close(area_fd)
            os.close(fd)
            raise
        return cls(path, fd, areas)

    def area(self, name: str) -> int:
        """The held descriptor of one area (do not close it)."""
        return self._areas[name]

    def path_of(self, *parts: str) -> str:
        """The host path of a place in the state root: for messages, and for mount targets the journal records."""
        return os.path.join(self.path, *parts)

    def open_entry(self, area: str, name: str) -> int:
        """A checked descriptor of ``<area>/<name>``, a root-owned directory that is not a symlink."""
        return open_directory_at(self._areas[area], name, self.path_of(area, name))

    def entries(self, area: str) -> list[str]:
        """The names in one area, sorted; what each is gets checked when it is opened."""
        return sorted(os.listdir(self._areas[area]))

    def free_bytes(self) -> int:
        """What the state root's filesystem still gives root (blocks reserved for root included), for a message."""
        usage = os.statvfs(self.path)
        return usage.f_bfree * usage.f_frsize

    def space_failure(self, error: BaseException) -> str | None:
        """The sentence for a failure that means the state root has no room, or None for any other failure.

        One rule for every place that writes into the state root (the session, recovery): a full disk or
        quota (ENOSPC, EDQUOT), or a journal whose cap could not be reserved.
        """
        if isinstance(error, Unreserved):
            if error.errno in NO_SPACE:
                return (
                    f"the steward's state root {self.path} is full: a stage's journal needs {error.needed:,} bytes "
                    f"reserved on disk and {self.free_bytes():,} are free ({error.strerror}); free space there"
                )
            return (
                f"the steward's state root {self.path} cannot reserve the {error.needed:,} bytes a stage's journal "
                f"needs ({error.strerror}); put the state root on a filesystem that supports fallocate"
            )
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return (
                f"the steward's state root {self.path} is full ({error.strerror}; {self.free_bytes():,} bytes free); "
                "free space there, then run casebox stage recover --all"
            )
        return None

    def _lock_file(self, name: str) -> int:
        """The root-owned regular lock file ``locks/<name>``, opened (created when absent)."""
        shown = self.path_of(LOCKS, name)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._areas[LOCKS])
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise Refused(shown, "is a symlink; a lock is a regular file") from None
            raise
        try:
            info = check_root_owned(fd, shown)
            if not stat.S_ISREG(info.st_mode):
                raise Refused(shown, "must be a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _hold(self, names: list[tuple[str, int]], *, wait_seconds: float, stop: threading.Event | None, refusal) -> Lease:
        """The first of ``names`` (lock file, uid) that can be locked, polling until ``wait_seconds`` pass."""
        fds = []
        try:
            for name, _ in names:
                fds.append(self._lock_file(name))
            deadline = time.monotonic() + wait_seconds
            while True:
                for index, fd in enumerate(fds):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    fds.pop(index)
                    return Lease(fd, names[index][1])
                if time.monotonic() >= deadline:
                    raise refusal
                if stop is None:
                    time.sleep(_LEASE_POLL_SECONDS)
                elif stop.wait(_LEASE_POLL_SECONDS):
                    raise SandboxFailure("the steward is stopping; it starts nothing new")
        finally:
            for fd in fds:
                os.close(fd)

    def lease(self, uid: int, *, wait_seconds: float, stop: threading.Event | None = None) -> Lease:
        """Take the lease on ``uid``, waiting at most ``wait_seconds`` for another session to release it.

        ``stop``: an event that ends the wait when set (the daemon stopping): then no new sandbox starts.
        """
        refusal = Refused(
            f"sandbox uid {uid}",
            f"is leased by another session for more than {wait_seconds:g} s; one session at a time "
            "runs sandboxes as a dedicated UID (try again, or configure another sandbox_uid)",
        )
        return self._hold([(f"uid-{uid}", uid)], wait_seconds=wait_seconds, stop=stop, refusal=refusal)

    def bind(self, uids: tuple[int, ...]) -> Lease | None:
        """Bind a new session to the first uid of the pool no live session is bound to (S15: stages running at
        once get different sandbox uids while the pool has one free), held for the session's life; None when
        every uid is bound: the session then shares one, and its sandboxes take turns with the others' on that
        uid's :meth:`lease` (S6 holds per sandbox either way)."""
        for uid in uids:
            fd = self._lock_file(f"bound-{uid}")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return Lease(fd, uid)
        return None

    def close(self) -> None:
        for fd in self._areas.values():
            os.close(fd)
        self._areas = {}
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "StateRoot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
