"""`casebox steward serve` as root: the socket, SO_PEERCRED, sessions over the wire, hostile and concurrent clients."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from journal.errors import Refused
from journal.format import Kind
from daemon_support import running_daemon, sealed, wait_for
from sandbox_support import contained, processes_of  # noqa: F401
from steward import client, retirement
from steward.client import RemoteSession
from steward.session import Session, Steward
from steward_support import ENV, TRUE, accept_all, last_of, sealed_reading, settings

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]
STRANGER = 1234


@pytest.fixture
def daemon(tmp_path, sandbox_ids):
    with running_daemon(tmp_path, sandbox_ids) as made:
        yield made


def test_the_socket_is_root_only_without_a_casebox_group(daemon):
    """The socket's access: 0660 group casebox when that group exists, else 0600 root only."""
    info = os.stat(daemon.socket)
    assert stat.S_ISSOCK(info.st_mode) and (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    assert "mode 0600, root only" in daemon.text()


def test_the_client_offers_exactly_the_in_process_session_calls():
    """One API: every public call of the in-process Session exists on RemoteSession with the same parameters."""
    import inspect

    calls = {"info", "add_capability", "set_interpreter", "create_output", "start_sandbox", "start_ahead", "take_sandbox", "run",
             "close_sandbox", "seal_output", "open_output", "publish", "close", "abandon"}
    for name in calls:
        local, remote = inspect.signature(getattr(Session, name)), inspect.signature(getattr(RemoteSession, name))
        assert list(local.parameters) == list(remote.parameters), name


def test_a_session_over_the_socket_is_the_same_session(daemon, tmp_path):
    """The wire session: same values, same journal, same sealed tombstone, and the evidence exported.

    A capability crosses as a descriptor and passes F4's predicate (executor.capability) in the daemon; so does
    the interpreter, which every sandbox then runs from an execute-only copy (non-dumpable, E7).
    """
    session = client.connect(daemon.socket).open_session("attempt-1")
    interpreter = os.path.realpath("/usr/bin/python3")
    session.set_interpreter(os.open(interpreter, os.O_RDONLY), interpreter)
    session.create_output("out", max_bytes=1 << 20)
    ready = session.start_sandbox(write=["out"])
    proof = ready.proof
    assert not any(proof[name] for name in ("cap_inh", "cap_prm", "cap_eff", "cap_bnd", "cap_amb"))
    assert proof["no_new_privs"] and not proof["dumpable"] and proof["seccomp"] == 2 and len(proof["filter_digest"]) == 32
    outcome = session.run(["/bin/sh", "-c", "printf hi > /out/out/f; echo ok"], env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    assert (outcome.exit_code, outcome.observation.stdout) == (0, b"ok\n")
    dumpable = session.run([interpreter, "-S", "-c", "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"],
                           env=ENV, timeout_ms=10_000, stdout_cap=100, stderr_cap=1000)
    assert dumpable.observation.stdout == b"0\n", dumpable.observation.stderr
    session.close_sandbox()
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "data").write_text("from the client\n")
    session.add_capability("tree", os.open(clean, os.O_RDONLY | os.O_DIRECTORY))
    session.start_sandbox(read=["tree"])
    read = session.run(["/bin/cat", "/cap/tree/data"], env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    assert read.observation.stdout == b"from the client\n"
    session.close_sandbox()
    sealed = session.seal_output("out")
    fd = session.open_output("out")
    try:
        with open(os.open("f", os.O_RDONLY, dir_fd=fd), "rb") as file:
            assert file.read() == b"hi"
    finally:
        os.close(fd)
    leaky = tmp_path / "leaky"
    (leaky / ".git").mkdir(parents=True)
    with pytest.raises(Refused, match=r"capability leaky/\.git: is a \.git segment"):
        session.add_capability("leaky", os.open(leaky, os.O_RDONLY | os.O_DIRECTORY))
    session.publish("attempt-1.case.receipt.json", b"{}")
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    fd = os.open(evidence, os.O_RDONLY | os.O_DIRECTORY)
    try:
        closed = session.close(fd)
    finally:
        os.close(fd)
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    assert sealed.inventory_digest.startswith("sha256:")
    reading = sealed_reading(daemon.state, closed.stage_id)
    assert reading.head == closed.head
    assert sorted(os.listdir(evidence)) == ["attempt-1.case.receipt.json", "journal", "seal.json"]
    assert f"closed stage {closed.stage_id}: CLEANED, VERIFIED" in daemon.text()


def _as_stranger(socket_path: str) -> str:
    """Connect and OPEN as another uid, in a child; what it was told."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.setgroups([])
            os.setgid(STRANGER)
            os.setuid(STRANGER)
            client.connect(socket_path).open_session("attempt-1")
            answer = "opened"
        except Refused as refusal:
            answer = refusal.sentence()
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            answer = f"{type(error).__name__}: {error}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 4096).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    return answer


def test_sandboxes_started_ahead_over_the_socket(tmp_path, sandbox_ids):
    """START_AHEAD and TAKE: the daemon's session starts a sandbox on its own thread while the open one runs an
    op, tells its depth in OPEN's reply (sandboxes_ahead), refuses one more than that, and retires the stage
    VERIFIED with the sandbox it started ahead taken and closed."""
    with running_daemon(tmp_path, sandbox_ids, settings="sandboxes_ahead = 1\n") as daemon:
        session = client.connect(daemon.socket).open_session("attempt-ahead")
        assert session.info().ahead == 1
        first = session.start_sandbox()
        second = session.start_ahead()
        with pytest.raises(Refused, match="more than 1 sandboxes started ahead"):
            session.start_ahead()
        assert session.run(["/usr/bin/true"], env=ENV, timeout_ms=5000, stdout_cap=10, stderr_cap=10).exit_code == 0
        session.close_sandbox()
        taken = session.take_sandbox()
        assert taken.sandbox == second != first.sandbox and taken.proof["seccomp"] == 2
        outcome = session.run(["/usr/bin/true"], env=ENV, timeout_ms=5000, stdout_cap=10, stderr_cap=10)
        assert outcome.sandbox == second and outcome.exit_code == 0
        session.close_sandbox()
        closed = session.close()
        assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")


def test_sigterm_closes_a_sandbox_started_ahead_with_its_session(tmp_path, sandbox_ids):
    """C9 when the daemon stops: a session with a sandbox open and one started ahead and never taken is retired
    (SHUTDOWN) with both shut down by the steward, nothing of the dedicated ids left running."""
    with running_daemon(tmp_path, sandbox_ids, settings="sandboxes_ahead = 1\n") as daemon:
        session = client.connect(daemon.socket).open_session("attempt-stop")
        session.start_sandbox()
        waiting = session.start_ahead()
        # Spawned once an op of the open sandbox is released.
        assert session.run(["/usr/bin/true"], env=ENV, timeout_ms=5000, stdout_cap=10, stderr_cap=10).exit_code == 0
        assert daemon.stop() == 0
        reading = sealed_reading(daemon.state, session.stage_id)
        terminal = [record.fields for record in reading.records
                    if record.kind is Kind.PROCESS_TERMINAL and record.fields["op_id"] == f"{waiting}.init"]
        assert [fields["reaper"] for fields in terminal] == ["steward"]
        assert last_of(reading, Kind.RETIRED).fields["note"] == "session=SHUTDOWN diagnostic=SHUTDOWN"
        assert processes_of(*sandbox_ids) == []


def test_a_client_with_the_wrong_uid_is_refused_and_the_refusal_logged(daemon):
    """S2-style peer check: SO_PEERCRED against client_uids; the refusal names the uid and is logged."""
    os.chmod(daemon.socket, 0o666)
    answer = _as_stranger(daemon.socket)
    assert answer == f"client uid: {STRANGER} is not allowed to use this steward (client_uids)."
    assert f"refused client pid" in daemon.text() and f"uid {STRANGER} is not in client_uids" in daemon.text()
    assert os.listdir(os.path.join(daemon.state, "stages")) == []


def test_a_client_that_disconnects_mid_session_is_cleaned_up_and_retired_unverified(daemon, sandbox_ids):
    """C8: the daemon closes the sandbox, proves cleanup, and retires the stage with UNVERIFIED evidence."""
    session = client.connect(daemon.socket).open_session("attempt-1")
    session.create_output("out", max_bytes=1 << 20)
    session.start_sandbox(write=["out"])
    session.run(TRUE, env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    stage_id = session.stage_id
    session.abandon()
    wait_for(lambda: stage_id in sealed(daemon.state))
    reading = sealed_reading(daemon.state, stage_id)
    assert last_of(reading, Kind.CLEANUP_EVIDENCE).fields["outcome"] == "UNVERIFIED"
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=ABANDONED diagnostic=SESSION_ABANDONED"
    assert f"left stage {stage_id} before CLOSE" in daemon.text()
    assert processes_of(*sandbox_ids) == []


def test_a_client_ends_its_session_as_runtime_changed_and_no_other_way(daemon, sandbox_ids):
    """C7 over the socket: END retires the stage UNVERIFIED with the one ending a client may give itself,
    RUNTIME_CHANGED, as the tombstone's diagnostic; an ending that is the daemon's (SHUTDOWN, IDLE) or CLOSED is
    refused and the session goes on, so no client makes its tombstone blame the daemon or claim a close."""
    session = client.connect(daemon.socket).open_session("attempt-1")
    session.start_sandbox()
    session.run(TRUE, env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    for forged in ("SHUTDOWN", "IDLE", "CLOSED", "ABANDONED"):
        with pytest.raises(Refused) as refused:
            session.end(forged)
        assert refused.value.sentence() == "$.body.ending: must be one of RUNTIME_CHANGED."
    session.close_sandbox()
    closed = session.end("RUNTIME_CHANGED")
    assert (closed.cleanup, closed.diagnostic, closed.exported) == ("UNVERIFIED", "RUNTIME_CHANGED", ())
    reading = sealed_reading(daemon.state, session.stage_id)
    assert last_of(reading, Kind.CLEANUP_EVIDENCE).fields["outcome"] == "UNVERIFIED"
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=RUNTIME_CHANGED diagnostic=RUNTIME_CHANGED"
    assert processes_of(*sandbox_ids) == []


def test_a_client_that_breaks_the_protocol_abandons_its_session(daemon):
    """An out-of-sequence message ends the connection; the session is retired as abandoned."""
    connection = client.connect(daemon.socket)
    session = connection.open_session("attempt-1")
    endpoint = session._endpoint
    endpoint.send_seq = 7
    endpoint.send("STOP", {})
    with pytest.raises(client.WireError):
        endpoint.receive()
    wait_for(lambda: session.stage_id in sealed(daemon.state))
    assert "STOP is numbered 7, expected 1" in daemon.text()


def test_four_sessions_at_once(daemon):
    """Four clients hold sessions at the same time; their sandboxes take the dedicated UID's lease in turn."""
    barrier = threading.Barrier(4, timeout=60)
    results, errors = {}, []

    def one(index: int) -> None:
        try:
            session = client.connect(daemon.socket).open_session(f"attempt-{index}")
            barrier.wait()
            session.create_output("out", max_bytes=1 << 20)
            session.start_sandbox(write=["out"])
            outcome = session.run(["/bin/sh", "-c", f"echo {index} > /out/out/n; sleep 0.2; cat /out/out/n"], env=ENV,
                                  timeout_ms=10_000, stdout_cap=100, stderr_cap=100)
            session.close_sandbox()
            session.seal_output("out")
            results[index] = (outcome.observation.stdout, session.close())
        except BaseException as error:  # noqa: BLE001 - collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and sorted(results) == [0, 1, 2, 3]
    lifetimes = []
    for index, (stdout, closed) in results.items():
        assert stdout == f"{index}\n".encode()
        assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
        reading = sealed_reading(daemon.state, closed.stage_id)
        assert reading.verdict == "VALID"
        times = {(record.kind, record.fields.get("role") or record.fields.get("op_id")): record.fields.get("at")
                 for record in reading.records}
        lifetimes.append((times[(Kind.PROCESS_INTENT, "launcher")], times[(Kind.PROCESS_TERMINAL, f"{closed.stage_id}-1.init")]))
    lifetimes.sort()
    assert all(end < next_start for (_, end), (next_start, _) in zip(lifetimes, lifetimes[1:])), \
        "two sandboxes ran as the dedicated UID at once (S6): the lease must serialize them"
    assert len(sealed(daemon.state)) == 4


def test_sigterm_retires_open_sessions_and_removes_the_socket(daemon):
    """Stopping the daemon retires what is still open as UNVERIFIED (SHUTDOWN): nothing is left running or in
    stages/, and the exit is 0 because every session was retired in time."""
    session = client.connect(daemon.socket).open_session("attempt-1")
    session.start_sandbox()
    assert daemon.stop() == 0
    assert not os.path.exists(daemon.socket)
    assert session.stage_id in sealed(daemon.state)
    assert os.listdir(os.path.join(daemon.state, "stages")) == []
    with Steward(settings(daemon.state, (1, 1)), capability_check=accept_all) as steward:
        assert retirement.assess(steward.root, session.stage_id).state == retirement.SEALED
    assert last_of(sealed_reading(daemon.state, session.stage_id), Kind.RETIRED).fields["note"] == "session=SHUTDOWN diagnostic=SHUTDOWN"


def _config(tmp_path, sandbox_ids, socket_path: str, state: str):
    from executor.cli.config import Config

    return Config(state_root=state, socket=socket_path, sandbox_uid=sandbox_ids[0], sandbox_gid=sandbox_ids[1])


def test_the_cli_uses_the_daemon_when_it_answers(daemon, tmp_path, sandbox_ids):
    from executor.cli import sessions

    session = sessions.open_session(_config(tmp_path, sandbox_ids, daemon.socket, daemon.state), "attempt-1")
    assert isinstance(session, RemoteSession)
    assert session.close().cleanup == "CLEANED"


def test_an_explicit_state_root_runs_the_steward_embedded_even_when_a_daemon_answers(daemon, tmp_path, sandbox_ids):
    """verify and demo with --state-root: that state root is this process's, so the daemon is not asked."""
    from executor.cli import sessions

    config = _config(tmp_path, sandbox_ids, daemon.socket, str(tmp_path / "own-state"))
    session = sessions.open_session(config, "attempt-1", embedded=True)
    assert isinstance(session, Session) and sessions.steward_of(session, config).endswith(str(tmp_path / "own-state"))
    assert session.close().tombstone.startswith(str(tmp_path / "own-state"))
    assert os.listdir(os.path.join(daemon.state, "stages")) == []


def test_without_a_daemon_root_gets_an_embedded_session_with_the_same_evidence(tmp_path, sandbox_ids):
    """Embedded mode: no socket answers, the caller is root: the same steward code runs in process for one session."""
    from executor.cli import sessions

    state = str(tmp_path / "state")
    session = sessions.open_session(_config(tmp_path, sandbox_ids, str(tmp_path / "none.sock"), state), "attempt-1")
    assert isinstance(session, Session)
    session.start_sandbox()
    session.run(TRUE, env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    session.close_sandbox()
    closed = session.close()
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    assert sealed_reading(state, closed.stage_id).verdict == "VALID"
    assert session.steward.root.fd == -1, "the embedded steward lives for its one session"


def test_without_a_daemon_an_unprivileged_caller_is_told_what_to_do(tmp_path, sandbox_ids, monkeypatch):
    from executor.cli import sessions
    from executor.cli.frontend import NeedsRoot

    monkeypatch.setattr(sessions.os, "geteuid", lambda: 1000)
    with pytest.raises(NeedsRoot, match="start casebox-steward.service, or run it as root: sudo casebox"):
        sessions.open_session(_config(tmp_path, sandbox_ids, str(tmp_path / "none.sock"), str(tmp_path / "state")), "attempt-1")
