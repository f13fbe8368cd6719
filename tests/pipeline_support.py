"""An in-memory stand-in for the steward session API (docs/steward-protocol.md), for the pipeline's unit tests.

It keeps outputs as plain directories, answers each op with what a test
scripts, and records every call, so the case service, the dependency
preparer and the ownership rules can be tested without root. The real
session is exercised end to end by tests/test_verify.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
from typing import Callable

from executor.cases.runtime import Installer, Runtime
from launcher.protocol import MESSAGES
from steward.api import Opened, OpNotStarted, OpOutcome, OpResult, Ready, Sealed
from steward.failure import SandboxFailure
from test_receipts import BINDING, SHIPPED_FILTER

HEAD = "ab" * 32
# The filter every fake sandbox ran under: the one this casebox ships (S12), so the evaluator accepts it.
FILTER = SHIPPED_FILTER
# What the fake launcher proves at READY: one value of each field's kind (launcher/protocol.py's READY).
READY_PROOF = {
    name: {"u8": False, "u32": 0, "u64": 0, "str": "", "strs": ("0",) * 4, "bytes": bytes.fromhex(FILTER)}[kind]
    for name, kind in MESSAGES["READY"][3]
}
RUNTIME = Runtime(
    interpreter="/usr/bin/python3.11",
    version="3.11.2",
    installer=Installer("pip-24.2-py3-none-any.whl", "6" * 64, "runtime", b"not a wheel"),
    inventory={},
    stdlib_path=("/usr/lib/python311.zip", "/usr/lib/python3.11", "/usr/lib/python3.11/lib-dynload"),
    stdlib_modules=frozenset({"argparse", "json", "os", "sys"}),
)


def outcome(op_id: str = "s.op-1", *, limit: str = "OK", wait_status: int = 0, stdout: bytes = b"", started: bool = True) -> OpOutcome:
    observation = (
        OpResult(
            limit=limit, wait_status=wait_status, descendants_reaped=0, wall_ms=5, cpu_ms=4, max_rss_kib=1000,
            memory_peak_bytes=2 << 20,
            stdout=stdout, stderr=b"", stdout_truncated=False, stderr_truncated=False,
        )
        if started
        else OpNotStarted(step="execve", errno=2, wait_status=wait_status, descendants_reaped=0)
    )
    return OpOutcome(
        sandbox="s", op_id=op_id, pid=4242, starttime=99, pgid=4242, observation=observation,
        terminal_head=HEAD, head=HEAD, filter_digest=FILTER,
    )


@dataclasses.dataclass
class Op:
    argv: list[str]
    read: list[str]
    write: list[str]
    outputs: dict[str, pathlib.Path]
    network: str = "loopback"
    index: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    limits: object = None
    cwd: str = ""
    timeout_ms: int = 0
    caps: tuple[int, int] = (0, 0)


class FakeSession:
    """The session API in memory. ``answer(op)`` returns the OpOutcome of each op (default: exit 0);
    ``failing_starts`` holds the numbers (from 1) of the sandbox starts that fail (a start ahead fails when it
    is taken); ``ahead`` is how many sandboxes it lets a client start ahead. ``events`` is every call in order."""

    def __init__(self, root: pathlib.Path, answer: Callable[[Op], OpOutcome] | None = None, failing_starts=(), ahead: int = 0) -> None:
        self.root = root
        (root / "live").mkdir(parents=True)
        (root / "sealed").mkdir()
        self.answer = answer or (lambda op: outcome(f"s.op-{len(self.ops)}"))
        self.failing_starts = set(failing_starts)
        self.ahead = ahead
        self.capabilities: dict[str, int] = {}
        self.interpreter: str | None = None
        self.starts = 0
        self.open: tuple[list[str], list[str]] | None = None
        self.waiting: list[tuple[int, tuple]] = []
        self.events: list[tuple[str, int]] = []
        self.ops: list[Op] = []
        self.published: dict[str, bytes] = {}
        self.closed_sandboxes = 0

    def info(self) -> Opened:
        return Opened("stage-1", "journal-1", "run-1", HEAD, self.ahead)

    def add_capability(self, name: str, fd: int) -> None:
        assert name not in self.capabilities
        self.capabilities[name] = fd

    def set_interpreter(self, fd: int, path: str) -> None:
        assert self.interpreter is None
        os.close(fd)
        self.interpreter = path

    def create_output(self, name: str, *, max_bytes: int = 0, max_inodes: int = 0) -> None:
        (self.root / "live" / name).mkdir()

    def start_sandbox(self, *, read=(), write=(), limits=None, network="loopback", index=None) -> Ready:
        assert self.open is None, "one sandbox at a time"
        self.starts += 1
        self.events.append(("start", self.starts))
        if self.starts in self.failing_starts:
            raise SandboxFailure(f"start {self.starts} failed on purpose")
        self.open = (list(read), list(write), network, index, limits)
        self.number = self.starts
        return Ready(f"s{self.starts}", HEAD, READY_PROOF, network)

    def start_ahead(self, *, read=(), write=(), limits=None) -> str:
        assert len(self.waiting) < self.ahead
        self.starts += 1
        self.events.append(("ahead", self.starts))
        self.waiting.append((self.starts, (list(read), list(write), "loopback", None, limits)))
        return f"s{self.starts}"

    def take_sandbox(self) -> Ready:
        assert self.open is None and self.waiting
        number, request = self.waiting.pop(0)
        self.events.append(("take", number))
        if number in self.failing_starts:
            raise SandboxFailure(f"start {number} failed on purpose")
        self.open, self.number = request, number
        return Ready(f"s{number}", HEAD, READY_PROOF, "loopback")

    def run(self, argv, **op) -> OpOutcome:
        assert self.open is not None
        self.events.append(("run", self.number))
        read, write, network, index, limits = self.open
        record = Op(
            list(argv), read, write, {name: self.root / "live" / name for name in write}, network, index, dict(op["env"]),
            limits, op.get("cwd", "/work"), op["timeout_ms"], (op["stdout_cap"], op["stderr_cap"]),
        )
        self.ops.append(record)
        return self.answer(record)

    def close_sandbox(self) -> str:
        assert self.open is not None
        self.open = None
        self.closed_sandboxes += 1
        return HEAD

    def seal_output(self, name: str) -> Sealed:
        source = self.root / "live" / name
        target = self.root / "sealed" / name
        shutil.move(source, target)
        files = sorted(path for path in target.rglob("*") if path.is_file())
        digest = hashlib.sha256(b"".join(path.name.encode() + path.read_bytes() for path in files)).hexdigest()
        return Sealed(name, f"sha256:{digest}", len(files), 0, sum(path.stat().st_size for path in files))

    def open_output(self, name: str) -> int:
        return os.open(self.root / "sealed" / name, os.O_RDONLY | os.O_DIRECTORY)

    def publish(self, name: str, data: bytes) -> None:
        assert name not in self.published
        self.published[name] = data

    def release(self) -> None:
        for fd in self.capabilities.values():
            os.close(fd)
        self.capabilities = {}


def interrupt_while_a_class_is_made() -> None:
    """What the main thread raises when Ctrl-C's or SIGTERM's KeyboardInterrupt lands while a class is created
    (a module that defines a dataclass, imported late): on Python 3.11 a RuntimeError the interrupt caused."""

    class Interrupting:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    type("Holder", (), {"field": Interrupting()})
