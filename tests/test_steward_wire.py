"""The steward protocol's bytes (docs/steward-protocol.md): closed, canonical, sequenced, descriptors counted."""

from __future__ import annotations

import array
import dataclasses
import os
import select
import socket
import threading

import pytest

from steward import wire
from steward.wire import CLIENT, STEWARD, Endpoint, WireError


def test_the_documented_open_message():
    """The example in docs/steward-protocol.md, byte for byte."""
    data = wire.encode(0, "OPEN", {"attempt_id": "run-42-1"})
    assert data == bytes.fromhex("00000038") + b'{"body":{"attempt_id":"run-42-1"},"seq":0,"type":"OPEN"}'
    assert wire.decode(data, reply=False) == (0, "OPEN", None, {"attempt_id": "run-42-1"})


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("data, why", [
    (b"\x00\x00\x00\x10" + b'{"body":{},"seq":0,"type":"STOP"}', "length prefix"),
    (frame(b'{"body":{}, "seq":0,"type":"STOP"}'), "canonical"),
    (frame(b'{"seq":0,"type":"STOP","body":{}}'), "canonical"),
    (frame(b'{"body":{},"seq":0,"type":"HALT"}'), "unknown request type"),
    (wire.encode(0, "STOP", {}, re=0), "not a known field"),
    (frame(b'{"body":{},"type":"STOP"}'), "missing"),
    (frame(b'{"body":{},"seq":0,"type":"STOP","x":1}'), "not a known field"),
    (b"\x00\x00", "length prefix"),
])
def test_anything_the_encoder_would_not_write_is_refused(data, why):
    """The decoder refuses non-canonical bodies, unknown types and fields, and a wrong length."""
    with pytest.raises(WireError, match=why):
        wire.decode(data, reply=False)


def test_a_reply_carries_the_number_of_its_request():
    data = wire.encode(3, "OK", {"head": "0" * 64}, re=5)
    assert wire.decode(data, reply=True) == (3, "OK", 5, {"head": "0" * 64})
    with pytest.raises(WireError, match="missing"):
        wire.decode(wire.encode(3, "OK", {}), reply=True)


@pytest.fixture
def pair():
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield Endpoint(near, CLIENT), Endpoint(far, STEWARD)
    near.close()
    far.close()


def test_a_replayed_or_skipped_number_ends_the_connection(pair):
    client, steward = pair
    client.send("STOP", {})
    assert steward.receive().seq == 0
    client.send_seq = 0
    client.send("STOP", {})
    with pytest.raises(WireError, match="numbered 0, expected 1"):
        steward.receive()


def test_descriptors_only_with_the_messages_that_carry_them(pair, tmp_path):
    """A request with the wrong number of descriptors is refused and the descriptors it brought are closed."""
    client, steward = pair
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    client.send("CAPABILITY", {"name": "tree"}, fds=(fd,))
    message = steward.receive()
    assert message.type == "CAPABILITY" and len(message.fds) == 1
    assert os.path.samestat(os.fstat(message.fds[0]), os.fstat(fd))
    message.close_fds()
    before = len(os.listdir("/proc/self/fd"))
    client.send("STOP", {}, fds=(fd,))
    with pytest.raises(WireError, match="STOP carried 1 descriptors"):
        steward.receive()
    assert len(os.listdir("/proc/self/fd")) == before
    os.close(fd)


def test_a_closed_peer_ends_the_connection(pair):
    client, steward = pair
    client.sock.close()
    with pytest.raises(WireError, match="closed"):
        steward.receive()


def test_an_op_outcome_crosses_the_wire_as_the_same_value():
    """One API: the launcher's observation comes back as the very OpResult or OpNotStarted the starter made."""
    from journal.closed import ClosedObject
    from journal.strictjson import canonical, loads
    from steward.api import OpNotStarted, OpOutcome, OpResult

    head = "ab" * 32
    ran = OpResult("OK", 0, 0, 3, 2, 1000, 64 << 20, b"\x00\xffout", b"", False, True, op_id="s-1.op-1")
    # S14 / issue 12: a kernel without memory.peak has no peak, and null crosses the socket as null.
    no_peak = dataclasses.replace(ran, memory_peak_bytes=None)
    failed = OpNotStarted("execve", 2, 127 << 8, 0, op_id="s-1.op-2")
    for observation in (ran, no_peak, failed):
        outcome = OpOutcome("s-1", observation.op_id, 42, 7, 42, observation, head, head, "cd" * 32)
        wire = loads(canonical(outcome.to_wire()), max_bytes=1 << 20)
        assert OpOutcome.from_wire(ClosedObject(wire)) == outcome
    assert not hasattr(ran, "step") and hasattr(failed, "step"), "receipts tell the two apart by their fields"
    assert OpOutcome("s-1", "s-1.op-2", 42, 7, 42, failed, head, head, "cd" * 32).exit_code is None


@pytest.mark.parametrize("peak", [-1, "67108864", True, "missing"])
def test_an_op_outcome_with_a_bad_memory_peak_is_refused_naming_it(peak):
    """S14 / issue 12: the daemon's reply is read as strictly as a receipt: memory_peak_bytes is null or an
    integer from 0 up, and a reply without it is refused, naming the field."""
    from journal.closed import ClosedObject
    from journal.strictjson import StrictJSONError
    from steward.api import OpOutcome, OpResult

    head = "ab" * 32
    ran = OpResult("OK", 0, 0, 3, 2, 1000, 64 << 20, b"out", b"", False, False, op_id="s-1.op-1")
    value = OpOutcome("s-1", ran.op_id, 42, 7, 42, ran, head, head, "cd" * 32).to_wire()
    if peak == "missing":
        del value["observation"]["memory_peak_bytes"]
    else:
        value["observation"]["memory_peak_bytes"] = peak
    with pytest.raises(StrictJSONError) as caught:
        OpOutcome.from_wire(ClosedObject(value))
    assert caught.value.where == "$.observation.memory_peak_bytes", caught.value.sentence()


def test_descriptors_past_the_control_space_end_the_connection_and_none_leaks(pair, tmp_path):
    """SCM_RIGHTS is counted: more descriptors than the protocol's control space holds are truncated by the
    kernel (MSG_CTRUNC), which ends the connection; the ones that did arrive are closed."""
    client, steward = pair
    fds = [os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY) for _ in range(wire.MAX_FDS + 2)]
    before = len(os.listdir("/proc/self/fd"))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    client.sock.sendmsg([wire.encode(0, "CAPABILITY", {"name": "tree"})], ancillary)
    with pytest.raises(WireError, match="truncated"):
        steward.receive()
    assert len(os.listdir("/proc/self/fd")) == before
    for fd in fds:
        os.close(fd)


def test_a_reply_must_name_the_request_it_answers(pair):
    """The client pairs each reply with its request by number; a reply naming another request ends the call."""
    from steward.client import _call

    client, steward = pair

    def answer_wrongly():
        steward.receive()
        steward.send("OK", {}, re=7)

    thread = threading.Thread(target=answer_wrongly)
    thread.start()
    with pytest.raises(WireError, match="names request 7, not 0"):
        _call(client, "STOP", {})
    thread.join()


def _remote(endpoint: Endpoint):
    from steward import api
    from steward.client import RemoteSession

    return RemoteSession(endpoint, api.Opened("s-1", "j-1", "a-1", "0" * 64))


FULL = "the steward's state root /var/lib/casebox is full (No space left on device; 0 bytes free)"


def test_after_a_reply_that_ends_the_session_the_client_sends_nothing_more(pair):
    """A FAILED reply with open false ends the session on the client too: every later call, SEAL included
    (the dependency preparer's seal after a failure), raises the steward's own reason and sends nothing."""
    from steward.client import SessionEnded

    client, steward = pair
    session = _remote(client)
    steward.send("FAILED", {"reason": FULL, "open": False}, re=0)
    with pytest.raises(SessionEnded, match=r"^the steward's state root /var/lib/casebox is full"):
        session.run(["/bin/true"], env={}, timeout_ms=1000, stdout_cap=1, stderr_cap=1)
    assert steward.receive().type == "RUN"
    for call in (lambda: session.seal_output("deps"), session.close, session.close_sandbox):
        with pytest.raises(SessionEnded, match=r"^the steward's state root /var/lib/casebox is full"):
            call()
    session.abandon()
    with pytest.raises(WireError, match="closed the connection"):
        steward.receive()


@pytest.mark.parametrize("request_arrives_first", [True, False])
def test_an_answer_the_steward_sent_before_it_closed_is_read_not_lost(pair, request_arrives_first):
    """The steward may answer a request before it is sent (idle, shutdown, a refused connection) and close:
    whether the request then cannot be sent (EPIPE) or was sent and left unread (the receive is reset first),
    the client reads that answer and reports the steward's reason, never a bare connection error."""
    from steward.client import SessionEnded

    client, steward = pair
    steward.send("FAILED", {"reason": "the steward is shutting down", "open": False}, re=0)
    if request_arrives_first:
        send = client.send

        def send_then_let_the_steward_close(*args, **kwargs):
            seq = send(*args, **kwargs)
            poller = select.poll()
            poller.register(steward.sock, select.POLLIN)
            assert poller.poll(5000), "the request never arrived"
            steward.sock.close()  # with the request unread
            return seq

        client.send = send_then_let_the_steward_close
    else:
        steward.sock.close()
    with pytest.raises(SessionEnded, match="^the steward is shutting down$"):
        _remote(client).seal_output("deps")


def test_ready_crosses_the_wire_with_every_field_the_launcher_proved():
    """S5/S12: the client receives READY's proof field by field as launcher/protocol.py defines it (the one
    list), and a proof with a field missing, added or of another kind is refused, never filled in."""
    import json

    from journal.closed import ClosedObject
    from journal.errors import Refused
    from journal.strictjson import canonical
    from steward.api import READY_PROOF, Ready
    from pipeline_support import READY_PROOF as FAKE

    proof = dict(FAKE, uids=("7",) * 4, seccomp=2, no_new_privs=True)
    ready = Ready("s1", "ab" * 32, proof, "index")
    wired = json.loads(canonical(ready.to_wire()))
    assert set(wired["proof"]) == {name for name, _ in READY_PROOF} and wired["proof"]["filter_digest"] == FAKE["filter_digest"].hex()
    assert Ready.from_wire(ClosedObject(wired, "$")) == ready

    def changed(change):
        copy = json.loads(canonical(ready.to_wire()))
        change(copy["proof"])
        return ClosedObject(copy, "$")

    for change, where in [
        (lambda p: p.pop("dumpable"), r"\$\.proof\.dumpable"),
        (lambda p: p.update(extra=1), r"\$\.proof\.extra"),
        (lambda p: p.update(no_new_privs=1), r"\$\.proof\.no_new_privs"),
        (lambda p: p.update(filter_digest="AB"), r"\$\.proof\.filter_digest"),
        (lambda p: p.update(securebits=1 << 32), r"\$\.proof\.securebits"),
    ]:
        with pytest.raises(Refused, match=where):
            Ready.from_wire(changed(change))
