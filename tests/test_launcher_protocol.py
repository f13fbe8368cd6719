"""S2: the launcher protocol is closed, sequenced and canonical (docs/launcher-protocol.md).

The byte strings here are written by hand from the specification, so the
encoder and decoder are checked against the document, not against each other.
"""

from __future__ import annotations

import os
import re
import socket

import pytest

from launcher import protocol
from launcher.protocol import Aborted, Channel, ProtocolError

HELLO_BYTES = bytes.fromhex(
    "00000043"  # length: everything after these four bytes (8 + 23 + 36 = 67)
    "00000000"  # seq 0
    "000a"  # type 10, HELLO
    "0000"  # reserved
    "00000013" + b"casebox.launcher.v2".hex()  # version: u32 length 19, UTF-8
    + "00000020" + "11" * 32  # nonce: u32 length 32, bytes
)
OP_BYTES = bytes.fromhex(
    "00000050"  # length: 8 + argv 16 + env 23 + cwd 9 + three u64 24 = 80
    "00000007"  # seq 7
    "0023"  # type 35, OP
    "0000"
    "00000002" "00000003" + b"env".hex() + "00000001" + b"A".hex()  # argv: 2 strings
    + "00000002"  # env: 2 pairs, names ascending
    + "00000001" + b"A".hex() + "00000001" + b"1".hex()
    + "00000001" + b"B".hex() + "00000000"
    + "00000005" + b"/work".hex()  # cwd
    + "00000000000003e8"  # timeout_ms 1000
    + "0000000000001000"  # stdout_cap 4096
    + "0000000000000400"  # stderr_cap 1024
)


def test_hello_encodes_to_the_documented_bytes():
    """S2: length-prefixed, numbered, canonical."""
    assert protocol.encode("HELLO", 0, {"version": protocol.VERSION, "nonce": b"\x11" * 32}) == HELLO_BYTES
    assert protocol.decode(HELLO_BYTES) == ("HELLO", 0, {"version": protocol.VERSION, "nonce": b"\x11" * 32})


def test_op_encodes_to_the_documented_bytes():
    fields = {
        "argv": ["env", "A"],
        "env": [("A", "1"), ("B", "")],
        "cwd": "/work",
        "timeout_ms": 1000,
        "stdout_cap": 4096,
        "stderr_cap": 1024,
    }
    assert len(OP_BYTES) == 4 + 0x50
    assert protocol.encode("OP", 7, fields) == OP_BYTES
    assert protocol.decode(OP_BYTES) == ("OP", 7, fields)


def _patched(data: bytes, offset: int, replacement: bytes) -> bytes:
    return data[:offset] + replacement + data[offset + len(replacement):]


@pytest.mark.parametrize(
    "data, rule",
    [
        (HELLO_BYTES[:7], "shorter than its header"),
        (_patched(HELLO_BYTES, 0, b"\x00\x00\x00\x44"), "length does not match"),
        (HELLO_BYTES + b"\x00", "length does not match"),
        (_patched(HELLO_BYTES, 10, b"\x00\x01"), "reserved field is not zero"),
        (_patched(HELLO_BYTES, 8, b"\x00\x63"), "unknown message type 99"),
        (_patched(HELLO_BYTES, 35, b"\x00\x00\x00\x21"), "runs past the end"),
        (_patched(HELLO_BYTES, 0, b"\x00\x00\x00\x44") + b"\x00", "trailing bytes"),
        (_patched(HELLO_BYTES, 16, b"\xff"), "not UTF-8"),
        (_patched(HELLO_BYTES, 16, b"\x00"), "holds NUL"),
        (_patched(OP_BYTES, 36, b"C"), "not unique and sorted"),
        (_patched(OP_BYTES, 46, b"A"), "not unique and sorted"),
    ],
)
def test_decoder_refuses_every_non_canonical_or_malformed_message(data, rule):
    """S2: anything the encoder would not write is refused."""
    with pytest.raises(ProtocolError, match=rule):
        protocol.decode(data)


def test_a_bool_is_one_byte_zero_or_one():
    fields = {"stdout": b"", "stderr": b"", "stdout_truncated": True, "stderr_truncated": False, "limit": "OK",
              "wait_status": 0, "descendants_reaped": 0, "wall_ms": 1, "cpu_ms": 1, "max_rss_kib": 1}
    data = protocol.encode("OP_RESULT", 0, fields)
    assert protocol.decode(data)[2] == fields
    with pytest.raises(ProtocolError, match="neither 0 nor 1"):
        protocol.decode(data[:-2] + b"\x02" + data[-1:])


def test_encoder_refuses_missing_or_extra_fields_and_wrong_types():
    with pytest.raises(ProtocolError, match="exactly the fields"):
        protocol.encode("CHILD", 0, {})
    with pytest.raises(ProtocolError, match="exactly the fields"):
        protocol.encode("CHILD", 0, {"pid": 1, "extra": 2})
    with pytest.raises(ProtocolError, match="must be an integer"):
        protocol.encode("CHILD", 0, {"pid": True})
    with pytest.raises(ProtocolError, match="without NUL"):
        protocol.encode("ABORT", 0, {"reason": "a\x00b"})


@pytest.fixture
def pair():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield Channel(left, protocol.STARTER), Channel(right, protocol.LAUNCHER)
    left.close()
    right.close()


def test_a_leaf_waits_for_its_ack(pair):
    """S2: every leaf is ACKed, naming its number."""
    starter, launcher = pair
    launcher.send("CHILD", pid=5)
    message = starter.receive("CHILD")
    assert (message.name, message.seq, message.fields) == ("CHILD", 0, {"pid": 5})
    starter.ack(message)
    launcher.await_ack(0)
    assert launcher.send_seq == 1 and starter.recv_seq == 1


def test_an_ack_for_another_message_aborts(pair):
    starter, launcher = pair
    starter.send("ACK", acked=3)
    with pytest.raises(ProtocolError, match="ACK names message 3, expected 0"):
        launcher.await_ack(0)


def test_a_replayed_message_aborts(pair):
    """S2: a message numbered below the next expected number is refused."""
    starter, launcher = pair
    launcher.sock.send(protocol.encode("CHILD", 0, {"pid": 5}))
    starter.receive("CHILD")
    launcher.sock.send(protocol.encode("CHILD", 0, {"pid": 5}))
    with pytest.raises(ProtocolError, match="replayed or out of order"):
        starter.receive("CHILD")


def test_an_out_of_order_message_aborts(pair):
    starter, launcher = pair
    launcher.sock.send(protocol.encode("CHILD", 1, {"pid": 5}))
    with pytest.raises(ProtocolError, match="numbered 1, expected 0"):
        starter.receive("CHILD")


def test_an_unexpected_message_aborts(pair):
    """S2: the state machine names what may come next; anything else aborts."""
    starter, launcher = pair
    launcher.send("CHILD", pid=5)
    with pytest.raises(ProtocolError, match="CHILD arrived where READY was expected"):
        starter.receive("READY")


def test_a_message_from_the_wrong_side_aborts(pair):
    """S2: the launcher may not send a starter message, whatever its number."""
    starter, launcher = pair
    launcher.sock.send(protocol.encode("SHUTDOWN", 0, {}))
    with pytest.raises(ProtocolError, match="may not come from the launcher"):
        starter.receive("SHUTDOWN")
    with pytest.raises(ProtocolError, match="may not send SETUP_END"):
        launcher.send("SETUP_END")


def test_descriptors_travel_only_where_the_message_carries_them(pair):
    """S2: capabilities cross only as SCM_RIGHTS, one per CAPABILITY; a stray descriptor aborts."""
    starter, launcher = pair
    directory = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        starter.send("CAPABILITY", (directory,), target="/cap/x")
        message = launcher.receive("CAPABILITY")
        assert len(message.fds) == 1 and os.path.samestat(os.fstat(message.fds[0]), os.fstat(directory))
        os.close(message.fds[0])
        with pytest.raises(ProtocolError, match="may not send CAPABILITY with 0 descriptors"):
            starter.send("CAPABILITY", target="/cap/y")
        socket.send_fds(starter.sock, [protocol.encode("SETUP_END", 1, {})], [directory])
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(ProtocolError, match="carried 1 descriptors, expected 0"):
            launcher.receive("SETUP_END")
        assert len(os.listdir("/proc/self/fd")) == before, "a refused message's descriptors are closed"
    finally:
        os.close(directory)


def test_abort_carries_the_reason_and_a_closed_peer_is_an_error(pair):
    starter, launcher = pair
    launcher.abort("bootstrap: no tmpfs")
    with pytest.raises(Aborted, match="bootstrap: no tmpfs"):
        starter.receive("READY")
    launcher.sock.close()
    with pytest.raises(ProtocolError, match="closed the channel"):
        starter.receive("READY")


OUTPUT_BYTES = bytes.fromhex(
    "00000015"  # length: 8 + target 13 = 21
    "00000005"  # seq 5
    "0025"  # type 37, OUTPUT
    "0000"
    "00000009" + b"/out/tree".hex()  # target
)


def test_output_encodes_to_the_documented_bytes():
    """An output travels like a capability, with its own type: one descriptor, a /out/NAME target."""
    assert protocol.encode("OUTPUT", 5, {"target": "/out/tree"}) == OUTPUT_BYTES
    assert protocol.decode(OUTPUT_BYTES) == ("OUTPUT", 5, {"target": "/out/tree"})


@pytest.mark.parametrize("message, target, accepted", [
    ("CAPABILITY", "/usr", True),
    ("CAPABILITY", "/cap/data", True),
    ("CAPABILITY", "/out/data", False),
    ("CAPABILITY", "/etc", False),
    ("OUTPUT", "/out/data", True),
    ("OUTPUT", "/cap/data", False),
    ("OUTPUT", "/usr", False),
    ("OUTPUT", "/out/../etc", False),
    ("OUTPUT", "/out/", False),
    ("OUTPUT", "/etc", False),
    ("EXECUTABLE", "/usr/bin/python3", True),
    ("EXECUTABLE", "/usr", False),
    ("EXECUTABLE", "/cap/data/python3", False),
    ("EXECUTABLE", "/opt/python/bin/python3", False),
])
def test_setup_places_capabilities_read_only_and_outputs_writable_only_where_they_belong(pair, message, target, accepted):
    """S4: a writable tree only at /out/NAME, a read-only one only at /usr or /cap/NAME, each target once;
    S9: never /etc (no sandbox gets host configuration, not even the resolver's of a network index); E7: an
    execute-only file only over a file inside a capability already placed at /usr or a path of its own."""
    from launcher import rendezvous

    starter, launcher = pair
    directory = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        launcher.leaf = lambda name, fds=(), **fields: None
        for name, fds, fields in [
            ("SETUP", (), {"digest": b"\x00" * 32, "uid": 7, "gid": 7, "hostname": "h", "tmp_bytes": 1, "work_bytes": 1,
                           "rlimit_nproc": 1, "rlimit_nofile": 1, "rlimit_fsize": 1, "seccomp_program": b""}),
            ("IMPORT_DIR", (directory,), {}),
            ("INTERPRETER", (directory,), {"path": "/usr/bin/python3"}),
            ("OP_CGROUP", (directory,), {}),
            *([("CAPABILITY", (directory,), {"target": "/usr"})] if message == "EXECUTABLE" else []),
            (message, (directory,), {"target": target}),
            ("SETUP_END", (), {}),
        ]:
            starter.send(name, fds, **fields)
        if accepted:
            setup = rendezvous.receive_setup(launcher, b"\x00" * 32)
            placed = {"OUTPUT": setup.outputs, "EXECUTABLE": setup.executables}.get(message, setup.capabilities)
            assert [known for _, known in placed] == [target]
            for fd, _ in setup.capabilities + setup.outputs + setup.executables:
                os.close(fd)
            os.close(setup.import_dir)
            os.close(setup.interpreter)
            os.close(setup.op_cgroup)
        else:
            with pytest.raises(ProtocolError, match=f"target {target!r} is not"):
                rendezvous.receive_setup(launcher, b"\x00" * 32)
    finally:
        os.close(directory)


OP = {"argv": ["/usr/bin/true"], "env": [("PATH", "/usr/bin")], "cwd": "/work", "timeout_ms": 1000, "stdout_cap": 10, "stderr_cap": 10}


@pytest.mark.parametrize("change, rule", [
    ({"argv": []}, "argv must name a program"),
    ({"argv": [""]}, "argv must name a program"),
    ({"cwd": "work"}, "cwd must be absolute"),
    ({"timeout_ms": 0}, "timeout_ms must be positive"),
    ({"stdout_cap": protocol.MAX_OUTPUT_CAP + 1}, "stdout_cap is over"),
    ({"stderr_cap": protocol.MAX_OUTPUT_CAP + 1}, "stderr_cap is over"),
    ({"env": [("", "x")]}, "environment name '' is not valid"),
    ({"env": [("A=B", "x")]}, "environment name 'A=B' is not valid"),
])
def test_pid_one_refuses_an_op_it_cannot_run_as_materialized(change, rule):
    """S7: pid 1 runs only a fully materialized op: a program, an absolute cwd, a positive timeout, output
    caps within the protocol's, valid environment names; anything else ends the sandbox before a fork."""
    from launcher.ops import OpError, check_op

    check_op(OP)
    with pytest.raises(OpError, match=rule):
        check_op({**OP, **change})


SETUP = {"digest": b"\x00" * 32, "uid": 7, "gid": 7, "hostname": "h", "tmp_bytes": 1, "work_bytes": 1,
         "rlimit_nproc": 1, "rlimit_nofile": 1, "rlimit_fsize": 1, "seccomp_program": b""}


@pytest.mark.parametrize("setup, trees, rule", [
    ({"uid": 0}, [], "names root as the sandbox identity"),
    ({"gid": 0}, [], "names root as the sandbox identity"),
    ({"digest": b"\x00" * 31}, [], "digest is not 32 bytes"),
    ({}, ["/cap/data", "/cap/data"], "target '/cap/data' is not"),
])
def test_stage_one_refuses_a_setup_it_must_not_build(pair, setup, trees, rule):
    """S2, S5: stage 1 never builds a sandbox for root, for a digest that cannot be the launcher's, or with
    one target twice (a second tree would hide the first); it ends instead."""
    from launcher import rendezvous

    starter, launcher = pair
    directory = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        launcher.leaf = lambda name, fds=(), **fields: None
        starter.send("SETUP", (), **{**SETUP, **setup})
        starter.send("IMPORT_DIR", (directory,))
        starter.send("INTERPRETER", (directory,), path="/usr/bin/python3")
        starter.send("OP_CGROUP", (directory,))
        for target in trees:
            starter.send("CAPABILITY", (directory,), target=target)
        starter.send("SETUP_END")
        with pytest.raises(ProtocolError, match=rule):
            rendezvous.receive_setup(launcher, b"\x00" * 32)
    finally:
        os.close(directory)


def test_the_documented_message_table_is_the_schema(repo):
    """S2, docs move with code: every row of docs/launcher-protocol.md's message table names a message's type,
    sender, descriptor count and fields (name and kind, in order) exactly as launcher/protocol.py defines them,
    and every message has its row. READY's fields are the one list of the launcher's proof (steward.api.Ready
    derives from it), so this is where a new proof field must be documented."""
    text = (repo / "docs" / "launcher-protocol.md").read_text()
    table = text.split("## Messages", 1)[1].split("\n\n", 2)[1]
    documented = {}
    for row in table.splitlines()[2:]:
        code, name, sender, fds, fields = (cell.strip() for cell in row.strip().strip("|").split("|"))
        # A field is written `name kind`, followed by an explanation in parentheses that may hold backticks too.
        pairs = tuple(tuple(field.split(" ")) for field in re.findall(r"(?:^|, )`([a-z0-9_]+ [a-z0-9]+)`", fields))
        documented[name] = (int(code), None if sender == "either" else sender, int(fds), pairs)
    assert documented == {name: (code, sender, fds, tuple(schema)) for name, (code, sender, fds, schema) in protocol.MESSAGES.items()}
