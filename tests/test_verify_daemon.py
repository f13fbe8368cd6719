"""casebox verify through the steward daemon, run by an unprivileged user (issue 6's socket, issue 7's verify).

A daemon (`casebox steward serve`) runs as root with nobody in client_uids and a socket group of its own, and
with no capability outside the CapabilityBoundingSet of packaging/systemd/casebox-steward.service and no new
privileges, as systemd starts it (issue 12: a root daemon that needs CAP_SYS_PTRACE passes a plain root run
and fails under the unit); the client is `casebox verify` run as nobody on the runtime interpreter, from a world-readable copy of casebox's
packages with no site-packages at all (so the client needs nothing of the root side: no psutil, prctl or
cffi), on world-readable copies of the demo's bundle, plan, verifier tree and index, into an evidence
directory nobody owns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time

import pytest
from sandbox_support import mount_table, processes_of
from test_verify import EXAMPLES, EXPECTED, REPO, packed, scratch_dirs, table, value
from test_verify_jobs import SLEEPERS, interrupt_when_both_stages_run

from executor.cases import runtime
from executor.inside import LIBRARIES
from journal.reader import read_journal
from steward import client

pytestmark = pytest.mark.root
NOBODY = 65534
PACKAGES = ("executor", "journal", "steward", "launcher")
UNIT = REPO / "packaging" / "systemd" / "casebox-steward.service"


def _unit_capabilities() -> set[str]:
    """The unit's CapabilityBoundingSet, as python-prctl's names (``sys_admin``)."""
    lines = [line for line in UNIT.read_text().splitlines() if line.startswith("CapabilityBoundingSet=")]
    assert len(lines) == 1, f"{UNIT} has {len(lines)} CapabilityBoundingSet= lines"
    return {name.removeprefix("CAP_").lower() for name in lines[0].split("=", 1)[1].split()}


def _as_unit() -> None:
    """In the daemon's child before its exec: the unit's bounding set, NoNewPrivileges=yes and UMask=0077. Root's
    exec then keeps exactly those capabilities in its permitted and effective sets."""
    import prctl

    os.umask(0o077)

    kept = _unit_capabilities()
    for name in prctl.ALL_CAP_NAMES:
        if name not in kept:
            prctl.capbset.drop(name)
    prctl.set_no_new_privs(1)


def _readable(path: pathlib.Path) -> None:
    for entry in [path, *path.rglob("*")]:
        os.chmod(entry, 0o755 if entry.is_dir() else 0o644)


def _as_client(gid: int):
    def drop() -> None:
        os.setgroups([gid])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return drop


@pytest.fixture(scope="module")
def attempt(sandbox_ids, other_ids, sandbox_pool_size, casebox):
    """The daemon, then one verify through it as nobody; everything the checks need."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="casebox-daemon-verify-"))
    pool = min(sandbox_pool_size, 2)
    socket_gid = other_ids[1]
    try:
        for package in PACKAGES:
            shutil.copytree(REPO / package, base / "code" / package, ignore=shutil.ignore_patterns("__pycache__"))
        # The client's environment holds casebox's runtime libraries too: the install tool's comes from it.
        for library in LIBRARIES:
            origin = pathlib.Path(importlib.util.find_spec(library).origin).parent
            shutil.copytree(origin, base / "code" / library, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(EXAMPLES / "verifier", base / "verifier")
        shutil.copytree(EXAMPLES / "index", base / "index")
        shutil.copy(EXAMPLES / "plan.json", base / "plan.json")
        bundle, sha256 = packed(base)
        shutil.rmtree(base / "wheels")
        (base / "run").mkdir()
        sock, state = base / "run" / "steward.sock", base / "state"
        (base / "daemon.toml").write_text(
            f"sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\nclient_uids = [0, {NOBODY}]\n"
            f"socket_group = {socket_gid}\nsandbox_ids = {pool}\n"
        )
        (base / "client.toml").write_text(f'socket = "{sock}"\nstate_root = "{state}"\nsandbox_ids = {pool}\n')
        _readable(base)
        (base / "out").mkdir()
        os.chown(base / "out", NOBODY, NOBODY)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(base / "notify"))
        notify.settimeout(30)
        log = open(base / "daemon.log", "wb")
        daemon = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "casebox"), "--config", str(base / "daemon.toml"), "steward", "serve",
             "--socket", str(sock), "--state-root", str(state)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env={**os.environ, "NOTIFY_SOCKET": str(base / "notify")}, preexec_fn=_as_unit,
        )
        try:
            assert notify.recv(64) == b"READY=1"
            before, staged = mount_table(str(base)), scratch_dirs()
            script = f"import sys; sys.path.insert(0, {str(base / 'code')!r}); from executor.cli.main import main; sys.exit(main())"

            def command(attempt_id: str, *extra: str, plan: str = "plan.json") -> list[str]:
                return [runtime.choose_interpreter(), "-I", "-S", "-c", script, "--config", str(base / "client.toml"), "verify",
                        "--bundle", str(bundle), "--sha256", sha256, "--plan", str(base / plan),
                        "--verifier-tree", str(base / "verifier"), "--index", str(base / "index"), "--attempt", attempt_id,
                        "--evidence", str(base / "out" / attempt_id), "--root", str(base), *extra]

            def verify(attempt_id: str, *extra: str) -> subprocess.CompletedProcess:
                return subprocess.run(command(attempt_id, *extra), capture_output=True, cwd=base, env={"PATH": "/usr/bin:/bin"},
                                      timeout=300, preexec_fn=_as_client(socket_gid))

            # One stage, as the tests of this module expect of the demo's evidence.
            result = verify("daemon-1", "--jobs", "1")
            # Issue 14 (5) through the daemon: two stages at once, each a connection bound to its own pair.
            jobs = verify("daemon-jobs", "--jobs", "2") if pool >= 2 else None
            yield {"base": base, "result": result, "sha256": sha256, "daemon": daemon, "socket": str(sock),
                   "before": before, "staged": staged, "socket_gid": socket_gid, "jobs": jobs, "command": command}
        finally:
            notify.close()
            if daemon.poll() is None:
                os.kill(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=60)
            log.close()
    finally:
        shutil.rmtree(base)


def test_nobody_verifies_through_the_daemon_with_the_designed_statuses(attempt):
    """Issue 7: verify uses the daemon when its socket answers; an unprivileged client gets the demo's ten
    designed statuses, and the output says the daemon served it."""
    result = attempt["result"]
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    assert {case: tuple(row[:2]) for case, row in table(stdout).items()} == EXPECTED
    assert f"steward: the daemon at {attempt['socket']}" in stdout
    info = os.stat(attempt["socket"])
    assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o660, attempt["socket_gid"])


def test_the_tombstone_is_valid_and_sealed_and_the_evidence_is_the_clients(attempt, casebox):
    """C5, J4: the daemon's tombstone is sealed with a VALID journal; the evidence directory is nobody's own and
    holds its byte copy, evaluable by casebox evaluate with the same statuses."""
    stdout = attempt["result"].stdout.decode()
    tombstone = pathlib.Path(value(stdout, "tombstone"))
    assert tombstone.parent == attempt["base"] / "state" / "tombstones"
    assert casebox("journal", "verify", str(tombstone / "journal")).returncode == 0
    assert (tombstone / "seal.json").is_file() and not os.stat(tombstone).st_mode & 0o222
    evidence = pathlib.Path(value(stdout, "evidence"))
    assert os.stat(evidence).st_uid == NOBODY
    assert (evidence / "journal").read_bytes() == (tombstone / "journal").read_bytes()
    judged = casebox("evaluate", "--evidence", str(evidence), "--plan", str(attempt["base"] / "plan.json"),
                     "--attempt", "daemon-1", "--bundle-sha256", attempt["sha256"], "--report-dir", str(attempt["base"]))
    assert judged.returncode == 3, judged.stderr
    assert {case: tuple(row[:2]) for case, row in table(judged.stdout.decode()).items()} == EXPECTED
    assert json.loads((attempt["base"] / "report-daemon-1.json").read_bytes())["verdict"] == "UNVERIFIED"


def test_nothing_is_left_and_the_daemon_still_serves(attempt, sandbox_ids):
    """S6, C4: no process of the dedicated UID, no mount, no scratch directory left; the daemon serves the next session."""
    assert processes_of(*sandbox_ids) == []
    assert mount_table(str(attempt["base"])) == attempt["before"] and scratch_dirs() == attempt["staged"]
    assert attempt["daemon"].poll() is None
    closed = client.connect(attempt["socket"]).open_session("after-1").close()
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")


def test_verify_jobs_runs_two_stages_through_the_daemon(attempt):
    """Issue 14 (5), S15: through the daemon, --jobs 2 splits the demo plan, its pytest cases
    included, over two stages, each a session of its own bound to its own pair of the daemon's pool, with its own evidence
    directory owned by the client; the one evaluation gives every case its designed status."""
    if attempt["jobs"] is None:
        pytest.skip("needs CASEBOX_TEST_IDS of 2 or more")
    result = attempt["jobs"]
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    rows = {case: tuple(row[:2]) for case, row in table(stdout).items()}
    assert rows == EXPECTED
    evidence = attempt["base"] / "out" / "daemon-jobs"
    assert sorted(os.listdir(evidence)) == ["stage-1", "stage-2"]
    assert all((evidence / stage).stat().st_uid == NOBODY for stage in ("stage-1", "stage-2"))
    assert "running the attempt as 2 stages, 2 at once" in result.stderr.decode()


def test_an_interrupted_verify_with_two_stages_leaves_the_daemon_both_sessions_abandoned(attempt, sandbox_ids):
    """Issue 14 (5), C9 through the daemon: Ctrl-C while two stages run their cases ends verify with exit 130;
    each stage's connection is shut down, so the daemon kills its op and retires the stage UNVERIFIED
    (ABANDONED), exporting nothing; no stage is closed with its killed cases as failed receipts, and the daemon
    serves on."""
    if attempt["jobs"] is None:
        pytest.skip("needs CASEBOX_TEST_IDS of 2 or more")
    base = attempt["base"]
    (base / "sleepers.json").write_text(json.dumps(SLEEPERS))
    os.chmod(base / "sleepers.json", 0o644)
    drop = _as_client(attempt["socket_gid"])

    def as_a_foreground_client() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        drop()

    process = subprocess.Popen(attempt["command"]("daemon-stopped", "--jobs", "2", plan="sleepers.json"), cwd=base,
                               env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=as_a_foreground_client)
    code, output = interrupt_when_both_stages_run(process)
    assert code == 130, output[-3000:]
    tombstones = base / "state" / "tombstones"
    deadline = time.monotonic() + 120
    while True:
        notes = []
        for name in os.listdir(tombstones):
            records = read_journal((tombstones / name / "journal").read_bytes()).records
            if records[0].fields["attempt_id"] == "daemon-stopped":
                notes.append(records[-1].fields.get("note"))
        if len(notes) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(notes) == 2 and all(note.startswith("session=ABANDONED") for note in notes), notes
    evidence = base / "out" / "daemon-stopped"
    assert not evidence.exists() or [path for path in evidence.rglob("*") if path.is_file()] == []
    assert attempt["daemon"].poll() is None
