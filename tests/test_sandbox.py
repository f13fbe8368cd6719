"""The sandbox end to end, as root: S1–S8 and J1 through the real launcher and starter."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import prctl
import pytest

from journal.errors import Refused
from journal.reader import Verdict, read_journal
from journal.writer import JournalWriter
from launcher import protocol, reexec, rendezvous, syscalls
from launcher.mounts import SCRATCH
from launcher.protocol import Channel, ProtocolError
from sandbox_support import PYTHON, contained, hostile, mount_table, processes_of, run, start, state_root  # noqa: F401
from steward import procfs, provision, starter
from steward.failure import SandboxFailure
from steward.ledger import RecordingLedger
from steward.api import Limits
from steward.starter import OpNotStarted, OpResult, Sandbox, Spec

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]
GREP_STATUS = ["/usr/bin/grep", "-E", "^(Groups|Sig(Blk|Ign)|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):", "/proc/self/status"]
HOLD = 0.3


def _status_lines(result: OpResult) -> dict:
    return {key: value.strip() for key, _, value in (line.partition(":") for line in result.stdout.decode().splitlines())}


def test_one_op_runs_as_the_dedicated_ids_and_everything_is_torn_down(sandbox_ids, state_root):
    ledger = RecordingLedger()
    result = run(sandbox_ids, state_root, ["/usr/bin/id", "-u"], ledger=ledger)
    assert isinstance(result, OpResult)
    assert (result.limit, result.wait_status, result.exit_code, result.signal) == ("OK", 0, 0, None)
    assert result.stdout == f"{sandbox_ids[0]}\n".encode()
    assert os.listdir(os.path.join(state_root, "staging")) == [], "the launcher file and the socket are removed"
    roles = {record[1].split(".")[1]: record[2] for record in ledger.records if record[0] == "process_intent"}
    assert roles == {"launcher": "launcher", "init": "namespace", "op-1": "descendant"}
    terminal = {record[1].split(".")[1]: record[2:] for record in ledger.records if record[0] == "process_terminal"}
    assert terminal == {"launcher": (0, "steward"), "init": (0, "steward"), "op-1": (0, "launcher")}


def test_every_intent_precedes_its_release_and_completion(sandbox_ids, state_root):
    """J1: intent before release or effect, and every intent is closed by its completion."""
    ledger = RecordingLedger()
    run(sandbox_ids, state_root, ["/usr/bin/true"], ledger=ledger)
    seen: dict[str, list[str]] = {}
    for record in ledger.records:
        seen.setdefault(record[1], []).append(record[0])
    processes = [op for op, kinds in seen.items() if "process_intent" in kinds]
    mounts = [op for op, kinds in seen.items() if "mount_intent" in kinds or "unmount_intent" in kinds]
    assert len(processes) == 3 and len(mounts) == 7
    for op in processes:
        # pid 1's READY (its filter, S12) is recorded while it lives, after its release and before its terminal.
        ready = ["sandbox_ready"] if op.endswith(".init") else []
        assert [kind for kind in seen[op] if kind != "descendants_terminal"] == ["process_intent", "process_released", *ready, "process_terminal"], seen[op]
    for op in mounts:
        assert seen[op] in (["mount_intent", "mount_done"], ["unmount_intent", "unmount_done"]), seen[op]


def _mount_source(line: str) -> str:
    """The source field of a mountinfo line: the launcher names its own tmpfs mounts ``casebox``, while a
    session's output on the host is ``casebox-output``, which any copy of the host's mount table may hold."""
    return line.split(" - ", 1)[1].split()[1]


class _Watcher(RecordingLedger):
    """A ledger that holds each intent for a moment and looks at the blocked process meanwhile."""

    def __init__(self):
        super().__init__()
        self.init_pid = 0
        self.looks: dict[str, object] = {}
        self.mount_counts: dict[str, list[int]] = {}

    def _mounts(self) -> int:
        with open(f"/proc/{self.init_pid}/mountinfo") as file:
            return len(file.readlines())

    def process_intent(self, op_id, role, pid, starttime, pgid):
        time.sleep(HOLD)
        if role == "launcher":
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            self.looks[role] = [fd for fd in fds if fd.startswith("socket:")]
            self.looks["argv_environ"] = open(f"/proc/{pid}/cmdline", "rb").read() + open(f"/proc/{pid}/environ", "rb").read()
        elif role == "namespace":
            self.init_pid = pid
            self.looks[role] = any(_mount_source(line) == "casebox" for line in open(f"/proc/{pid}/mountinfo"))
            self.looks["namespaces"] = {
                kind: os.readlink(f"/proc/{pid}/ns/{kind}") != os.readlink(f"/proc/self/ns/{kind}")
                for kind in ("mnt", "pid", "net", "ipc", "uts", "cgroup")
            }
            self.looks["memfd"] = self._memfd(pid)
        else:
            self.looks[role] = os.readlink(f"/proc/{pid}/exe")
        assert procfs.identity(pid).starttime == starttime
        super().process_intent(op_id, role, pid, starttime, pgid)

    @staticmethod
    def _memfd(pid: int) -> tuple[int, bool]:
        arguments = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        source = next(item.decode() for item in arguments if item.startswith(b"/proc/self/fd/"))
        fd = os.open(f"/proc/{pid}/fd/{source.rsplit('/', 1)[1]}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            data = os.pread(fd, 1 << 22, 0)
        finally:
            os.close(fd)
        return seals, hashlib.sha256(data).digest() == provision.shipped()[1]

    def mount_intent(self, op_id, target, kind):
        if self.init_pid:
            time.sleep(HOLD)
            self.mount_counts[target] = [self._mounts()]
        super().mount_intent(op_id, target, kind)

    def mount_done(self, op_id, target, kind):
        if target in self.mount_counts:
            self.mount_counts[target].append(self._mounts())
        super().mount_done(op_id, target, kind)

    def unmount_intent(self, op_id, target, kind):
        time.sleep(HOLD)
        self.mount_counts[target] = [self._mounts()]
        super().unmount_intent(op_id, target, kind)

    def unmount_done(self, op_id, target, kind):
        self.mount_counts[target].append(self._mounts())
        super().unmount_done(op_id, target, kind)


def test_blocked_processes_and_mounts_wait_for_their_durable_intent(sandbox_ids, state_root):
    """J1: while an intent is being recorded, the process it names stays blocked and the mount stays unmade."""
    watcher = _Watcher()
    result = run(sandbox_ids, state_root, ["/usr/bin/true"], ledger=watcher)
    assert result.limit == "OK"
    assert watcher.looks["launcher"] == [], "stage 1 connected before its intent was durable"
    assert watcher.looks["namespace"] is False, "pid 1 mounted before its intent was durable"
    assert watcher.looks["descendant"] == os.path.realpath(sys.executable), "the op exec'd before its intent was durable"
    for target, (at_intent, at_done) in watcher.mount_counts.items():
        if target == "/.old-root":
            assert at_done < at_intent, "the old root was detached before its intent was durable"
        else:
            assert at_done == at_intent + 1, f"{target} was mounted before its intent was durable"
    assert set(watcher.mount_counts) == {"/", "/proc", "/dev", "/tmp", "/work", "/.old-root"}


def test_the_nonce_is_never_on_argv_or_in_the_environment(sandbox_ids, state_root, monkeypatch):
    """S2: the single-use nonce travels on stdin only."""
    nonce = bytes(range(32))
    real = starter.secrets.token_bytes
    monkeypatch.setattr(starter.secrets, "token_bytes", lambda count: nonce if count == len(nonce) else real(count))
    watcher = _Watcher()
    run(sandbox_ids, state_root, ["/usr/bin/true"], ledger=watcher)
    seen = watcher.looks["argv_environ"]
    assert nonce not in seen and nonce.hex().encode() not in seen


def test_pid_one_runs_from_the_sealed_memfd_in_new_namespaces(sandbox_ids, state_root):
    """S3: all four seals, the shipped bytes, and mount, pid, net, ipc, uts and cgroup namespaces."""
    watcher = _Watcher()
    run(sandbox_ids, state_root, ["/usr/bin/true"], ledger=watcher)
    seals, authentic = watcher.looks["memfd"]
    assert seals & reexec.REQUIRED_SEALS == reexec.REQUIRED_SEALS
    assert authentic
    assert watcher.looks["namespaces"] == dict.fromkeys(("mnt", "pid", "net", "ipc", "uts", "cgroup"), True)


def test_a_ledger_that_cannot_record_stops_the_sandbox(sandbox_ids, state_root):
    """J1: no durable intent, no effect: the sandbox fails closed and leaves nothing."""

    class Failing(RecordingLedger):
        def mount_intent(self, op_id, target, kind):
            if target == "/proc":
                raise OSError(errno.EIO, "journal write failed")
            super().mount_intent(op_id, target, kind)

    ledger = Failing()
    with pytest.raises(OSError, match="journal write failed"):
        start(sandbox_ids, state_root, ledger=ledger)
    assert not any(record[0] == "mount_done" and record[2] == "/proc" for record in ledger.records)
    terminal = [record for record in ledger.records if record[0] == "process_terminal"]
    assert [record[1].split(".")[1] for record in terminal] == ["launcher", "init"]
    assert os.listdir(os.path.join(state_root, "staging")) == []


def test_the_bootstrap_builds_the_documented_filesystem(sandbox_ids, state_root, tmp_path):
    """S4: /usr and capabilities read-only nosuid nodev, fresh /proc, minimal /dev, capped tmpfs, read-only root."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "f").write_text("x")
    result, seen = hostile(sandbox_ids, state_root, """
        import fcntl, json, os, socket, struct
        mounts = {}
        for line in open('/proc/self/mountinfo'):
            fields = line.split()
            rest = fields[fields.index('-') + 1:]
            mounts[fields[4]] = [fields[5], rest[0], rest[2]]
        probe = socket.socket()
        flags = struct.unpack('16sh22x', fcntl.ioctl(probe.fileno(), 0x8913, struct.pack('16sh22x', b'lo', 0)))[1]
        limits = {line[:26].strip(): line[26:].split()[:2] for line in list(open('/proc/self/limits'))[1:]}
        print(json.dumps({'mounts': mounts, 'dev': sorted(os.listdir('/dev')), 'root': sorted(os.listdir('/')),
                          'hostname': socket.gethostname(), 'lo_up': bool(flags & 1), 'limits': limits,
                          'cwd': os.getcwd(), 'stdin': os.read(0, 10).decode()}))
    """, capabilities=[("data", str(data))], limits=Limits(tmp_bytes=8 << 20, work_bytes=16 << 20, processes=20, files=100))
    mounts = seen["mounts"]
    assert set(mounts) == {"/", "/usr", "/cap/data", "/proc", "/dev", "/tmp", "/work"}
    for point in ("/", "/usr", "/cap/data", "/dev"):
        assert "ro" in mounts[point][0].split(","), point
    for point in ("/usr", "/cap/data", "/tmp", "/work"):
        assert {"nosuid", "nodev"} <= set(mounts[point][0].split(",")), point
    assert mounts["/proc"][1] == "proc" and "hidepid=invisible" in mounts["/proc"][2]
    assert "size=8192k" in mounts["/tmp"][2] and "size=16384k" in mounts["/work"][2]
    assert seen["dev"] == ["fd", "full", "null", "random", "stderr", "stdin", "stdout", "urandom", "zero"]
    assert seen["root"] == ["bin", "cap", "dev", "lib", "lib64", "out", "proc", "sbin", "tmp", "usr", "work"]
    assert seen["hostname"] == "casebox" and seen["lo_up"] is True
    # Soft and hard alike (S4): the op cannot raise a soft limit back up to a looser hard one.
    assert seen["limits"]["Max core file size"] == ["0", "0"]
    assert seen["limits"]["Max processes"] == ["22", "22"]
    assert seen["limits"]["Max open files"] == ["100", "100"]
    assert seen["limits"]["Max file size"] == [str(16 << 20)] * 2
    # S14: memory is the cgroup's; an address-space limit would stop threads long before memory runs out.
    assert seen["limits"]["Max address space"] == ["unlimited", "unlimited"]
    assert seen["limits"]["Max cpu time"] == ["20", "21"]
    assert (seen["cwd"], seen["stdin"]) == ("/work", "")


def test_the_drop_is_complete_for_every_op(sandbox_ids, state_root):
    """S5: no groups, no capability in any set, NoNewPrivs, default signals and an empty mask.

    The starter here holds supplementary groups and an inheritable capability,
    which the launcher inherits, so each is gone only because the drop removed it.
    """
    os.setgroups([4321, 4322])
    prctl.cap_inheritable.net_raw = True
    try:
        result = run(sandbox_ids, state_root, GREP_STATUS)
    finally:
        os.setgroups([])
        prctl.cap_inheritable.net_raw = False
    status = _status_lines(result)
    assert status["Groups"] == ""
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "SigBlk", "SigIgn"):
        assert int(status[name], 16) == 0, name
    assert status["NoNewPrivs"] == "1"


def test_the_sandbox_dies_with_its_starter(sandbox_ids, state_root):
    """S5/S8: pdeathsig is armed again after the UID change, so killing the starter ends the sandbox."""
    sandbox_id = f"dies-{os.urandom(6).hex()}"
    program = (
        "import sys; from sandbox_support import run;"
        f"run({tuple(sandbox_ids)!r}, {state_root!r}, ['/usr/bin/sleep', '30'], timeout_ms=30_000, sandbox_id={sandbox_id!r})"
    )
    child = subprocess.Popen([sys.executable, "-c", program], cwd=os.path.dirname(__file__))
    try:
        deadline = time.monotonic() + 20
        while not any(process_is_sleep(pid) for pid in processes_of(*sandbox_ids)):
            assert time.monotonic() < deadline, "the op never started"
            time.sleep(0.05)
        child.kill()
        child.wait()
        deadline = time.monotonic() + 5
        while processes_of(*sandbox_ids):
            assert time.monotonic() < deadline, "the sandbox outlived its starter"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
        for pid in processes_of(*sandbox_ids):
            os.kill(pid, signal.SIGKILL)
        # A killed starter cannot remove its sandbox's cgroup; recovery (the
        # steward's) does that in production, this test does it for itself:
        # its own sandbox's alone, never another suite's on this machine.
        for directory in _sandbox_cgroups():
            if os.path.basename(directory) == f"casebox-{sandbox_id}":
                starter.cgroups.remove_sandbox_directory(directory)


def _sandbox_cgroups() -> set[str]:
    hierarchy = starter.cgroups.detect()
    if hierarchy is None:
        return set()
    return {
        os.path.join(parent, name)
        for parent in {hierarchy.memory_dir, hierarchy.pids_dir}
        if os.path.isdir(parent)
        for name in os.listdir(parent)
        if name.startswith("casebox-")
    }


def process_is_sleep(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith("/sleep")
    except OSError:
        return False


def test_a_dedicated_id_in_use_refuses_the_session(sandbox_ids, state_root):
    """S6: a live process already running as the dedicated UID refuses the sandbox."""
    uid, gid = sandbox_ids
    squatter = subprocess.Popen(["/usr/bin/sleep", "30"], user=uid, group=gid)
    try:
        with pytest.raises(Refused, match=f"sandbox uid {uid}.*already runs as it"):
            start(sandbox_ids, state_root)
    finally:
        squatter.kill()
        squatter.wait()


def test_a_sandbox_whose_cgroup_cannot_be_joined_never_starts(sandbox_ids, state_root, monkeypatch):
    """S10: pid 1 is born in the sandbox's cgroup or there is no sandbox, and nothing remains. On v1 the blocked
    stage 1 is moved there beside the S6 check: if the move fails, stage 1 is never released. On v2 stage 1
    clones pid 1 into it (CLONE_INTO_CGROUP): if the kernel refuses (here the descriptor is no cgroup's),
    stage 1 aborts. (The v1 case alone once stood here, and on v2 it started a sandbox it never closed.)"""
    from steward import cgroups

    hierarchy = cgroups.detect()
    if hierarchy is None:
        pytest.skip("this host has no memory and pids controllers")
    ledger = RecordingLedger()
    if hierarchy.version == 1:
        def refuse(self, pid):
            raise OSError(errno.EACCES, "cgroup.procs refused")

        monkeypatch.setattr(cgroups.SandboxCgroup, "attach", refuse)
        with pytest.raises(OSError, match="cgroup.procs refused"):
            start(sandbox_ids, state_root, ledger=ledger)
        expected = ["process_intent", "process_terminal"]
    else:
        monkeypatch.setattr(cgroups.SandboxCgroup, "open_birthplace",
                            lambda self: os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        with pytest.raises(SandboxFailure):
            start(sandbox_ids, state_root, ledger=ledger)
        # Stage 1 announces its capability trees' clones before it clones pid 1.
        expected = ["process_intent", "process_released", *["mount_intent"] * (len(ledger.records) - 3), "process_terminal"]
    names = [record[0] for record in ledger.records]
    assert names == expected, names
    assert os.listdir(os.path.join(state_root, "staging")) == []


class _Poisoned(RecordingLedger):
    """A ledger that fails on one record and then refuses every later one, as the journal writer does (J5)."""

    def __init__(self, method: str, role_or_target: str) -> None:
        super().__init__()
        self.failing = (method, role_or_target)
        self.poisoned = False

    def _check(self, method: str, what: str) -> None:
        if self.poisoned:
            raise OSError(errno.EIO, "the writer is poisoned by an earlier failure")
        if (method, what) == self.failing:
            self.poisoned = True
            raise OSError(errno.EIO, "journal write failed")

    def process_intent(self, op_id, role, pid, starttime, pgid):
        self._check("process_intent", role)
        super().process_intent(op_id, role, pid, starttime, pgid)

    def process_released(self, op_id):
        self._check("process_released", op_id)
        super().process_released(op_id)

    def process_terminal(self, op_id, wait_status, reaper):
        self._check("process_terminal", op_id)
        super().process_terminal(op_id, wait_status, reaper)

    def descendants_terminal(self, op_id, count):
        self._check("descendants_terminal", op_id)
        super().descendants_terminal(op_id, count)

    def mount_intent(self, op_id, target, kind):
        self._check("mount_intent", target)
        super().mount_intent(op_id, target, kind)


@pytest.mark.parametrize("method, what", [("process_intent", "launcher"), ("mount_intent", "/proc")])
def test_a_start_whose_journal_breaks_still_leaves_nothing(sandbox_ids, state_root, method, what):
    """J1/J5: after a failed record every later one fails too; the failed start still kills and reaps
    every process, and removes its cgroup and staging files."""
    sandbox_id = f"poisoned-{os.urandom(6).hex()}"
    children_before = procfs.children(os.getpid())
    with pytest.raises(OSError, match="journal write failed|poisoned by an earlier failure"):
        Sandbox.start(Spec(*sandbox_ids), ledger=_Poisoned(method, what), state_root=state_root, sandbox_id=sandbox_id)
    assert os.listdir(os.path.join(state_root, "staging")) == []
    assert not any(os.path.basename(path) == f"casebox-{sandbox_id}" for path in _sandbox_cgroups())
    assert procfs.children(os.getpid()) == children_before


def test_an_op_that_fails_before_exec_never_gets_an_exit_code(sandbox_ids, state_root):
    """S7: a failed exec reports the step and errno, and the child's raw status goes to the ledger only."""
    ledger = RecordingLedger()
    result = run(sandbox_ids, state_root, ["/nonexistent/program"], ledger=ledger)
    assert isinstance(result, OpNotStarted)
    assert (result.step, result.errno) == ("execve", errno.ENOENT)
    assert not hasattr(result, "exit_code")
    terminal = [record for record in ledger.records if record[0] == "process_terminal" and record[1].endswith("op-1")]
    assert terminal == [("process_terminal", terminal[0][1], result.wait_status, "launcher")]


def test_a_hot_sandbox_runs_ops_one_after_another(sandbox_ids, state_root):
    """S7: after READY, each message is one op; the sandbox keeps serving."""
    with start(sandbox_ids, state_root) as sandbox:
        outputs = [
            sandbox.run(["/usr/bin/echo", str(number)], env={}, timeout_ms=5000, stdout_cap=100, stderr_cap=100).stdout
            for number in range(3)
        ]
    assert outputs == [b"0\n", b"1\n", b"2\n"]


@pytest.fixture
def socket_directory(tmp_path):
    """``tmp_path`` as ``/proc/self/fd/N``, as the starter names its staging directory: a socket there has a
    short name however long the run's TMPDIR is (108 bytes at most; the platform guest's is longer)."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    yield f"/proc/self/fd/{fd}"
    os.close(fd)


def test_the_launcher_refuses_a_rendezvous_peer_that_is_not_its_parent(socket_directory):
    """S2: SO_PEERCRED must show uid 0 and the launcher's own parent."""
    path = f"{socket_directory}/s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(1)
    try:
        with pytest.raises(ProtocolError, match=f"not the starter \\(pid {os.getppid()}"):
            rendezvous.connect(path)
    finally:
        server.close()


def test_the_starter_refuses_a_peer_that_is_not_its_launcher(tmp_path, socket_directory):
    """S2: the starter checks SO_PEERCRED for the pid it started."""
    sandbox = Sandbox(Spec(2, 2), RecordingLedger(), str(tmp_path))
    sandbox.outer_launcher = subprocess.Popen(["/usr/bin/true"])
    sandbox.outer_launcher.wait()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"{socket_directory}/s.sock")
    listener.listen(1)
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    impostor.connect(f"{socket_directory}/s.sock")
    try:
        with pytest.raises(ProtocolError, match=f"peer is pid {os.getpid()} uid 0, not the launcher"):
            sandbox._accept(listener)
    finally:
        impostor.close()
        listener.close()


def test_the_starter_releases_only_its_own_child_that_is_pid_one_of_a_new_namespace(tmp_path):
    """S8: the starter does not take stage 1's word for pid 1: a CHILD naming its own child that is not pid 1
    of a pid namespace of its own (what a launcher without CLONE_NEWPID reports) is refused through the host's
    /proc, with no record and no ACK that would release it."""
    ledger = RecordingLedger()
    sandbox = Sandbox(Spec(2, 2), ledger, str(tmp_path))
    sandbox.outer_launcher = subprocess.Popen(["/usr/bin/true"])
    sandbox.unreaped[sandbox.outer_launcher.pid] = sandbox._op_id("launcher")
    impostor = subprocess.Popen(["/usr/bin/sleep", "30"])
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sandbox.channel = Channel(near, protocol.STARTER)
        Channel(far, protocol.LAUNCHER).send("CHILD", pid=impostor.pid)
        with pytest.raises(ProtocolError, match=f"process {impostor.pid} is not our child and pid 1 of a new namespace"):
            sandbox._handover(sandbox.channel.receive("CHILD"))
        far.setblocking(False)
        with pytest.raises(BlockingIOError):
            far.recv(64)  # no ACK was sent
        assert sandbox.init_pid == 0 and ledger.records == []
    finally:
        near.close()
        far.close()
        impostor.kill()
        impostor.wait()
        sandbox.outer_launcher.wait()


def _hello(sandbox: Sandbox, nonce: bytes) -> None:
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sandbox.channel = Channel(near, protocol.STARTER)
        Channel(far, protocol.LAUNCHER).send("HELLO", version=protocol.VERSION, nonce=nonce)
        sandbox._hello()
    finally:
        near.close()
        far.close()


def test_the_nonce_must_match_and_is_single_use(tmp_path, monkeypatch):
    """S2: a wrong nonce aborts, and the right nonce works once only."""
    monkeypatch.setattr(starter.cgroups, "detect", lambda: None)
    sandbox = Sandbox(Spec(2, 2), RecordingLedger(), str(tmp_path))
    sandbox.nonce = b"a" * 32
    with pytest.raises(ProtocolError, match="nonce is wrong"):
        _hello(sandbox, b"b" * 32)
    sandbox.nonce = b"a" * 32
    _hello(sandbox, b"a" * 32)
    with pytest.raises(ProtocolError, match="nonce is wrong"):
        _hello(sandbox, b"a" * 32)


def test_a_sandbox_failure_is_one_sentence_with_a_way_forward(sandbox_ids, state_root, monkeypatch):
    """S11: a host that cannot sandbox fails closed with a sentence, never by running unsandboxed."""
    monkeypatch.setattr(starter, "HOSTNAME", "x" * 100)
    with pytest.raises(SandboxFailure, match=r"the launcher aborted during bootstrap: OSError: .*casebox doctor"):
        start(sandbox_ids, state_root)


def test_no_sandbox_mount_propagates_even_when_the_starters_mounts_are_shared(sandbox_ids, state_root):
    """S4: pid 1 makes propagation private before its first mount, so a shared host root sees nothing: no tmpfs
    named ``casebox`` and nothing at or below the launcher's scratch directory, where it builds the new root."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            syscalls.unshare(syscalls.CLONE_NEWNS)
            syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_SHARED)
            before = mount_table(SCRATCH)
            try:
                run(sandbox_ids, state_root, ["/usr/bin/true"])
                failure = None
            except SandboxFailure as error:
                failure = str(error)  # a mount made before a failed start has propagated all the same
            after = mount_table(SCRATCH)
            os.write(write_end, json.dumps([before, after, failure]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    seen = json.loads(os.read(read_end, 1 << 16) or b"null")
    os.close(read_end)
    os.waitpid(pid, 0)
    assert seen is not None and seen[0] == seen[1], "a sandbox mount propagated into the starter's namespace"
    assert seen[2] is None, seen[2]


def test_the_journal_writer_is_a_ledger_and_its_journal_verifies(sandbox_ids, state_root, tmp_path):
    """J1 with the production ledger: every record the starter makes is valid and durable, and the journal is VALID."""
    stage = tmp_path / "stage"
    stage.mkdir()
    directory = os.open(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with JournalWriter.create(directory, "journal", journal_id="journal-1", stage_id="stage-1", attempt_id="a-1") as writer:
            result = run(sandbox_ids, state_root, ["/usr/bin/true"], ledger=writer)
    finally:
        os.close(directory)
    reading = read_journal((stage / "journal").read_bytes(), expect_stage_id="stage-1")
    assert reading.verdict == Verdict.VALID, reading.reason
    kinds = [record.kind.name for record in reading.records]
    assert kinds.count("PROCESS_INTENT") == kinds.count("PROCESS_TERMINAL") == 3
    assert kinds.count("MOUNT_INTENT") == kinds.count("MOUNT_DONE") == 6
    terminal = [record.fields for record in reading.records if record.kind.name == "PROCESS_TERMINAL"]
    assert [(fields["wait_status"], fields["reaper"]) for fields in terminal] == [(0, "steward"), (result.wait_status, "launcher"), (0, "steward")]


def test_teardown_closes_every_descriptor_the_starter_opened(sandbox_ids, state_root):
    """A long-lived starter must not leak: after close, even a kept Sandbox holds no descriptor."""
    run(sandbox_ids, state_root, ["/usr/bin/true"])
    before = sorted(os.listdir("/proc/self/fd"))
    kept = []
    for _ in range(3):
        sandbox = start(sandbox_ids, state_root)
        sandbox.run(["/usr/bin/true"], env={}, timeout_ms=5000, stdout_cap=16, stderr_cap=16)
        sandbox.close()
        kept.append(sandbox)
    assert sorted(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("nonce", [b"", b"n" * 31, b"n" * 33])
def test_the_launcher_takes_exactly_one_nonce_of_its_length(nonce):
    """S2: stage 1 reads exactly NONCE_BYTES from stdin and then end of file; a shorter or longer one ends it."""
    read_end, write_end = os.pipe()
    os.write(write_end, nonce)
    os.close(write_end)
    try:
        with pytest.raises(ProtocolError, match=f"the nonce on stdin is {min(len(nonce), 33)} bytes, not 32"):
            rendezvous.read_nonce(read_end)
    finally:
        os.close(read_end)


def test_a_steward_with_a_strict_umask_still_gives_ops_readable_capabilities(sandbox_ids, state_root, tmp_path):
    """S1 with the shipped unit's UMask=0077: the sandbox's umask is the launcher's own (0022), never the
    steward's, so the mount points pid 1 makes (/cap, /cap/NAME) are traversable by the dedicated uid and an op
    reads its capability; with the steward's umask inherited, /cap was 0700 root's and every import from a
    capability failed (found in the platform-check guest: 'No module named executor')."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "hello.txt").write_text("hello")
    os.chmod(tmp_path, 0o755)
    os.chmod(tree, 0o755)
    os.chmod(tree / "hello.txt", 0o644)
    before = os.umask(0o077)
    try:
        _, seen = hostile(sandbox_ids, state_root, """
            import json, os
            print(json.dumps({"umask": os.umask(0o022), "cap": os.stat('/cap').st_mode & 0o777,
                              "read": open('/cap/tree/hello.txt').read()}))
        """, capabilities=[("tree", str(tree))])
    finally:
        os.umask(before)
    assert seen == {"umask": 0o022, "cap": 0o755, "read": "hello"}
