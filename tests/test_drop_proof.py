"""S5: READY requires a proved drop; the launcher and the starter apply the same check."""

from __future__ import annotations

import errno
import os
import re
import socket

import pytest

from launcher import drop, protocol, seccomp
from launcher.protocol import Channel, ProtocolError
from sandbox_support import PYTHON, SANDBOX_ENV, contained, start, state_root  # noqa: F401
from steward.ledger import RecordingLedger
from steward.starter import Sandbox, Spec

UID = GID = 2_000_000_100


def proved() -> dict:
    return {
        "uids": [str(UID)] * 4,
        "gids": [str(GID)] * 4,
        "groups": "",
        "setuid0_errno": errno.EPERM,
        "securebits": drop.LOCKED_SECUREBITS,
        "cap_inh": 0,
        "cap_prm": 0,
        "cap_eff": 0,
        "cap_bnd": 0,
        "cap_amb": 0,
        "no_new_privs": True,
        "dumpable": False,
    }


def filtered() -> dict:
    """READY's filter proof as a complete one reads (S12)."""
    return {
        "seccomp": 2,
        "seccomp_filters": seccomp.inherited_filters() + 1,
        "filter_digest": bytes.fromhex(min(seccomp.SHIPPED_DIGESTS[seccomp.syscalls.MACHINE])),
    }


def test_a_complete_drop_passes():
    drop.check(proved(), UID, GID)


@pytest.mark.parametrize(
    "change, complaint",
    [
        ({"uids": [str(UID), "0", str(UID), str(UID)]}, "Uid is"),
        ({"gids": [str(GID)] * 3 + ["0"]}, "Gid is"),
        ({"groups": "0"}, "supplementary groups 0 remain"),
        ({"setuid0_errno": 0}, "setuid(0) did not fail"),
        ({"securebits": 0}, "securebits are 0x0"),
        ({"cap_inh": 1}, "CapInh is 0x1"),
        ({"cap_prm": 1 << 21}, "CapPrm is"),
        ({"cap_eff": 1}, "CapEff is"),
        ({"cap_bnd": 0x1FFFFFFFFFF}, "CapBnd is"),
        ({"cap_amb": 4}, "CapAmb is"),
        ({"no_new_privs": False}, "NoNewPrivs is not 1"),
        ({"dumpable": True}, "the process is dumpable"),
    ],
)
def test_any_privilege_left_refuses_ready(change, complaint):
    """S5: setuid(0) must fail, every capability set must be empty, NoNewPrivs must be 1."""
    observations = {**proved(), **change}
    with pytest.raises(drop.DropError, match=re.escape(complaint)):
        drop.check(observations, UID, GID)


@pytest.mark.root
def test_the_launcher_refuses_ready_when_nothing_was_dropped():
    """S5: the launcher's own proof reads the kernel's view; still root, it must refuse."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            drop.prove(UID, GID)
            os.write(write_end, b"proved")
        except drop.DropError as error:
            os.write(write_end, str(error).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    verdict = os.read(read_end, 4096).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert verdict.startswith("the drop is not proved") and "CapEff" in verdict


def test_the_starter_refuses_ready_with_privileges_left(tmp_path):
    """S5: the starter checks READY's observations again, with the same rule, before it ACKs."""
    sandbox = Sandbox(Spec(UID, GID), RecordingLedger(), str(tmp_path))
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sandbox.channel = Channel(near, protocol.STARTER)
    launcher = Channel(far, protocol.LAUNCHER)
    launcher.send("READY", proc_hidepid=True, **{**proved(), **filtered(), "cap_eff": 1 << 21})
    with pytest.raises(ProtocolError, match="CapEff is 0x200000"):
        sandbox._bootstrap()
    far.setblocking(False)
    with pytest.raises(BlockingIOError):
        far.recv(64)  # no ACK was sent
    near.close()
    far.close()


@pytest.fixture
def suid_dumpable_user():
    """fs.suid_dumpable at 1 for one test: a UID change then leaves a process dumpable unless it says otherwise."""
    path = "/proc/sys/fs/suid_dumpable"
    with open(path) as file:
        before = file.read().strip()
    with open(path, "w") as file:
        file.write("1")
    try:
        yield
    finally:
        with open(path, "w") as file:
            file.write(before)


@pytest.mark.root
def test_pid1_is_not_dumpable_even_when_the_host_lets_a_uid_change_keep_it(sandbox_ids, state_root, contained, suid_dumpable_user):
    """S5, S8: READY proves pid 1 not dumpable, so the candidate (same UID) cannot read pid 1 through /proc."""
    with start(sandbox_ids, state_root) as sandbox:
        assert sandbox.ready["dumpable"] is False
        result = sandbox.run(
            [PYTHON, "-c", "import os\ntry:\n    os.open('/proc/1/environ', os.O_RDONLY)\n    print('read')\nexcept OSError as e:\n    print(e.errno)"],
            env=dict(SANDBOX_ENV), timeout_ms=20_000, stdout_cap=4096, stderr_cap=4096,
        )
    # hidepid=2 shows a process that may not be read as absent, so ENOENT is as good a refusal as EACCES.
    assert result.wait_status == 0 and result.stdout.strip() in (b"%d" % errno.EACCES, b"%d" % errno.ENOENT), result


def _descriptors(pid: int) -> dict[int, str]:
    """What each open descriptor of ``pid`` refers to, read from the trusted side."""
    return {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


@pytest.mark.root
def test_pid1_holds_only_its_standard_streams_the_channel_and_the_ops_cgroup(sandbox_ids, state_root, contained):
    """S5, S7: before the drop pid 1 closes every descriptor but 0, 1, 2, the channel and the ops cgroup
    (drop.close_descriptors_but), so pid 1 itself, not only each op's child (which marks descriptors
    close-on-exec on its own), holds no staging file, launcher memfd or host directory; and an op leaves it
    nothing new. Read from the host, since an op cannot read pid 1's descriptors."""
    with start(sandbox_ids, state_root) as sandbox:
        ready = _descriptors(sandbox.init_pid)
        result = sandbox.run(["/bin/true"], env=dict(SANDBOX_ENV), timeout_ms=20_000, stdout_cap=4096, stderr_cap=4096)
        after_op = _descriptors(sandbox.init_pid)
        ops_cgroup = os.readlink(f"/proc/self/fd/{sandbox.op_cgroup_fd}")
    assert result.wait_status == 0, result
    assert after_op == ready
    standard = {fd: ready.pop(fd) for fd in (0, 1, 2)}
    assert standard[0] == standard[1] == "/dev/null" and standard[2].startswith("pipe:"), standard
    channel = [fd for fd, target in ready.items() if target.startswith("socket:")]
    assert len(channel) == 1, ready
    del ready[channel[0]]
    assert list(ready.values()) == [ops_cgroup], "pid 1 holds a descriptor it was not designed to keep"
