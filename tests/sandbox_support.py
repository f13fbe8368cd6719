"""Shared pieces of the root sandbox tests: running a program in a real sandbox, and proving nothing is left."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import textwrap

import psutil
import pytest

from executor.environ import SANDBOX_ENV
from steward.ledger import RecordingLedger
from steward.api import Limits
from steward.starter import OpResult, Sandbox, Spec

PYTHON = "/usr/bin/python3"


def mount_table(own: str) -> list[str]:
    """The mounts a test can be held to: those at or below ``own`` (its own state root or directories), and
    every mount named ``casebox`` (a launcher's tmpfs, which belongs in a sandbox's namespace and never in the
    host's) wherever it is. Each without the ids that change when unrelated mounts come and go.

    Every other host mount, another suite's output mounts among them, is left out: it comes and goes with
    whatever else runs on this machine.
    """
    inside = own.rstrip("/") + "/"
    found = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point, source = fields[4], fields[fields.index("-") + 2]
        if point == own.rstrip("/") or point.startswith(inside) or source == "casebox":
            found.append(line.split(" ", 4)[4])
    return sorted(found)


def start_with_launcher_without(tmp_path: pathlib.Path, sandbox_ids: tuple[int, int], monkeypatch, line: str):
    """A session's sandbox start with a launcher built from this checkout's with ``line`` (a namespace flag of
    launcher/reexec.py's) left out, provisioned as if it were the shipped one: what a test of the starter's
    own checks of the launcher's word runs. The start's failure sentence, and what the session's close said."""
    import launcher
    from steward import provision
    from steward.failure import SandboxFailure
    from steward.session import Steward
    from steward_support import accept_all, settings

    forged = tmp_path / "launcher"
    shutil.copytree(pathlib.Path(launcher.__file__).parent, forged, ignore=shutil.ignore_patterns("__pycache__"))
    source = (forged / "reexec.py").read_text()
    assert source.count(line) == 1, f"launcher/reexec.py no longer holds {line!r} once"
    (forged / "reexec.py").write_text(source.replace(line, ""))
    data = provision.build(forged)
    monkeypatch.setattr(provision, "shipped", lambda: (data, hashlib.sha256(data).digest()))
    steward = Steward(settings(str(tmp_path / "state"), sandbox_ids), capability_check=accept_all)
    try:
        session = steward.open_session("forged-launcher")
        with pytest.raises(SandboxFailure) as failure:
            session.start_sandbox()
        closed = session.close()
    finally:
        steward.close()
    return str(failure.value), closed


def processes_of(uid: int, gid: int) -> list[int]:
    """The host's processes with ``uid`` or ``gid`` among their real, effective or saved ids: with the
    test's dedicated ids, its own sandboxes' processes and nothing of another suite's."""
    found = []
    for process in psutil.process_iter(["pid", "uids", "gids"]):
        uids, gids = process.info["uids"], process.info["gids"]
        if (uids and uid in tuple(uids)) or (gids and gid in tuple(gids)):
            found.append(process.info["pid"])
    return found


def _describe(pids: list[int]) -> list[str]:
    described = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                described.append(f"{stat.read()[:80]} {cmdline.read()[:80]!r}")
        except OSError:
            described.append(f"{pid} (gone)")
    return described


@pytest.fixture
def contained(sandbox_ids, tmp_path_factory):
    """After the test: no process of the dedicated ids remains, and the mounts in this run's own directories
    (and any launcher tmpfs in the host's namespace) are as before."""
    own = str(tmp_path_factory.getbasetemp())
    before = mount_table(own)
    yield
    left = processes_of(*sandbox_ids)
    assert left == [], f"processes of the dedicated UID outlived their sandbox: {_describe(left)}"
    after = mount_table(own)
    assert after == before, f"the host mount table changed: gone {sorted(set(before) - set(after))}, new {sorted(set(after) - set(before))}"


@pytest.fixture
def state_root(tmp_path) -> str:
    return str(tmp_path / "state")


def start(sandbox_ids, state_root: str, *, capabilities=(), limits: Limits = Limits(), ledger=None, sandbox_id=None) -> Sandbox:
    """A READY sandbox; each capability is (NAME, DIR), opened here as the sandbox takes descriptors."""
    uid, gid = sandbox_ids
    opened = [(name, os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for name, directory in capabilities]
    try:
        return Sandbox.start(
            Spec(uid, gid, tuple(opened), limits), ledger=ledger or RecordingLedger(), state_root=state_root,
            sandbox_id=sandbox_id,
        )
    finally:
        for _, fd in opened:
            os.close(fd)


def run(sandbox_ids, state_root: str, argv, *, capabilities=(), limits: Limits = Limits(), timeout_ms=20_000,
        output=64 << 10, env=None, ledger=None, sandbox_id=None):
    """One op in a fresh sandbox; the sandbox is torn down before this returns."""
    with start(sandbox_ids, state_root, capabilities=capabilities, limits=limits, ledger=ledger, sandbox_id=sandbox_id) as sandbox:
        return sandbox.run(
            list(argv), env=dict(SANDBOX_ENV if env is None else env), timeout_ms=timeout_ms,
            stdout_cap=output, stderr_cap=output,
        )


def hostile(sandbox_ids, state_root: str, source: str, *args: str, **options) -> tuple[OpResult, object]:
    """Run a small Python program in the sandbox; it prints one JSON value as its last line."""
    result = run(sandbox_ids, state_root, [PYTHON, "-c", textwrap.dedent(source), *args], **options)
    assert isinstance(result, OpResult), result
    lines = result.stdout.decode().strip().splitlines()
    assert lines, f"the program printed nothing; class {result.limit}, stderr: {result.stderr.decode(errors='replace')}"
    return result, json.loads(lines[-1])
