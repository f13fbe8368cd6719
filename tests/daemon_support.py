"""A `casebox steward serve` of the test's own: its configuration, socket, state root and log."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

CASEBOX = pathlib.Path(__file__).resolve().parent.parent / ".venv" / "bin" / "casebox"


class Daemon:
    def __init__(self, process: subprocess.Popen, socket_path: str, state: str, log: pathlib.Path) -> None:
        self.process = process
        self.socket = socket_path
        self.state = state
        self.log = log

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/task"))


@contextlib.contextmanager
def running_daemon(tmp_path: pathlib.Path, sandbox_ids, *, state: str | None = None, settings: str = "",
                   client_uids=(0,), preexec_fn=None):
    """The daemon with these ids and extra ``settings`` (TOML lines), READY before this yields; stopped after."""
    config = tmp_path / "daemon.toml"
    config.write_text(
        f"sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\nclient_uids = {list(client_uids)}\n{settings}"
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    # The socket's directory is reachable by every user, so the peer check, not the path, is what refuses a stranger.
    run = pathlib.Path(tempfile.mkdtemp(prefix="casebox-run-"))
    os.chmod(run, 0o755)
    socket_path, log = str(run / "steward.sock"), tmp_path / "daemon.log"
    state = state or str(tmp_path / "state")
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [str(CASEBOX), "--config", str(config), "steward", "serve", "--socket", socket_path, "--state-root", state],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")}, preexec_fn=preexec_fn,
        )
    try:
        assert notify.recv(64) == b"READY=1"
        yield Daemon(process, socket_path, state, log)
    finally:
        notify.close()
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=120)
        shutil.rmtree(run)


def wait_for(predicate, seconds: float = 30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def sealed(state: str) -> list[str]:
    """The tombstones of ``state`` that are sealed (their seal marker is there)."""
    return [name for name in os.listdir(os.path.join(state, "tombstones"))
            if os.path.exists(os.path.join(state, "tombstones", name, "seal.json"))]
