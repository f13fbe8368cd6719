"""C9: close-once capabilities, start outcomes with one owner, and the gate that gives each start right once."""

from __future__ import annotations

import errno
import os

import pytest
from pipeline_support import HEAD, FakeSession

from executor.cases.ownership import (
    CASE_SERVICE,
    PREPARER,
    DirectoryCapability,
    Gate,
    LifecycleEvidence,
    OwnershipError,
    Running,
    Started,
    StartFailed,
)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as error:
        assert error.errno == errno.EBADF
        return False
    return True


@pytest.fixture
def directory_fd(tmp_path):
    return os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)


@pytest.fixture
def session(tmp_path):
    fake = FakeSession(tmp_path / "session")
    yield fake
    fake.release()


def test_a_capability_is_taken_exactly_once(directory_fd, session):
    """C9: taking transfers the descriptor once; a double take is refused and the session still owns it."""
    capability = DirectoryCapability("verifier", directory_fd)
    capability.hand_to(session)
    assert session.capabilities == {"verifier": directory_fd} and is_open(directory_fd)
    with pytest.raises(OwnershipError, match="exactly once"):
        capability.take()
    with pytest.raises(OwnershipError, match="exactly once"):
        capability.close()
    assert is_open(directory_fd)


def test_a_closed_capability_cannot_be_taken(directory_fd):
    """C9: closing releases the descriptor once; a take after close, or a second close, is refused."""
    capability = DirectoryCapability("index", directory_fd)
    capability.close()
    assert not is_open(directory_fd)
    with pytest.raises(OwnershipError, match="already closed"):
        capability.take()
    with pytest.raises(OwnershipError, match="already closed"):
        capability.close()


def test_cancelling_closes(directory_fd):
    """C9: a capability left untaken when its owner gives up is closed (cancel = close)."""
    with DirectoryCapability("tools", directory_fd) as capability:
        pass
    assert capability.state == "closed" and not is_open(directory_fd)
    other = os.dup(0)
    DirectoryCapability("x", other).cancel()
    assert not is_open(other)


def test_a_ready_sandbox_is_taken_by_its_owner_alone(session):
    """C9: a READY start outcome goes to its single owner; another consumer is refused."""
    owner, stranger = object(), object()
    started = Gate(session).starter(CASE_SERVICE, owner).start()
    assert isinstance(started, Started)
    with pytest.raises(OwnershipError, match="cannot take"):
        started.take(stranger)
    running = started.take(owner)
    assert isinstance(running, Running)
    with pytest.raises(OwnershipError, match="exactly once"):
        started.take(owner)
    assert running.close() == HEAD and session.closed_sandboxes == 1
    assert running.close() is None and session.closed_sandboxes == 1


def test_a_closed_sandbox_runs_no_op(session):
    """C9: a taken sandbox runs ops only until it is closed; an op after close is refused, never sent."""
    owner = object()
    running = Gate(session).starter(CASE_SERVICE, owner).start().take(owner)
    running.close()
    with pytest.raises(OwnershipError, match="is closed"):
        running.run(["true"], env={}, timeout_ms=1, stdout_cap=1, stderr_cap=1)
    assert session.ops == []


def test_an_untaken_ready_sandbox_closes_and_returns_its_head(session):
    """C9: a READY capability that is never taken is closed: the sandbox is shut down, the head returned."""
    owner = object()
    started = Gate(session).starter(PREPARER, owner).start()
    assert started.close(owner) == HEAD and session.closed_sandboxes == 1
    with pytest.raises(OwnershipError):
        started.take(owner)


def test_a_sandbox_started_ahead_is_its_owners_alone_and_closes_untaken(session):
    """C9: a sandbox started ahead belongs to the one who started it: no one else takes it; taken, it is the
    READY sandbox; never taken, closing it shuts it down (the head), and a start ahead that failed hands its
    lifecycle evidence back instead, each once."""
    session.ahead = 2
    session.failing_starts = {2}
    owner = object()
    starter = Gate(session).starter(CASE_SERVICE, owner)
    first, second = starter.start_ahead(), starter.start_ahead()
    with pytest.raises(OwnershipError, match="cannot take"):
        first.take(object())
    assert first.close(owner) == HEAD and session.closed_sandboxes == 1
    with pytest.raises(OwnershipError, match="already closed"):
        first.take(owner)
    assert second.close(owner) == LifecycleEvidence("start 2 failed on purpose")
    assert session.open is None and session.waiting == []


def test_a_failed_start_returns_its_evidence_to_its_owner(session):
    """C9: a start that fails cannot be taken; closing it hands its lifecycle evidence to its owner, once."""
    session.failing_starts = {1}
    owner = object()
    failed = Gate(session).starter(CASE_SERVICE, owner).start()
    assert isinstance(failed, StartFailed)
    with pytest.raises(OwnershipError, match="cannot be taken"):
        failed.take(owner)
    with pytest.raises(OwnershipError, match="cannot close"):
        failed.close(object())
    evidence = failed.close(owner)
    assert evidence == LifecycleEvidence("start 1 failed on purpose")
    with pytest.raises(OwnershipError, match="already closed"):
        failed.close(owner)
    assert session.open is None


def test_run_one_hands_a_failed_start_back_as_evidence(session):
    """C9: the case service's one-op helper turns a failed start into the evidence its owner keeps."""
    session.failing_starts = {1}
    starter = Gate(session).starter(CASE_SERVICE, object())
    assert starter.run_one(["true"], env={}, timeout_ms=1, stdout_cap=1, stderr_cap=1) == LifecycleEvidence("start 1 failed on purpose")
    assert starter.run_one(["true"], env={}, timeout_ms=1, stdout_cap=1, stderr_cap=1).observation.limit == "OK"
    assert session.closed_sandboxes == 1


def test_each_start_right_is_given_once():
    """C9: the case service alone starts sandboxes, the dependency preparer alone starts resolvers."""
    gate = Gate(object())
    service, preparer = object(), object()
    gate.starter(CASE_SERVICE, service)
    gate.starter(PREPARER, preparer)
    with pytest.raises(OwnershipError, match="already given"):
        gate.starter(CASE_SERVICE, object())
    with pytest.raises(OwnershipError, match="already given"):
        gate.starter(PREPARER, service)
    with pytest.raises(OwnershipError, match="not a role"):
        gate.starter("evaluator", object())


def test_an_infrastructure_op_that_never_started_is_a_failure_saying_so():
    """C1, fail closed: an op whose child failed before exec (it has no limit class and no exit code) is a
    failure of the step that ran it, named with its failing step and errno, never read as success."""
    from executor.cases.ownership import failure_of
    from pipeline_support import outcome

    assert failure_of(outcome(started=False, wait_status=127 << 8)) == "the op did not start (execve failed with errno 2)"
    assert failure_of(outcome()) is None
