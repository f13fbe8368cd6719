"""The exit boundary for capabilities (DESIGN F4, seed 000 §3).

Every directory handed into a sandbox (the verifier tree, the find-links
index, any extra capability) passes through :func:`open_capability` first,
and the sandbox gets the descriptor it returns, never the path again. A
directory is refused, with exit 64 naming the path, when

- a segment of its own path, or of any entry below it, is ``.git`` compared
  without regard to case (on CI, ``actions/checkout`` leaves a token in
  ``.git/config``);
- an entry below it is named like the state directory (the state root's last
  segment), compared without regard to case;
- it is the state root, lies inside it, or holds it;
- it holds a symlink whose target leaves the directory.

The directory's own path is not checked against the state directory's name:
a checkout at ``/home/runner/work/casebox/casebox`` is not the state root,
and whether a path is the state root or inside it is decided exactly, by
the identity (device, inode) of the state root and of each directory above
and below the one handed in.

The walk is descriptor-relative: each directory is opened with ``openat``
and ``O_NOFOLLOW`` from its parent's descriptor, so no symlink is ever
followed, and it is bounded by :data:`MAX_ENTRIES` and :data:`MAX_DEPTH`.
The judgement on each name and each link target is a pure function
(:func:`segment_rule`, :func:`link_leaves`).
"""

from __future__ import annotations

import os
import stat

from journal.errors import Refused

# A verifier tree or a find-links index holds a few hundred entries; these
# bounds stop a walk handed "/" or a home directory long before it costs much.
MAX_ENTRIES = 50_000
MAX_DEPTH = 32
# How many parents the state-root check climbs at most; a path is at most
# 4,096 bytes, so it has at most 2,048 segments.
MAX_PARENTS = 2_048

GIT = ".git"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _same_name(name: str, reserved: str) -> bool:
    return bool(reserved) and name.casefold() == reserved.casefold()


def segment_rule(name: str, state_name: str) -> str | None:
    """The rule an entry named ``name`` below a capability breaks, or None."""
    if _same_name(name, GIT):
        return "is a .git segment (compared without regard to case); a repository's .git never enters a sandbox"
    if _same_name(name, state_name):
        return f"is named like the casebox state directory {state_name!r} (compared without regard to case)"
    return None


def link_leaves(target: str, depth: int) -> bool:
    """Whether a symlink ``depth`` directories below the capability's root, pointing at ``target``, can leave it.

    A target stays inside when it is relative and made of at most ``depth``
    leading ``..`` segments followed by names, with no ``..`` after a name.
    Every directory the walk stands in is a real directory, so each leading
    ``..`` climbs exactly one level; a ``..`` after a name could climb out of
    wherever a symlinked name led, so it is refused. Every other symlink in
    the capability is held to the same rule, so a chain of them stays inside
    too. An absolute target always leaves: inside the sandbox the directory
    is mounted somewhere else.
    """
    if not target or target.startswith("/"):
        return True
    climbs = 0
    named = False
    for segment in target.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if named:
                return True
            climbs += 1
        else:
            named = True
    return climbs > depth


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def _state_identity(state_root: str) -> tuple[int, int] | None:
    try:
        return _identity(os.stat(state_root))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise Refused(state_root, f"the state root cannot be examined ({os.strerror(error.errno)})") from None


def _open_root(path: str) -> int:
    try:
        return os.open(os.path.realpath(path), _DIRECTORY)
    except OSError as error:
        raise Refused(path, f"cannot be opened as a directory ({os.strerror(error.errno)})") from None


def _check_location(fd: int, shown: str, state: tuple[int, int] | None) -> None:
    """The directory's own path has no .git segment, and neither it nor any parent is the state root."""
    located = os.readlink(f"/proc/self/fd/{fd}")
    for segment in located.split("/"):
        if _same_name(segment, GIT):
            raise Refused(shown, f"lies inside a .git directory ({located}); a repository's .git never enters a sandbox")
    if state is None:
        return
    current = os.dup(fd)
    try:
        for climbed in range(MAX_PARENTS):
            here = _identity(os.fstat(current))
            if here == state:
                raise Refused(shown, "lies inside the casebox state root" if climbed else "is the casebox state root")
            parent = os.open("..", _DIRECTORY, dir_fd=current)
            os.close(current)
            current = parent
            if _identity(os.fstat(current)) == here:
                return
        raise Refused(shown, f"is more than {MAX_PARENTS} directories deep")
    finally:
        os.close(current)


class _Walk:
    def __init__(self, shown: str, state_name: str, state: tuple[int, int] | None) -> None:
        self.shown = shown
        self.state_name = state_name
        self.state = state
        self.entries = 0

    def refuse(self, relative: str, rule: str) -> Refused:
        return Refused(f"{self.shown}/{relative}" if relative else self.shown, rule)

    def directory(self, fd: int, relative: str, depth: int) -> None:
        if self.state is not None and _identity(os.fstat(fd)) == self.state:
            raise self.refuse(relative, "is the casebox state root")
        entries = []
        with os.scandir(fd) as listing:
            for entry in listing:
                self.entries += 1
                if self.entries > MAX_ENTRIES:
                    raise self.refuse("", f"holds more than {MAX_ENTRIES} entries, the bound of a capability walk")
                entries.append(entry)
        for entry in sorted(entries, key=lambda entry: entry.name):
            where = f"{relative}/{entry.name}" if relative else entry.name
            rule = segment_rule(entry.name, self.state_name)
            if rule is not None:
                raise self.refuse(where, rule)
            if entry.is_symlink():
                target = os.readlink(entry.name, dir_fd=fd)
                if link_leaves(target, depth):
                    raise self.refuse(where, f"is a symlink to {target}, which leaves the directory")
            elif entry.is_dir(follow_symlinks=False):
                if depth + 1 > MAX_DEPTH:
                    raise self.refuse(where, f"is more than {MAX_DEPTH} directories deep, the bound of a capability walk")
                child = os.open(entry.name, _DIRECTORY, dir_fd=fd)
                try:
                    self.directory(child, where, depth + 1)
                finally:
                    os.close(child)


def check_descriptor(fd: int, shown: str, *, state_root: str) -> None:
    """F4 on an open directory descriptor; ``shown`` names it in a refusal.

    The same checks as :func:`open_capability`, for a directory someone else
    opened: a steward session applies it to every descriptor its client hands
    in (docs/steward-protocol.md).
    """
    state_root = os.path.normpath(state_root)
    state = _state_identity(state_root)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise Refused(shown, "must be a directory")
        _check_location(fd, shown, state)
        _Walk(shown.rstrip("/") or "/", os.path.basename(state_root), state).directory(fd, "", 0)
    except OSError as error:
        raise Refused(shown, f"cannot be walked ({os.strerror(error.errno)})") from None


def open_capability(path: str, *, state_root: str) -> int:
    """A read-only descriptor of the directory at ``path``, checked against F4; the caller closes it.

    Hand the sandbox this descriptor, never ``path``: the descriptor is the
    directory that was checked.
    """
    fd = _open_root(path)
    try:
        check_descriptor(fd, path, state_root=state_root)
    except BaseException:
        os.close(fd)
        raise
    return fd
