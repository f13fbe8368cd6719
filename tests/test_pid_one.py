"""S14: the case cannot kill or stall pid 1, and the sandbox's own limits are never the candidate's failure.

Each attack runs from inside a real sandbox and must end with its own class
while pid 1 lives on (it answers the next op and exits 0 at SHUTDOWN). The
traced zombie needs ptrace, which the filter denies every op (S12), so that
one runs pid 1's op loop (launcher/ops.py) as pid 1 of a namespace of its
own without the filter: it is the guard behind the guard.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import textwrap
import threading
import time

import pytest

from launcher import kernel, ops, protocol, syscalls
from launcher.protocol import Channel
from sandbox_support import PYTHON, contained, run, start, state_root  # noqa: F401
from steward.api import Limits
from steward.ledger import RecordingLedger
from steward.starter import OpResult

pytestmark = [pytest.mark.root]
MIB = 1 << 20
# The filler first makes itself as unattractive to the OOM killer as it may (-1000 where pid 1 could exempt
# itself, since a child inherits its floor; else 0, pid 1's own score), so only the cgroup layout can spare pid 1.
FILL_TMP = """
for score in ('-1000', '0'):
    try:
        with open('/proc/self/oom_score_adj', 'w') as file:
            file.write(score)
        break
    except PermissionError:
        pass
with open('/tmp/fill', 'wb') as file:
    while True:
        file.write(b'x' * 65536)
"""


def _init_status(ledger: RecordingLedger, sandbox_id: str) -> int:
    (status,) = [record[2] for record in ledger.records if record[:2] == ("process_terminal", f"{sandbox_id}.init")]
    return status


@pytest.mark.usefixtures("contained")
def test_a_tmpfs_fill_past_the_memory_cap_is_memory_and_pid_1_lives(sandbox_ids, state_root):
    """S14: tmpfs pages are charged to no process, so the OOM killer must choose among the op's processes: the
    op runs in the ops cgroup, which alone carries the cap, and pid 1 does not, so even an op that tried to
    lower its own OOM score is the one killed. A /tmp larger than the memory cap, filled, is MEMORY (never exit 70),
    pid 1 answers the next ops, and it exits 0 at SHUTDOWN."""
    ledger = RecordingLedger()
    with start(sandbox_ids, state_root, limits=Limits(memory_bytes=48 * MIB, tmp_bytes=256 * MIB), ledger=ledger) as sandbox:
        filled = sandbox.run([PYTHON, "-c", FILL_TMP], env={}, timeout_ms=30_000, stdout_cap=4096, stderr_cap=4096)
        # The pages stay charged: the next op may itself hit the cap, but pid 1 runs it and reports it.
        after = [sandbox.run(["/usr/bin/true"], env={}, timeout_ms=10_000, stdout_cap=64, stderr_cap=64) for _ in range(2)]
    assert isinstance(filled, OpResult) and (filled.limit, filled.signal) == ("MEMORY", 9), filled
    assert all(isinstance(result, OpResult) and result.limit in ("OK", "MEMORY") for result in after), after
    assert _init_status(ledger, sandbox.id) == 0


@pytest.mark.usefixtures("contained")
def test_a_real_allocation_bomb_is_memory(sandbox_ids, state_root):
    """S14: memory is the cgroup's, never an address-space rlimit: a bomb that really touches its pages is
    killed by the ops cgroup's OOM killer and named MEMORY."""
    result = run(sandbox_ids, state_root, [PYTHON, "-c", "chunks = []\nwhile True:\n    chunks.append(bytearray(b'x') * (1 << 20))\n"],
                 limits=Limits(memory_bytes=48 * MIB), timeout_ms=30_000)
    assert isinstance(result, OpResult) and (result.limit, result.signal) == ("MEMORY", 9), result


TCP_HOLD = """
import json, socket, sys, time
target = int(sys.argv[1]) << 20
listener = socket.socket(); listener.bind(('127.0.0.1', 0)); listener.listen(256)
held, connections = 0, []
chunk = b'x' * 65536
while held < target and len(connections) < 100:
    client = socket.create_connection(listener.getsockname())
    connections.append((client, listener.accept()[0]))   # the reader never reads: the bytes stay in the buffers
    client.setblocking(False)
    for _ in range(3):
        try:
            while held < target:
                held += client.send(chunk)
        except BlockingIOError:
            time.sleep(0.002)
print(json.dumps(held >> 20))
sys.exit(0 if held >= target else 3)
"""


@pytest.mark.usefixtures("contained")
def test_tcp_buffers_beyond_the_memory_cap_are_not_ok(sandbox_ids, state_root):
    """S14: socket buffers are memory: with a 48 MiB cap an op cannot hold 192 MiB in loopback TCP buffers
    (cgroup v1 charges them only with memory.kmem.tcp.limit_in_bytes set; v2's memory.max always does), and the
    op that tried is not OK."""
    result = run(sandbox_ids, state_root, [PYTHON, "-c", TCP_HOLD, "192"], limits=Limits(memory_bytes=48 * MIB), timeout_ms=30_000)
    assert isinstance(result, OpResult) and result.limit != "OK", result
    assert result.limit == "MEMORY", result


# The op's score as it execs, then each lower score it tries and is refused (EACCES).
LOWER_OOM_SCORE = """
import os
print(open('/proc/self/oom_score_adj').read().strip())
for score in ('-1000', '0', '999'):
    fd = os.open('/proc/self/oom_score_adj', os.O_WRONLY)
    try:
        os.write(fd, score.encode())
    except PermissionError:
        print(score)
    finally:
        os.close(fd)
"""


@pytest.mark.usefixtures("contained")
def test_an_op_is_the_oom_killers_first_choice_and_pid_1_its_last(sandbox_ids, state_root):
    """S14: the steward gives every op oom_score_adj 1000 before its release, and where it holds
    CAP_SYS_RESOURCE that is also the op's floor, so an op cannot lower it. (An op once raised its own score,
    and could lower it again to the -1000 it inherited from an exempt pid 1; at the memory cap the OOM killer
    then found no one to kill, as Ubuntu 24.04's kernel showed.) pid 1 sets its own score to -1000 where the
    host grants CAP_SYS_RESOURCE and keeps it where it does not; an op there may lower its own to pid 1's."""
    with start(sandbox_ids, state_root) as sandbox:
        with open(f"/proc/{sandbox.init_pid}/oom_score_adj") as file:
            pid_1 = int(file.read())
        result = sandbox.run([PYTHON, "-c", LOWER_OOM_SCORE], env={}, timeout_ms=10_000, stdout_cap=256, stderr_cap=4096)
    with open("/proc/self/status") as status:
        bounding = int(next(line for line in status if line.startswith("CapBnd:")).split()[1], 16)
    may_exempt = bool(bounding & (1 << 24))  # CAP_SYS_RESOURCE
    assert pid_1 == (kernel.OOM_SCORE_ADJ_MIN if may_exempt else 0)
    floor = kernel.OOM_SCORE_ADJ_MAX if may_exempt else pid_1
    assert result.stdout.decode().split() == ["1000", *(score for score in ("-1000", "0", "999") if int(score) < floor)], result


@pytest.mark.usefixtures("contained")
def test_prlimit_of_pid_1_is_eperm_and_pid_1_keeps_serving(sandbox_ids, state_root):
    """S12, S14: an op of pid 1's own UID cannot set pid 1's limits (prlimit64(1, RLIMIT_NOFILE, {1, 1}) once
    made pid 1 abort) nor its priority or I/O priority; pid 1 then runs the next op."""
    with start(sandbox_ids, state_root) as sandbox:
        result = sandbox.run([PYTHON, "-c", textwrap.dedent("""
            import errno, json, os, resource
            seen = {}
            for name, call in (('prlimit', lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (1, 1))),
                               ('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
                               ('sched_setscheduler', lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)))):
                try:
                    call(); seen[name] = 'ok'
                except OSError as error:
                    seen[name] = errno.errorcode[error.errno]
            print(json.dumps(seen))
        """)], env={}, timeout_ms=10_000, stdout_cap=4096, stderr_cap=4096)
        after = sandbox.run(["/usr/bin/true"], env={}, timeout_ms=10_000, stdout_cap=64, stderr_cap=64)
    assert result.limit == "OK" and result.stdout == b'{"prlimit": "EPERM", "setpriority": "EPERM", "sched_setscheduler": "EPERM"}\n'
    assert after.limit == "OK"


# -- the deadline kills before it waits ----------------------------------------------

TRACED_ZOMBIE = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
read_end, write_end = os.pipe()
if os.fork() == 0:
    if libc.ptrace(0x4206, os.getppid(), 0, 0) != 0:   # PTRACE_SEIZE the op's main process
        os._exit(1)
    os.write(write_end, b't')
    time.sleep(15)                                     # a tracer that does not reap its zombie in time
    os._exit(0)
os.read(read_end, 1)
sys.exit(0)                                            # the main process ends as a zombie only the tracer may reap
"""


def _pid_one_runs(fields: dict, channel_fd: int, scratch: str) -> None:
    """In a forked child: become pid 1 of new pid and mount namespaces with a /proc of its own and a scratch
    tmpfs at ``scratch`` standing in for the sandbox's /tmp and /work (pid 1 checks them after each op; the host
    need have no /work), then run one op."""
    syscalls.unshare(syscalls.CLONE_NEWPID | syscalls.CLONE_NEWNS)
    init = os.fork()
    if init:
        os._exit(os.waitstatus_to_exitcode(os.waitpid(init, 0)[1]))
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    syscalls.mount("proc", "/proc", "proc", syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC)
    syscalls.mount("tmpfs", scratch, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, "size=1m")
    ops.SCRATCH_MOUNTS = (scratch,)
    _, joined = os.pipe()  # stands in for the ops cgroup's process file: the child writes "0" into it
    ops.run(Channel(socket.socket(fileno=channel_fd), protocol.LAUNCHER), fields, joined)
    os._exit(0)


def test_a_traced_zombie_returns_within_the_timeout_as_timeout(tmp_path):
    """S14: the op's main process exits while a tracer it forked holds its zombie, which only the tracer may
    reap: pid 1 never waits on it past the deadline, but kills every other process first (the tracer with
    them) and then reaps it; the op is TIMEOUT within timeout + 1 s."""
    if os.geteuid() != 0:
        pytest.skip("needs root for new pid and mount namespaces")
    starter_end, launcher_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fields = {"argv": [PYTHON, "-c", TRACED_ZOMBIE], "env": [("PATH", "/usr/bin")], "cwd": "/", "timeout_ms": 1000,
              "stdout_cap": 4096, "stderr_cap": 4096}
    child = os.fork()
    if child == 0:
        try:
            starter_end.close()
            _pid_one_runs(fields, launcher_end.detach(), str(tmp_path))
        except BaseException:
            import traceback

            traceback.print_exc()  # the failure's own words, in the test's captured output
        finally:
            os._exit(70)
    launcher_end.close()
    starter = Channel(starter_end, protocol.STARTER)
    starter_end.settimeout(10)
    try:
        starter.ack(starter.receive("OP_CHILD"))
        released = time.monotonic()
        result = starter.receive("OP_RESULT")
        elapsed = time.monotonic() - released
        starter.ack(result)
    finally:
        starter_end.close()  # a pid 1 still waiting for an ACK reads end of file and ends
        status = os.waitpid(child, 0)[1]
    assert os.waitstatus_to_exitcode(status) == 0
    assert (result.fields["limit"], result.fields["wait_status"]) == ("TIMEOUT", 0)
    assert elapsed < 2.0, f"pid 1 waited {elapsed:.1f} s on a zombie only its tracer could reap"


# -- cgroup v2 (the CI platform; this development host is v1) ------------------------

def _cgroup_v2() -> bool:
    from steward import cgroups

    hierarchy = cgroups.detect()
    return hierarchy is not None and hierarchy.version == 2


@pytest.mark.usefixtures("contained")
@pytest.mark.cgroup2
@pytest.mark.skipif(not _cgroup_v2(), reason="needs cgroup v2 with memory and pids; this host is v1")
def test_on_cgroup_v2_pid_1_sits_in_init_and_every_op_in_ops(sandbox_ids, state_root):
    """S14 on v2: the sandbox's cgroup holds no process (its children have controllers); pid 1 is in its leaf
    init, each op joins its leaf ops, which alone carries memory.max (and swap 0), and pids.max is the sandbox's."""
    with start(sandbox_ids, state_root, limits=Limits(memory_bytes=48 * MIB, processes=30)) as sandbox:
        group = sandbox.cgroup
        with open(f"/proc/{sandbox.init_pid}/cgroup") as file:
            pid_1 = file.read().strip()
        result = sandbox.run(["/usr/bin/cat", "/proc/self/cgroup"], env={}, timeout_ms=10_000, stdout_cap=4096, stderr_cap=4096)
        top = os.path.dirname(group.ops)
        with open(os.path.join(top, "cgroup.procs")) as file:
            in_top = file.read()
        with open(os.path.join(top, "cgroup.subtree_control")) as file:
            controllers = set(file.read().split())
        with open(os.path.join(group.ops, "memory.max")) as file:
            cap = int(file.read())
        with open(os.path.join(top, "pids.max")) as file:
            pids = int(file.read())
    assert pid_1.endswith("/init") and in_top == ""
    assert result.stdout.decode().strip().endswith("/ops"), result.stdout
    assert {"memory", "pids"} <= controllers and cap == 48 * MIB and pids == 31


@pytest.mark.usefixtures("contained")
@pytest.mark.cgroup2
@pytest.mark.skipif(not _cgroup_v2(), reason="needs cgroup v2 with memory and pids; this host is v1")
def test_on_cgroup_v2_pid_1_is_cloned_into_its_cgroup_and_nothing_is_moved_there(sandbox_ids, state_root, monkeypatch):
    """S14 on v2: pid 1 is born in the sandbox's init cgroup (clone3 with CLONE_INTO_CGROUP from stage 1), so
    the starter moves no process there; a case's op then runs in ops. Any move of stage 1 fails this test."""
    from steward import cgroups

    def moved(self, pid):
        raise AssertionError(f"stage 1 ({pid}) was moved into the sandbox's cgroup")

    monkeypatch.setattr(cgroups.SandboxCgroup, "attach", moved)
    with start(sandbox_ids, state_root) as sandbox:
        init = sandbox.cgroup.sandbox[0]
        with open(f"/proc/{sandbox.init_pid}/cgroup") as file:
            pid_1 = file.read().strip()
        result = sandbox.run(["/usr/bin/cat", "/proc/self/cgroup"], env={}, timeout_ms=10_000, stdout_cap=4096, stderr_cap=4096)
    assert pid_1.startswith("0::/") and init.endswith(pid_1[len("0::"):]), (pid_1, init)
    # The op sees its cgroup from pid 1's cgroup namespace, which was made in init: ops is init's sibling.
    assert result.stdout.decode().strip() == "0::/../ops", result.stdout


@pytest.mark.usefixtures("contained")
@pytest.mark.cgroup2
@pytest.mark.skipif(not _cgroup_v2(), reason="needs cgroup v2 with memory and pids; this host is v1")
def test_on_cgroup_v2_a_tmpfs_fill_counts_refused_charges_in_memory_events(sandbox_ids, state_root):
    """S14 on v2: the fill's charges refused at memory.max are counted in the ops cgroup's memory.events (max)
    and name MEMORY (tmpfs pages are not freed by a kill, so the kernel refuses the write rather than OOM-kill
    the writer: measured in the platform-check guest, oom_kill 0 and max 174160); pid 1 lives."""
    ledger = RecordingLedger()
    with start(sandbox_ids, state_root, limits=Limits(memory_bytes=48 * MIB, tmp_bytes=256 * MIB), ledger=ledger) as sandbox:
        before = sandbox.cgroup.counters()
        filled = sandbox.run([PYTHON, "-c", FILL_TMP], env={}, timeout_ms=30_000, stdout_cap=4096, stderr_cap=4096)
        after = sandbox.cgroup.counters()
    assert filled.limit == "MEMORY" and after.memory_failures > before.memory_failures
    assert _init_status(ledger, sandbox.id) == 0


@pytest.mark.usefixtures("contained")
@pytest.mark.parametrize("oom_killed", [True, False])
def test_a_pid_1_that_dies_anyway_under_an_oom_kill_is_memory_never_an_internal_failure(sandbox_ids, state_root, oom_killed, monkeypatch):
    """S14: should pid 1 die under an op (here the host kills it) while the sandbox's cgroups counted an OOM
    kill, the failure carries the class MEMORY (casebox sandbox run prints it and exits 0); without such a
    count it stays an internal failure, with no class and no wait status made up."""
    from steward.failure import SandboxFailure

    with start(sandbox_ids, state_root) as sandbox:
        real = sandbox.cgroup.counters
        calls = []

        def counted():
            calls.append(1)
            found = real()
            return dataclasses.replace(found, oom_kills=found.oom_kills + len(calls) - 1) if oom_killed else found

        monkeypatch.setattr(sandbox.cgroup, "counters", counted)
        killer = threading.Timer(0.5, os.kill, (sandbox.init_pid, 9))
        killer.start()
        try:
            with pytest.raises(SandboxFailure) as caught:
                sandbox.run(["/usr/bin/sleep", "10"], env={}, timeout_ms=20_000, stdout_cap=64, stderr_cap=64)
        finally:
            killer.cancel()
    assert caught.value.limit == ("MEMORY" if oom_killed else None)


# -- the op's memory high-water mark (issue 12) --------------------------------------

# Touches its argument in MiB: the bytes object is filled, so every page is charged to the ops cgroup.
TOUCH = "import sys\nheld = b'x' * (int(sys.argv[1]) << 20)\n"


def _two_ops(sandbox) -> tuple[OpResult, OpResult]:
    """An op that touches 64 MiB, then one that touches 1 MiB, in one sandbox under a 256 MiB cap."""
    big, small = (sandbox.run([PYTHON, "-c", TOUCH, size], env={}, timeout_ms=30_000, stdout_cap=4096, stderr_cap=4096)
                  for size in ("64", "1"))
    assert isinstance(big, OpResult) and isinstance(small, OpResult) and big.limit == small.limit == "OK", (big, small)
    return big, small


@pytest.mark.usefixtures("contained")
def test_each_op_reports_its_own_memory_peak_and_the_receipt_carries_it(sandbox_ids, state_root):
    """S14 / issue 12: an op that touches 64 MiB under a larger cap has a memory peak of at least 64 MiB, as the
    ops cgroup measured it, and its receipt's observed.memory_peak_bytes is that peak; the next op in the same
    sandbox, touching little, has a much smaller one because the peak is reset before each op (v1's
    memory.max_usage_in_bytes; v2's memory.peak where the kernel lets a write reset it, 6.12 and later). Where
    it cannot be reset (v2 on 5.19 to 6.11, bookworm's guest) the second op reports the peak since the sandbox
    began, as docs/receipts.md says, never less."""
    from executor.evidence.receipts import outcome_from_launcher

    with start(sandbox_ids, state_root, limits=Limits(memory_bytes=256 * MIB)) as sandbox:
        resets = sandbox.cgroup.peak_resets
        big, small = _two_ops(sandbox)
    assert big.memory_peak_bytes >= 64 * MIB, big.memory_peak_bytes
    if resets:
        assert small.memory_peak_bytes < 32 * MIB, (big.memory_peak_bytes, small.memory_peak_bytes)
    else:
        assert small.memory_peak_bytes >= big.memory_peak_bytes
    assert outcome_from_launcher(big).observed.memory_peak_bytes == big.memory_peak_bytes


@pytest.mark.usefixtures("contained")
@pytest.mark.cgroup2
@pytest.mark.skipif(not _cgroup_v2(), reason="needs cgroup v2 with memory and pids; this host is v1")
def test_on_cgroup_v2_the_memory_peak_is_the_ops_cgroups_memory_peak(sandbox_ids, state_root):
    """S14 / issue 12 on v2: the peak is read from the ops cgroup's memory.peak (kernel 5.19 and later; before,
    it is null). The starter resets it exactly where the kernel made the file writable (6.12 and later, where a
    write resets the peak for reads through the same descriptor): there the second op's peak is its own, much
    smaller; on 5.19 to 6.11 it is the peak since the sandbox began, as docs/receipts.md says. Whether a write
    resets it is probed here with a descriptor of the test's own (bookworm's 6.1 lets root open the file for
    writing and refuses only the write)."""
    with start(sandbox_ids, state_root, limits=Limits(memory_bytes=256 * MIB)) as sandbox:
        group = sandbox.cgroup
        path = os.path.join(group.ops, "memory.peak")
        if not os.path.exists(path):
            assert group.memory_peak() is None
            pytest.skip("this kernel keeps no memory.peak (before 5.19): the peak is null")
        try:
            probe = os.open(path, os.O_RDWR)
        except PermissionError:
            writable = False
        else:
            try:
                os.pwrite(probe, b"0", 0)
                writable = True
            except OSError:
                writable = False
            finally:
                os.close(probe)
        big, small = _two_ops(sandbox)
        with open(path) as file:
            since_start = int(file.read())  # a descriptor of its own: never reset by the starter
    assert group.peak_resets == writable
    assert big.memory_peak_bytes >= 64 * MIB, big.memory_peak_bytes
    assert since_start >= big.memory_peak_bytes
    if writable:
        assert small.memory_peak_bytes < 32 * MIB, (big.memory_peak_bytes, small.memory_peak_bytes)
    else:
        assert small.memory_peak_bytes >= big.memory_peak_bytes
