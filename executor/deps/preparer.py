"""The dependency preparer: resolution and fetch, the only starter of resolvers (DESIGN step 4, C9, E7; docs/pipeline.md).

It runs on the trusted side and never parses candidate bytes. From the
sealed extraction and the closed plan it makes the resolver's request
capability (``request.json``: the plan digest, the runner's requirements and
the installer wheel; plus that wheel), then:

1. **resolve**: a sandbox with the tools, the sealed candidate, the request
   and the index, read-only; one op, the resolver (executor/deps/resolver.py),
   which runs pip's own resolver twice, for the runner (its requirements
   alone, against the index: never the bundle) and for the candidate (its
   wheels against the index), and answers with the leaves of
   ``casebox.resolver.v2``. Each leaf is validated and each PIN ACKed by
   :class:`~executor.deps.protocol.Acceptor`, hashing the named index file
   itself;
2. **shadowing** (E7, executor/deps/shadowing.py): a candidate project that is a
   distribution of the runner's closure, or a candidate module named like a
   standard-library module, stops here;
3. **fetch**: the ACKed pins become a new capability (``pins.json``), and a
   second sandbox copies exactly those files from the find-links index, or
   downloads them from the URLs pip named, into the writable output
   ``deps``, each refused unless it has the ACKed hash;
4. **seal**: ``deps`` is sealed, its inventory digest is the dependency
   inventory digest, and the sealed files must be exactly the ACKed wheels
   with the ACKed hashes.

With a network index (an http(s) URL) the two sandboxes, and only these,
have the index network (``network="index"``: their own namespace plus the
steward's forwarder to that index and its file hosts, steward/forwarder.py,
which both tools name as their proxy; every other sandbox of the session has
loopback only, S9), and the PINs are ACKed as claims (the trusted side has
no network to hash them with) that the fetch and the seal check. Their
environment is the sandbox allowlist and pip's fixed settings, never the
caller's: no token, proxy, ``PIP_*`` or home directory of the host reaches
them.

Any refusal, failure or abort is an :class:`Unresolved` with a fixed code
and a sentence; the case service then gives every case a receipt that never
started, whose step names the code (docs/receipts.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from typing import Callable, Sequence

from executor.environ import SANDBOX_ENV
from executor.inside import BOOT
from executor.cases.ownership import PREPARER, Gate, failure_of
from executor.deps.protocol import MAX_PINS, NO_PROXY, RUNNER, Abort, Acceptor, Failed, Pin, accept, acks_bytes, request_bytes
from executor.cases.runtime import Runtime
from executor.deps.shadowing import shadowed
from executor.scratch import Scratch
from journal.errors import Refused
from launcher.protocol import MAX_OUTPUT_CAP
from steward.api import INDEX_NETWORK, LOOPBACK, MIB, Limits, OpOutcome, Sealed
from steward.forwarder import PROXY_URL

DEPS = "deps"
REQUEST = "request"
PINS = "pins"
RESOLVE_TIMEOUT_MS = 120_000
FETCH_TIMEOUT_MS = 300_000
DEPS_MAX_BYTES = 512 * MIB
PIP_ENV = {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INPUT": "1", "PYTHONDONTWRITEBYTECODE": "1"}
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Dependencies:
    """A sealed offline bundle: exactly the ACKed pins, with the inventory digest of their sealed output, and
    the top-level modules the resolver listed for each candidate project."""

    sealed: Sealed
    pins: tuple[Pin, ...]
    modules: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def files(self, tree: str) -> tuple[str, ...]:
        """The sealed wheels of one tree (``runner`` or ``candidate``)."""
        return tuple(sorted({pin.file for pin in self.pins if pin.tree == tree}))

    @property
    def runner_projects(self) -> tuple[str, ...]:
        return tuple(sorted(pin.name for pin in self.pins if pin.tree == RUNNER))


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """Resolution failed: a fixed code, a sentence, and the ``deps`` output as it was sealed (or None)."""

    code: str
    sentence: str
    sealed: Sealed | None


def install_argv(runtime: Runtime, tree: str, wheels: Sequence[str], *, runner: bool = False) -> list[str]:
    """Exactly ``wheels`` installed into ``/out/TREE`` and compiled for ``/cap/TREE``, where the cases mount
    it: nothing resolved, nothing from the network (executor/inside.py, ``install``); the ``runner``'s tree with
    the runner's boot as its sitecustomize (``install-runner``)."""
    tool = "install-runner" if runner else "install"
    return [runtime.interpreter, "-I", "-S", "-B", "-c", BOOT, tool, f"/out/{tree}", f"/cap/{tree}", *wheels]


def hash_regular(directory_fd: int, name: str) -> str | None:
    """The SHA-256 of the regular file ``name`` in ``directory_fd``, or None when there is no such file."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        hasher = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            hasher.update(chunk)
        return hasher.hexdigest()
    finally:
        os.close(fd)


class Preparer:
    """The dependency preparer of one session: it alone starts resolvers."""

    def __init__(
        self, gate: Gate, session, *, scratch: Scratch, runtime: Runtime, index_fd: int | None,
        progress: Callable[[str], None], index_url: str | None = None,
    ) -> None:
        if index_fd is not None and index_url is not None:
            raise ValueError("an index is a find-links directory or a URL, not both")
        self.starter = gate.starter(PREPARER, self)
        self.session = session
        self.scratch = scratch
        self.runtime = runtime
        self.index_fd = index_fd
        self.index_url = index_url
        self.progress = progress
        # The sandboxes that had the index network, as the session named them (``<stage>-<n>-net``).
        self.networked: list[str] = []

    def __repr__(self) -> str:
        return PREPARER

    @property
    def network(self) -> str:
        """The network of the resolve and fetch sandboxes: the index network only for a network index."""
        return INDEX_NETWORK if self.index_url is not None else LOOPBACK

    @property
    def proxy(self) -> str:
        """What the resolve and fetch tools reach a network index through: the forwarder, their one way out."""
        return PROXY_URL if self.index_url is not None else NO_PROXY

    def _sandboxed(self, argv: list[str], *, read: Sequence[str], write: Sequence[str] = (), timeout_ms: int):
        result = self.starter.run_one(
            argv, read=read, write=write, limits=Limits(tmp_bytes=256 * MIB), network=self.network, index=self.index_url,
            env={**SANDBOX_ENV, **PIP_ENV}, cwd="/work", timeout_ms=timeout_ms, stdout_cap=MAX_OUTPUT_CAP,
            stderr_cap=MAX_OUTPUT_CAP,
        )
        if isinstance(result, OpOutcome) and self.network == INDEX_NETWORK:
            self.networked.append(result.sandbox)
        return result

    def _index_sha256(self, file: str) -> str | None:
        return None if self.index_fd is None else hash_regular(self.index_fd, file)

    def _index_argument(self) -> str:
        if self.index_url is not None:
            return self.index_url
        return "/cap/index" if self.index_fd is not None else "-"

    def prepare(self, *, plan_digest: str, runner: Sequence[str], candidate: dict[str, str]) -> Dependencies | Unresolved:
        """Resolve, fetch and seal the runner's and the sealed ``candidate``'s (project -> version) wheels."""
        self.scratch.directory(
            REQUEST,
            {
                "request.json": request_bytes(plan_digest, runner, self.runtime.installer.as_dict()),
                self.runtime.installer.file: self.runtime.installer.data,
            },
        ).hand_to(self.session)
        self.session.create_output(DEPS, max_bytes=DEPS_MAX_BYTES, max_inodes=MAX_PINS + 16)
        try:
            pins, modules = self._resolve(candidate)
            refusal = shadowed(
                candidate_projects=candidate, candidate_modules=modules,
                runner_projects={pin.name for pin in pins if pin.tree == RUNNER},
                stdlib_modules=self.runtime.stdlib_modules,
            )
            if refusal is not None:
                raise _Stop(*refusal)
            if pins:
                self._fetch(pins)
        except _Stop as stop:
            return Unresolved(stop.code, stop.sentence, self._seal_anyway())
        sealed = self.session.seal_output(DEPS)
        problem = self._check_sealed(pins)
        if problem is not None:
            return Unresolved("fetched_mismatch", problem, sealed)
        return Dependencies(sealed, pins, modules)

    def _resolve(self, candidate: dict[str, str]) -> tuple[tuple[Pin, ...], dict[str, tuple[str, ...]]]:
        self.progress("resolving the runner and the candidate with pip's resolver in a sandbox")
        read = ["tools", "candidate", REQUEST] + (["index"] if self.index_fd is not None else [])
        argv = [
            self.runtime.interpreter, "-I", "-S", "-B", "-c", BOOT, "resolve", f"/cap/{REQUEST}", "/cap/candidate/candidate",
            self._index_argument(), self.proxy,
        ]
        result = self._sandboxed(argv, read=read, timeout_ms=RESOLVE_TIMEOUT_MS)
        problem = failure_of(result)
        if problem is not None:
            raise _Stop("resolver_failed", f"the resolver failed: {problem}")
        if result.observation.stdout_truncated:
            raise _Stop("incomplete", "the resolver's output passed its cap")
        acceptor = Acceptor(
            python=self.runtime.version, candidate=candidate,
            index_sha256=None if self.index_url is not None else self._index_sha256,
        )
        try:
            answer = accept(result.observation.stdout, acceptor)
        except Abort as abort:
            raise _Stop(abort.code, f"the resolver's answer was refused ({abort.detail})") from None
        if isinstance(answer, Failed):
            raise _Stop(answer.reason, f"pip's resolver found no resolution ({answer.reason}: {answer.requirement})")
        return answer, acceptor.modules

    def _fetch(self, pins: tuple[Pin, ...]) -> None:
        files = {pin.file for pin in pins}
        self.progress(f"fetching {len(files)} wheels in a sandbox")
        self.scratch.directory(PINS, {"pins.json": acks_bytes(pins)}).hand_to(self.session)
        read = ["tools", REQUEST, PINS] + (["index"] if self.index_fd is not None else [])
        argv = [
            self.runtime.interpreter, "-I", "-S", "-B", "-c", BOOT, "fetch", f"/cap/{PINS}/pins.json", f"/out/{DEPS}",
            self._index_argument(), f"/cap/{REQUEST}/{self.runtime.installer.file}", self.proxy,
        ]
        result = self._sandboxed(argv, read=read, write=[DEPS], timeout_ms=FETCH_TIMEOUT_MS)
        problem = failure_of(result)
        if problem is not None:
            raise _Stop("fetch_failed", f"the fetch failed: {problem}")

    def _seal_anyway(self) -> Sealed | None:
        try:
            return self.session.seal_output(DEPS)
        except Refused:
            return None

    def _check_sealed(self, pins: tuple[Pin, ...]) -> str | None:
        fd = self.session.open_output(DEPS)
        try:
            found = sorted(os.listdir(fd))
            expected = sorted({pin.file for pin in pins})
            if found != expected:
                return f"the sealed dependencies hold {found}, not the ACKed {expected}"
            for pin in pins:
                digest = hash_regular(fd, pin.file)
                if digest != pin.sha256:
                    return f"the sealed {pin.file} hashes to {digest}, not the ACKed {pin.sha256}"
        finally:
            os.close(fd)
        return None


class _Stop(Exception):
    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence
