"""The steward's session API, in process: one stage, one journal, its sandboxes, outputs, cleanup and retirement.

``Steward(settings, capability_check=...).open_session(attempt_id)`` opens a
stage; the :class:`Session` then takes capabilities, makes outputs, starts
sandboxes and runs ops through them, seals outputs, stores evidence files,
and finally closes: cleanup proof, CLEANUP_EVIDENCE, retirement into a
sealed tombstone, and an export of the journal, the seal marker and the
evidence files into the client's evidence directory. The server
(steward/server.py) exposes exactly these calls over its socket, and the
client (steward/client.py) offers the same methods, so a caller cannot tell
an embedded session from a remote one. docs/steward-protocol.md is the
reference.

J1 runs through :class:`SessionLedger`: the stage's journal writer is the
starter's intent ledger, and every record is durable before its effect. A
``/proc/<pid>`` handle is opened for each process at intent time, so its
absence can later be proved without a wait call (C2). Every capability is a
close-once object (C9): the session owns each descriptor it accepted and
closes each exactly once, when the session ends.

A state root with no room (a full disk or quota, or a journal cap that cannot
be reserved) fails the call that needed it with one sentence saying so
(``StateRoot.space_failure``), as a :class:`SandboxFailure`; the journal
itself never runs out, since its cap is reserved when it is created.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import secrets
import signal
import stat
import threading
from typing import Callable, Sequence

from journal.createonly import publish_once
from journal.errors import Refused
from journal.files import JOURNAL_NAME, read_evidence
from journal.format import CAP, NETWORK_SANDBOX_SUFFIX, check_id
from journal.seal import NAME as SEAL_NAME
from journal.writer import JournalWriter, Unreserved
from steward import api, cleanup, dedicated, documents, helperattempts, outputs, procfs, retirement
from steward.api import Limits
from steward.failure import SandboxFailure
from steward.stateroot import STAGES, TOMBSTONES, Lease, StateRoot, make_directory_at, open_directory_at

EVIDENCE = "evidence"
# Each capability is a descriptor the session holds until it ends; the daemon's descriptor budget counts them.
MAX_CAPABILITIES = 32
# The session's interpreter, copied execute-only into its stage (set_interpreter): a CPython is some 5 to 30 MiB.
INTERPRETER_NAME = "interpreter"
INTERPRETER_MODE = 0o111
MAX_INTERPRETER_BYTES = 256 * 1024 * 1024
# How a session ends without its client's CLOSE (steward/fold.py gives each its diagnostic).
ENDINGS = ("ABANDONED", "IDLE", "SHUTDOWN", "INTERRUPTED", api.RUNTIME_CHANGED)
AFTER_STAGE_DIRECTORY = "after_stage_directory"
AFTER_PROCESS_INTENT = "after_process_intent"
AFTER_MOUNT_INTENT = "after_mount_intent"
AFTER_CLEANUP_EVIDENCE = "after_cleanup_evidence"
SESSION_KILL_POINTS = (AFTER_STAGE_DIRECTORY, AFTER_PROCESS_INTENT, AFTER_MOUNT_INTENT, AFTER_CLEANUP_EVIDENCE)
DEFAULT_OUTPUT_BYTES = 256 * api.MIB
DEFAULT_OUTPUT_INODES = 16_384
MAX_OUTPUT_BYTES = 8 << 30

Hook = Callable[[str], None]


def _room_checked(method):
    """A state root with no room fails the call with its one sentence (a SandboxFailure), never a bare OSError."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (OSError, Unreserved) as error:
            sentence = self.root.space_failure(error)
            if sentence is None:
                raise
            raise SandboxFailure(sentence) from None

    return call

# F4's one capability predicate: it gets each accepted descriptor and the name it will have, and
# raises Refused for a directory that must not enter a sandbox. The composition root injects it.
CapabilityCheck = Callable[[int, str], None]


@dataclasses.dataclass(frozen=True)
class Settings:
    state_root: str
    uid: int
    gid: int
    lease_seconds: float = 120.0
    # The pool's size: the pairs (uid + n, gid + n) for n below it (config sandbox_ids); one per live session.
    ids: int = 1
    timing: helperattempts.Timing = helperattempts.Timing()
    helper_command: tuple[str, ...] = helperattempts.HELPER_COMMAND
    # The hosts besides the index's own that an index sandbox's forwarder may reach (``index_file_hosts``).
    index_file_hosts: tuple[str, ...] = ()
    # How many sandboxes a session may start ahead of their ops at once (start_ahead).
    ahead: int = dataclasses.field(default_factory=api.ahead_for_host)


def pool(settings: Settings) -> tuple[tuple[int, int], ...]:
    """(uid, gid) of every pair of the sandbox pool, in order."""
    return tuple((settings.uid + n, settings.gid + n) for n in range(settings.ids))


class SessionLedger:
    """The stage's journal writer as the starter's intent ledger (J1), keeping a ``/proc`` handle per process."""

    def __init__(self, writer: JournalWriter, hook: Hook | None) -> None:
        self.writer = writer
        self.hook = hook
        self.handles: dict[str, procfs.ProcessHandle] = {}
        self.identities: dict[str, tuple[int, int, int]] = {}
        self.terminal_heads: dict[str, str] = {}
        # The op that runs now (recorded, no terminal yet), and whether the steward wants every op ended.
        self._running: str | None = None
        self._halted = False
        self._guard = threading.Lock()

    @property
    def head(self) -> str:
        return self.writer.head

    def _pass(self, point: str) -> None:
        if self.hook is not None:
            self.hook(point)

    def process_intent(self, op_id: str, role: str, pid: int, starttime: int, pgid: int) -> str:
        handle = procfs.ProcessHandle.open(pid, starttime)
        try:
            head = self.writer.process_intent(op_id, role, pid, starttime, pgid)
        except BaseException:
            handle.close()
            raise
        self.handles[op_id] = handle
        self.identities[op_id] = (pid, starttime, pgid)
        if role == "descendant":
            with self._guard:
                self._running = op_id
                halted = self._halted
            if halted:
                self._kill(op_id)
        self._pass(AFTER_PROCESS_INTENT)
        return head

    def process_released(self, op_id: str) -> str:
        return self.writer.process_released(op_id)

    def process_terminal(self, op_id: str, wait_status: int, reaper: str) -> str:
        head = self.writer.process_terminal(op_id, wait_status, reaper)
        self.terminal_heads[op_id] = head
        with self._guard:
            if self._running == op_id:
                self._running = None
        return head

    def halt(self) -> None:
        """End the op that runs now, and any op recorded from now on, with SIGKILL (safe from another thread).

        Its end is observed as any other: pid 1 kills what the op left, reaps
        it and reports its raw wait status, which PROCESS_TERMINAL records.
        """
        with self._guard:
            self._halted = True
            running = self._running
        if running is not None:
            self._kill(running)

    def _kill(self, op_id: str) -> None:
        """SIGKILL the recorded process through a pidfd, once its ``/proc`` handle shows it is still that process."""
        pid = self.identities[op_id][0]
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            if not self.handles[op_id].gone():
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)

    def descendants_terminal(self, op_id: str, count: int) -> str:
        return self.writer.descendants_terminal(op_id, count)

    def mount_intent(self, op_id: str, target: str, kind: str) -> str:
        head = self.writer.mount_intent(op_id, target, kind)
        self._pass(AFTER_MOUNT_INTENT)
        return head

    def mount_done(self, op_id: str, target: str, kind: str) -> str:
        return self.writer.mount_done(op_id, target, kind)

    def unmount_intent(self, op_id: str, target: str, kind: str) -> str:
        return self.writer.unmount_intent(op_id, target, kind)

    def unmount_done(self, op_id: str, target: str, kind: str) -> str:
        return self.writer.unmount_done(op_id, target, kind)

    def sandbox_ready(self, op_id: str, filter_digest: str) -> str:
        return self.writer.sandbox_ready(op_id, filter_digest)

    def helper_attempt(self, attempt: int, response_digest: str, outcome: str) -> str:
        return self.writer.helper_attempt(attempt, response_digest, outcome)

    def cleanup_evidence(self, *fields: str) -> str:
        head = self.writer.cleanup_evidence(*fields)
        self._pass(AFTER_CLEANUP_EVIDENCE)
        return head

    def retirement_intent(self, note: str = "") -> str:
        return self.writer.retirement_intent(note)

    def retired(self, note: str = "") -> str:
        return self.writer.retired(note)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles = {}


class Steward:
    """The root side: one open state root; sessions are opened from it, in process or for the server."""

    def __init__(
        self,
        settings: Settings,
        *,
        capability_check: CapabilityCheck,
        hook: Hook | None = None,
    ) -> None:
        self.settings = settings
        self.capability_check = capability_check
        self.hook = hook
        self.root = StateRoot.open(settings.state_root)
        # Set when the daemon stops: a wait for the dedicated UID's lease then ends, and nothing new starts.
        self.stopping = threading.Event()

    def open_session(self, attempt_id: str, *, client_uid: int | None = None, single: bool = False) -> "Session":
        """A new stage and journal for ``attempt_id``; refused while a live process uses the dedicated ids (S6).

        ``client_uid`` is the peer's uid for a session served over the socket
        (an evidence directory must then be the client's own); None in process.
        ``single``: this steward exists for this one session (embedded mode)
        and is closed when the session ends.
        """
        check_id(attempt_id, "attempt_id")
        settings = self.settings
        pairs = pool(settings)
        binding = None
        try:
            # S15: a live session holds a free pair for its life, so stages running at once get different uids;
            # with none free it shares the first, whose lease its sandboxes then wait for (S6).
            binding = self.root.bind(tuple(uid for uid, _ in pairs))
            uid, gid = pairs[0] if binding is None else (binding.uid, dict(pairs)[binding.uid])
            with self.root.lease(uid, wait_seconds=settings.lease_seconds, stop=self.stopping):
                dedicated.require_unused(uid, gid)
                # Made under the lease: recovery removes a stage whose journal was never begun only under it, so
                # it never takes a stage this steward is still creating for one.
                session = Session(self, attempt_id, client_uid, binding, uid, gid)
        except Exception as error:
            if binding is not None:
                binding.release()
            sentence = self.root.space_failure(error)
            if sentence is None:
                raise
            raise SandboxFailure(sentence) from None
        except BaseException:
            if binding is not None:
                binding.release()
            raise
        session.single = single
        return session

    def close(self) -> None:
        self.root.close()

    def __enter__(self) -> "Steward":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class _Waiting:
    """A sandbox started ahead: its outputs, the descriptors its start opened, and its way to READY on a thread
    of its own (``completion``), None while its spawn waits for the open sandbox's op (Session.run)."""

    sandbox: object
    outputs: frozenset[str]
    opened: list[int]
    completion: object = None


class _LaunchFailed:
    """The completion of a start ahead whose spawn failed: its take raises the failure."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure

    def join(self) -> BaseException:
        return self.failure


def _complete(sandbox, opened: list[int]) -> None:
    """Bring a launched sandbox to READY; the descriptors its start opened are closed after it, either way."""
    try:
        sandbox.complete()
    finally:
        for fd in opened:
            os.close(fd)


class Session:
    """One stage. Not thread-safe: one caller drives it, one call at a time."""

    def __init__(
        self, steward: Steward, attempt_id: str, client_uid: int | None, binding: Lease | None, uid: int, gid: int,
    ) -> None:
        self.steward = steward
        # The pool pair of this session (its own while ``binding`` is held, else shared): every sandbox, output
        # and cleanup of the stage uses it.
        self.binding = binding
        self.uid, self.gid = uid, gid
        self.settings = steward.settings
        self.root = steward.root
        self.hook = steward.hook
        self.client_uid = client_uid
        self.single = False
        self.attempt_id = attempt_id
        self.stage_id = secrets.token_hex(8)
        self.journal_id = secrets.token_hex(8)
        self.capabilities: dict[str, int] = {}
        # The capabilities mounted at a path of their own (name -> path) rather than at /cap/NAME.
        self.mounts: dict[str, str] = {}
        # (path, descriptor of its execute-only copy): mounted over that path in every sandbox (set_interpreter).
        self.interpreter: tuple[str, int] | None = None
        self.live: dict[str, bool] = {}
        self.sealed: dict[str, api.Sealed] = {}
        self.sandbox = None
        self.sandbox_outputs: set[str] = set()
        # Sandboxes started ahead, oldest first, each on its way to READY or there (start_ahead).
        self.waiting: collections.deque[_Waiting] = collections.deque()
        self.sandboxes = 0
        self.lease: Lease | None = None
        self.outer: list[tuple[str, int, bool]] = []
        self.ended = False
        self._lock = threading.Lock()
        self.stage_fd = make_directory_at(self.root.area(STAGES), self.stage_id, self.stage_path)
        try:
            os.fsync(self.root.area(STAGES))
            self._pass(AFTER_STAGE_DIRECTORY)
            self.writer = JournalWriter.create(
                self.stage_fd, JOURNAL_NAME, journal_id=self.journal_id, stage_id=self.stage_id,
                attempt_id=attempt_id, hook=self.hook,
            )
        except BaseException:
            os.close(self.stage_fd)
            # No GENESIS is durable, so nothing can have run in it (J1): the stage goes again at once.
            retirement.remove_unborn(self.root, self.stage_id)
            raise
        self.ledger = SessionLedger(self.writer, self.hook)
        self.documents_fd = self.live_fd = self.outputs_fd = self.evidence_fd = -1
        try:
            dedicated.record_ids(self.stage_fd, self.uid, self.gid, self.stage_path)
            self.documents_fd = self._subdirectory(documents.DOCUMENTS)
            self.live_fd = self._subdirectory(outputs.LIVE)
            self.outputs_fd = self._subdirectory(outputs.OUTPUTS)
            self.evidence_fd = self._subdirectory(EVIDENCE)
            os.fsync(self.stage_fd)
        except BaseException:
            # The journal is begun, so the stage stays (ACTIVE) for recovery; only our descriptors go.
            self._release()
            raise

    # -- helpers -------------------------------------------------------------

    @property
    def stage_path(self) -> str:
        return self.root.path_of(STAGES, self.stage_id)

    def _pass(self, point: str) -> None:
        if self.hook is not None:
            self.hook(point)

    def _subdirectory(self, name: str) -> int:
        return make_directory_at(self.stage_fd, name, f"{self.stage_path}/{name}")

    def _usable(self) -> None:
        if self.ended:
            raise Refused("session", "is already closed")

    def info(self) -> api.Opened:
        return api.Opened(self.stage_id, self.journal_id, self.attempt_id, self.ledger.head, self.settings.ahead)

    # -- capabilities and outputs ---------------------------------------------

    def add_capability(self, name: str, fd: int, mount: str | None = None) -> None:
        """Accept a read-only directory capability; the session now owns ``fd`` and closes it exactly once (C9).

        A sandbox sees it at /cap/NAME, or at ``mount``, a path of its own (a case
        runtime's installation prefix, at the path it has on the host)."""
        try:
            self._usable()
            api.check_name(name, "capability name")
            if name in self.capabilities or name in self.live or name in self.sealed:
                raise Refused(f"capability {name}", "is a name this session already uses")
            if len(self.capabilities) >= MAX_CAPABILITIES:
                raise Refused(f"capability {name}", f"would be more than {MAX_CAPABILITIES} capabilities in one session")
            if mount is not None:
                api.check_mount(mount, f"capability {name} mount")
                if mount in self.mounts.values():
                    raise Refused(f"capability {name} mount", f"{mount} is already another capability's")
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise Refused(f"capability {name}", "must be a directory descriptor")
            self.steward.capability_check(fd, f"capability {name}")
        except BaseException:
            os.close(fd)
            raise
        self.capabilities[name] = fd
        if mount is not None:
            self.mounts[name] = mount

    @_room_checked
    def set_interpreter(self, fd: int, path: str) -> None:
        """Every sandbox of this session runs ``path`` from an execute-only copy of the file at ``fd``.

        The copy is the stage's, root-owned with mode 0111, and each sandbox
        mounts it over ``path`` (inside /usr or a capability's mount). The
        dedicated UID may execute it but not read it, so the kernel makes
        every process that execs it non-dumpable: no process of a sandbox
        can open another's memory through /proc, whatever the host's ptrace
        policy (E7). The session takes ownership of ``fd``.
        """
        from launcher.rendezvous import is_executable_target

        try:
            self._usable()
            if self.interpreter is not None:
                raise Refused("interpreter", "is already set for this session")
            if not is_executable_target(path, ["/usr", *self.mounts.values()]):
                raise Refused("interpreter path", f"{path} is not a normalized path inside /usr or a capability's mount")
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused("interpreter", "must be a regular file descriptor")
            copy = _execute_only_copy(fd, self.stage_fd)
        finally:
            os.close(fd)
        self.interpreter = (path, copy)

    @_room_checked
    def create_output(self, name: str, *, max_bytes: int = DEFAULT_OUTPUT_BYTES, max_inodes: int = DEFAULT_OUTPUT_INODES) -> None:
        """A writable output the next sandbox fills at /out/NAME: a capped tmpfs in the stage (J1 for its mount)."""
        self._usable()
        api.check_name(name, "output name")
        if name in self.capabilities or name in self.live or name in self.sealed:
            raise Refused(f"output {name}", "is a name this session already uses")
        if not (api.MIB <= max_bytes <= MAX_OUTPUT_BYTES and 16 <= max_inodes <= 1_000_000):
            raise Refused(f"output {name}", f"needs 1 MiB to {MAX_OUTPUT_BYTES} bytes and 16 to 1,000,000 inodes")
        outputs.mount_live(
            self.live_fd, name, target=f"{self.stage_path}/{outputs.LIVE}/{name}", uid=self.uid,
            gid=self.gid, max_bytes=max_bytes, max_inodes=max_inodes, ledger=self.ledger,
        )
        self.live[name] = True

    @_room_checked
    def seal_output(self, name: str) -> api.Sealed:
        """Seal an output no sandbox holds: a root-owned read-only copy with its inventory digest; unmount the tmpfs."""
        self._usable()
        if name not in self.live:
            raise Refused(f"output {name}", "is not an unsealed output of this session")
        if name in self._held_outputs():
            raise Refused(f"output {name}", "is still mounted in a live sandbox; close it first")
        source = outputs.open_live(self.live_fd, name)
        try:
            inventory, files, directories, size = outputs.seal_copy(
                source, self.outputs_fd, name, shown=f"{self.stage_path}/{outputs.LIVE}/{name}"
            )
        finally:
            os.close(source)
        data, _ = documents.encode(inventory)
        digest = documents.keep(self.documents_fd, data, shown=f"{self.stage_path}/{documents.DOCUMENTS}")
        self._unmount(name)
        sealed = api.Sealed(name, f"sha256:{digest}", files, directories, size)
        self.sealed[name] = sealed
        return sealed

    def _unmount(self, name: str) -> None:
        outputs.unmount_live(self.live_fd, name, target=f"{self.stage_path}/{outputs.LIVE}/{name}", ledger=self.ledger)
        del self.live[name]

    def open_output(self, name: str) -> int:
        """A read-only descriptor of a sealed output, for the client (which closes it)."""
        self._usable()
        if name not in self.sealed:
            raise Refused(f"output {name}", "is not a sealed output of this session")
        return outputs.open_sealed(self.outputs_fd, name)

    @_room_checked
    def publish(self, name: str, data: bytes) -> None:
        """Store an evidence file (a receipt) in the stage, created once (E4); it travels with the tombstone."""
        self._usable()
        if type(name) is not str or not api.EVIDENCE_NAME.match(name) or name in (JOURNAL_NAME, SEAL_NAME):
            raise Refused(f"evidence {name}", api.EVIDENCE_RULE + ", and not journal or seal.json")
        if len(data) > api.MAX_EVIDENCE_BYTES:
            raise Refused(f"evidence {name}", f"is larger than {api.MAX_EVIDENCE_BYTES} bytes")
        stored = os.listdir(self.evidence_fd)
        if len(stored) >= api.MAX_EVIDENCE_FILES and name not in stored:
            raise Refused(f"evidence {name}", f"would be more than {api.MAX_EVIDENCE_FILES} evidence files")
        publish_once(self.evidence_fd, name, data, mode=0o444, shown=f"{self.stage_path}/{EVIDENCE}/{name}")

    # -- sandboxes ----------------------------------------------------------------

    @_room_checked
    def start_sandbox(
        self, *, read: Sequence[str] = (), write: Sequence[str] = (), limits: Limits = Limits(), network: str = api.LOOPBACK,
        index: str | None = None,
    ) -> api.Ready:
        """Start one sandbox: each ``read`` name (a capability or a sealed output) read-only at /cap/NAME,
        each ``write`` name (an unsealed output) writable at /out/NAME. One sandbox is open at a time per session.
        ``network`` is ``loopback`` (S9) or ``index``, which needs the ``index`` URL: the sandbox then gets the
        forwarder to that index and the configured file hosts (steward/forwarder.py) and is named
        ``<stage>-<n>-net``."""
        self._usable()
        if self.sandbox is not None:
            raise Refused("sandbox", "is already open; close it before starting another")
        sandbox, opened = self._launch(read, write, limits, network, index)
        try:
            _complete(sandbox, opened)
        except BaseException:
            self._ended_sandbox(sandbox)
            raise
        self._open(sandbox)
        return self._ready()

    @_room_checked
    def start_ahead(self, *, read: Sequence[str] = (), write: Sequence[str] = (), limits: Limits = Limits()) -> str:
        """Start a loopback sandbox ahead of its op, to be brought to READY on a thread of its own while the
        open sandbox runs its op; :meth:`take_sandbox` then opens it. At most ``ahead`` wait at once
        (Settings.ahead). Its id.

        Everything is checked and reserved now (names, outputs, the lease). With a sandbox open, stage 1 is
        spawned once that sandbox's next op is released (:meth:`run`), so the spawn overlaps the op instead
        of delaying it; with none open, or at the take if no op came first, it is spawned at once. A spawn
        that fails is raised at the take."""
        self._usable()
        if len(self.waiting) >= self.settings.ahead:
            raise Refused("sandbox", f"would be more than {self.settings.ahead} sandboxes started ahead in this session")
        sandbox, opened = self._prepare(read, write, limits, api.LOOPBACK, None)
        self.waiting.append(_Waiting(sandbox, frozenset(write), opened))
        if self.sandbox is None:
            self._spawn_waiting()
        return sandbox.id

    def _spawn_waiting(self) -> None:
        """Spawn, on this thread, each sandbox started ahead that waits for its spawn, and set it completing on
        a thread of its own; a failed spawn is kept for its take."""
        from steward.starter import Background

        for waiting in self.waiting:
            if waiting.completion is not None:
                continue
            try:
                self._spawn(waiting.sandbox)
            except Exception as failure:
                for fd in waiting.opened:
                    os.close(fd)
                waiting.completion = _LaunchFailed(failure)
                continue
            waiting.completion = Background(_complete, waiting.sandbox, waiting.opened, name=f"casebox-ahead-{waiting.sandbox.id}")

    @_room_checked
    def take_sandbox(self) -> api.Ready:
        """Open the oldest sandbox started ahead, once it is READY; its start's failure is raised here."""
        self._usable()
        if self.sandbox is not None:
            raise Refused("sandbox", "is already open; close it before taking another")
        if not self.waiting:
            raise Refused("sandbox", "none was started ahead; start one first")
        self._spawn_waiting()
        # Left in the queue until READY or its failure, so an interrupted wait leaves it for the session's end.
        waiting = self.waiting[0]
        failure = waiting.completion.join()
        self.waiting.popleft()
        if failure is not None:
            self._ended_sandbox(waiting.sandbox)
            raise failure
        self._open(waiting.sandbox)
        return self._ready()

    def _launch(self, read, write, limits: Limits, network: str, index: str | None):
        """Check a start, take the lease if no sandbox holds it yet, and spawn stage 1 on this thread."""
        sandbox, opened = self._prepare(read, write, limits, network, index)
        try:
            self._spawn(sandbox)
        except BaseException:
            for fd in opened:
                os.close(fd)
            self._note_outer(sandbox)
            self._release_idle_lease()
            raise
        return sandbox, opened

    def _spawn(self, sandbox) -> None:
        """Spawn a prepared sandbox's stage 1 on this thread; S6 passes over the session's other live sandboxes
        as they are now (one started since this start was asked for, or opened fresh after a failed take,
        runs as the pair too)."""
        others = tuple(live.id for live in self._live_sandboxes() if live is not sandbox)
        sandbox.spec = dataclasses.replace(sandbox.spec, beside=others)
        sandbox.launch()

    def _prepare(self, read, write, limits: Limits, network: str, index: str | None):
        """Check a start and take the lease if no sandbox holds it yet: the sandbox, not yet spawned, and the
        descriptors opened for it."""
        from steward.forwarder import Destinations
        from steward.starter import Sandbox, Spec

        if network not in api.NETWORKS:
            raise Refused("network", f"must be one of {', '.join(api.NETWORKS)}")
        if (index is not None) != (network == api.INDEX_NETWORK):
            raise Refused("index", f"is given with the {api.INDEX_NETWORK} network, and only with it")
        destinations = None if index is None else Destinations.of(index, self.settings.index_file_hosts)
        names = list(read) + list(write)
        if len(set(names)) != len(names):
            raise Refused("sandbox", "names one capability or output twice")
        for name in read:
            if name not in self.capabilities and name not in self.sealed:
                raise Refused(f"read {name}", "is not a capability or a sealed output of this session")
        for name in write:
            if name not in self.live:
                raise Refused(f"write {name}", "is not an unsealed output of this session")
            if name in self._held_outputs():
                raise Refused(f"write {name}", "is another live sandbox's output")
        opened: list[int] = []
        try:
            if self.lease is None:
                self.lease = self.root.lease(self.uid, wait_seconds=self.settings.lease_seconds, stop=self.steward.stopping)
            capabilities, mounts = [], []
            for name in read:
                fd = self.capabilities[name] if name in self.capabilities else outputs.open_sealed(self.outputs_fd, name)
                if name not in self.capabilities:
                    opened.append(fd)
                if name in self.mounts:
                    mounts.append((self.mounts[name], fd))
                else:
                    capabilities.append((name, fd))
            writable = []
            for name in write:
                fd = outputs.open_live(self.live_fd, name)
                opened.append(fd)
                writable.append((name, fd))
            self.sandboxes += 1
            spec = Spec(
                self.uid, self.gid, tuple(capabilities), limits, tuple(writable), network, tuple(mounts),
                destinations, (), self.settings.ahead, executables=() if self.interpreter is None else (self.interpreter,),
            )
            suffix = NETWORK_SANDBOX_SUFFIX if network == api.INDEX_NETWORK else ""
            sandbox = Sandbox(spec, self.ledger, self.root, f"{self.stage_id}-{self.sandboxes}{suffix}")
        except BaseException:
            for fd in opened:
                os.close(fd)
            self._release_idle_lease()
            raise
        return sandbox, opened

    def _open(self, sandbox) -> None:
        self.sandbox = sandbox
        self.sandbox_outputs = {name for name, _ in sandbox.spec.outputs}

    def _ready(self) -> api.Ready:
        return api.Ready(self.sandbox.id, self.ledger.head, dict(self.sandbox.ready), self.sandbox.spec.network)

    def _live_sandboxes(self) -> list:
        return ([] if self.sandbox is None else [self.sandbox]) + [waiting.sandbox for waiting in self.waiting]

    def _held_outputs(self) -> set[str]:
        return set(self.sandbox_outputs).union(*(waiting.outputs for waiting in self.waiting))

    def _ended_sandbox(self, sandbox) -> None:
        """A sandbox of this session is torn down: keep its outer claim; the lease goes with the last one."""
        self._note_outer(sandbox)
        self._release_idle_lease()

    def _release_idle_lease(self) -> None:
        if self.lease is not None and self.sandbox is None and not self.waiting:
            self.lease.release()
            self.lease = None

    def _note_outer(self, sandbox) -> None:
        """Keep the C3 claim the starter made at teardown on a sandbox's outer group, if it ever had one."""
        if sandbox.outer_pgid:
            self.outer.append((sandbox.id, sandbox.outer_pgid, bool(sandbox.outer_absent)))

    @_room_checked
    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str = "/work",
        timeout_ms: int,
        stdout_cap: int,
        stderr_cap: int,
    ) -> api.OpOutcome:
        """Run one op in the open sandbox; its identity is durable before it is released (J1)."""
        self._usable()
        if self.sandbox is None:
            raise Refused("op", "needs an open sandbox; start one first")
        sandbox = self.sandbox
        try:
            observation = sandbox.run(
                list(argv), env=dict(env), cwd=cwd, timeout_ms=timeout_ms, stdout_cap=stdout_cap, stderr_cap=stderr_cap,
                while_running=self._spawn_waiting,
            )
        except SandboxFailure:
            self._closed_sandbox()
            raise
        pid, starttime, pgid = self.ledger.identities[observation.op_id]
        return api.OpOutcome(
            sandbox=sandbox.id, op_id=observation.op_id, pid=pid, starttime=starttime, pgid=pgid, observation=observation,
            terminal_head=self.ledger.terminal_heads[observation.op_id], head=self.ledger.head,
            filter_digest=sandbox.ready["filter_digest"].hex(),
        )

    @_room_checked
    def close_sandbox(self) -> str:
        """Shut the open sandbox down: its pid 1 and outer group are reaped and claimed (C3); the journal head."""
        self._usable()
        if self.sandbox is None:
            raise Refused("sandbox", "is not open")
        try:
            self.sandbox.close()
        finally:
            self._closed_sandbox()
        return self.ledger.head

    def _closed_sandbox(self) -> None:
        """After the starter's teardown of the open sandbox (by close or by failure)."""
        sandbox, self.sandbox = self.sandbox, None
        self.sandbox_outputs = set()
        if sandbox is not None:
            self._ended_sandbox(sandbox)

    # -- the end --------------------------------------------------------------------

    @_room_checked
    def close(self, evidence_fd: int | None = None) -> api.Closed:
        """Cleanup, CLEANUP_EVIDENCE, retirement into a sealed tombstone, then the export into ``evidence_fd``.

        The export writes ``journal`` (a byte copy of the tombstone's),
        ``seal.json`` and every stored evidence file, each created once
        (E4). ``evidence_fd`` stays the caller's.
        """
        if evidence_fd is not None:
            self._check_evidence_directory(evidence_fd)
        try:
            closed = self._end("CLOSED")
            if evidence_fd is not None:
                closed = dataclasses.replace(closed, exported=self._export(evidence_fd))
        finally:
            self._close_single()
        return closed

    def abandon(self) -> api.Closed:
        """The client went away: clean up and retire all the same; the session is UNVERIFIED (SESSION_ABANDONED)."""
        return self.end("ABANDONED")

    @_room_checked
    def end(self, ending: str) -> api.Closed:
        """End the session without its client's CLOSE: cleaned up and retired all the same, UNVERIFIED.

        ``ending`` is ABANDONED (the client went away), IDLE (it sent
        nothing for the daemon's idle timeout), SHUTDOWN (the daemon
        stopped), INTERRUPTED (an embedded client was interrupted) or
        RUNTIME_CHANGED (the client found the case runtime changed under its
        receipts, and asked for this end: api.CLIENT_ENDINGS); steward/fold.py
        gives each its diagnostic.
        """
        if ending not in ENDINGS:
            raise ValueError(f"{ending!r} is not one of {ENDINGS}")
        try:
            return self._end(ending)
        finally:
            self._close_single()

    def interrupt(self) -> api.Closed:
        """The client was interrupted (SIGINT, SIGTERM) and ends the session on its way out: clean up and
        retire all the same; the session is UNVERIFIED (INTERRUPTED), never read as a failed proof."""
        return self.end("INTERRUPTED")

    def halt(self) -> None:
        """The daemon is stopping: SIGKILL the op that runs now, and any op started after (from another thread).

        The one call that may come while another call runs; the op's own end
        is then observed, recorded and reported as always.
        """
        self.ledger.halt()

    def _close_single(self) -> None:
        """An embedded steward exists for its one session: close it once the session has ended (after the export)."""
        if self.single and self.ended:
            self.steward.close()

    def _check_evidence_directory(self, fd: int) -> None:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode):
            raise Refused("evidence directory", "must be a directory descriptor")
        if self.client_uid is not None and info.st_uid != self.client_uid:
            raise Refused("evidence directory", f"is owned by uid {info.st_uid}; it must be the client's own (uid {self.client_uid})")

    def _end(self, ending: str) -> api.Closed:
        with self._lock:
            self._usable()
            self.ended = True
        try:
            self._take_down()
            result = cleanup.Cleaner(
                root=self.root, area=STAGES, stage_id=self.stage_id, stage_fd=self.stage_fd,
                documents_fd=self.documents_fd, writer=self.ledger, uid=self.uid, gid=self.gid,
                lease_seconds=self.settings.lease_seconds, reaper="steward", ending=ending,
                timing=self.settings.timing, command=self.settings.helper_command,
                handles=self.ledger.handles, outer=self.outer, hook=self.hook,
            ).clean()
            text = retirement.note(ending, result.diagnostic)
            head = retirement.retire(self.root, self.stage_id, self.ledger, text, self.hook)
            reading = cleanup.read_own_journal(self.stage_fd, self.stage_id, head)
            self.writer.close()
            retirement.seal(self.root, self.stage_id, retirement.marker_for(reading), self.hook)
        finally:
            self._release()
        return api.Closed(
            stage_id=self.stage_id, journal_id=self.journal_id, attempt_id=self.attempt_id, head=head,
            tombstone=self.root.path_of(TOMBSTONES, self.stage_id), cleanup=result.outcome,
            diagnostic=result.diagnostic, exported=(),
        )

    def _take_down(self) -> None:
        """Close the open sandbox and unmount every unsealed output, each attempted whatever failed before it
        (an unmount still records its intent first, J1); then the first failure is raised."""
        failures: list[BaseException] = []
        if self.sandbox is not None:
            try:
                self.sandbox.close()
            except Exception as error:
                failures.append(error)
            finally:
                self._closed_sandbox()
        # C9: a sandbox started ahead and never taken is closed here, its records in this journal.
        while self.waiting:
            waiting = self.waiting.popleft()
            try:
                if waiting.completion is None:
                    # Never spawned: nothing ran, nothing was recorded; only its descriptors are left.
                    for fd in waiting.opened:
                        os.close(fd)
                elif waiting.completion.join() is None:
                    waiting.sandbox.close()
            except Exception as error:
                failures.append(error)
            finally:
                self._ended_sandbox(waiting.sandbox)
        for name in list(self.live):
            try:
                self._unmount(name)
            except Exception as error:
                failures.append(error)
        if failures:
            raise failures[0]

    def _release(self) -> None:
        """Close every descriptor the session owns, each exactly once."""
        for fd in self.capabilities.values():
            os.close(fd)
        self.capabilities = {}
        if self.interpreter is not None:
            os.close(self.interpreter[1])
            self.interpreter = None
        for fd in (self.documents_fd, self.live_fd, self.outputs_fd, self.evidence_fd, self.stage_fd):
            if fd >= 0:
                os.close(fd)
        self.documents_fd = self.live_fd = self.outputs_fd = self.evidence_fd = self.stage_fd = -1
        self.ledger.close()
        self.writer.close()
        if self.binding is not None:
            self.binding.release()

    def _export(self, evidence_fd: int) -> tuple[str, ...]:
        tombstone = open_directory_at(self.root.area(TOMBSTONES), self.stage_id, self.root.path_of(TOMBSTONES, self.stage_id))
        try:
            files = [JOURNAL_NAME, SEAL_NAME]
            stored = open_directory_at(tombstone, EVIDENCE, f"{self.root.path_of(TOMBSTONES, self.stage_id)}/{EVIDENCE}")
            try:
                names = sorted(os.listdir(stored))
                contents = [(name, _read_file(tombstone, name)) for name in files]
                contents += [(name, _read_file(stored, name)) for name in names]
            finally:
                os.close(stored)
        finally:
            os.close(tombstone)
        try:
            for name, data in contents:
                publish_once(evidence_fd, name, data, mode=0o444, shown=f"evidence directory/{name}")
        except OSError as error:
            # The client's directory, not the state root: the stage itself is sealed by now.
            raise SandboxFailure(
                f"the evidence could not be written into the evidence directory ({error.strerror}); the sealed "
                f"tombstone {self.root.path_of(TOMBSTONES, self.stage_id)} holds it all"
            ) from None
        return tuple(name for name, _ in contents)


def _read_file(directory_fd: int, name: str) -> bytes:
    """A file of the sealed tombstone, whole (the journal up to its cap, evidence up to its own)."""
    data = read_evidence(directory_fd, name, CAP if name == JOURNAL_NAME else api.MAX_EVIDENCE_BYTES)
    if data is None:
        raise Refused(name, "is missing from the tombstone")
    return data


def _execute_only_copy(source: int, stage_fd: int) -> int:
    """The bytes of ``source`` as the stage's root-owned, mode 0111 file; a read-only descriptor of it.

    Created once (O_EXCL), written to the end of ``source`` (at most
    MAX_INTERPRETER_BYTES), then opened again read-only, which root may.
    """
    writer = os.open(INTERPRETER_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o100, dir_fd=stage_fd)
    try:
        os.fchown(writer, 0, 0)
        os.fchmod(writer, INTERPRETER_MODE)
        copied = 0
        while True:
            # sendfile, not copy_file_range: the source is the host's, and the state root may be another filesystem.
            chunk = os.sendfile(writer, source, copied, 1 << 24)
            if chunk == 0:
                break
            copied += chunk
            if copied > MAX_INTERPRETER_BYTES:
                raise Refused("interpreter", f"is more than {MAX_INTERPRETER_BYTES} bytes")
    finally:
        os.close(writer)
    return os.open(INTERPRETER_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stage_fd)

