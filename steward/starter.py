"""The starter: the root side of one sandbox (docs/launcher.md, docs/launcher-protocol.md).

It provisions the launcher (S1), starts it blocked, serves the rendezvous
(S2), hands over the setup and the capability descriptors, and from then on
answers the launcher's leaves. Its J1 duty: it calls the intent ledger, and
waits for the record to be durable, before it releases a blocked process
(the launcher's nonce, pid 1's release, an op child's release) and before it
ACKs a mount or unmount. It reaps the two processes it is the parent of, the
launcher's first stage and the sandbox's pid 1, by pid, and records their raw
wait statuses; op statuses come from pid 1, their parent.

The outer process group is stage 1's group, which pid 1 joins through
CLONE_PARENT. At teardown the starter alone claims it absent, and only after
three steps in order (C3): a pidfd shows each member it is the parent of is a
zombie (``waitid(P_PIDFD, WEXITED|WNOWAIT)``, so no pid of the group can be
reused), a descriptor-relative procfs scan finds no other member, and then
those exact children are reaped. It never calls ``waitpid(-1)``.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import os
import secrets
import select
import signal
import socket
import subprocess
import threading
from typing import Callable

from journal.errors import Refused
from launcher import drop, limits, protocol, seccomp, seqpacket, vocabulary
from launcher.kernel import OOM_SCORE_ADJ_MAX
from launcher.environment import forbidden_variable
from launcher.protocol import Channel, ProtocolError
from steward import cgroups, dedicated, procfs, provision
from steward.api import INDEX_NETWORK, LOOPBACK, NETWORKS, Limits, OpNotStarted, OpResult
from steward.failure import SandboxFailure
from steward.forwarder import Destinations, Forwarder
from steward.ledger import IntentLedger
from steward.log import log
from steward.interpreter import open_runtime
from steward.stateroot import StateRoot

HOSTNAME = "casebox"
BOOTSTRAP_SECONDS = 20.0
REPORT_GRACE_SECONDS = 10.0
SHUTDOWN_SECONDS = 5.0
_STDERR_TAIL = 2000
# The launcher's own, never the steward's: pid 1 makes the sandbox's mount points and root directories with it,
# and every op inherits it. Under the unit's UMask=0077 an inherited one left /cap unreadable to the dedicated
# uid, so no op could import anything from a capability.
SANDBOX_UMASK = 0o022


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a sandbox gets. Each capability and output is (NAME, directory descriptor); the caller keeps
    ownership of the descriptors. A capability is mounted read-only at /cap/NAME, an output writable (nosuid,
    nodev, noexec) at /out/NAME. ``mounts`` are (PATH, descriptor): capabilities mounted read-only at a path
    of their own, the one they have on the host (a case runtime's prefix; launcher.rendezvous.is_mount_target).
    ``executables`` are (PATH, file descriptor): execute-only files mounted over the file at PATH inside /usr or
    a mount (the session's interpreter; launcher.rendezvous.is_executable_target).
    Every sandbox has a network namespace of its own with only lo (S9); ``network`` ``index`` adds the
    forwarder to ``destinations`` (steward/forwarder.py: only the resolver and fetch of a network index),
    ``loopback`` nothing."""

    uid: int
    gid: int
    capabilities: tuple[tuple[str, int], ...] = ()
    limits: Limits = Limits()
    outputs: tuple[tuple[str, int], ...] = ()
    network: str = LOOPBACK
    mounts: tuple[tuple[str, int], ...] = ()
    destinations: Destinations | None = None
    # The session's other sandboxes that may run as the same pair beside this one (one open while others start
    # ahead, docs/launcher.md): ``beside`` names those live at its start, whose processes S6 tolerates;
    # ``companions`` counts how many pid 1s of them may live at once, which its RLIMIT_NPROC leaves room for.
    beside: tuple[str, ...] = ()
    companions: int = 0
    executables: tuple[tuple[str, int], ...] = ()


def op_class(reported: str, before: cgroups.Counters, after: cgroups.Counters) -> str:
    """An op's limit class (S10, S14): the launcher's, and MEMORY or PIDS where the cgroup counted an event.

    An OOM kill names MEMORY whatever the exit. A charge that failed at the
    memory cap (a thread, a buffer or a tmpfs page the cap refused) names
    MEMORY for an op that did not end OK: the sandbox's own limit is never
    the candidate's failure. A class the launcher may not report is a
    protocol failure, never left to the priority order, where an unknown name
    would read as OK.
    """
    if reported not in vocabulary.LAUNCHER_CLASSES:
        raise ProtocolError(f"OP_RESULT names the limit class {reported!r}, not one of {', '.join(vocabulary.LAUNCHER_CLASSES)}")
    observed = {reported}
    if after.oom_kills > before.oom_kills or (reported != "OK" and after.memory_failures > before.memory_failures):
        observed.add("MEMORY")
    if after.pids_refused > before.pids_refused:
        observed.add("PIDS")
    return limits.worst(observed)


def _reap(pid: int, seconds: float) -> int:
    """The raw wait status of our child ``pid``; SIGKILL first if it has not ended within ``seconds``."""
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], seconds)[0]:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(pidfd)
    return os.waitpid(pid, 0)[1]


def _group_of(pid: int) -> int | None:
    try:
        return procfs.identity(pid).pgid
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise


def _await_zombie(pid: int, seconds: float) -> int | None:
    """A pidfd of our child ``pid`` once it is a zombie (SIGKILLed if it outlives ``seconds``), or None.

    ``waitid(P_PIDFD, WEXITED|WNOWAIT)`` confirms the exit and leaves the
    zombie in place, so its pid, and the group it belongs to, cannot be reused
    before the caller reaps it.
    """
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], seconds)[0]:
            os.kill(pid, signal.SIGKILL)
            if not select.select([pidfd], [], [], SHUTDOWN_SECONDS)[0]:
                os.close(pidfd)
                return None
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd


class Background:
    """``function(*arguments)`` on a thread of its own; ``join`` waits and returns what it raised, if anything.

    It waits on an event, not Thread.join: CPython 3.11's join, interrupted by Ctrl-C at the wrong moment,
    marks a thread that still runs as ended (bpo-45274's fix), and a teardown would then run beside it.
    """

    def __init__(self, function, *arguments, name: str = "casebox-starter") -> None:
        self._failure: BaseException | None = None
        self._done = threading.Event()

        def run() -> None:
            try:
                function(*arguments)
            except BaseException as error:
                self._failure = error
            finally:
                self._done.set()

        threading.Thread(target=run, name=name, daemon=True).start()

    def join(self) -> BaseException | None:
        self._done.wait()
        return self._failure


class Sandbox:
    """One READY sandbox; ``run`` one op at a time, then ``close``.

    ``state_root`` is an open :class:`StateRoot` or the path of one; ``sandbox_id``
    names the sandbox's op ids, staging files and cgroup (random when not given).
    """

    def __init__(self, spec: Spec, ledger: IntentLedger, state_root: StateRoot | str, sandbox_id: str | None = None) -> None:
        self.spec = spec
        self.ledger = ledger
        self.state_root = state_root
        self.id = sandbox_id or secrets.token_hex(8)
        self.channel: Channel | None = None
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.op_cgroup_fd = -1
        self.op_counters: cgroups.Counters | None = None
        self.staging_fd = -1
        self.launcher_name = f"launcher-{self.id}.pyc"
        self.socket_name = f"rendezvous-{self.id}.sock"
        self.forwarder: Forwarder | None = None
        self.outer_launcher: subprocess.Popen | None = None
        self.unreaped: dict[int, str] = {}
        self.init_pid = 0
        # pid 1's network namespace, opened at the handover and closed when the bootstrap ends (S9).
        self.init_netns_fd = -1
        self.ops = 0
        self.mount_ops = 0
        self.pending_mounts: dict[tuple[str, str, str], str] = {}
        self.nonce: bytes | None = None
        self.hidepid = False
        self.launcher_stderr = ""
        self.outer_pgid = 0
        # None until teardown; then True only if the outer group was proved absent (C3).
        self.outer_absent: bool | None = None
        self.ready: dict | None = None
        # Held from the launch to the end of the bootstrap only.
        self.usr_fd = -1
        self.runtime = None
        self.digest = b""
        self.listener: socket.socket | None = None
        self.attaching: Background | None = None
        # Ledger failures during teardown, raised once the teardown is done.
        self.unrecorded: list[Exception] = []
        if spec.network not in NETWORKS:
            raise ValueError(f"network must be one of {NETWORKS}")
        if (spec.destinations is not None) != (spec.network == INDEX_NETWORK):
            raise ValueError("an index network needs its destinations, and only it has any")

    # -- start -----------------------------------------------------------

    @classmethod
    def start(
        cls, spec: Spec, *, ledger: IntentLedger, state_root: StateRoot | str, sandbox_id: str | None = None
    ) -> "Sandbox":
        """Provision, start and bootstrap a sandbox up to READY; nothing is left behind on failure."""
        sandbox = cls(spec, ledger, state_root, sandbox_id)
        sandbox.boot()
        return sandbox

    def boot(self) -> None:
        """Bring this sandbox up to READY; on failure everything is torn down (and the outer group claimed, C3)."""
        self.launch()
        self.complete()

    def launch(self) -> None:
        """The first half of :meth:`boot`, on the thread that owns the session: stage 1 is spawned and recorded.

        pid 1 is the child of the thread that spawned stage 1 (CLONE_PARENT), and its parent-death signal
        follows that thread (prctl(2)), so the spawn happens on the thread that lives as long as the session;
        :meth:`complete` may then run on any thread (a sandbox started ahead, docs/launcher.md).
        """
        self._failing_closed(self._launch)

    def complete(self) -> None:
        """The second half of :meth:`boot`: S6, stage 1's release, the rendezvous and the bootstrap, to READY."""
        self._failing_closed(self._complete)

    def _failing_closed(self, step) -> None:
        """Run one half of the boot; on any failure, the boot's descriptors closed and the sandbox torn down."""
        try:
            step()
        except BaseException as error:
            self._close_boot_descriptors()
            self._teardown()
            if isinstance(error, ProtocolError):
                raise SandboxFailure(self._explain(error)) from None
            raise

    def _op_id(self, what: str) -> str:
        return f"{self.id}.{what}"

    def _launch(self) -> None:
        self.usr_fd = os.open("/usr", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.runtime = open_runtime()
        data, self.digest = provision.shipped()
        self.staging_fd, root_path = provision.open_staging(self.state_root)
        shown = os.path.join(root_path, provision.STAGING, self.launcher_name)
        provision.provision(self.staging_fd, self.launcher_name, data, shown=shown)
        launcher_fd = provision.open_verified(self.staging_fd, self.launcher_name, self.digest, shown=shown)
        try:
            self.listener = self._listen()
            self._spawn(self.runtime.interpreter, launcher_fd)
        finally:
            os.close(launcher_fd)

    def _complete(self) -> None:
        self._release_stage_one()
        connection = self._accept(self.listener)
        self._close_listener()
        self.channel = Channel(connection, protocol.STARTER)
        self._hello()
        trees = [
            ("CAPABILITY", self.usr_fd, "/usr"),
            *(("CAPABILITY", fd, f"/cap/{name}") for name, fd in self.spec.capabilities),
            *(("CAPABILITY", fd, path) for path, fd in self.spec.mounts),
            *(("OUTPUT", fd, f"/out/{name}") for name, fd in self.spec.outputs),
            *(("EXECUTABLE", fd, path) for path, fd in self.spec.executables),
        ]
        self._setup(self.digest, provision.shipped_filter(), self.runtime, trees)
        self._close_boot_descriptors()
        self._bootstrap()

    def _close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            os.unlink(self.socket_name, dir_fd=self.staging_fd)

    def _close_boot_descriptors(self) -> None:
        """What only the boot needs: the rendezvous listener, /usr and the runtime's descriptors (and, on a
        failed launch, the wait for stage 1's move into the cgroups)."""
        attaching, self.attaching = self.attaching, None
        if attaching is not None:
            attaching.join()
        self._close_listener()
        if self.usr_fd >= 0:
            os.close(self.usr_fd)
            self.usr_fd = -1
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

    def _listen(self) -> socket.socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            listener.bind(f"/proc/self/fd/{self.staging_fd}/{self.socket_name}")
            listener.listen(1)
            listener.settimeout(BOOTSTRAP_SECONDS)
        except BaseException:
            listener.close()
            raise
        return listener

    def _spawn(self, interpreter: str, launcher_fd: int) -> None:
        """Start stage 1 blocked on its nonce; record it, admit the session, then release it with the nonce."""
        self.nonce = secrets.token_bytes(protocol.NONCE_BYTES)
        self._make_cgroup()
        birthplace = self.cgroup.open_birthplace()
        handed = () if birthplace is None else (birthplace,)
        try:
            process = subprocess.Popen(
                [interpreter, "-I", "-S", f"/proc/self/fd/{launcher_fd}", "stage1", str(self.staging_fd),
                 self.socket_name, *map(str, handed)],
                executable=interpreter,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(launcher_fd, self.staging_fd, *handed),
                env={},
                cwd="/",
                start_new_session=True,
                umask=SANDBOX_UMASK,
            )
        finally:
            for fd in handed:
                os.close(fd)
        self.outer_launcher = process
        self.unreaped[process.pid] = self._op_id("launcher")
        # While stage 1's interpreter starts (it then waits for the nonce):
        # on v1 its move into the cgroups, on a thread because the move mostly
        # waits in the kernel (an RCU grace period, about 10 ms) and releases
        # nothing (so it needs no intent), beside its durable record and S6,
        # checked before anything runs as the dedicated ids.
        self.attaching = None if birthplace is not None else Background(self.cgroup.attach, process.pid)
        found = procfs.identity(process.pid)
        self.outer_pgid = found.pgid
        self.ledger.process_intent(self._op_id("launcher"), "launcher", found.pid, found.starttime, found.pgid)

    def _release_stage_one(self) -> None:
        """S6 before anything can run as the dedicated ids (no process but the session's own sandboxes' uses
        them), stage 1 in its cgroups, then its release with the nonce."""
        try:
            dedicated.require_unused(self.spec.uid, self.spec.gid, beside=self.spec.beside)
        finally:
            attaching, self.attaching = self.attaching, None
            failure = None if attaching is None else attaching.join()
        if failure is not None:
            raise failure
        self.outer_launcher.stdin.write(self.nonce)
        self.outer_launcher.stdin.close()
        self.ledger.process_released(self._op_id("launcher"))

    def _make_cgroup(self) -> None:
        """The sandbox's own cgroups (S14); pid 1 is born in the sandbox's (cloned into it on v2, the clone of a
        stage 1 moved there while still blocked on v1), and pid 1 gets the ops cgroup as a descriptor. Without
        the controllers there is no memory cap, so there is no sandbox."""
        hierarchy = cgroups.detect()
        if hierarchy is None:
            raise SandboxFailure(
                "this host has no cgroup memory and pids controllers, and casebox caps an op's memory and processes "
                "only there (S14); enable them (cgroup v2, or the v1 memory and pids hierarchies)"
            )
        self.cgroup = cgroups.SandboxCgroup.create(
            hierarchy, cgroups.sandbox_name(self.id), memory_bytes=self.spec.limits.memory_bytes,
            pids_max=self.spec.limits.processes + 1,
        )
        self.op_cgroup_fd = self.cgroup.open_ops()

    def _accept(self, listener: socket.socket) -> socket.socket:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            raise ProtocolError("the launcher did not connect in time") from None
        pid, uid, _ = seqpacket.peer_credentials(connection)
        if uid != 0 or pid != self.outer_launcher.pid:
            connection.close()
            raise ProtocolError(f"the rendezvous peer is pid {pid} uid {uid}, not the launcher (pid {self.outer_launcher.pid}, uid 0)")
        seqpacket.force_send_buffer(connection)
        connection.settimeout(BOOTSTRAP_SECONDS)
        return connection

    def _hello(self) -> None:
        message = self.channel.receive("HELLO")
        nonce, self.nonce = self.nonce, None
        if message.fields["version"] != protocol.VERSION:
            raise ProtocolError(f"the launcher speaks {message.fields['version']!r}, not {protocol.VERSION!r}")
        if nonce is None or not hmac.compare_digest(message.fields["nonce"], nonce):
            raise ProtocolError("the launcher's nonce is wrong")
        self.channel.ack(message)

    def _setup(self, digest: bytes, program: bytes, runtime, trees: list[tuple[str, int, str]]) -> None:
        spec, caps = self.spec, self.spec.limits
        self.channel.leaf(
            "SETUP",
            digest=digest,
            uid=spec.uid,
            gid=spec.gid,
            hostname=HOSTNAME,
            tmp_bytes=caps.tmp_bytes,
            work_bytes=caps.work_bytes,
            # One above the cgroup's pids.max (which counts pid 1 too) and the pid 1s of the sandboxes beside
            # it (the kernel counts every process of the uid), so the cgroup refuses the fork first and counts it.
            rlimit_nproc=caps.processes + 2 + spec.companions,
            rlimit_nofile=caps.files,
            rlimit_fsize=caps.file_size,
            seccomp_program=program,
        )
        self.channel.leaf("IMPORT_DIR", (runtime.import_dir_fd,))
        self.channel.leaf("INTERPRETER", (runtime.interpreter_fd,), path=runtime.interpreter)
        self.channel.leaf("OP_CGROUP", (self.op_cgroup_fd,))
        for message, fd, target in trees:
            self.channel.leaf(message, (fd,), target=target)
        self.channel.leaf("SETUP_END")

    def _bootstrap(self) -> None:
        """Answer the launcher's leaves until READY."""
        try:
            self._bootstrap_leaves()
        finally:
            if self.init_netns_fd >= 0:
                os.close(self.init_netns_fd)
                self.init_netns_fd = -1

    def _bootstrap_leaves(self) -> None:
        while True:
            message = self.channel.receive(
                "MOUNT_INTENT", "MOUNT_DONE", "UNMOUNT_INTENT", "UNMOUNT_DONE", "CHILD", "READY"
            )
            if message.name == "CHILD":
                self._handover(message)
            elif message.name == "READY":
                observations = dict(message.fields)
                observations.pop("proc_hidepid")
                try:
                    drop.check(observations, self.spec.uid, self.spec.gid)
                    seccomp.check(observations, seccomp.inherited_filters())
                except (drop.DropError, seccomp.FilterError) as error:
                    raise ProtocolError(str(error)) from None
                if self.init_netns_fd < 0:
                    raise ProtocolError("READY came before stage 1 handed pid 1 over")
                if procfs.shares_network_namespace(self.init_netns_fd):
                    # S9: no op ever runs in the host's network namespace.
                    raise ProtocolError("pid 1 shares the steward's network namespace; every sandbox has its own")
                if self.spec.network == INDEX_NETWORK:
                    try:
                        self.forwarder = Forwarder.open(self.init_netns_fd, self.spec.destinations, name=self.id, log=log)
                    except OSError as error:
                        raise ProtocolError(f"the forwarder cannot listen in the sandbox's network namespace: {error}") from None
                self.hidepid = message.fields["proc_hidepid"]
                self.ready = dict(message.fields)
                # The filter every op will run under is durable before any op can be sent (S12, J1).
                self.ledger.sandbox_ready(self._op_id("init"), message.fields["filter_digest"].hex())
                self.channel.ack(message)
                self.channel.sock.settimeout(None)
                return
            else:
                self._mount_record(message)

    def _mount_record(self, message) -> None:
        target, kind = message.fields["target"], message.fields["kind"]
        if message.name.endswith("_INTENT"):
            self.mount_ops += 1
            op_id = self._op_id(f"mount-{self.mount_ops}")
            key = (message.name.removesuffix("_INTENT"), target, kind)
            if key in self.pending_mounts:
                raise ProtocolError(f"{message.name} for {target} repeats an open intent")
            self.pending_mounts[key] = op_id
            record = self.ledger.mount_intent if message.name == "MOUNT_INTENT" else self.ledger.unmount_intent
        else:
            key = (message.name.removesuffix("_DONE"), target, kind)
            op_id = self.pending_mounts.pop(key, None)
            if op_id is None:
                raise ProtocolError(f"{message.name} for {target} has no intent before it")
            record = self.ledger.mount_done if message.name == "MOUNT_DONE" else self.ledger.unmount_done
        record(op_id, target, kind)
        self.channel.ack(message)

    def _handover(self, message) -> None:
        """Stage 1 started pid 1 as our child: record it, reap stage 1, then release pid 1."""
        pid = message.fields["pid"]
        found = procfs.identity(pid)
        if found.ppid != os.getpid() or procfs.namespace_pids(pid)[-1] != 1:
            raise ProtocolError(f"process {pid} is not our child and pid 1 of a new namespace")
        self.init_pid = pid
        # Opened now, while pid 1 has root's credentials and is dumpable: after its drop only CAP_SYS_PTRACE
        # could open it, which the unit's bounding set leaves out (issue 12). pid 1 is blocked until our ack.
        self.init_netns_fd = procfs.open_network_namespace(pid)
        self.unreaped[pid] = self._op_id("init")
        self.ledger.process_intent(self._op_id("init"), "namespace", found.pid, found.starttime, found.pgid)
        outer_launcher = self.outer_launcher.pid
        status = _reap(outer_launcher, BOOTSTRAP_SECONDS)
        del self.unreaped[outer_launcher]
        self.outer_launcher.returncode = os.waitstatus_to_exitcode(status)
        self.ledger.process_terminal(self._op_id("launcher"), status, "steward")
        if status != 0:
            raise ProtocolError(f"the launcher's first stage ended with wait status {status:#x}")
        self.channel.ack(message)
        self.ledger.process_released(self._op_id("init"))

    # -- ops ---------------------------------------------------------------

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str = "/work",
        timeout_ms: int,
        stdout_cap: int,
        stderr_cap: int,
        while_running: Callable[[], None] | None = None,
    ) -> OpResult | OpNotStarted:
        """Run one exec op; its identity is durable before it is released. ``while_running`` is called on this
        thread once the op is released, before its result is awaited (where a session spawns the sandboxes
        started ahead); it must not raise.

        S7: no ``GIT_*`` variable and nothing named like a credential enters
        the op, whoever built its environment (a refusal, before anything runs).
        """
        for name in sorted(env):
            if forbidden_variable(name):
                raise Refused(f"op environment {name}", "GIT_* variables and credentials never enter a sandbox (S7)")
        if self.channel is None:
            raise SandboxFailure("the sandbox is closed")
        try:
            return self._run(argv, env, cwd, timeout_ms, stdout_cap, stderr_cap, while_running)
        except ProtocolError as error:
            limit = self._lost_op_class()
            self._teardown()
            raise SandboxFailure(self._explain(error), limit) from None

    def _lost_op_class(self) -> str | None:
        """S14: pid 1 died under an op while the sandbox's cgroups counted an OOM kill: the op's class is MEMORY,
        whatever else failed. The op's own wait status died with pid 1, so none is claimed."""
        if self.cgroup is None or self.op_counters is None:
            return None
        return "MEMORY" if self.cgroup.counters().oom_kills > self.op_counters.oom_kills else None

    def _run(self, argv, env, cwd, timeout_ms, stdout_cap, stderr_cap, while_running) -> OpResult | OpNotStarted:
        self.ops += 1
        op_id = self._op_id(f"op-{self.ops}")
        self.cgroup.reset_peaks()
        before = self.op_counters = self.cgroup.counters()
        self.channel.sock.settimeout(BOOTSTRAP_SECONDS)
        self.channel.leaf(
            "OP",
            argv=list(argv),
            env=sorted(env.items()),
            cwd=cwd,
            timeout_ms=timeout_ms,
            stdout_cap=stdout_cap,
            stderr_cap=stderr_cap,
        )
        message = self.channel.receive("OP_CHILD")
        try:
            host_pid = procfs.host_pid_of_child(self.init_pid, message.fields["pid"])
            found = procfs.identity(host_pid)
        except (OSError, LookupError) as error:
            raise ProtocolError(f"the op child cannot be identified: {error}") from None
        self.ledger.process_intent(op_id, "descendant", found.pid, found.starttime, found.pgid)
        self._make_killable_first(found)
        self.channel.ack(message)
        self.ledger.process_released(op_id)
        if while_running is not None:
            while_running()
        self.channel.sock.settimeout(timeout_ms / 1000 + REPORT_GRACE_SECONDS)
        message = self.channel.receive("OP_RESULT", "OP_NOT_STARTED")
        fields = message.fields
        self.ledger.process_terminal(op_id, fields["wait_status"], "launcher")
        self.ledger.descendants_terminal(op_id, fields["descendants_reaped"])
        after = self.cgroup.counters()
        memory_peak = self.cgroup.memory_peak()  # every process of the op is reaped: the mark is final
        self.op_counters = None
        self.channel.ack(message)
        self.channel.sock.settimeout(None)
        if message.name == "OP_NOT_STARTED":
            return OpNotStarted(fields["step"], fields["errno"], fields["wait_status"], fields["descendants_reaped"], op_id)
        return OpResult(
            limit=op_class(fields["limit"], before, after),
            wait_status=fields["wait_status"],
            descendants_reaped=fields["descendants_reaped"],
            wall_ms=fields["wall_ms"],
            cpu_ms=fields["cpu_ms"],
            max_rss_kib=fields["max_rss_kib"],
            memory_peak_bytes=memory_peak,
            stdout=fields["stdout"],
            stderr=fields["stderr"],
            stdout_truncated=fields["stdout_truncated"],
            stderr_truncated=fields["stderr_truncated"],
            op_id=op_id,
        )

    @staticmethod
    def _make_killable_first(found: procfs.Identity) -> None:
        """S14: the op child, still blocked on its release, gets the highest OOM score from us, not from itself.

        pid 1 exempted itself (-1000) while it was root, and a child inherits that floor with the score, so a
        score the op set itself it could lower again to -1000 and be spared by the OOM killer. Written by the
        steward, where it holds CAP_SYS_RESOURCE, 1000 is the op's floor too: nothing the op starts can lower
        it. Where the steward lacks that capability pid 1 could not exempt itself either, and the op may go
        down only to the floor it inherited, pid 1's own score."""
        try:
            handle = procfs.ProcessHandle.open(found.pid, found.starttime)
            try:
                handle.set_oom_score(OOM_SCORE_ADJ_MAX)
            finally:
                handle.close()
        except (OSError, LookupError) as error:
            raise ProtocolError(f"the op child's OOM score cannot be set: {error}") from None

    # -- teardown ----------------------------------------------------------

    def close(self) -> None:
        """SHUTDOWN, then reap pid 1 and remove what the sandbox left on the host."""
        if self.channel is not None:
            try:
                self.channel.sock.settimeout(SHUTDOWN_SECONDS)
                self.channel.leaf("SHUTDOWN")
            except ProtocolError:
                pass
        self._teardown()

    def _teardown(self) -> None:
        """Reap every process we are the parent of (killing what still runs) and remove our host state.

        A record that fails here does not stop the teardown (a journal writer
        that failed once refuses every later record, J5): every process is
        still reaped and the cgroup and staging files removed, then the first
        such failure is raised, so a missing record is never silent.
        """
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None
        if self.channel is not None:
            self.channel.sock.close()
            self.channel = None
        if self.outer_launcher is not None and self.outer_launcher.pid in self.unreaped:
            status = _reap(self.outer_launcher.pid, 0)
            del self.unreaped[self.outer_launcher.pid]
            self.outer_launcher.returncode = os.waitstatus_to_exitcode(status)
            self._record(self.ledger.process_terminal, self._op_id("launcher"), status, "steward")
        if self.outer_launcher is not None:
            self._close_outer_group()
        if self.outer_launcher is not None and self.outer_launcher.stderr is not None and not self.outer_launcher.stderr.closed:
            # Every writer (stage 1, pid 1) is reaped, so this read ends.
            lines = [line for line in self.outer_launcher.stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
            self.outer_launcher.stderr.close()
            self.launcher_stderr = " ".join(lines[-1:])[-_STDERR_TAIL:]
        if self.op_cgroup_fd >= 0:
            os.close(self.op_cgroup_fd)
            self.op_cgroup_fd = -1
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self.staging_fd >= 0:
            try:
                os.unlink(self.launcher_name, dir_fd=self.staging_fd)
            except FileNotFoundError:
                pass
            os.close(self.staging_fd)
            self.staging_fd = -1
        if self.unrecorded:
            failure, self.unrecorded = self.unrecorded[0], []
            raise failure

    def _record(self, call, *arguments) -> None:
        """A ledger call made during teardown; a failure is kept for the end of the teardown."""
        try:
            call(*arguments)
        except Exception as error:
            self.unrecorded.append(error)

    def _close_outer_group(self) -> None:
        """C3: claim the outer group absent only after zombie, scan, then the exact reap of each member.

        The members we are the parent of are pid 1 and, if stage 1 failed after
        cloning it but before its CHILD report arrived, a pid 1 whose pid we
        were never told: such a clone is found among our own children by its
        group, and counted as a descendant of stage 1 when reaped.
        """
        group = self.outer_pgid
        unknown = [
            pid for pid in procfs.children(os.getpid())
            if pid not in self.unreaped and _group_of(pid) == group
        ]
        members = [pid for pid in self.unreaped] + unknown
        zombies: dict[int, int] = {}
        stuck = []
        try:
            for pid in members:
                pidfd = _await_zombie(pid, SHUTDOWN_SECONDS if pid == self.init_pid else 0)
                if pidfd is None:
                    stuck.append(pid)
                else:
                    zombies[pid] = pidfd
            others = [pid for pid in procfs.group_members(group) if pid not in zombies]
            for pid in list(zombies):
                status = os.waitpid(pid, 0)[1]
                os.close(zombies.pop(pid))
                if pid in self.unreaped:
                    self._record(self.ledger.process_terminal, self.unreaped.pop(pid), status, "steward")
            if unknown:
                self._record(self.ledger.descendants_terminal, self._op_id("launcher"), len([pid for pid in unknown if pid not in stuck]))
            self.outer_absent = not others and not stuck
        finally:
            for pidfd in zombies.values():
                os.close(pidfd)

    def _explain(self, error: ProtocolError) -> str:
        """One sentence, after teardown: why the sandbox failed, with the launcher's last stderr line if any."""
        if isinstance(error, protocol.Aborted):
            reason = f"the launcher aborted during {error}"
        else:
            reason = f"the launcher protocol failed: {error}"
        if self.launcher_stderr:
            reason += f" (launcher stderr: {self.launcher_stderr})"
        return f"{reason}; run `sudo casebox doctor` to check what this host supports"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
