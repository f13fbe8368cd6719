"""S2: stage 1 meets its starter and receives the sandbox's setup.

The single-use nonce comes on stdin, never argv: the starter writes it only
after it has recorded this process (J1), so reading it is also this
process's release. The launcher then connects to the starter's socket,
checks SO_PEERCRED (uid 0 and its own parent's pid), and proves itself with
HELLO carrying the nonce; the starter checks the launcher's credentials the
same way on its side. Setup follows as leaves, each ACKed, in a fixed order:
SETUP, IMPORT_DIR, INTERPRETER, then one CAPABILITY per read-only directory,
one OUTPUT per writable one and one EXECUTABLE per file to mount over a file
a capability holds, then SETUP_END. Descriptors arrive only with
the message that names them.
"""

import _socket
import os

from launcher import seqpacket
from launcher.protocol import DIGEST_BYTES, LAUNCHER, NONCE_BYTES, VERSION, Channel, ProtocolError

_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_NAME_CHARS = _NAME_START | frozenset("_-")


class Setup:
    """What stage 1 received: the SETUP fields and the descriptors that came with the leaves."""

    def __init__(self, fields: dict) -> None:
        self.fields = fields
        self.import_dir = -1
        self.interpreter = -1
        self.interpreter_path = ""
        self.op_cgroup = -1
        self.capabilities: list[tuple[int, str]] = []
        self.outputs: list[tuple[int, str]] = []
        self.executables: list[tuple[int, str]] = []


def read_nonce(fd: int = 0) -> bytes:
    """Exactly NONCE_BYTES from ``fd``, then end of file; stdin becomes /dev/null."""
    data = b""
    while True:
        chunk = os.read(fd, NONCE_BYTES + 1 - len(data))
        if not chunk:
            break
        data += chunk
        if len(data) > NONCE_BYTES:
            break
    if len(data) != NONCE_BYTES:
        raise ProtocolError(f"the nonce on stdin is {len(data)} bytes, not {NONCE_BYTES}")
    null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, fd)
    os.close(null)
    return data


def connect(path: str) -> Channel:
    """Connect to the starter and authenticate it: uid 0 and the pid of this process's parent."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        seqpacket.force_send_buffer(sock)
        sock.connect(path)
        pid, uid, _ = seqpacket.peer_credentials(sock)
        if uid != 0 or pid != os.getppid():
            raise ProtocolError(f"the rendezvous peer is pid {pid} uid {uid}, not the starter (pid {os.getppid()}, uid 0)")
    except BaseException:
        sock.close()
        raise
    return Channel(sock, LAUNCHER)


def _is_named(target: str, directory: str) -> bool:
    """``target`` is DIRECTORY/NAME with NAME lowercase letters, digits, '_' and '-' (at most 64, first alphanumeric)."""
    name = target[len(directory):] if target.startswith(directory) else ""
    return 0 < len(name) <= 64 and name[0] in _NAME_START and all(char in _NAME_CHARS for char in name)


# The first segments of the sandbox's own tree: a capability mounted at a path of its own may not take one.
SANDBOX_ROOTS = ("bin", "cap", "dev", "etc", "lib", "lib32", "lib64", "libx32", "out", "proc", "sbin", "tmp", "usr", "work")
MAX_MOUNT_SEGMENTS = 16
MAX_MOUNT_BYTES = 512


def is_mount_target(target: str) -> bool:
    """A path of its own where a capability is mounted as it is on the host (a case runtime's prefix, which
    toolcache builds have compiled in): absolute and normalized, printable ASCII without spaces or quotes, at
    most 16 segments, and not inside the sandbox's own tree (/usr, /cap, /out, /proc, ...)."""
    return _is_normalized(target) and target.split("/")[1] not in SANDBOX_ROOTS and not target.startswith("/.")


def _is_normalized(target: str) -> bool:
    """Absolute and normalized, printable ASCII without spaces or quotes, at most 16 segments."""
    segments = target.split("/")[1:]
    return (
        target.startswith("/") and 0 < len(segments) <= MAX_MOUNT_SEGMENTS and len(target) <= MAX_MOUNT_BYTES
        and all(segment not in ("", ".", "..") for segment in segments)
        and all(char.isascii() and char.isprintable() and char not in " \"'\\" for char in target)
    )


def is_capability_target(target: str) -> bool:
    """Where a read-only CAPABILITY may go: /usr, /cap/NAME, or a path of its own (:func:`is_mount_target`);
    never /etc (S9: no sandbox gets host configuration)."""
    return target == "/usr" or _is_named(target, "/cap/") or is_mount_target(target)


def is_executable_target(target: str, trees: list[str]) -> bool:
    """Where an EXECUTABLE may go: over a file inside /usr or a path of its own that a CAPABILITY already
    holds (a case runtime's interpreter, at its own path), never at a tree's top or under /cap."""
    return _is_normalized(target) and any(
        target.startswith(tree + "/") for tree in trees if tree == "/usr" or is_mount_target(tree)
    )


def is_output_target(target: str) -> bool:
    """Where a writable OUTPUT may go: /out/NAME."""
    return _is_named(target, "/out/")


def receive_setup(channel: Channel, nonce: bytes) -> Setup:
    channel.leaf("HELLO", version=VERSION, nonce=nonce)
    message = channel.receive("SETUP")
    if len(message.fields["digest"]) != DIGEST_BYTES:
        raise ProtocolError("SETUP digest is not 32 bytes")
    if message.fields["uid"] == 0 or message.fields["gid"] == 0:
        raise ProtocolError("SETUP names root as the sandbox identity")
    setup = Setup(message.fields)
    channel.ack(message)
    message = channel.receive("IMPORT_DIR")
    setup.import_dir = message.fds[0]
    channel.ack(message)
    message = channel.receive("INTERPRETER")
    setup.interpreter, setup.interpreter_path = message.fds[0], message.fields["path"]
    channel.ack(message)
    message = channel.receive("OP_CGROUP")
    setup.op_cgroup = message.fds[0]
    channel.ack(message)
    while True:
        message = channel.receive("CAPABILITY", "OUTPUT", "EXECUTABLE", "SETUP_END")
        if message.name == "SETUP_END":
            channel.ack(message)
            return setup
        target = message.fields["target"]
        known = {target for _, target in setup.capabilities + setup.outputs + setup.executables}
        if message.name == "CAPABILITY":
            valid, place, trees = is_capability_target(target), "/usr, a new /cap/NAME or a path of its own", setup.capabilities
        elif message.name == "EXECUTABLE":
            holders = [tree for _, tree in setup.capabilities]
            valid, place, trees = is_executable_target(target, holders), "a new file inside /usr or a path of its own", setup.executables
        else:
            valid, place, trees = is_output_target(target), "a new /out/NAME", setup.outputs
        if not valid or target in known:
            os.close(message.fds[0])
            raise ProtocolError(f"{message.name.lower()} target {target!r} is not {place}")
        trees.append((message.fds[0], target))
        channel.ack(message)
