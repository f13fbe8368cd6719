"""S4: the sandbox's filesystem, built as root inside the new mount namespace before READY.

Every mount is announced to the starter first (MOUNT_INTENT) and made only
after its ACK, which the starter sends once the intent is durable (J1); its
completion is announced the same way (MOUNT_DONE), as is the detach of the
old root.

Capabilities arrive as descriptors. Stage 1, still in the host mount
namespace (a tree can only be cloned from the caller's own namespace), turns
each into a detached, recursively read-only, nosuid, nodev copy with
open_tree(OPEN_TREE_CLONE|AT_RECURSIVE) and mount_setattr(AT_RECURSIVE);
here pid 1 attaches each copy with move_mount. An output (a steward-owned
directory the op fills) is cloned the same way but stays writable, and is
nosuid, nodev and noexec. No path is ever looked up: the starter opened each
directory, and only descriptors travel.
"""

import os
import stat

from launcher import syscalls as sc

CAPABILITY_ATTRIBUTES = sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV
OUTPUT_ATTRIBUTES = sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV | sc.MOUNT_ATTR_NOEXEC
# The host path the new root tmpfs is mounted over, in this private namespace only.
SCRATCH = "/tmp"
DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9))
USR_LINKS = ("bin", "sbin", "lib", "lib64")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))


def clone_tree(directory_fd: int, attributes: int) -> int:
    """A detached copy of the tree at ``directory_fd`` with ``attributes`` set recursively (stage 1, host namespace)."""
    tree = sc.open_tree(
        directory_fd, "", sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC | sc.AT_RECURSIVE | sc.AT_EMPTY_PATH
    )
    try:
        sc.mount_setattr(tree, "", sc.AT_EMPTY_PATH | sc.AT_RECURSIVE, attributes)
    except BaseException:
        os.close(tree)
        raise
    return tree


def _tmpfs(target: str, size: int, mode: int, flags: int, inodes: int) -> None:
    sc.mount("casebox", target, "tmpfs", flags, f"size={size},nr_inodes={inodes},mode={mode:o}")


class Builder:
    """Builds the new root under the current directory, announcing each mount through ``journal``."""

    def __init__(self, journal) -> None:
        self.journal = journal

    def mount(self, target: str, kind: str, make) -> None:
        self.journal("MOUNT_INTENT", target, kind)
        make()
        self.journal("MOUNT_DONE", target, kind)

    def root(self) -> None:
        """Private propagation, then a small tmpfs as the new root; the cwd moves onto it."""
        sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
        self.mount("/", "tmpfs", lambda: _tmpfs(SCRATCH, 1 << 20, 0o755, sc.MS_NOSUID | sc.MS_NODEV, 256))
        os.chdir(SCRATCH)
        for directory in ("usr", "cap", "out", "proc", "dev", "tmp", "work"):
            os.mkdir(directory, 0o755)
        for link in USR_LINKS:
            os.symlink(f"usr/{link}", link)

    def attach(self, tree: int, target: str) -> None:
        """Attach one detached capability or output tree; its MOUNT_INTENT was made before stage 1 cloned it."""
        relative = target.lstrip("/")
        if stat.S_ISREG(os.fstat(tree).st_mode):
            # An executable, attached after every tree: over the file at its path in one of them (the case
            # runtime's interpreter), so the sandbox runs the execute-only copy wherever it names that path.
            if not stat.S_ISREG(os.stat(relative, follow_symlinks=False).st_mode):
                raise OSError(f"{target} is not a regular file of the trees attached before it")
            # A clone of a shared mount is its peer (a systemd host's / and /usr are shared): a mount on top of
            # a file in it would propagate to the host's own. The new root's trees go private first.
            sc.mount(None, ".", None, sc.MS_REC | sc.MS_PRIVATE)
        elif target.startswith(("/cap/", "/out/")) or target == "/etc":
            os.mkdir(relative, 0o755)
        elif target != "/usr":
            # A capability at a path of its own (a case runtime's prefix): its parents are made on the root tmpfs.
            os.makedirs(relative, 0o755)
        sc.move_mount(tree, "", sc.AT_FDCWD, relative, sc.MOVE_MOUNT_F_EMPTY_PATH)
        os.close(tree)
        self.journal("MOUNT_DONE", target, "tree")

    def proc(self) -> bool:
        """A fresh /proc for the new pid namespace; True when hidepid=2 was accepted."""
        hidden = []

        def make() -> None:
            flags = sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC
            try:
                sc.mount("proc", "proc", "proc", flags, "hidepid=2")
                hidden.append(True)
            except OSError as error:
                if error.errno != 22:
                    raise
                sc.mount("proc", "proc", "proc", flags, None)

        self.mount("/proc", "proc", make)
        return bool(hidden)

    def dev(self) -> None:
        """A read-only tmpfs holding only null, zero, full, random and urandom."""

        def make() -> None:
            _tmpfs("dev", 64 << 10, 0o755, sc.MS_NOSUID | sc.MS_NOEXEC, 64)
            for name, major, minor in DEVICES:
                path = f"dev/{name}"
                os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
                os.chmod(path, 0o666)
            for name, target in DEV_LINKS:
                os.symlink(target, f"dev/{name}")
            sc.mount_setattr(sc.AT_FDCWD, "dev", 0, sc.MOUNT_ATTR_RDONLY)

        self.mount("/dev", "tmpfs", make)

    def scratch(self, target: str, size: int, uid: int, gid: int) -> None:
        """A size- and inode-capped tmpfs the dedicated UID owns (/tmp, /work)."""
        relative = target.lstrip("/")

        def make() -> None:
            _tmpfs(relative, size, 0o700, sc.MS_NOSUID | sc.MS_NODEV, max(1024, size // 4096))
            os.chown(relative, uid, gid)

        self.mount(target, "tmpfs", make)

    def pivot(self) -> None:
        """pivot_root onto the new root, detach the old one, and make the root tmpfs read-only."""
        sc.pivot_root(".", ".")
        self.journal("UNMOUNT_INTENT", "/.old-root", "tree")
        sc.umount2(".", sc.MNT_DETACH)
        self.journal("UNMOUNT_DONE", "/.old-root", "tree")
        os.chdir("/")
        sc.mount_setattr(sc.AT_FDCWD, "/", 0, sc.MOUNT_ATTR_RDONLY)
