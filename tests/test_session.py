"""The in-process session end to end, as root: J1, C1–C5, C8, C9, S6 through real sandboxes and a real journal."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from journal.errors import Refused
from journal.format import Kind
from journal.seal import SealMarker, seal_from_bytes
from launcher.protocol import ProtocolError
from sandbox_support import contained  # noqa: F401
from steward import documents, procfs, retirement, starter
from steward.session import AFTER_MOUNT_INTENT, AFTER_PROCESS_INTENT, Steward
from steward_support import (  # noqa: F401
    ENV, accept_all, kinds, last_of, one_session, read_dir_journal, run_true, sealed_reading, settings, state_path,
    steward, tombstone,
)

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]


def _modes(directory) -> set[tuple[str, int, int]]:
    found = set()
    for path in [directory, *directory.rglob("*")]:
        info = path.lstat()
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
        found.add((kind, stat.S_IMODE(info.st_mode), info.st_uid))
    return found


def test_a_session_retires_into_a_sealed_tombstone_and_exports_its_evidence(steward, state_path, tmp_path):
    """C4, C5, E4: CLEANED evidence, a sealed tombstone, and a byte copy of its journal and seal marker."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    fd = os.open(evidence, os.O_RDONLY | os.O_DIRECTORY)
    try:
        session = steward.open_session("attempt-1")
        session.start_sandbox()
        run_true(session)
        session.close_sandbox()
        session.publish("attempt-1.true.receipt.json", b'{"x":1}')
        closed = session.close(fd)
    finally:
        os.close(fd)
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    place = tombstone(state_path, closed.stage_id)
    assert not (place.parent.parent / "stages" / closed.stage_id).exists()
    assert os.listdir(place.parent.parent / "staging") == []
    reading = sealed_reading(state_path, closed.stage_id)
    assert reading.verdict == "VALID" and reading.head == closed.head
    assert kinds(reading)[-3:] == [Kind.CLEANUP_EVIDENCE, Kind.RETIREMENT_INTENT, Kind.RETIRED]
    marker = seal_from_bytes((place / "seal.json").read_bytes())
    assert marker == SealMarker("attempt-1", closed.stage_id, closed.journal_id, closed.head)
    assert _modes(place) == {("dir", 0o555, 0), ("file", 0o444, 0)}
    assert sorted(closed.exported) == sorted(os.listdir(evidence)) == ["attempt-1.true.receipt.json", "journal", "seal.json"]
    assert (evidence / "journal").read_bytes() == (place / "journal").read_bytes()
    assert (evidence / "seal.json").read_bytes() == (place / "seal.json").read_bytes()
    evidence_record = last_of(reading, Kind.CLEANUP_EVIDENCE).fields
    assert evidence_record["journal_head"] == reading.records[-4].digest
    for key in ("process_inventory_digest", "mount_inventory_digest", "preceding_process_digest"):
        assert documents.digest((place / "documents" / evidence_record[key]).read_bytes()) == evidence_record[key]
    attempt = last_of(reading, Kind.HELPER_ATTEMPT).fields
    assert attempt["outcome"] == "CLEANED" and (place / "documents" / attempt["response_digest"]).exists()
    assert retirement.assess(steward.root, closed.stage_id).state == retirement.SEALED


def test_the_op_identity_is_exactly_what_the_journal_recorded(steward, state_path):
    """C1: the op's (pid, starttime, pgid) and raw status as PROCESS_INTENT/PROCESS_TERMINAL hold them, with both heads."""
    session, outcome, closed = one_session(steward)
    reading = sealed_reading(state_path, closed.stage_id)
    by_op = {(record.kind, record.fields.get("op_id")): record for record in reading.records}
    intent = by_op[(Kind.PROCESS_INTENT, outcome.op_id)].fields
    assert (intent["pid"], intent["starttime"], intent["pgid"], intent["role"]) == (outcome.pid, outcome.starttime, outcome.pgid, "descendant")
    terminal = by_op[(Kind.PROCESS_TERMINAL, outcome.op_id)]
    assert terminal.fields["wait_status"] == outcome.wait_status == 0 and terminal.fields["reaper"] == "launcher"
    assert outcome.terminal_head == terminal.digest
    assert outcome.head == by_op[(Kind.DESCENDANTS_TERMINAL, outcome.op_id)].digest


def test_an_op_environment_with_a_token_is_refused_and_never_runs(steward, state_path):
    """S7: the session refuses a credential or GIT_* name in an op's environment before the op exists;
    the sandbox stays usable and the journal records no process for the refused op."""
    session = steward.open_session("attempt-env")
    session.start_sandbox()
    with pytest.raises(Refused, match="op environment GITHUB_TOKEN"):
        session.run(["/usr/bin/env"], env={**ENV, "GITHUB_TOKEN": "ghs_secret"}, timeout_ms=10_000, stdout_cap=1024, stderr_cap=1024)
    assert run_true(session).observation.limit == "OK"
    session.close_sandbox()
    closed = session.close()
    intents = [record for record in sealed_reading(state_path, closed.stage_id).records if record.kind is Kind.PROCESS_INTENT]
    assert [record.fields["role"] for record in intents].count("descendant") == 1


def test_a_session_is_refused_while_the_dedicated_ids_are_in_use(steward, state_path, sandbox_ids):
    """S6: opening a session checks, under the lease, that no live process uses the dedicated ids; no stage is made."""
    uid, gid = sandbox_ids
    squatter = subprocess.Popen(["/usr/bin/sleep", "30"], user=uid, group=gid)
    try:
        with pytest.raises(Refused, match=f"sandbox uid {uid}.*already runs as it"):
            steward.open_session("attempt-1")
        assert os.listdir(os.path.join(state_path, "stages")) == []
    finally:
        squatter.kill()
        squatter.wait()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError as error:
        assert error.errno == errno.EBADF
        return False


def test_a_refused_capability_is_closed_and_never_mounted(state_path, sandbox_ids, tmp_path):
    """F4, C9: every capability passes the one predicate; a refused one is closed at once."""
    def refuse(fd: int, name: str) -> None:
        raise Refused(name, "is refused by the predicate")

    refusing = Steward(settings(state_path, sandbox_ids), capability_check=refuse)
    try:
        session = refusing.open_session("attempt-1")
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(Refused, match="capability data: is refused by the predicate"):
            session.add_capability("data", fd)
        assert not _is_open(fd)
        with pytest.raises(Refused, match="not a capability"):
            session.start_sandbox(read=["data"])
        session.close()
    finally:
        refusing.close()


def test_a_capability_must_be_a_directory_under_a_name_not_yet_used(steward, tmp_path):
    """C9, F4: a descriptor that is not a directory, or a name the session already uses, is refused and the
    descriptor closed at once, so no second consumer ever sees it."""
    (tmp_path / "file").write_bytes(b"x")
    session = steward.open_session("attempt-1")
    try:
        file_fd = os.open(tmp_path / "file", os.O_RDONLY)
        with pytest.raises(Refused, match="capability data: must be a directory descriptor"):
            session.add_capability("data", file_fd)
        assert not _is_open(file_fd)
        session.add_capability("data", os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
        again = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(Refused, match="capability data: is a name this session already uses"):
            session.add_capability("data", again)
        assert not _is_open(again)
    finally:
        session.close()


def test_a_session_holds_at_most_its_count_of_capabilities(steward, tmp_path):
    """C9 and the daemon's descriptor budget: a session owns each capability's descriptor until it ends, so it
    accepts at most MAX_CAPABILITIES; one more is refused and closed at once."""
    from steward.session import MAX_CAPABILITIES

    session = steward.open_session("attempt-1")
    try:
        for number in range(MAX_CAPABILITIES):
            session.add_capability(f"c{number}", os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
        extra = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(Refused, match=f"would be more than {MAX_CAPABILITIES} capabilities in one session"):
            session.add_capability("one-more", extra)
        assert not _is_open(extra)
    finally:
        session.close()


def test_a_halted_session_ends_its_running_op_and_every_later_one(steward, state_path):
    """The daemon's shutdown: halt() SIGKILLs the op that runs, and an op recorded after it, through a pidfd
    checked against the op's /proc handle; pid 1 still reaps each and its raw status is recorded."""
    session = steward.open_session("attempt-1")
    session.start_sandbox()
    outcomes = []
    running = threading.Thread(target=lambda: outcomes.append(
        session.run(["/bin/sleep", "60"], env=ENV, timeout_ms=120_000, stdout_cap=64, stderr_cap=64)))
    running.start()
    try:
        deadline = time.monotonic() + 30
        while not session.ledger._running and time.monotonic() < deadline:
            time.sleep(0.02)
        session.halt()
        running.join(30)
        began = time.monotonic()
        later = session.run(["/bin/sleep", "60"], env=ENV, timeout_ms=120_000, stdout_cap=64, stderr_cap=64)
        assert time.monotonic() - began < 30
    finally:
        session.close_sandbox()
        closed = session.close()
    for outcome in (*outcomes, later):
        assert outcome.wait_status == signal.SIGKILL, outcome
    reading = sealed_reading(state_path, closed.stage_id)
    terminals = {record.fields["op_id"]: record.fields["wait_status"] for record in reading.records if record.kind is Kind.PROCESS_TERMINAL}
    assert terminals[outcomes[0].op_id] == terminals[later.op_id] == signal.SIGKILL
    assert closed.diagnostic == "VERIFIED", "ending ops this way leaves every privileged status 0"


def test_an_op_killed_before_its_release_is_observed_like_any_other(state_path, sandbox_ids):
    """J1, C1: after halt() the next op is killed as soon as its identity is durable, before pid 1 has
    released it; pid 1 finds nobody to release, reaps it and reports its raw status, and the sandbox goes on."""
    holder = {}

    def hook(point: str) -> None:
        ledger = holder["session"].ledger if "session" in holder else None
        if point == AFTER_PROCESS_INTENT and ledger is not None and ledger._halted and ledger._running:
            pid = ledger.identities[ledger._running][0]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with open(f"/proc/{pid}/stat") as stat_file:
                    if stat_file.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return  # dead, every descriptor closed: the release cannot reach it
                time.sleep(0.01)
            raise AssertionError("the interrupted op was not killed")

    made = Steward(settings(state_path, sandbox_ids), capability_check=accept_all, hook=hook)
    try:
        session = holder["session"] = made.open_session("attempt-1")
        session.start_sandbox()
        session.halt()
        outcome = session.run(["/bin/sleep", "60"], env=ENV, timeout_ms=120_000, stdout_cap=64, stderr_cap=64)
        assert outcome.wait_status == signal.SIGKILL
        assert run_true(session).wait_status == signal.SIGKILL, "every op after halt() is ended"
        session.close_sandbox()
        assert session.close().diagnostic == "VERIFIED"
    finally:
        made.close()


def test_a_sandbox_names_only_known_inputs_each_once_and_runs_alone(steward):
    """C9: a sandbox reads only this session's capabilities and sealed outputs and writes only its unsealed
    outputs, each named once; a second sandbox waits until the first is closed."""
    session = steward.open_session("attempt-1")
    try:
        session.create_output("out", max_bytes=1 << 20)
        with pytest.raises(Refused, match="write elsewhere: is not an unsealed output"):
            session.start_sandbox(write=["elsewhere"])
        with pytest.raises(Refused, match="names one capability or output twice"):
            session.start_sandbox(write=["out", "out"])
        session.start_sandbox(write=["out"])
        with pytest.raises(Refused, match="sandbox: is already open"):
            session.start_sandbox()
        session.close_sandbox()
    finally:
        session.close()


@pytest.mark.parametrize("name, size, rule", [
    ("../x.receipt.json", 10, "must be one file name"),
    ("journal", 10, "and not journal or seal.json"),
    ("seal.json", 10, "and not journal or seal.json"),
    ("big.receipt.json", (512 << 10) + 1, "is larger than 524288 bytes"),
])
def test_evidence_a_client_stores_is_one_plain_name_within_its_cap(steward, name, size, rule):
    """E4: a stored evidence file is one plain name that is neither the journal nor the seal marker, and at
    most MAX_EVIDENCE_BYTES; the export into the client's directory can then never be redirected or swollen."""
    session = steward.open_session("attempt-1")
    try:
        with pytest.raises(Refused, match=rule):
            session.publish(name, b"x" * size)
    finally:
        session.close()


def test_a_session_stores_at_most_its_count_of_evidence_files(steward, monkeypatch):
    """E4: the evidence directory of a stage is bounded in files too (MAX_EVIDENCE_FILES)."""
    from steward import api

    monkeypatch.setattr(api, "MAX_EVIDENCE_FILES", 2)
    session = steward.open_session("attempt-1")
    try:
        session.publish("a.receipt.json", b"a")
        session.publish("b.receipt.json", b"b")
        session.publish("a.receipt.json", b"a")
        with pytest.raises(Refused, match="would be more than 2 evidence files"):
            session.publish("c.receipt.json", b"c")
    finally:
        session.close()


def test_a_capability_is_read_only_in_the_sandbox_and_closed_once_at_the_end(steward, tmp_path):
    """S4, C9: mounted read-only at /cap/NAME; the session owns the descriptor until it ends, then closes it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello").write_text("hi\n")
    fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
    session = steward.open_session("attempt-1")
    session.add_capability("data", fd)
    session.start_sandbox(read=["data"])
    outcome = session.run(["/bin/sh", "-c", "cat /cap/data/hello; touch /cap/data/x"], env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=200)
    assert outcome.observation.stdout == b"hi\n" and outcome.exit_code == 1 and b"Read-only" in outcome.observation.stderr
    session.close_sandbox()
    assert _is_open(fd)
    session.close()
    assert not _is_open(fd)


def test_every_sandbox_runs_the_interpreter_from_an_execute_only_copy_so_its_processes_are_not_dumpable(steward, state_path):
    """E7: set_interpreter copies the file into the stage, root-owned with mode 0111, and every sandbox of the
    session mounts that copy over the interpreter's path. The dedicated UID may execute it but not read it, so
    the kernel makes each process that execs it non-dumpable: another process of the sandbox cannot open its
    /proc/PID/fd or /proc/PID/mem, whatever the host's ptrace policy. The same probe without the copy opens
    both on a host without Yama, as this one (with Yama's ptrace_scope 1 a sibling is refused either way)."""
    interpreter = os.path.realpath("/usr/bin/python3")
    probe = (
        "import ctypes, os, subprocess, sys, time\n"
        "sleeper = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], stdin=subprocess.PIPE)\n"
        "time.sleep(0.2)\n"
        "for name in ('fd/0', 'mem'):\n"
        "    try:\n"
        "        os.close(os.open(f'/proc/{sleeper.pid}/{name}', os.O_RDONLY)); print(name, 'opened')\n"
        "    except OSError as error:\n"
        "        print(name, error.strerror)\n"
        "sleeper.communicate(b'')\n"
        "print('dumpable', ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"
    )
    seen = {}
    for copied in (True, False):
        session = steward.open_session("attempt-1")
        try:
            if copied:
                session.set_interpreter(os.open(interpreter, os.O_RDONLY), interpreter)
                copy = os.stat(f"{state_path}/stages/{session.stage_id}/interpreter")
                assert (stat.S_IMODE(copy.st_mode), copy.st_uid, copy.st_size) == (0o111, 0, os.stat(interpreter).st_size)
            session.start_sandbox()
            outcome = session.run([interpreter, "-S", "-c", probe], env=ENV, timeout_ms=20_000, stdout_cap=1000, stderr_cap=1000)
            seen[copied] = outcome.observation.stdout.decode()
            session.close_sandbox()
        finally:
            session.close()
    # Under hidepid=2 a non-dumpable process's /proc/PID is root's, so it is not even there for the UID.
    refused = ("No such file or directory", "Permission denied")
    assert seen[True] in [f"fd/0 {fd}\nmem {mem}\ndumpable 0\n" for fd in refused for mem in refused], seen
    assert seen[False] == "fd/0 opened\nmem opened\ndumpable 1\n", seen


SHARED_HOST = """
import os, sys
sys.path[:0] = sys.argv[1:3]
from steward.session import Steward
from steward_support import ENV, accept_all, settings

def mounted_here(path):
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == path for line in table)

interpreter = os.path.realpath("/usr/bin/python3")
steward = Steward(settings(sys.argv[3], (int(sys.argv[4]), int(sys.argv[5]))), capability_check=accept_all)
session = steward.open_session("attempt-1")
session.set_interpreter(os.open(interpreter, os.O_RDONLY), interpreter)
session.start_sandbox()
outcome = session.run([interpreter, "-S", "-c", "print('ran')"], env=ENV, timeout_ms=20_000, stdout_cap=100, stderr_cap=1000)
during = mounted_here(interpreter)
session.close_sandbox()
closed = session.close()
steward.close()
print(outcome.observation.stdout.decode().strip(), during, mounted_here(interpreter), closed.cleanup)
"""


def test_the_interpreter_s_mount_stays_in_its_sandbox_on_a_host_whose_mounts_are_shared(state_path, sandbox_ids):
    """E7, S4: on a systemd host / and /usr are shared, and a tree cloned from a shared mount is its peer: the
    interpreter's copy mounted over its path inside the sandbox's /usr reached the host's /usr/bin/python3.11
    (and the stage could not retire while its copy stayed mounted there). pid 1 makes the new root's trees
    private before it mounts the copy. Here the host is a mount namespace of the test's own whose mounts are
    shared; the copy is never mounted in it, during the op or after."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    uid, gid = sandbox_ids
    found = subprocess.run(
        ["unshare", "--mount", "--propagation", "shared", sys.executable, "-c", SHARED_HOST, repo,
         os.path.join(repo, "tests"), state_path, str(uid), str(gid)],
        capture_output=True, text=True, timeout=120,
    )
    assert found.stdout.split() == ["ran", "False", "False", "CLEANED"], found.stdout + found.stderr


@pytest.mark.parametrize("path, rule", [
    ("/usr", "is not a normalized path inside /usr or a capability's mount"),
    ("/cap/runtime/bin/python3", "is not a normalized path inside /usr or a capability's mount"),
    ("/opt/python/bin/python3", "is not a normalized path inside /usr or a capability's mount"),
    ("/usr/bin/../bin/python3", "is not a normalized path inside /usr or a capability's mount"),
])
def test_an_interpreter_goes_only_over_a_file_inside_usr_or_a_mount_and_only_once(steward, tmp_path, path, rule):
    """C9, E7: the interpreter's path lies inside /usr or a capability's own mount (the launcher checks the
    same rule, launcher.rendezvous.is_executable_target), its descriptor is a regular file, it is set once;
    a refused descriptor is closed at once."""
    interpreter = os.path.realpath("/usr/bin/python3")
    session = steward.open_session("attempt-1")
    try:
        fd = os.open(interpreter, os.O_RDONLY)
        with pytest.raises(Refused, match=rule):
            session.set_interpreter(fd, path)
        assert not _is_open(fd)
        directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(Refused, match="interpreter: must be a regular file descriptor"):
            session.set_interpreter(directory, interpreter)
        assert not _is_open(directory)
        session.set_interpreter(os.open(interpreter, os.O_RDONLY), interpreter)
        again = os.open(interpreter, os.O_RDONLY)
        with pytest.raises(Refused, match="interpreter: is already set for this session"):
            session.set_interpreter(again, interpreter)
        assert not _is_open(again)
    finally:
        session.close()


def test_an_output_is_filled_sealed_and_reused_read_only(steward, state_path):
    """Outputs: writable in the sandbox that fills it; sealed root-owned 0444/0555 with its inventory digest; then read-only."""
    session = steward.open_session("attempt-1")
    session.create_output("wheels", max_bytes=4 << 20)
    session.start_sandbox(write=["wheels"])
    fill = session.run(["/bin/sh", "-c", "mkdir /out/wheels/d && printf abc > /out/wheels/d/a.whl && chmod 4755 /out/wheels/d/a.whl"],
                       env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    assert fill.exit_code == 0, fill.observation.stderr
    with pytest.raises(Refused, match="still mounted in a live sandbox"):
        session.seal_output("wheels")
    session.close_sandbox()
    sealed = session.seal_output("wheels")
    assert (sealed.files, sealed.directories, sealed.bytes) == (1, 1, 3)
    stage = tombstone(state_path, session.stage_id).parent.parent / "stages" / session.stage_id
    document = (stage / "documents" / sealed.inventory_digest.removeprefix("sha256:")).read_bytes()
    assert documents.digest(document) == sealed.inventory_digest.removeprefix("sha256:")
    assert _modes(stage / "outputs" / "wheels") == {("dir", 0o555, 0), ("file", 0o444, 0)}
    descriptor = session.open_output("wheels")
    try:
        with open(os.open("d/a.whl", os.O_RDONLY, dir_fd=descriptor), "rb") as file:
            assert file.read() == b"abc"
    finally:
        os.close(descriptor)
    session.start_sandbox(read=["wheels"])
    reuse = session.run(["/bin/sh", "-c", "cat /cap/wheels/d/a.whl; touch /cap/wheels/x"], env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=200)
    assert reuse.observation.stdout == b"abc" and reuse.exit_code == 1
    session.close_sandbox()
    assert session.close().diagnostic == "VERIFIED"


def test_an_output_holding_a_symlink_is_not_sealed(steward):
    """A sealed output holds only regular files and directories."""
    session = steward.open_session("attempt-1")
    session.create_output("out", max_bytes=4 << 20)
    session.start_sandbox(write=["out"])
    session.run(["/bin/ln", "-s", "/etc/shadow", "/out/out/link"], env=ENV, timeout_ms=5000, stdout_cap=100, stderr_cap=100)
    session.close_sandbox()
    with pytest.raises(Refused, match="out/link: is a symlink"):
        session.seal_output("out")
    with pytest.raises(Refused, match="not a sealed output"):
        session.open_output("out")
    session.close()


def test_an_output_is_capped(steward):
    """The output's tmpfs is size-capped: filling it past max_bytes fails inside the sandbox."""
    session = steward.open_session("attempt-1")
    session.create_output("out", max_bytes=1 << 20)
    session.start_sandbox(write=["out"])
    outcome = session.run(["/bin/sh", "-c", "head -c 3000000 /dev/zero > /out/out/big"], env=ENV, timeout_ms=10_000, stdout_cap=100, stderr_cap=300)
    assert outcome.exit_code != 0 and b"No space left" in outcome.observation.stderr
    session.close()


@pytest.mark.parametrize("max_bytes, max_inodes", [((1 << 20) - 1, 16), (1 << 20, 15), ((8 << 30) + 1, 16), (1 << 20, 1_000_001)])
def test_an_output_is_sized_within_its_bounds(steward, max_bytes, max_inodes):
    """Outputs: a tmpfs of 1 MiB to 8 GiB and 16 to 1,000,000 inodes; anything else is refused unmounted."""
    session = steward.open_session("attempt-1")
    try:
        with pytest.raises(Refused, match="needs 1 MiB to"):
            session.create_output("out", max_bytes=max_bytes, max_inodes=max_inodes)
        assert not session.live
    finally:
        session.close()


def test_an_output_tmpfs_is_nosuid_nodev_noexec_on_the_host_too(steward, state_path):
    """Outputs: the host side of an output (the tmpfs in the stage) is mounted nosuid, nodev and noexec, so
    nothing the candidate writes there can be executed or used as a device on the host, in any namespace."""
    session = steward.open_session("attempt-1")
    try:
        session.create_output("out", max_bytes=1 << 20)
        target = os.path.join(state_path, "stages", session.stage_id, "live", "out")
        with open("/proc/self/mountinfo") as mountinfo:
            fields = [line.split() for line in mountinfo if line.split()[4] == target]
    finally:
        session.close()
    assert len(fields) == 1 and {"nosuid", "nodev", "noexec"} <= set(fields[0][5].split(","))


def test_an_output_mount_intent_is_durable_before_the_mount(state_path, sandbox_ids):
    """J1: when MOUNT_INTENT returns, the journal on disk holds it and the tmpfs is not mounted yet."""
    seen = []

    def hook(point: str) -> None:
        if point == AFTER_MOUNT_INTENT and not seen:
            stages = os.path.join(state_path, "stages")
            (stage,) = os.listdir(stages)
            target = os.path.join(stages, stage, "live", "out")
            with open("/proc/self/mountinfo") as mountinfo:
                mounted = any(line.split(" ")[4] == target for line in mountinfo)
            reading = read_dir_journal(tombstone(state_path, stage).parent.parent / "stages" / stage)
            seen.append((mounted, reading.records[-1].kind, reading.records[-1].fields["target"] == target))

    hooked = Steward(settings(state_path, sandbox_ids), capability_check=accept_all, hook=hook)
    try:
        session = hooked.open_session("attempt-1")
        session.create_output("out", max_bytes=1 << 20)
        session.close()
    finally:
        hooked.close()
    assert seen == [(False, Kind.MOUNT_INTENT, True)]


def test_an_evidence_directory_must_be_the_clients_own(steward, tmp_path):
    """A served session writes only into a directory its client owns (no confused deputy)."""
    session = steward.open_session("attempt-1", client_uid=1234)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match="owned by uid 0; it must be the client's own"):
            session.close(fd)
    finally:
        os.close(fd)
    assert session.close().cleanup == "CLEANED"


def test_an_abandoned_session_is_retired_unverified(steward, state_path):
    """C8: a client that goes away leaves a sealed tombstone whose cleanup evidence is UNVERIFIED."""
    session = steward.open_session("attempt-1")
    session.create_output("out", max_bytes=1 << 20)
    session.start_sandbox(write=["out"])
    run_true(session)
    closed = session.abandon()
    assert (closed.cleanup, closed.diagnostic) == ("UNVERIFIED", "SESSION_ABANDONED")
    reading = sealed_reading(state_path, closed.stage_id)
    assert last_of(reading, Kind.CLEANUP_EVIDENCE).fields["outcome"] == "UNVERIFIED"
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=ABANDONED diagnostic=SESSION_ABANDONED"


def test_an_interrupted_session_is_retired_as_interrupted(steward, state_path):
    """C7, issue 13: a client stopped by Ctrl-C retires its session with its own diagnostic, not a failed proof."""
    session = steward.open_session("attempt-1")
    session.start_sandbox()
    run_true(session)
    closed = session.interrupt()
    assert (closed.cleanup, closed.diagnostic) == ("UNVERIFIED", "INTERRUPTED")
    reading = sealed_reading(state_path, closed.stage_id)
    assert last_of(reading, Kind.RETIRED).fields["note"] == "session=INTERRUPTED diagnostic=INTERRUPTED"
    from steward import recovery

    assert recovery.diagnostic_of(reading) == "INTERRUPTED"


def test_the_outer_group_is_claimed_only_after_zombie_scan_then_reap(steward, monkeypatch):
    """C3: waitid(P_PIDFD, WNOWAIT) shows the zombie, then the scan, then the exact reap; never waitpid(-1)."""
    order = []
    real_waitid, real_members, real_waitpid = os.waitid, procfs.group_members, os.waitpid

    def waitid(idtype, ident, options):
        if options & os.WNOWAIT:
            order.append("zombie")
        return real_waitid(idtype, ident, options)

    def group_members(pgid):
        order.append("scan")
        return real_members(pgid)

    def waitpid(pid, options):
        assert pid > 0, "never waitpid(-1)"
        order.append("reap")
        return real_waitpid(pid, options)

    session = steward.open_session("attempt-1")
    session.start_sandbox()
    monkeypatch.setattr(starter.os, "waitid", waitid)
    monkeypatch.setattr(starter.procfs, "group_members", group_members)
    monkeypatch.setattr(starter.os, "waitpid", waitpid)
    session.close_sandbox()
    monkeypatch.undo()
    assert order == ["zombie", "scan", "reap"]
    assert session.outer[0][2] is True
    assert session.close().diagnostic == "VERIFIED"


def test_another_member_of_the_outer_group_leaves_it_unproven(steward, monkeypatch):
    """C3: a scan that finds another member of the group means no absence claim, and the session is not verified."""
    session = steward.open_session("attempt-1")
    session.start_sandbox()
    group = session.sandbox.outer_pgid
    real_members = procfs.group_members
    monkeypatch.setattr(starter.procfs, "group_members", lambda pgid: real_members(pgid) + [4_000_000] * (pgid == group))
    session.close_sandbox()
    monkeypatch.undo()
    closed = session.close()
    assert session.outer[0][2] is False
    assert (closed.cleanup, closed.diagnostic) == ("UNVERIFIED", "OUTER_UNPROVEN")


def test_a_member_never_shown_a_zombie_leaves_the_outer_group_unproven(steward, monkeypatch):
    """C3: a member whose pidfd never shows it a zombie in time (stuck, or gone from the scan's sight) means no
    absence claim, even when the scan then finds no other member of the group."""
    session = steward.open_session("attempt-1")
    session.start_sandbox()
    init_pid = session.sandbox.init_pid
    real_await = starter._await_zombie

    def never_a_zombie(pid, seconds):
        pidfd = real_await(pid, seconds)
        if pid != init_pid or pidfd is None:
            return pidfd
        os.close(pidfd)
        os.waitpid(pid, 0)  # out of the scan's sight, and never left unreaped by the test
        return None

    monkeypatch.setattr(starter, "_await_zombie", never_a_zombie)
    session.close_sandbox()
    monkeypatch.undo()
    closed = session.close()
    assert session.outer[0][2] is False
    assert closed.cleanup == "UNVERIFIED"


def test_a_pid_1_whose_report_never_arrived_is_reaped_and_counted(steward, state_path, monkeypatch):
    """C1, C3: stage 1 cloned pid 1 but the starter failed before learning its pid: found by group, reaped, counted."""
    def broken(self, message):
        raise ProtocolError("the CHILD report was lost")

    monkeypatch.setattr(starter.Sandbox, "_handover", broken)
    session = steward.open_session("attempt-1")
    with pytest.raises(starter.SandboxFailure, match="CHILD report was lost"):
        session.start_sandbox()
    monkeypatch.undo()
    assert [pid for pid in procfs.children(os.getpid())] == []
    closed = session.close()
    reading = sealed_reading(state_path, closed.stage_id)
    counted = [record.fields for record in reading.records if record.kind is Kind.DESCENDANTS_TERMINAL]
    assert counted == [{**counted[0], "op_id": f"{closed.stage_id}-1.launcher", "count": 1}]
    assert not any(record.fields.get("role") == "namespace" for record in reading.records)


def test_a_process_handle_proves_a_non_child_absent_without_waiting_for_it(tmp_path):
    """C2: the /proc/<pid> descriptor opened at intent time is bound to that process and its start time."""
    child = subprocess.Popen(["/usr/bin/sleep", "30"])
    try:
        found = procfs.identity(child.pid)
        with pytest.raises(LookupError):
            procfs.ProcessHandle.open(child.pid, found.starttime + 1)
        handle = procfs.ProcessHandle.open(child.pid, found.starttime)
        assert handle.gone() is False
        child.kill()
        child.wait()
        assert handle.gone() is True
        handle.close()
    finally:
        child.kill()
        child.wait()


def test_a_handle_whose_pid_now_holds_another_process_says_gone(tmp_path):
    """C2: the pid is gone or its start time differs: a handle whose recorded start time is not the process's says gone."""
    child = subprocess.Popen(["/usr/bin/sleep", "30"])
    try:
        found = procfs.identity(child.pid)
        handle = procfs.ProcessHandle.open(child.pid, found.starttime)
        handle.starttime += 1
        assert handle.gone() is True
        handle.close()
    finally:
        child.kill()
        child.wait()


def test_cleanup_kills_what_still_runs_as_the_dedicated_uid(steward, state_path, sandbox_ids):
    """C6: the helper kills a process of the dedicated ids through a checked pidfd, and proves it gone."""
    session = steward.open_session("attempt-1")
    uid, gid = sandbox_ids
    stray = subprocess.Popen(["/usr/bin/sleep", "60"], user=uid, group=gid, start_new_session=True)
    parent = threading.Thread(target=stray.wait)  # its parent reaps it once the helper killed it
    parent.start()
    try:
        closed = session.close()
        parent.join(10)
        assert stray.returncode == -9
    finally:
        stray.kill()
        parent.join()
    reading = sealed_reading(state_path, closed.stage_id)
    response_digest = last_of(reading, Kind.HELPER_ATTEMPT).fields["response_digest"]
    response = (tombstone(state_path, closed.stage_id) / "documents" / response_digest).read_bytes()
    assert b'"killed":1' in response and b'"outcome":"CLEANED"' in response
    assert closed.cleanup == "CLEANED"


def test_a_journal_changed_behind_its_writer_refuses_the_cleanup_claim(steward, state_path):
    """J4: cleanup reads the journal as stored and needs it VALID at the writer's own head; otherwise no claim."""
    session = steward.open_session("attempt-1")
    stage = tombstone(state_path, session.stage_id).parent.parent / "stages" / session.stage_id
    with open(stage / "journal", "r+b") as file:
        data = bytearray(file.read())
        data[40] ^= 0x01
        file.seek(0)
        file.write(data)
    with pytest.raises(Refused, match="journal: is CORRUPT on disk"):
        session.close()
    assert (stage / "journal").exists() and not tombstone(state_path, session.stage_id).exists()


def test_the_helper_never_kills_a_pid_whose_start_time_changed():
    """C2: a kill goes through a pidfd whose process is checked to be the one the scan saw (pid and start time)."""
    from steward import helper

    child = subprocess.Popen(["/usr/bin/sleep", "30"])
    try:
        found = procfs.identity(child.pid)
        seen = procfs.Entry(child.pid, os.getpid(), found.pgid, found.starttime + 1, "S", (0,), (0,))
        assert helper._kill(seen) is False
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
