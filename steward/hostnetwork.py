"""The host's network for one sandbox: which network its pid 1 is in, and the /etc it needs to use it (S9).

Every sandbox gets a network namespace of its own with only ``lo``, except
the resolver and fetch sandboxes of a network index (docs/pipeline.md),
which share the steward's own network namespace. The starter never takes
the launcher's word for which one it got: :func:`network_of` compares the
namespace of pid 1 with its own through the host's ``/proc``.

Names in such a sandbox resolve through the host's DNS servers, so the
starter gives it an ``/etc`` of exactly three files, made in the staging
directory (``net-<sandbox>``, root-owned, files 0444) and mounted read-only
at ``/etc``: a byte copy of the host's ``/etc/resolv.conf``, a ``hosts``
naming only localhost, and an ``nsswitch.conf`` saying ``hosts: files dns``.
Nothing else of the host's ``/etc`` enters (no ``.netrc``, no ``pip.conf``,
no CA store: HTTPS is verified against the installer's own bundle).
"""

from __future__ import annotations

import os

from steward.api import HOST_NETWORK, LOOPBACK

PREFIX = "net-"
TARGET = "/etc"
RESOLV_CONF = "/etc/resolv.conf"
RESOLV_MAX_BYTES = 65_536
HOSTS = b"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
NSSWITCH = b"hosts: files dns\n"
FILES = ("resolv.conf", "hosts", "nsswitch.conf")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def network_of(pid: int) -> str:
    """``host`` when process ``pid`` is in this process's network namespace, else ``loopback``."""
    return HOST_NETWORK if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino else LOOPBACK


def _host_resolv() -> bytes:
    try:
        with open(RESOLV_CONF, "rb") as file:
            return file.read(RESOLV_MAX_BYTES)
    except FileNotFoundError:
        return b""


def make_etc(staging_fd: int, name: str) -> int:
    """Create ``name`` in the staging directory holding the three files; a read-only descriptor of it."""
    os.mkdir(name, 0o700, dir_fd=staging_fd)
    fd = os.open(name, _DIRECTORY, dir_fd=staging_fd)
    try:
        for file, data in zip(FILES, (_host_resolv(), HOSTS, NSSWITCH)):
            written = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444, dir_fd=fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(written, view):]
            finally:
                os.close(written)
        os.fchmod(fd, 0o755)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_etc(staging_fd: int, name: str) -> bool:
    """Remove ``name`` and its files from the staging directory; False when it was not there."""
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=staging_fd)
    except FileNotFoundError:
        return False
    try:
        for file in os.listdir(fd):
            os.unlink(file, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=staging_fd)
    return True
