"""The launcher protocol: closed, sequenced, canonical messages over one SOCK_SEQPACKET socket.

docs/launcher-protocol.md is the specification; this module is its only
encoder and decoder, used by both the launcher and its starter. A message is
one datagram:

    u32 length | u32 seq | u16 type | u16 reserved=0 | fields

``length`` counts every byte after itself. Fields follow the message's schema
in order: ``u8`` (a bool is 0 or 1), ``u32``, ``u64``, ``bytes`` and ``str``
(u32 length, then the bytes; a str is UTF-8 without NUL), ``strs`` (u32 count,
then each str) and ``env`` (u32 count, then name/value str pairs, names
strictly ascending). Integers are big-endian. Every value has exactly one
encoding, so the decoder refuses anything the encoder would not write.

Each direction numbers its messages from 0. The receiver refuses a message
whose number is not the next one, an unknown type, a type the peer may not
send, a wrong descriptor count, trailing bytes and truncation: any of these
ends the sandbox. Every message but ACK and ABORT is a leaf that the receiver
acknowledges with ACK, naming the leaf's number, before the sender goes on.

The launcher side runs with ``python -I -S`` and imports only C modules here
(and launcher/seqpacket.py, the transport it shares with the steward protocol).
"""

import _struct

from launcher import seqpacket

LAUNCHER, STARTER = "launcher", "starter"
VERSION = "casebox.launcher.v2"
NONCE_BYTES = 32
DIGEST_BYTES = 32
MAX_MESSAGE = 1 << 20
MAX_OUTPUT_CAP = 256 << 10
MAX_FDS = 1

_HEADER = _struct.Struct(">IIHH")
_U32 = _struct.Struct(">I")
_U64 = _struct.Struct(">Q")

# name: (type code, sender, descriptors carried, fields)
MESSAGES = {
    "ACK": (1, None, 0, (("acked", "u32"),)),
    "ABORT": (2, None, 0, (("reason", "str"),)),
    "HELLO": (10, LAUNCHER, 0, (("version", "str"), ("nonce", "bytes"))),
    "MOUNT_INTENT": (11, LAUNCHER, 0, (("target", "str"), ("kind", "str"))),
    "MOUNT_DONE": (12, LAUNCHER, 0, (("target", "str"), ("kind", "str"))),
    "UNMOUNT_INTENT": (13, LAUNCHER, 0, (("target", "str"), ("kind", "str"))),
    "UNMOUNT_DONE": (14, LAUNCHER, 0, (("target", "str"), ("kind", "str"))),
    "CHILD": (15, LAUNCHER, 0, (("pid", "u32"),)),
    "READY": (
        16,
        LAUNCHER,
        0,
        (
            ("uids", "strs"),
            ("gids", "strs"),
            ("groups", "str"),
            ("setuid0_errno", "u32"),
            ("securebits", "u32"),
            ("cap_inh", "u64"),
            ("cap_prm", "u64"),
            ("cap_eff", "u64"),
            ("cap_bnd", "u64"),
            ("cap_amb", "u64"),
            ("no_new_privs", "u8"),
            ("dumpable", "u8"),
            ("seccomp", "u32"),
            ("seccomp_filters", "u32"),
            ("filter_digest", "bytes"),
            ("proc_hidepid", "u8"),
        ),
    ),
    "OP_CHILD": (17, LAUNCHER, 0, (("pid", "u32"),)),
    "OP_RESULT": (
        18,
        LAUNCHER,
        0,
        (
            ("wait_status", "u32"),
            ("descendants_reaped", "u32"),
            ("wall_ms", "u64"),
            ("cpu_ms", "u64"),
            ("max_rss_kib", "u64"),
            ("limit", "str"),
            ("stdout", "bytes"),
            ("stderr", "bytes"),
            ("stdout_truncated", "u8"),
            ("stderr_truncated", "u8"),
        ),
    ),
    "OP_NOT_STARTED": (
        19,
        LAUNCHER,
        0,
        (("step", "str"), ("errno", "u32"), ("wait_status", "u32"), ("descendants_reaped", "u32")),
    ),
    "SETUP": (
        30,
        STARTER,
        0,
        (
            ("digest", "bytes"),
            ("uid", "u32"),
            ("gid", "u32"),
            ("hostname", "str"),
            ("tmp_bytes", "u64"),
            ("work_bytes", "u64"),
            ("rlimit_nproc", "u64"),
            ("rlimit_nofile", "u64"),
            ("rlimit_fsize", "u64"),
            ("seccomp_program", "bytes"),
        ),
    ),
    "IMPORT_DIR": (31, STARTER, 1, ()),
    "INTERPRETER": (32, STARTER, 1, (("path", "str"),)),
    "CAPABILITY": (33, STARTER, 1, (("target", "str"),)),
    "SETUP_END": (34, STARTER, 0, ()),
    "OP_CGROUP": (38, STARTER, 1, ()),
    "OUTPUT": (37, STARTER, 1, (("target", "str"),)),
    "EXECUTABLE": (39, STARTER, 1, (("target", "str"),)),
    "OP": (
        35,
        STARTER,
        0,
        (
            ("argv", "strs"),
            ("env", "env"),
            ("cwd", "str"),
            ("timeout_ms", "u64"),
            ("stdout_cap", "u64"),
            ("stderr_cap", "u64"),
        ),
    ),
    "SHUTDOWN": (36, STARTER, 0, ()),
}
_BY_CODE = {code: (name, sender, fds, fields) for name, (code, sender, fds, fields) in MESSAGES.items()}


class Message:
    """One received message: its name, number, fields and the descriptors it carried."""

    __slots__ = ("name", "seq", "fields", "fds")

    def __init__(self, name: str, seq: int, fields: dict, fds: list[int]) -> None:
        self.name, self.seq, self.fields, self.fds = name, seq, fields, fds


class ProtocolError(Exception):
    """The peer broke the protocol, or the channel failed; the sandbox ends."""


class Aborted(ProtocolError):
    """The peer sent ABORT with a reason."""


def _encode_str(value: str) -> bytes:
    if type(value) is not str or "\x00" in value:
        raise ProtocolError("a str field must be a string without NUL")
    data = value.encode("utf-8")
    return _U32.pack(len(data)) + data


def _encode_field(kind: str, value) -> bytes:
    if kind == "u8":
        if type(value) is not bool:
            raise ProtocolError("a u8 field must be a bool")
        return b"\x01" if value else b"\x00"
    if kind in ("u32", "u64"):
        if type(value) is not int:
            raise ProtocolError(f"a {kind} field must be an integer")
        return (_U32 if kind == "u32" else _U64).pack(value)
    if kind == "bytes":
        if type(value) is not bytes:
            raise ProtocolError("a bytes field must be bytes")
        return _U32.pack(len(value)) + value
    if kind == "str":
        return _encode_str(value)
    if kind == "strs":
        return _U32.pack(len(value)) + b"".join(_encode_str(item) for item in value)
    if kind == "env":
        names = [name for name, _ in value]
        encoded = [name.encode("utf-8") for name in names]
        if encoded != sorted(set(encoded)):
            raise ProtocolError("env names must be unique and sorted")
        return _U32.pack(len(value)) + b"".join(_encode_str(name) + _encode_str(item) for name, item in value)
    raise ProtocolError(f"unknown field kind {kind}")


def encode(name: str, seq: int, fields: dict) -> bytes:
    """The canonical datagram for message ``name`` numbered ``seq``."""
    code, _, _, schema = MESSAGES[name]
    if set(fields) != {field for field, _ in schema}:
        raise ProtocolError(f"{name} needs exactly the fields {[field for field, _ in schema]}")
    body = b"".join(_encode_field(kind, fields[field]) for field, kind in schema)
    data = _HEADER.pack(8 + len(body), seq, code, 0) + body
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"{name} is larger than {MAX_MESSAGE} bytes")
    return data


class _Reader:
    def __init__(self, data: bytes, offset: int) -> None:
        self.data = data
        self.offset = offset

    def take(self, count: int) -> bytes:
        end = self.offset + count
        if end > len(self.data):
            raise ProtocolError("a field runs past the end of the message")
        chunk = self.data[self.offset:end]
        self.offset = end
        return chunk

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def text(self) -> str:
        raw = self.take(self.u32())
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("a str field is not UTF-8") from None
        if "\x00" in value:
            raise ProtocolError("a str field holds NUL")
        return value

    def field(self, kind: str):
        if kind == "u8":
            byte = self.take(1)
            if byte not in (b"\x00", b"\x01"):
                raise ProtocolError("a bool is neither 0 nor 1")
            return byte == b"\x01"
        if kind == "u32":
            return self.u32()
        if kind == "u64":
            return _U64.unpack(self.take(8))[0]
        if kind == "bytes":
            return self.take(self.u32())
        if kind == "str":
            return self.text()
        if kind == "strs":
            return [self.text() for _ in range(self.u32())]
        pairs = [(self.text(), self.text()) for _ in range(self.u32())]
        names = [name.encode("utf-8") for name, _ in pairs]
        if names != sorted(set(names)):
            raise ProtocolError("env names are not unique and sorted")
        return pairs


def decode(data: bytes) -> tuple[str, int, dict]:
    """(name, seq, fields) of one datagram, or ProtocolError."""
    if len(data) < _HEADER.size:
        raise ProtocolError("a message is shorter than its header")
    length, seq, code, reserved = _HEADER.unpack_from(data)
    if length != len(data) - 4:
        raise ProtocolError("a message's length does not match its size")
    if reserved != 0:
        raise ProtocolError("a message's reserved field is not zero")
    if code not in _BY_CODE:
        raise ProtocolError(f"unknown message type {code}")
    name, _, _, schema = _BY_CODE[code]
    reader = _Reader(data, _HEADER.size)
    fields = {field: reader.field(kind) for field, kind in schema}
    if reader.offset != len(data):
        raise ProtocolError(f"{name} has trailing bytes")
    return name, seq, fields


class Channel:
    """One side of the conversation: numbering, role checks, descriptors and ACKs."""

    def __init__(self, sock, me: str, *, send_seq: int = 0, recv_seq: int = 0) -> None:
        self.sock = sock
        self.me = me
        self.send_seq = send_seq
        self.recv_seq = recv_seq

    def send(self, name: str, fds: tuple[int, ...] = (), **fields) -> int:
        code, sender, fd_count, _ = MESSAGES[name]
        if sender not in (None, self.me) or len(fds) != fd_count:
            raise ProtocolError(f"{self.me} may not send {name} with {len(fds)} descriptors")
        seq = self.send_seq
        try:
            seqpacket.send(self.sock, encode(name, seq, fields), fds)
        except seqpacket.TransportError as error:
            raise ProtocolError(f"sending {name} {error}") from None
        self.send_seq += 1
        return seq

    def receive(self, *expected: str) -> Message:
        """The next message, which must be one of ``expected``; its descriptors are the caller's to close."""
        try:
            data, fds = seqpacket.receive(self.sock, MAX_MESSAGE, MAX_FDS)
        except seqpacket.PeerClosed:
            raise ProtocolError("the peer closed the channel") from None
        except seqpacket.TransportError as error:
            raise ProtocolError(str(error)) from None
        try:
            name, seq, fields = decode(data)
            if name == "ABORT":
                raise Aborted(fields["reason"])
            _, sender, fd_count, _ = MESSAGES[name]
            if seq != self.recv_seq:
                raise ProtocolError(f"{name} is numbered {seq}, expected {self.recv_seq} (replayed or out of order)")
            if sender is not None and sender == self.me:
                raise ProtocolError(f"{name} may not come from the {'starter' if self.me == LAUNCHER else 'launcher'}")
            if name not in expected:
                raise ProtocolError(f"{name} arrived where {' or '.join(expected)} was expected")
            if len(fds) != fd_count:
                raise ProtocolError(f"{name} carried {len(fds)} descriptors, expected {fd_count}")
        except BaseException:
            seqpacket.close_all(fds)
            raise
        self.recv_seq += 1
        return Message(name, seq, fields, fds)

    def ack(self, message: Message) -> None:
        self.send("ACK", acked=message.seq)

    def await_ack(self, seq: int) -> None:
        acked = self.receive("ACK").fields["acked"]
        if acked != seq:
            raise ProtocolError(f"ACK names message {acked}, expected {seq}")

    def leaf(self, name: str, fds: tuple[int, ...] = (), **fields) -> None:
        """Send one leaf and wait for its ACK."""
        self.await_ack(self.send(name, fds, **fields))

    def abort(self, reason: str) -> None:
        """Best effort: tell the peer why; the channel is finished either way."""
        try:
            self.send("ABORT", reason=reason[:4000])
        except ProtocolError:
            pass

