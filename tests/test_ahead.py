"""Sandboxes started ahead (issue 14): the next case's sandbox comes to READY while the open one runs its op,
and a hostile op in the open sandbox gets nothing from it: S6, S10, S13, S14, C9, J1 with two live sandboxes."""

from __future__ import annotations

import subprocess
import time

import pytest

from journal.errors import Refused
from journal.format import Kind
from sandbox_support import contained  # noqa: F401
from steward import dedicated
from steward.api import Limits
from steward.session import Steward
from steward_support import (  # noqa: F401
    ENV, accept_all, run_true, sealed_reading, settings, state_path, steward,
)

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]

PYTHON = "/usr/bin/python3"


@pytest.fixture
def pipelined(state_path, sandbox_ids):
    """A steward whose sessions start one sandbox ahead, whatever this host's cores."""
    made = Steward(settings(state_path, sandbox_ids, ahead=1), capability_check=accept_all)
    yield made
    made.close()


@pytest.fixture
def two_ahead(state_path, sandbox_ids):
    """A steward whose sessions start two sandboxes ahead."""
    made = Steward(settings(state_path, sandbox_ids, ahead=2), capability_check=accept_all)
    yield made
    made.close()


def _op(session, source: str, *, timeout_ms: int = 20_000):
    return session.run([PYTHON, "-c", source], env=ENV, timeout_ms=timeout_ms, stdout_cap=4096, stderr_cap=4096)


def _index(reading, kind: Kind, op_id: str) -> int:
    (found,) = [n for n, record in enumerate(reading.records) if record.kind is kind and record.fields.get("op_id") == op_id]
    return found


def test_a_sandbox_started_ahead_comes_to_ready_while_the_open_one_runs_its_op(pipelined, state_path):
    """The point of starting ahead, and J1 with two writers: the next sandbox's SANDBOX_READY is recorded
    between the open sandbox's op's PROCESS_INTENT and its PROCESS_TERMINAL, the journal stays VALID, and each
    sandbox has its own launcher, pid 1 and op ids. Red when the start ahead completes before returning. Its
    stage 1 is spawned only once the op is released, so the spawn never delays the op (red when start_ahead
    spawns it at once)."""
    session = pipelined.open_session("attempt-ahead")
    first = session.start_sandbox()
    second = session.start_ahead()
    slow = _op(session, "import time; time.sleep(1.5)")
    assert slow.observation.limit == "OK", slow.observation.stderr
    session.close_sandbox()
    taken = session.take_sandbox()
    assert taken.sandbox == second != first.sandbox
    assert run_true(session).observation.limit == "OK"
    session.close_sandbox()
    closed = session.close()
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    reading = sealed_reading(state_path, closed.stage_id)
    assert reading.verdict == "VALID"
    ready = _index(reading, Kind.SANDBOX_READY, f"{second}.init")
    assert _index(reading, Kind.PROCESS_INTENT, slow.op_id) < ready < _index(reading, Kind.PROCESS_TERMINAL, slow.op_id)
    assert _index(reading, Kind.PROCESS_RELEASED, slow.op_id) < _index(reading, Kind.PROCESS_INTENT, f"{second}.launcher")
    launchers = [record for record in reading.records if record.kind is Kind.PROCESS_INTENT and record.fields["role"] == "launcher"]
    assert [record.fields["op_id"] for record in launchers] == [f"{first.sandbox}.launcher", f"{second}.launcher"]


def test_a_fork_bomb_beside_sandboxes_started_ahead_is_classified_as_its_process_limit(two_ahead):
    """S10, S14: the kernel counts every process of the uid against RLIMIT_NPROC, the waiting sandboxes' pid 1s
    too, so each sandbox's NPROC leaves room for the pid 1s beside it: the cgroup refuses the bomb's fork first
    and counts it, and the class is PIDS. Without that room the rlimit refuses it uncounted and the bomb's
    own exit reads as the candidate's (class OK)."""
    session = two_ahead.open_session("attempt-bomb")
    session.start_sandbox(limits=Limits(processes=8))
    session.start_ahead()
    session.start_ahead()
    # Spawned while an op runs, and only once READY, so their pid 1s run as the pair beside the bomb.
    assert run_true(session).observation.limit == "OK"
    assert all(waiting.completion.join() is None for waiting in session.waiting)
    bomb = _op(session, """
import os, sys, time
children = 0
while True:
    try:
        pid = os.fork()
    except OSError as error:
        print(children, error.errno)
        sys.exit(0)
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children += 1
""")
    assert bomb.observation.limit == "PIDS", (bomb.observation.stdout, bomb.observation.stderr)
    session.close_sandbox()
    for _ in range(2):
        session.take_sandbox()
        assert run_true(session).observation.limit == "OK"
        session.close_sandbox()
    assert session.close().diagnostic == "VERIFIED"


def test_an_op_cannot_reach_the_sandbox_started_ahead_beside_it(pipelined, state_path):
    """S8, S13: the same uid, and still nothing to reach: an op that, for the whole time the sandbox started
    ahead is spawned and bootstrapped beside it (its launcher's record falls inside the op's run), SIGKILLs
    every process it may signal and lists every pid it can see, finds only its own sandbox; the sandbox
    started ahead is READY after it and runs its op."""
    session = pipelined.open_session("attempt-reach")
    session.start_sandbox()
    waiting = session.start_ahead()
    hostile = _op(session, """
import os, signal, time
seen = set()
end = time.monotonic() + 2
while time.monotonic() < end:
    seen.update(int(name) for name in os.listdir('/proc') if name.isdigit())
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
print(sorted(seen))
""")
    assert hostile.observation.limit == "OK", hostile.observation.stderr
    assert set(eval(hostile.observation.stdout.decode())) <= {1, 2, 3}
    session.close_sandbox()
    session.take_sandbox()
    assert run_true(session).observation.limit == "OK"
    session.close_sandbox()
    closed = session.close()
    assert closed.diagnostic == "VERIFIED"
    reading = sealed_reading(state_path, closed.stage_id)
    spawned = _index(reading, Kind.PROCESS_INTENT, f"{waiting}.launcher")
    ready = _index(reading, Kind.SANDBOX_READY, f"{waiting}.init")
    assert _index(reading, Kind.PROCESS_RELEASED, hostile.op_id) < spawned < ready < _index(reading, Kind.PROCESS_TERMINAL, hostile.op_id)


def test_a_start_ahead_tolerates_only_the_sessions_own_sandboxes_on_its_ids(pipelined, sandbox_ids):
    """S6 with two live sandboxes: the open sandbox's processes run as the pair, and a start ahead beside it
    is admitted (red when S6 tolerates nothing); a process outside every sandbox of the session that uses the
    pair is still refused, named (red when the check is gone)."""
    uid, gid = sandbox_ids
    session = pipelined.open_session("attempt-s6")
    session.start_sandbox()
    session.start_ahead()
    session.close_sandbox()
    session.take_sandbox()
    squatter = subprocess.Popen(["/usr/bin/sleep", "30"], user=uid, group=gid)
    try:
        session.start_ahead()
        session.close_sandbox()
        with pytest.raises(Refused, match=f"sandbox uid {uid}.*process {squatter.pid} "):
            session.take_sandbox()
    finally:
        squatter.kill()
        squatter.wait()
    session.close()


def test_a_start_ahead_spawned_beside_a_sandbox_opened_after_it_was_asked_for_passes_s6(pipelined):
    """S6 with the spawn after an op's release: a start ahead asked for beside one sandbox and spawned during
    the op of another opened since (as the case service opens a fresh one when a take failed) tolerates that
    one's pid 1 and op, which run as the pair: the sandboxes it passes over are the session's live ones when
    it is spawned (red when they are those of the ask, which no longer include the open one)."""
    session = pipelined.open_session("attempt-opened-since")
    session.start_sandbox()
    waiting = session.start_ahead()
    session.close_sandbox()
    session.start_sandbox()
    slow = _op(session, "import time; time.sleep(1)")
    assert slow.observation.limit == "OK", slow.observation.stderr
    session.close_sandbox()
    assert session.take_sandbox().sandbox == waiting
    assert run_true(session).observation.limit == "OK"
    session.close_sandbox()
    assert session.close().diagnostic == "VERIFIED"


def test_s6_beside_a_start_ahead_passes_over_a_process_that_can_never_run_again(sandbox_ids):
    """S6 with a sandbox closing beside a start ahead: its pid 1 and ops are exiting, the kernel has taken
    their cgroup from them, and they still hold the uid. A process that is exiting or a zombie runs nothing
    again, so beside the session's own sandboxes it is passed over (red without that rule: the start ahead
    raced the close and failed); alone, S6 still refuses it as before."""
    uid, gid = sandbox_ids
    zombie = subprocess.Popen(["/usr/bin/true"], user=uid, group=gid)
    try:
        for _ in range(200):
            with open(f"/proc/{zombie.pid}/stat") as file:
                if file.read().rpartition(")")[2].split()[0] == "Z":
                    break
            time.sleep(0.01)
        with pytest.raises(Refused, match=f"process {zombie.pid} "):
            dedicated.require_unused(uid, gid)
        dedicated.require_unused(uid, gid, beside=("some-stage-1",))
    finally:
        zombie.wait()


def test_s6_beside_a_start_ahead_still_refuses_a_live_stranger_on_the_pair(sandbox_ids):
    """S6 beside the session's own sandboxes: a running process on the pair that sits in none of their cgroups
    and is not exiting is a stranger, not theirs, and the start ahead is refused, naming it (red when S6 passes
    over more beside a live sandbox than its own processes and exiting ones)."""
    uid, gid = sandbox_ids
    stranger = subprocess.Popen(["/usr/bin/sleep", "30"], user=uid, group=gid)
    try:
        with pytest.raises(Refused, match=f"process {stranger.pid} \\(sleep\\) already runs as it"):
            dedicated.require_unused(uid, gid, beside=("some-stage-1",))
    finally:
        stranger.kill()
        stranger.wait()


def test_a_sandbox_started_ahead_and_never_taken_is_closed_with_its_session(pipelined, state_path):
    """C9: a sandbox started ahead that no one takes is shut down when the session ends, by its one owner:
    its pid 1 reaped by the steward with status 0 and recorded, the cleanup proof CLEANED and VERIFIED."""
    session = pipelined.open_session("attempt-untaken")
    session.start_sandbox()
    waiting = session.start_ahead()
    assert run_true(session).observation.limit == "OK"
    session.close_sandbox()
    closed = session.close()
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    reading = sealed_reading(state_path, closed.stage_id)
    terminal = reading.records[_index(reading, Kind.PROCESS_TERMINAL, f"{waiting}.init")].fields
    assert (terminal["wait_status"], terminal["reaper"]) == (0, "steward")


def test_a_start_ahead_no_op_came_to_spawn_ends_with_its_session_having_run_nothing(pipelined, state_path):
    """C9, J1: a start ahead asked for beside an open sandbox that runs no op is never spawned; the session's
    end releases its output and descriptors, and the journal holds no record of it (nothing of it ran), while
    the cleanup proof is CLEANED and VERIFIED. A take spawns such a start at once (the depth test)."""
    session = pipelined.open_session("attempt-unspawned")
    session.create_output("report")
    session.start_sandbox()
    waiting = session.start_ahead(write=["report"])
    session.close_sandbox()
    closed = session.close()
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    reading = sealed_reading(state_path, closed.stage_id)
    assert reading.verdict == "VALID"
    assert not [record for record in reading.records if str(record.fields.get("op_id", "")).startswith(f"{waiting}.")]


def test_sandboxes_started_ahead_keep_to_their_depth_and_their_outputs(pipelined):
    """The depth is the session's (Settings.ahead), a take needs a sandbox started ahead and none open, and an
    output in a live sandbox is neither sealed nor handed to a second one (E5)."""
    session = pipelined.open_session("attempt-depth")
    with pytest.raises(Refused, match="none was started ahead"):
        session.take_sandbox()
    session.create_output("report")
    session.start_ahead(write=["report"])
    with pytest.raises(Refused, match="more than 1 sandboxes started ahead"):
        session.start_ahead()
    with pytest.raises(Refused, match="write report: is another live sandbox's output"):
        session.start_sandbox(write=["report"])
    with pytest.raises(Refused, match="output report: is still mounted in a live sandbox"):
        session.seal_output("report")
    session.start_sandbox()
    with pytest.raises(Refused, match="is already open; close it before taking another"):
        session.take_sandbox()
    session.close_sandbox()
    session.take_sandbox()
    session.close_sandbox()
    assert session.seal_output("report").files == 0
    assert session.close().diagnostic == "VERIFIED"
