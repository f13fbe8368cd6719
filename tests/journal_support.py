"""Helpers for the journal tests: golden files, a hand encoder for broken journals, a power-loss file layer."""

from __future__ import annotations

import itertools
import json
import os
import pathlib

from journal.format import Kind, chain_step, encode_header, genesis_digest, padded, time_key
from journal.strictjson import canonical

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden" / "journal"
T0 = 1_767_225_600_000_000


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def vectors() -> list[dict]:
    return json.loads((GOLDEN / "vectors.json").read_text())["tests"]


def clock(start: int = T0, step: int = 1_000):
    """A deterministic writer clock."""
    return itertools.count(start, step).__next__


class Chain:
    """Hand-encodes frames, valid or deliberately not, keeping offsets and heads."""

    def __init__(self, journal_id: str = "j-1", stage_id: str = "s-1", attempt_id: str = "a-1") -> None:
        self.data = bytearray()
        self.digest = genesis_digest(journal_id, stage_id)
        self.offsets: list[int] = []
        self.heads: list[str] = []
        self.time = T0
        self.add(Kind.GENESIS, journal_id=journal_id, stage_id=stage_id, attempt_id=attempt_id)

    def payload(self, record_kind: Kind, /, **fields) -> bytes:
        fields.setdefault("prev", self.digest.hex())
        fields.setdefault(time_key(record_kind), self.time)
        return canonical(fields)

    def add(self, record_kind: Kind, /, **fields) -> "Chain":
        return self.raw(record_kind, self.payload(record_kind, **fields))

    def raw(self, kind: int, payload: bytes, *, header: bytes | None = None, padding: bytes | None = None) -> "Chain":
        header = header if header is not None else encode_header(kind, len(payload))
        padding = padding if padding is not None else bytes(padded(len(payload)) - len(payload))
        self.offsets.append(len(self.data))
        self.data += header + payload + padding
        self.digest = chain_step(self.digest, header, payload)
        self.heads.append(self.digest.hex())
        self.time += 1_000
        return self

    def process(self, op_id: str = "p-1", pid: int = 4242) -> "Chain":
        return self.add(Kind.PROCESS_INTENT, op_id=op_id, role="launcher", pid=pid, starttime=77, pgid=pid)

    def bytes(self) -> bytes:
        return bytes(self.data)


class ChainLedger:
    """JournalWriter's ledger calls, keyword arguments only, hand-encoded in memory by a :class:`Chain`."""

    def __init__(self, chain: Chain | None = None) -> None:
        self.chain = chain if chain is not None else Chain()

    def __getattr__(self, method: str):
        kind = Kind[method.upper()]
        return lambda **fields: self.chain.add(kind, **fields)


def write_sandbox(ledger, name: str, pid: int, *, mounts=("/usr", "/cap/bundle", "/out/candidate"),
                  op_statuses=(0,), pid1: str = "reaped") -> None:
    """One sandbox's records in the starter's order (docs/launcher.md, J1): the launcher, its tree mounts,
    pid 1 (``pid1`` is "reaped", "open" for never reaped, or "none" for never recorded), the mounts done,
    the old root unmounted, one op per status (None: never reaped), then pid 1's terminal status."""
    ledger.process_intent(op_id=f"{name}.launcher", role="launcher", pid=pid, starttime=100, pgid=pid)
    ledger.process_released(op_id=f"{name}.launcher")
    for number, target in enumerate(mounts, 1):
        ledger.mount_intent(op_id=f"{name}.mount-{number}", target=target, kind="tree")
    if pid1 != "none":
        ledger.process_intent(op_id=f"{name}.init", role="namespace", pid=pid + 1, starttime=101, pgid=pid)
    ledger.process_terminal(op_id=f"{name}.launcher", wait_status=0, reaper="steward")
    if pid1 != "none":
        ledger.process_released(op_id=f"{name}.init")
    for number, target in enumerate(mounts, 1):
        ledger.mount_done(op_id=f"{name}.mount-{number}", target=target, kind="tree")
    old_root = f"{name}.mount-{len(mounts) + 1}"
    ledger.unmount_intent(op_id=old_root, target="/.old-root", kind="tree")
    ledger.unmount_done(op_id=old_root, target="/.old-root", kind="tree")
    for number, status in enumerate(op_statuses, 1):
        op = f"{name}.op-{number}"
        ledger.process_intent(op_id=op, role="descendant", pid=pid + 1 + number, starttime=102, pgid=pid + 1 + number)
        ledger.process_released(op_id=op)
        if status is not None:
            ledger.process_terminal(op_id=op, wait_status=status, reaper="launcher")
            ledger.descendants_terminal(op_id=op, count=0)
    if pid1 == "reaped":
        ledger.process_terminal(op_id=f"{name}.init", wait_status=0, reaper="steward")


def output_target(name: str) -> str:
    return f"/state/stages/s-1/live/{name}"


def mount_output(ledger, name: str) -> None:
    """A steward output's host tmpfs, mounted before the sandbox that fills it."""
    ledger.mount_intent(op_id=f"output-{name}-mount", target=output_target(name), kind="tmpfs")
    ledger.mount_done(op_id=f"output-{name}-mount", target=output_target(name), kind="tmpfs")


def unmount_output(ledger, name: str, *, done: bool = True) -> None:
    ledger.unmount_intent(op_id=f"output-{name}-unmount", target=output_target(name), kind="tmpfs")
    if done:
        ledger.unmount_done(op_id=f"output-{name}-unmount", target=output_target(name), kind="tmpfs")


class PowerLoss(Exception):
    """Raised by a test hook where the power goes."""


class PowerLossLayer:
    """Stands in for ``os`` in journal.writer: forwards every call, and remembers what an fsync made durable.

    After a :class:`PowerLoss`, :meth:`image` gives the file as the disk would
    hold it: only writes that a later fsync/fdatasync of the file covered, and
    no file at all unless the directory was fsynced after the file was created.
    """

    def __init__(self, fail_sync_at: int | None = None, short_write_at: int | None = None) -> None:
        self.file_fd: int | None = None
        self.dir_fd: int | None = None
        self.pending: list[tuple[int, bytes]] = []
        self.durable: list[tuple[int, bytes]] = []
        self.entry_durable = False
        self.syncs = 0
        self.writes = 0
        self.fail_sync_at = fail_sync_at
        self.short_write_at = short_write_at

    def __getattr__(self, name: str):
        return getattr(os, name)

    def open(self, path, flags, mode=0o777, *, dir_fd=None):
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT:
            self.file_fd, self.dir_fd = fd, dir_fd
        return fd

    def pwrite(self, fd, data, offset):
        self.writes += 1
        if self.writes == self.short_write_at:
            data = data[: len(data) // 2]
        if fd == self.file_fd:
            self.pending.append((offset, bytes(data)))
        return os.pwrite(fd, data, offset)

    def _sync(self, fd, real) -> None:
        self.syncs += 1
        if self.syncs == self.fail_sync_at:
            raise OSError(5, "Input/output error")
        real(fd)
        if fd == self.file_fd:
            self.durable += self.pending
            self.pending = []
        elif fd == self.dir_fd and self.file_fd is not None:
            self.entry_durable = True

    def fsync(self, fd):
        self._sync(fd, os.fsync)

    def fdatasync(self, fd):
        self._sync(fd, os.fdatasync)

    def image(self) -> bytes | None:
        if not self.entry_durable:
            return None
        data = bytearray()
        for offset, chunk in self.durable:
            if len(data) < offset + len(chunk):
                data.extend(bytes(offset + len(chunk) - len(data)))
            data[offset : offset + len(chunk)] = chunk
        return bytes(data)
