"""The daemon's request decoding and socket set-up (steward/server.py), unprivileged, without a steward behind it."""

from __future__ import annotations

import os
import socket

import pytest

from journal.closed import ClosedObject
from journal.errors import Refused
from steward import server
from steward.wire import CLIENT, STEWARD, Endpoint, WireError

BOUNDS = server.Bounds(idle_seconds=60, max_connections=4, max_connections_per_uid=2, stop_seconds=10)


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A=B", "", "Ä", "A B"])
def test_an_op_environment_name_that_is_not_a_variable_name_is_refused(name):
    """S7: RUN's env names are variable names (letters, digits, underscore, no leading digit), nothing else."""
    with pytest.raises(Refused, match="must be a variable name"):
        server._environment(ClosedObject({"env": {name: "x"}}, "$.body"))
    assert server._environment(ClosedObject({"env": {"_OK1": "x", "PATH": "/usr/bin"}}, "$.body")) == {"_OK1": "x", "PATH": "/usr/bin"}


@pytest.mark.parametrize("item", ["a\x00b", "x" * 131_073, 7])
def test_an_argv_item_with_nul_over_its_cap_or_not_a_string_is_refused(item):
    """S7: RUN's argv holds strings without NUL of at most 128 KiB, so what reaches execve is what was asked."""
    with pytest.raises(Refused, match="must be a string without NUL of at most 128 KiB"):
        server._strings(ClosedObject({"argv": ["/usr/bin/true", item]}, "$.body"), "argv", min_items=1, max_items=4)


@pytest.fixture
def connection():
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield server.Connection(None, far, (1, 0, 0)), Endpoint(near, CLIENT)
    near.close()
    far.close()


@pytest.mark.parametrize("first", ["RUN", "START", "CLOSE", "PUBLISH"])
def test_a_session_request_before_open_ends_the_connection(connection, first):
    """S2 for the daemon: requests are sequenced; nothing but OPEN can come first."""
    conn, client = connection
    client.send(first, {})
    with pytest.raises(WireError, match=f"{first} arrived where OPEN was expected"):
        conn.handle(conn.endpoint.receive())
    assert conn.session is None


@pytest.fixture
def new_server():
    """A server over no steward, for its socket set-up alone; its stop pipe is closed afterwards."""
    made = []

    def make(path: str) -> server.Server:
        made.append(server.Server(None, socket_path=path, client_uids=(0,), bounds=BOUNDS))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_a_socket_path_holding_something_else_is_never_replaced(tmp_path, new_server):
    """F3: the daemon removes only a stale socket at its path; a regular file there is refused and kept."""
    path = tmp_path / "steward.sock"
    path.write_text("not a socket")
    with pytest.raises(Refused, match="exists and is not a socket"):
        new_server(str(path)).listen()
    assert path.read_text() == "not a socket"


def test_a_socket_another_steward_serves_is_never_taken_over(tmp_path, new_server):
    """One steward per socket: a path where a live listener answers is refused, and that listener keeps it."""
    path = str(tmp_path / "steward.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        live.bind(path)
        live.listen(1)
        with pytest.raises(Refused, match="another steward is already serving on it"):
            new_server(path).listen()
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.connect(path)
        probe.close()
    finally:
        live.close()


def test_a_stale_socket_is_replaced(tmp_path, new_server):
    """A socket nobody listens on any more (a steward that crashed) is removed and bound again."""
    path = str(tmp_path / "steward.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(path)
    stale.close()
    assert new_server(path).listen().startswith("mode 06")


@pytest.mark.parametrize("text", ["!!!!", "YWJj\n", "YW Jj", "YWJ"])
def test_publish_takes_strict_base64_only(connection, text):
    """E4 over the wire: an evidence file's bytes arrive as strict base64; text with anything else in it is
    refused, never decoded around the junk into other bytes than were sent."""
    conn, _ = connection
    published = []
    conn.session = type("Session", (), {"publish": lambda self, name, data: published.append((name, data))})()
    with pytest.raises(Refused, match="must be base64"):
        conn._do_publish(ClosedObject({"name": "a.receipt.json", "data": text}, "$.body"), [])
    conn._do_publish(ClosedObject({"name": "a.receipt.json", "data": "YWJj"}, "$.body"), [])
    assert published == [("a.receipt.json", b"abc")]


@pytest.mark.parametrize("owner, mode", [(1234, 0o755), (0, 0o777), (0, 0o775)])
def test_the_socket_lives_only_in_a_directory_no_one_else_can_write(tmp_path, new_server, owner, mode):
    """F3: anyone who can write the socket's directory could swap the socket for a link between bind and the
    steward setting its owner; such a directory is refused before anything is bound there."""
    run = tmp_path / "run"
    run.mkdir()
    os.chown(run, owner, 0)
    os.chmod(run, mode)
    with pytest.raises(Refused, match="only in a directory root owns and no one else can write"):
        new_server(str(run / "steward.sock")).listen()
    assert os.listdir(run) == []


def test_the_socket_is_made_with_its_mode_at_bind(tmp_path, new_server):
    """The socket's mode comes from bind itself (0600, or 0660 with the casebox group); nothing is changed
    through its path afterwards but the group, without following a link."""
    import grp
    import stat

    path = tmp_path / "steward.sock"
    described = new_server(str(path)).listen()
    try:
        grp.getgrnam(server.SOCKET_GROUP)
        expected = 0o660
    except KeyError:
        expected = 0o600
    assert stat.S_IMODE(os.lstat(path).st_mode) == expected and described.startswith(f"mode {expected:04o}")


def _admitting(new_server, tmp_path, per_uid: dict[int, int]):
    made = new_server(str(tmp_path / "steward.sock"))
    made.per_uid = dict(per_uid)
    return made


def test_connections_are_capped_per_uid_and_in_total_but_root_is_always_served(new_server, tmp_path):
    """The caps that bound the daemon: one more from a uid at its cap, or from anyone but root once the others
    fill max_connections, is turned away with the cap it passed; root's never count against the total."""
    made = _admitting(new_server, tmp_path, {1000: 2})
    assert "uid 1000 already has 2 connections to this steward (max_connections_per_uid)" in made._over_cap(1000)
    assert made._over_cap(1001) is None
    made = _admitting(new_server, tmp_path / "b", {1000: 2, 1001: 2})
    assert "the steward already serves 4 connections (max_connections)" in made._over_cap(1002)
    assert made._over_cap(0) is None, "root is served whatever the others hold"
    made = _admitting(new_server, tmp_path / "c", {0: 2, 1000: 2})
    assert made._over_cap(1001) is None, "root's connections are not counted against max_connections"
    assert "uid 0 already has 2 connections" in made._over_cap(0)


def test_the_shipped_unit_matches_the_default_caps_and_stop_time(repo):
    """The unit's LimitNOFILE is what the default connection caps need, and its TimeoutStopSec leaves the daemon
    time to name what it could not retire and exit 1 after stop_seconds, before systemd's SIGKILL."""
    import re

    from executor.cli.config import Config

    unit = (repo / "packaging" / "systemd" / "casebox-steward.service").read_text()
    config = Config()
    bounds = server.Bounds(config.idle_seconds, config.max_connections, config.max_connections_per_uid, config.stop_seconds)
    assert re.search(r"^LimitNOFILE=(\d+)$", unit, re.M).group(1) == str(server.descriptors_needed(bounds))
    assert int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1)) >= config.stop_seconds + 10
