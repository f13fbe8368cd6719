"""Steward-owned outputs: a capped tmpfs one sandbox fills, then a sealed, root-owned copy with its inventory.

An output (the extraction target, the resolver's wheel cache) lives while it
is filled as a tmpfs mounted in the steward's mount namespace at
``stages/<id>/live/<name>``: size- and inode-capped, nosuid, nodev, noexec,
owned by the dedicated UID, mode 0700. Its mount is journaled like any other
(MOUNT_INTENT before the effect, MOUNT_DONE after, J1), so REMOVE_AND_PROVE
knows to unmount it after a crash. A sandbox gets it writable at
``/out/<name>`` (launcher/mounts.py).

Sealing happens after every sandbox that had it is closed. The tree is read
descriptor-relatively, never following a symlink, and copied into
``stages/<id>/outputs/<name>``: directories 0555, files 0444, owned by root,
each file hashed as it is written. The copy is made durable by one
``syncfs`` of the state root's filesystem once every file is written, not by
an ``fsync`` per file and directory (which was nine tenths of a seal's cost:
one journal commit each). Anything but a regular file or a directory
(a symlink, a FIFO, a socket, a device) refuses the seal. The inventory is
canonical JSON; its SHA-256 is the output's inventory digest, and the
document is kept under that digest (steward/documents.py). The tmpfs is then
unmounted (UNMOUNT_INTENT, UNMOUNT_DONE). The sealed copy can be handed to
later sandboxes read-only, and as a read-only descriptor to the client.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from journal.errors import Refused
from launcher import syscalls as sc

LIVE = "live"
OUTPUTS = "outputs"
INVENTORY_VERSION = "casebox.output-inventory.v1"
MAX_ENTRIES = 8_000
MAX_DEPTH = 32
FILE_MODE = 0o444
DIRECTORY_MODE = 0o555
_UMOUNT_NOFOLLOW = 0x8
_CHUNK = 1 << 20
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def mount_ops(name: str) -> tuple[str, str]:
    """The journal op ids of an output's mount and unmount (no dot: they belong to no sandbox)."""
    return f"output-{name}-mount", f"output-{name}-unmount"


def mount_live(live_fd: int, name: str, *, target: str, uid: int, gid: int, max_bytes: int, max_inodes: int, ledger) -> None:
    """Create ``live/<name>`` and mount the output's tmpfs on it; the intent is durable first (J1)."""
    os.mkdir(name, 0o700, dir_fd=live_fd)
    point = os.open(name, _DIRECTORY, dir_fd=live_fd)
    op_id = mount_ops(name)[0]
    try:
        ledger.mount_intent(op_id, target, "tmpfs")
        sc.mount(
            "casebox-output", f"/proc/self/fd/{point}", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC,
            f"size={max_bytes},nr_inodes={max_inodes},mode=0700,uid={uid},gid={gid}",
        )
    finally:
        os.close(point)
    ledger.mount_done(op_id, target, "tmpfs")


def open_live(live_fd: int, name: str) -> int:
    """A descriptor of the mounted output's root (the tmpfs, not the directory under it)."""
    fd = os.open(name, _DIRECTORY, dir_fd=live_fd)
    if os.fstat(fd).st_dev == os.fstat(live_fd).st_dev:
        os.close(fd)
        raise Refused(name, "is not mounted; the output was never filled or was already unmounted")
    return fd


def unmount_live(live_fd: int, name: str, *, target: str, ledger) -> None:
    """Unmount the output's tmpfs (intent first) and remove its mount point."""
    op_id = mount_ops(name)[1]
    ledger.unmount_intent(op_id, target, "tmpfs")
    sc.umount2(f"/proc/self/fd/{live_fd}/{name}", _UMOUNT_NOFOLLOW)
    ledger.unmount_done(op_id, target, "tmpfs")
    os.rmdir(name, dir_fd=live_fd)


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file or directory"


class _Copy:
    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.entries: list[dict] = []
        self.files = 0
        self.directories = 0
        self.bytes = 0

    def refuse(self, relative: str, rule: str) -> Refused:
        return Refused(f"{self.shown}/{relative}", rule)

    def directory(self, source: int, target: int, relative: str, depth: int) -> None:
        for name in sorted(os.listdir(source)):
            path = f"{relative}/{name}" if relative else name
            if not name.isprintable() or any(0xD800 <= ord(char) <= 0xDFFF for char in name):
                raise self.refuse(repr(name)[1:-1], "is not a printable UTF-8 name")
            if len(self.entries) >= MAX_ENTRIES:
                raise self.refuse(path, f"is past the {MAX_ENTRIES}-entry cap of a sealed output")
            info = os.stat(name, dir_fd=source, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if depth >= MAX_DEPTH:
                    raise self.refuse(path, f"is more than {MAX_DEPTH} directories deep")
                self._subdirectory(source, target, name, path, depth)
            elif stat.S_ISREG(info.st_mode):
                self._file(source, target, name, path)
            else:
                raise self.refuse(path, f"is {_kind(info.st_mode)}; a sealed output holds only regular files and directories")

    def _subdirectory(self, source: int, target: int, name: str, path: str, depth: int) -> None:
        os.mkdir(name, 0o700, dir_fd=target)
        child_source = os.open(name, _DIRECTORY, dir_fd=source)
        try:
            child_target = os.open(name, _DIRECTORY, dir_fd=target)
            try:
                self.entries.append({"path": path, "type": "directory"})
                self.directories += 1
                self.directory(child_source, child_target, path, depth + 1)
                os.fchmod(child_target, DIRECTORY_MODE)
            finally:
                os.close(child_target)
        finally:
            os.close(child_source)

    def _file(self, source: int, target: int, name: str, path: str) -> None:
        reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=source)
        try:
            if not stat.S_ISREG(os.fstat(reader).st_mode):
                raise self.refuse(path, "changed while it was sealed")
            writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=target)
            try:
                digest, size = hashlib.sha256(), 0
                while chunk := os.read(reader, _CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(writer, view):]
                os.fchmod(writer, FILE_MODE)
            finally:
                os.close(writer)
        finally:
            os.close(reader)
        self.entries.append({"path": path, "type": "file", "size": size, "sha256": digest.hexdigest()})
        self.files += 1
        self.bytes += size


def seal_copy(source_fd: int, outputs_fd: int, name: str, *, shown: str) -> tuple[dict, int, int, int]:
    """Copy the tree at ``source_fd`` into ``outputs/<name>``, sealed; (inventory, files, directories, bytes).

    On a refusal the partial copy is left in the stage (it is root-owned and
    will be sealed into the tombstone with everything else); the output is
    not sealed and cannot be used.
    """
    os.mkdir(name, 0o700, dir_fd=outputs_fd)
    target = os.open(name, _DIRECTORY, dir_fd=outputs_fd)
    try:
        copy = _Copy(shown)
        copy.directory(source_fd, target, "", 0)
        os.fchmod(target, DIRECTORY_MODE)
        # Durable before the caller records the seal: every file, directory and the new entry in outputs/.
        sc.syncfs(target)
    finally:
        os.close(target)
    entries = sorted(copy.entries, key=lambda entry: entry["path"].encode("utf-8"))
    inventory = {"version": INVENTORY_VERSION, "name": name, "entries": entries}
    return inventory, copy.files, copy.directories, copy.bytes


def open_sealed(outputs_fd: int, name: str) -> int:
    """A read-only descriptor of a sealed output."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=outputs_fd)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise Refused(name, "is not a sealed output of this session") from None
        raise
