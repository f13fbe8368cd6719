"""The steward daemon under faults: SIGTERM during a long case, idle and hostile clients, no descriptor left.

Each test runs its own `casebox steward serve` (tests/daemon_support.py) with the bounds it needs; the
dedicated ids, the state root and the socket are the test's own.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import threading
import time

import psutil
import pytest

from daemon_support import running_daemon, sealed, wait_for
from journal.format import Kind
from sandbox_support import contained, processes_of  # noqa: F401
from steward import client
from steward.client import SessionEnded
from steward.failure import SandboxFailure
from steward.stateroot import StateRoot
from steward.wire import CLIENT, Endpoint
from steward_support import ENV, TRUE, kinds, last_of, sealed_reading

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("contained")]
STRANGER = 1234
CONNECTIONS = 2_000


def _run(session, argv, timeout_ms=10_000):
    return session.run(argv, env=ENV, timeout_ms=timeout_ms, stdout_cap=1024, stderr_cap=1024)


def _running(uid: int, name: str) -> bool:
    for process in psutil.process_iter(["uids", "name"]):
        if process.info["uids"] and process.info["uids"].real == uid and process.info["name"] == name:
            return True
    return False


def test_sigterm_during_a_ninety_second_case_retires_the_session_in_time(tmp_path, sandbox_ids):
    """SIGTERM during an op of 90 s (longer than the old 60 s wait, and than stop_seconds): the daemon stops
    accepting, kills the op (pid 1 reaps it and reports its raw wait status, which the journal records), retires
    the session as UNVERIFIED (SHUTDOWN) and exits 0 because all of that was in time; the client is told why."""
    with running_daemon(tmp_path, sandbox_ids, settings="stop_seconds = 30\n") as daemon:
        session = client.connect(daemon.socket).open_session("attempt-1")
        session.start_sandbox()
        answers = {}
        running = threading.Thread(target=lambda: answers.update(outcome=_run(session, ["/bin/sleep", "90"], 120_000)))
        running.start()
        wait_for(lambda: _running(sandbox_ids[0], "sleep"))
        began = time.monotonic()
        code = daemon.stop(timeout=60)
        stopped = time.monotonic() - began
        running.join(30)
        log = daemon.text()
    assert code == 0, log
    assert stopped < 30, f"the stop took {stopped:.1f} s: the op was waited for, not ended"
    assert not os.path.exists(daemon.socket)
    outcome = answers["outcome"]
    assert os.WIFSIGNALED(outcome.wait_status) and os.WTERMSIG(outcome.wait_status) == signal.SIGKILL
    with pytest.raises(SessionEnded, match="the steward is shutting down"):
        session.close_sandbox()
    assert sealed(daemon.state) == [session.stage_id] and os.listdir(os.path.join(daemon.state, "stages")) == []
    reading = sealed_reading(daemon.state, session.stage_id)
    terminals = {record.fields["op_id"]: record.fields for record in reading.records if record.kind is Kind.PROCESS_TERMINAL}
    assert terminals[outcome.op_id] == {**terminals[outcome.op_id], "wait_status": signal.SIGKILL, "reaper": "launcher"}
    assert terminals[f"{session.stage_id}-1.init"]["wait_status"] == 0
    assert last_of(reading, Kind.CLEANUP_EVIDENCE).fields["outcome"] == "UNVERIFIED"
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=SHUTDOWN diagnostic=SHUTDOWN"
    assert "stopped: every open session was retired" in log
    assert processes_of(*sandbox_ids) == []


def test_sigterm_answers_a_start_waiting_for_the_lease_and_boots_nothing_more(tmp_path, sandbox_ids):
    """A START that waits for the dedicated UID's lease when SIGTERM arrives is answered at once ("the steward
    is stopping") instead of booting a sandbox for a session that is about to be retired; both sessions are
    retired as SHUTDOWN, and the waiting one's journal holds no sandbox at all."""
    with running_daemon(tmp_path, sandbox_ids, settings="stop_seconds = 30\n") as daemon:
        holder = client.connect(daemon.socket).open_session("attempt-holder")
        waiter = client.connect(daemon.socket).open_session("attempt-waiter")
        holder.start_sandbox()
        answers = {}

        def start() -> None:
            try:
                waiter.start_sandbox()
                answers["started"] = True
            except SandboxFailure as failure:
                answers["failure"] = str(failure)

        running = threading.Thread(target=lambda: answers.update(outcome=_run(holder, ["/bin/sleep", "90"], 120_000)))
        running.start()
        wait_for(lambda: _running(sandbox_ids[0], "sleep"))
        starting = threading.Thread(target=start)
        starting.start()
        time.sleep(0.5)
        assert daemon.stop(timeout=60) == 0, daemon.text()
        running.join(30)
        starting.join(30)
    assert answers.get("failure") == "the steward is stopping; it starts nothing new", answers
    reading = sealed_reading(daemon.state, waiter.stage_id)
    roles = {record.fields["role"] for record in reading.records if record.kind is Kind.PROCESS_INTENT}
    assert roles == {"helper"}, "a sandbox was booted for a session being retired"
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=SHUTDOWN diagnostic=SHUTDOWN"


def test_sigterm_names_a_session_it_cannot_retire_in_time_and_exits_1(tmp_path, sandbox_ids, casebox):
    """SIGTERM with a session whose cleanup waits for the dedicated UID's lease (held here, as a running
    `stage recover` would): past stop_seconds the daemon names the stage in its log and exits 1, so systemd
    shows the stop failed; recovery then finishes the stage."""
    with running_daemon(tmp_path, sandbox_ids, settings="stop_seconds = 3\n") as daemon:
        session = client.connect(daemon.socket).open_session("attempt-1")
        root = StateRoot.open(daemon.state)
        try:
            with root.lease(sandbox_ids[0], wait_seconds=5):
                began = time.monotonic()
                code = daemon.stop(timeout=60)
                stopped = time.monotonic() - began
        finally:
            root.close()
        log = daemon.text()
    assert code == 1, log
    assert 3 <= stopped < 20
    assert f"stage {session.stage_id} of client pid {os.getpid()}" in log
    assert "was not retired within 3 s (stop_seconds); casebox stage recover --all finishes it" in log
    config = tmp_path / "daemon.toml"
    result = casebox("--config", str(config), "stage", "recover", "--all", "--state-root", daemon.state)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert f"ok   {session.stage_id}: ACTIVE -> SEALED (SESSION_RECOVERED)" in result.stdout.decode()


def test_an_idle_client_is_ended_after_the_idle_timeout_and_a_second_client_then_runs(tmp_path, sandbox_ids):
    """A client that holds the dedicated UID (an open sandbox) and then sends nothing is ended after
    idle_seconds: its session retired as UNVERIFIED (SESSION_IDLE), the lease free, and the next client's
    session, which waited for that lease, runs and is fully verified. The idle client is told why."""
    with running_daemon(tmp_path, sandbox_ids, settings="idle_seconds = 3\n") as daemon:
        idle = client.connect(daemon.socket).open_session("attempt-idle")
        idle.start_sandbox()
        began = time.monotonic()
        second = client.connect(daemon.socket).open_session("attempt-next")
        waited = time.monotonic() - began
        second.start_sandbox()
        assert _run(second, TRUE).exit_code == 0
        second.close_sandbox()
        closed = second.close()
        with pytest.raises(SessionEnded, match=r"the session sent nothing for 3 s \(idle_seconds\)"):
            _run(idle, TRUE)
        log = daemon.text()
    assert 2 <= waited < 30, f"the second client waited {waited:.1f} s"
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    reading = sealed_reading(daemon.state, idle.stage_id)
    assert Kind.PROCESS_INTENT in kinds(reading)
    assert last_of(reading, Kind.CLEANUP_EVIDENCE).fields["outcome"] == "UNVERIFIED"
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=IDLE diagnostic=SESSION_IDLE"
    assert f"stage {idle.stage_id}: the session sent nothing for 3 s" in log


def test_a_connection_that_never_opens_a_session_is_closed_after_the_idle_timeout(tmp_path, sandbox_ids):
    """Before OPEN an idle connection holds only a descriptor, and only for idle_seconds: then it is told why
    and closed."""
    with running_daemon(tmp_path, sandbox_ids, settings="idle_seconds = 1\n") as daemon:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(daemon.socket)
        sock.settimeout(10)
        reply = Endpoint(sock, CLIENT).receive()
        assert reply.type == "FAILED" and reply.re == 0 and reply.body["open"] is False
        assert "sent nothing for 1 s (idle_seconds)" in reply.body["reason"]
        assert sock.recv(16) == b""
        sock.close()


def _hold_connections(socket_path: str, count: int, report: int, release: int) -> None:
    """In a child as STRANGER: connect ``count`` times and keep every socket; report (answered, refusal)."""
    try:
        # Room for every connection beside whatever this process inherited from the test run.
        room = count + len(os.listdir("/proc/self/fd")) + 64
        resource.setrlimit(resource.RLIMIT_NOFILE, (room, room))
        os.setgroups([])
        os.setgid(STRANGER)
        os.setuid(STRANGER)
        held = []
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(socket_path)
            held.append(sock)
        time.sleep(1)
        poller = select.poll()
        for sock in held:
            poller.register(sock, select.POLLIN)
        readable = {fd for fd, _ in poller.poll(0)}
        answered = [sock for sock in held if sock.fileno() in readable]
        first = Endpoint(answered[0], CLIENT).receive() if answered else None
        reason = first.body["reason"] if first is not None and first.type == "FAILED" else repr(first)
        os.write(report, f"{len(answered)}\n{reason}".encode())
        os.read(release, 1)
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        os.write(report, f"-1\n{type(error).__name__}: {error}".encode())
    finally:
        os._exit(0)


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_two_thousand_idle_connections_from_an_allowed_uid_leave_the_daemon_bounded_and_root_served(tmp_path, sandbox_ids):
    """2,000 connections from a uid in client_uids that never send: the daemon keeps max_connections_per_uid of
    them, each a descriptor and no thread, answers every other one at once with the cap it passed (a refusal,
    not a hang), does not spin, and root still gets a fully verified session."""
    with running_daemon(tmp_path, sandbox_ids, client_uids=(0, STRANGER)) as daemon:
        os.chmod(daemon.socket, 0o666)
        descriptors, threads = daemon.descriptors(), daemon.threads()
        report_read, report_write = os.pipe()
        release_read, release_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _hold_connections(daemon.socket, CONNECTIONS, report_write, release_read)
        try:
            os.close(report_write)
            answered, reason = os.read(report_read, 4096).decode().split("\n", 1)
            assert int(answered) == CONNECTIONS - 8, (answered, reason)
            assert reason.startswith(f"uid {STRANGER} already has 8 connections to this steward (max_connections_per_uid)")
            assert daemon.descriptors() <= descriptors + 8, "the daemon holds more than its cap of connections"
            assert daemon.threads() <= threads, "an idle connection holds a thread"
            before = _cpu_seconds(daemon.process.pid)
            time.sleep(1)
            assert _cpu_seconds(daemon.process.pid) - before < 0.2, "the daemon spins while the connections idle"
            session = client.connect(daemon.socket).open_session("attempt-root")
            session.start_sandbox()
            assert _run(session, TRUE).exit_code == 0
            session.close_sandbox()
            closed = session.close()
            assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
        finally:
            os.write(release_write, b"x")
            os.waitpid(pid, 0)
            for fd in (report_read, release_read, release_write):
                os.close(fd)
        log = daemon.text()
    assert log.count(f"uid {STRANGER} already has 8 connections") == CONNECTIONS - 8


def test_with_no_descriptor_left_the_daemon_refuses_instead_of_spinning(tmp_path, sandbox_ids):
    """A descriptor limit below what the caps need (a unit without LimitNOFILE): once accept fails with EMFILE
    the daemon gives up a spare descriptor to refuse the waiting client, rather than spin on a listener it
    cannot accept from, and serves root again once the connections go."""
    limit = 48

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    settings = "max_connections = 4096\nmax_connections_per_uid = 4096\n"
    with running_daemon(tmp_path, sandbox_ids, settings=settings, client_uids=(0, STRANGER), preexec_fn=low_limit) as daemon:
        os.chmod(daemon.socket, 0o666)
        report_read, report_write = os.pipe()
        release_read, release_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _hold_connections(daemon.socket, 200, report_write, release_read)
        try:
            os.close(report_write)
            answered, reason = os.read(report_read, 4096).decode().split("\n", 1)
            assert int(answered) > 0 and "no descriptor left" in reason, (answered, reason)
            assert daemon.descriptors() <= limit
            before = _cpu_seconds(daemon.process.pid)
            time.sleep(1)
            assert _cpu_seconds(daemon.process.pid) - before < 0.2, "the daemon spins on a listener it cannot accept from"
        finally:
            os.write(release_write, b"x")
            os.waitpid(pid, 0)
            for fd in (report_read, release_read, release_write):
                os.close(fd)
        wait_for(lambda: daemon.descriptors() < limit - 20)
        session = client.connect(daemon.socket).open_session("attempt-root")
        assert session.close().cleanup == "CLEANED"
        assert "below the" in daemon.text() and "raise LimitNOFILE" in daemon.text()
