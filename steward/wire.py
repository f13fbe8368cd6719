"""The steward protocol's messages (docs/steward-protocol.md, "The wire protocol"): one encoder, one decoder.

A message is one SOCK_SEQPACKET datagram: a big-endian u32 length, then a
closed canonical JSON object ``{"seq", "type", "body"}`` (``re`` too in a
reply). The receiver refuses anything else and the connection ends: a body
that is not exactly its canonical encoding, an unknown type or field, a
number out of sequence, a wrong number of descriptors, a truncated datagram.
Descriptors cross only as SCM_RIGHTS and are received close-on-exec.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
import struct

from journal import strictjson
from journal.closed import ClosedObject
from journal.errors import Refused
from launcher import seqpacket

MAX_MESSAGE = 1 << 20
_LENGTH = struct.Struct(">I")
MAX_FDS = 1

CLIENT, STEWARD = "client", "steward"
# request type: the descriptor counts it may carry
REQUESTS = {
    "OPEN": (0,),
    "CAPABILITY": (1,),
    "INTERPRETER": (1,),
    "OUTPUT": (0,),
    "START": (0,),
    "START_AHEAD": (0,),
    "TAKE": (0,),
    "RUN": (0,),
    "STOP": (0,),
    "SEAL": (0,),
    "OPEN_OUTPUT": (0,),
    "PUBLISH": (0,),
    "CLOSE": (0, 1),
    "END": (0,),
}
# reply type: the descriptor counts it may carry (only OK to OPEN_OUTPUT carries one)
REPLIES = {"OK": (0, 1), "REFUSED": (0,), "FAILED": (0,)}


class WireError(Exception):
    """The peer broke the protocol or the connection failed; the connection ends."""


class PeerGone(WireError):
    """The peer closed the connection: a send failed, or a receive was reset because the peer closed with our
    message unread. What the peer sent before it closed is still there for the next receive."""


@dataclasses.dataclass
class Message:
    type: str
    seq: int
    re: int | None
    body: dict
    fds: list[int]

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def encode(seq: int, kind: str, body: dict, re: int | None = None) -> bytes:
    value = {"seq": seq, "type": kind, "body": body}
    if re is not None:
        value["re"] = re
    data = strictjson.canonical(value)
    if len(data) + _LENGTH.size > MAX_MESSAGE:
        raise WireError(f"{kind} is larger than {MAX_MESSAGE} bytes")
    return _LENGTH.pack(len(data)) + data


def decode(data: bytes, *, reply: bool) -> tuple[int, str, int | None, dict]:
    """(seq, type, re, body) of one datagram; WireError for anything the encoder would not write."""
    if len(data) < _LENGTH.size or _LENGTH.unpack_from(data)[0] != len(data) - _LENGTH.size:
        raise WireError("a message's length prefix does not match its size")
    raw = data[_LENGTH.size:]
    try:
        value = strictjson.loads(raw, max_bytes=MAX_MESSAGE)
        if strictjson.canonical(value) != raw:
            raise WireError("a message is not in canonical JSON form")
        fields = ClosedObject(value)
        seq = fields.pop_int("seq", low=0, high=strictjson.MAX_SAFE_INTEGER)
        kind = fields.pop_str("type", max_bytes=32)
        re = fields.pop_int("re", low=0, high=strictjson.MAX_SAFE_INTEGER) if reply else None
        fields.pop_object("body")
        fields.done()
    except Refused as refusal:
        raise WireError(f"a message is refused: {refusal.sentence()}") from None
    if kind not in (REPLIES if reply else REQUESTS):
        raise WireError(f"unknown {'reply' if reply else 'request'} type {kind!r}")
    return seq, kind, re, value["body"]


class Endpoint:
    """One side of a connection: numbering, descriptor counts and the envelope checks."""

    def __init__(self, sock: socket.socket, me: str) -> None:
        self.sock = sock
        self.me = me
        self.send_seq = 0
        self.recv_seq = 0

    def send(self, kind: str, body: dict, *, fds: tuple[int, ...] = (), re: int | None = None) -> int:
        seq = self.send_seq
        try:
            seqpacket.send(self.sock, encode(seq, kind, body, re), fds)
        except seqpacket.TransportError as error:
            failure = PeerGone if error.errno in (errno.EPIPE, errno.ECONNRESET) else WireError
            raise failure(f"sending {kind} {error}") from None
        self.send_seq += 1
        return seq

    def receive(self) -> Message:
        """The next message; its descriptors are the caller's to close (they are closed here if it is refused)."""
        reply = self.me == CLIENT
        try:
            data, fds = seqpacket.receive(self.sock, MAX_MESSAGE, MAX_FDS)
        except seqpacket.PeerClosed:
            raise WireError("the peer closed the connection") from None
        except seqpacket.TransportError as error:
            raise (PeerGone if error.errno == errno.ECONNRESET else WireError)(str(error)) from None
        try:
            seq, kind, re, body = decode(data, reply=reply)
            if seq != self.recv_seq:
                raise WireError(f"{kind} is numbered {seq}, expected {self.recv_seq} (replayed or out of order)")
            allowed = (REPLIES if reply else REQUESTS)[kind]
            if len(fds) not in allowed:
                raise WireError(f"{kind} carried {len(fds)} descriptors")
        except BaseException:
            seqpacket.close_all(fds)
            raise
        self.recv_seq += 1
        return Message(kind, seq, re, body, fds)
