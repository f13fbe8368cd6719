"""Issue 14 (5): verify --jobs N runs an attempt as stages, each a session bound to a pair of the sandbox pool
(S15: stages running at once never share a uid), each with its own journal, tombstone and evidence, folded by
one evaluation; a missing or forged stage leaves its cases UNVERIFIED, never PASS."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import pytest

from executor.attempt import cases_per_stage, split_stages
from executor.cases.runtime import choose_interpreter
from executor.cli.commands.verify import check_jobs
from executor.plan import plan_from_bytes
from journal.errors import Refused
from journal.files import JOURNAL_NAME
from journal.reader import Verdict, read_journal
from steward import dedicated
from steward.stateroot import StateRoot
from test_verify import EXAMPLES, REPO, attempt, packed, refused, world  # noqa: F401

IMPORT = {"op": "python-module", "args": ["demo_core"], "timeout_ms": 30000, "expect_exit": 0}


def plan_of(count: int, *, applicable=lambda n: True):
    cases = [{"id": f"c{n}", **IMPORT, "applicable": applicable(n)} for n in range(count)]
    return {"schema": "casebox.plan.v1", "cases": cases}


def indexed(plan: dict):
    parsed = plan_from_bytes(json.dumps(plan).encode())
    return [(index, case) for index, case in enumerate(parsed.cases)]


def test_a_plan_is_split_so_no_stage_outgrows_its_journal():
    """J2 with --jobs: the fewest stages, at least jobs, each within the journal's room, every case in exactly
    one stage, by the shard rule (case k to stage k mod s + 1)."""
    state_root = "/var/lib/" + "s" * 120
    interpreter = "/opt/hostedtoolcache/Python/3.12.7/x64/bin/python3.12"
    room = cases_per_stage(state_root, interpreter)
    cases = indexed(plan_of(64))
    stages = split_stages(cases, 1, state_root, interpreter)
    assert len(stages) == -(-64 // room) > 1
    assert all(sum(case.applicable for _, case in stage) <= room for stage in stages)
    assert sorted(index for stage in stages for index, _ in stage) == list(range(64))
    assert [index for index, _ in stages[1]] == list(range(1, 64, len(stages)))
    assert len(split_stages(cases, len(stages) + 1, state_root, interpreter)) == len(stages) + 1
    assert len(split_stages(indexed(plan_of(2)), 4, state_root, interpreter)) == 2, "never an empty stage"
    assert len(split_stages(indexed(plan_of(room)), 1, state_root, interpreter)) == 1
    # Only applicable cases fill a journal: a stage of N/A cases and `room` applicable ones is one stage.
    assert len(split_stages(indexed(plan_of(room + 5, applicable=lambda n: n < room)), 1, state_root, interpreter)) == 1


@pytest.mark.parametrize("given", ["0", "4", "-1", "two", "1.5", ""])
def test_a_bad_jobs_count_is_refused(given):
    """Bad input: --jobs outside 1 to the pool's size is one sentence naming --jobs and the rule."""
    with pytest.raises(Refused) as refusal:
        check_jobs(given, 3)
    assert refusal.value.where == "--jobs" and "sandbox_ids" in refusal.value.rule


@pytest.mark.parametrize("given", ["0", "2", "x"])
def test_verify_refuses_a_bad_jobs_before_anything_is_written(casebox, attempt, given):
    """Bad input: verify --jobs past the configured pool (here one pair) or not a count is exit 64, one
    sentence naming --jobs, and no evidence directory or scratch left."""
    assert "sandbox_ids" in refused(casebox, {**attempt, "--jobs": given}, "--jobs")


def test_the_default_jobs_is_the_cores_up_to_four_and_the_pool(monkeypatch):
    """Issue 14 (5): the default --jobs is the cores this process may run on (its affinity, as for the
    sandboxes started ahead: one count), at most four and at most the pool."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert check_jobs(None, 64) == 4 and check_jobs(None, 2) == 2 and check_jobs("3", 3) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert check_jobs(None, 64) == 2


def test_live_sessions_are_bound_to_different_uids_of_the_pool(tmp_path):
    """S15 (S6, S13 with a pool): a binding is held for a session's life, so two live sessions never get one
    uid while the pool has a free one; with none free there is no binding (the session shares a uid and its
    sandboxes take turns on its lease); a released pair is bound again. Only lock files of this test's own
    state root are used, no process runs as these ids."""
    with StateRoot.open(str(tmp_path / "state")) as root:
        first = root.bind((10, 11))
        second = root.bind((10, 11))
        assert {first.uid, second.uid} == {10, 11}
        assert root.bind((10, 11)) is None
        first.release()
        again = root.bind((10, 11))
        assert again.uid == first.uid
        second.release()
        again.release()


def test_a_session_beyond_the_pool_shares_its_first_pair(tmp_path, sandbox_ids):
    """S15: the default pool of one pair still serves two live sessions at once (as before the pool): the
    second is not bound, shares the pair, and its sandbox waits for the first's lease (S6 per sandbox)."""
    from steward.session import Steward
    from steward_support import accept_all, settings

    with Steward(settings(str(tmp_path / "state"), sandbox_ids, lease_seconds=0.2), capability_check=accept_all) as steward:
        first = steward.open_session("jobs-1")
        second = steward.open_session("jobs-2")
        assert (first.uid, second.uid) == (sandbox_ids[0], sandbox_ids[0])
        assert first.binding is not None and second.binding is None
        for session in (first, second):
            assert session.close().cleanup == "CLEANED"


def test_the_config_pool_is_consecutive_pairs_and_bounded(tmp_path):
    from executor.cli import config

    path = tmp_path / "casebox.toml"
    path.write_text("sandbox_uid = 3000\nsandbox_gid = 4000\nsandbox_ids = 3\n")
    assert config.load(str(path)).sandbox_pool == ((3000, 4000), (3001, 4001), (3002, 4002))
    for text, rule in (("sandbox_ids = 0\n", "from 1 to 64"), ("sandbox_uid = 4294967294\nsandbox_ids = 2\n", "past")):
        path.write_text(text)
        with pytest.raises(Refused) as refusal:
            config.load(str(path))
        assert "sandbox_ids" in refusal.value.where and rule in refusal.value.rule


@pytest.fixture(scope="module")
def big(tmp_path_factory, sandbox_ids, sandbox_pool_size, casebox):
    """One verify of a plan with one applicable case more than a stage's journal holds."""
    base = tmp_path_factory.mktemp("jobs")
    uid, gid = sandbox_ids
    pool = min(sandbox_pool_size, 3)
    config = base / "casebox.toml"
    config.write_text(
        f'state_root = "{base}/state"\nsandbox_uid = {uid}\nsandbox_gid = {gid}\nsandbox_ids = {pool}\n'
        f'socket = "{base}/no-steward.sock"\n'
    )
    room = cases_per_stage(f"{base}/state", choose_interpreter())
    plan = base / "plan.json"
    plan.write_text(json.dumps(plan_of(room + 1)))
    bundle, sha256 = packed(base)
    evidence = base / "evidence"
    result = casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256, "--plan", str(plan),
        "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(EXAMPLES / "index"), "--attempt", "jobs-1",
        "--evidence", str(evidence), "--root", "/", "--jobs", str(pool), "--json", timeout=900,
    )
    return base, config, plan, sha256, evidence, result, pool


@pytest.mark.root
@pytest.mark.slow
def test_a_plan_past_one_stages_room_passes_in_one_verify(big):
    """Issue 14 (5): more applicable cases than one stage's journal holds pass through one verify: split into
    stages, each with its own evidence directory whose journal verifies, its own sealed tombstone and its own
    sandbox uid of the pool when the pool has room."""
    base, _, _, _, evidence, result, pool = big
    assert result.returncode == 0, result.stdout.decode()[-3000:] + result.stderr.decode()[-3000:]
    value = json.loads(result.stdout)
    assert value["report"]["verdict"] == "PASS" and value["tombstone"] is None
    stages = value["stages"]
    assert len(stages) == max(2, pool) and sorted(os.listdir(evidence)) == [f"stage-{n}" for n in range(1, len(stages) + 1)]
    for stage in stages:
        reading = read_journal((pathlib.Path(stage["evidence"]) / JOURNAL_NAME).read_bytes())
        assert reading.verdict == Verdict.VALID
        assert (pathlib.Path(stage["tombstone"]) / JOURNAL_NAME).read_bytes() == (pathlib.Path(stage["evidence"]) / JOURNAL_NAME).read_bytes()
    ids = set()
    for stage in stages:
        fd = os.open(stage["tombstone"], os.O_RDONLY | os.O_DIRECTORY)
        try:
            ids.add(dedicated.recorded_ids(fd, (0, 0), stage["tombstone"]))
        finally:
            os.close(fd)
    assert len(ids) == min(pool, len(stages)), "stages running at once were bound to different pairs"


def evaluate(casebox, big, tmp_path, evidence: list[str]):
    _, _, plan, sha256, _, _, _ = big
    tmp_path.mkdir()
    return casebox(
        "evaluate", "--plan", str(plan), "--attempt", "jobs-1", "--bundle-sha256", sha256,
        "--report-dir", str(tmp_path), "--json", "--evidence", *evidence, timeout=120,
    )


@pytest.mark.root
@pytest.mark.slow
def test_a_missing_stage_leaves_its_cases_unverified(big, casebox, tmp_path):
    """E-fold over stages: evaluating without one stage's evidence is UNVERIFIED (its cases missing), never PASS."""
    evidence = big[4]
    stages = sorted(str(path) for path in evidence.iterdir())
    whole = evaluate(casebox, big, tmp_path / "whole", stages)
    assert json.loads(whole.stdout)["verdict"] == "PASS"
    partial = evaluate(casebox, big, tmp_path / "partial", stages[1:])
    report = json.loads(partial.stdout)
    assert partial.returncode == 3 and report["verdict"] == "UNVERIFIED"
    assert {case["reason"] for case in report["cases"] if case["status"] == "UNVERIFIED"} == {"missing"}


@pytest.mark.root
@pytest.mark.slow
def test_a_forged_stage_makes_the_verdict_unverified(big, casebox, tmp_path):
    """A stage whose journal is another stage's (a forger copying the good one over it) is not accepted: the
    receipts no longer match their stage's sealed journal, so the verdict is UNVERIFIED, never PASS."""
    evidence = big[4]
    forged = tmp_path / "forged"
    shutil.copytree(evidence, forged)
    first, second = forged / "stage-1", forged / "stage-2"
    os.chmod(second, 0o755)
    os.chmod(second / JOURNAL_NAME, 0o644)
    shutil.copyfile(first / JOURNAL_NAME, second / JOURNAL_NAME)
    result = evaluate(casebox, big, tmp_path / "forged-report", sorted(str(path) for path in forged.iterdir()))
    assert result.returncode == 3 and json.loads(result.stdout)["verdict"] == "UNVERIFIED"


HOSTILE = """
import json, os, signal
seen = sorted(int(name) for name in os.listdir('/proc') if name.isdigit())
try:
    os.kill(-1, signal.SIGKILL)
    killed = 'sent'
except OSError as error:
    killed = error.strerror
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "seen": seen, "kill": killed}))
"""


@pytest.mark.root
def test_a_hostile_op_in_one_stage_cannot_touch_another_stage_running_at_once(tmp_path, sandbox_ids, sandbox_pool_size):
    """S15 (S6, S13 with verify --jobs): two stages running at once, as verify runs them (a steward each, one state
    root), are bound to different pairs of the pool, so their sandboxes run at the same time under different
    uids. A hostile op in stage 2 sees no process of stage 1 and its kill(-1, SIGKILL) leaves stage 1's op
    running to its own end. Were the uid shared, stage 2's sandbox could not start while stage 1's holds its
    lease (one sandbox per uid), and this test would be refused waiting for it."""
    import threading

    from steward.session import Steward
    from steward_support import ENV, accept_all, settings

    if sandbox_pool_size < 2:
        pytest.skip("needs CASEBOX_TEST_IDS of 2 or more")
    state = str(tmp_path / "state")
    stewards = [Steward(settings(state, sandbox_ids, ids=2, lease_seconds=5.0), capability_check=accept_all) for _ in range(2)]
    try:
        first, second = (steward.open_session(f"jobs-{n}") for n, steward in enumerate(stewards))
        assert {first.uid, second.uid} == {sandbox_ids[0], sandbox_ids[0] + 1}
        first.start_sandbox()
        outcome = {}
        sleeper = threading.Thread(target=lambda: outcome.update(op=first.run(
            ["/usr/bin/sleep", "3"], env=ENV, timeout_ms=30_000, stdout_cap=1024, stderr_cap=1024)))
        sleeper.start()
        second.start_sandbox()
        probe = second.run(["/usr/bin/python3", "-I", "-c", HOSTILE], env=ENV, timeout_ms=30_000, stdout_cap=65536, stderr_cap=65536)
        second.close_sandbox()
        sleeper.join(60)
        first.close_sandbox()
        report = json.loads(probe.observation.stdout.decode().strip().splitlines()[-1])
        assert (report["uid"], report["gid"]) == (second.uid, second.gid) != (first.uid, first.gid)
        assert len(report["seen"]) <= 2, "only its own pid 1 and itself"
        observed = outcome["op"].observation
        assert observed.limit == "OK" and os.WIFEXITED(observed.wait_status) and os.WEXITSTATUS(observed.wait_status) == 0
        for session in (first, second):
            closed = session.close()
            assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    finally:
        for steward in stewards:
            steward.close()


@pytest.mark.root
def test_recovery_cleans_up_as_the_pair_the_stage_was_bound_to(tmp_path, sandbox_ids, sandbox_pool_size):
    """S15, C4: a stage bound to the pool's second pair whose steward died is finished by recovery as that
    pair: a process left running as the stage's uid is killed, and the stage is sealed. Cleaning up as the
    pool's first pair instead would leave it running and claim CLEANED."""
    import subprocess
    import time

    from steward.recovery import Recovery
    from steward.session import Steward
    from steward_support import accept_all, settings

    if sandbox_pool_size < 2:
        pytest.skip("needs CASEBOX_TEST_IDS of 2 or more")
    state = str(tmp_path / "state")
    pool = settings(state, sandbox_ids, ids=2)
    with Steward(pool, capability_check=accept_all) as steward:
        holder = steward.open_session("jobs-holder")
        crashed = steward.open_session("jobs-crashed")
        assert crashed.uid == sandbox_ids[0] + 1
        crashed._release()  # its steward "dies": the journal's lock and the binding go, the stage stays ACTIVE
        left = subprocess.Popen(["/usr/bin/sleep", "60"], user=crashed.uid, group=crashed.gid)
        try:
            with StateRoot.open(state) as root:
                report = Recovery(root, pool).recover(crashed.stage_id)
            deadline = time.monotonic() + 10
            while left.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert left.poll() is not None, "recovery left the stage's uid running"
            assert report.ok and report.after == "SEALED", report
        finally:
            if left.poll() is None:
                left.kill()
            left.wait()
        assert holder.close().cleanup == "CLEANED"


# Four cases that never end on their own: an interrupt always finds both stages of --jobs 2 in their cases.
SLEEPERS = {"schema": "casebox.plan.v1", "cases": [
    {"id": f"sleep-{n}", "op": "pytest", "args": ["tests/test_limits.py::test_sleeps_forever"], "timeout_ms": 300_000,
     "applicable": True, "expect_exit": 0} for n in range(4)]}


def interrupt_when_both_stages_run(process: subprocess.Popen) -> tuple[int, bytes]:
    """SIGINT to ``process`` (a verify --jobs 2 started in a session of its own) once both its stages are in
    their cases; its exit code and what it printed on stderr."""
    seen = b""
    deadline = time.monotonic() + 600
    while not all(f"stage {n}/2: running".encode() in seen for n in (1, 2)) and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen += line
    try:
        assert all(f"stage {n}/2: running".encode() in seen for n in (1, 2)), f"both stages never ran cases: {seen[-3000:]!r}"
        time.sleep(2)  # each stage's first op under way
        os.killpg(process.pid, signal.SIGINT)
        _, rest = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, seen + rest


@pytest.mark.root
def test_an_interrupt_retires_every_running_stage_as_interrupted(tmp_path, sandbox_ids, sandbox_pool_size):
    """Issue 14 (5), with C9: Ctrl-C while two stages run their cases: exit 130, and each stage is retired as
    INTERRUPTED (cleanup UNVERIFIED), exporting nothing. The interrupt halts (kills) the stages' ops; were a stage
    then closed as usual, its killed cases would be exported as failed receipts of a CLOSED stage, evidence
    that a later evaluate would read as FAIL."""
    if sandbox_pool_size < 2:
        pytest.skip("needs CASEBOX_TEST_IDS of 2 or more")
    uid, gid = sandbox_ids
    config = tmp_path / "casebox.toml"
    config.write_text(
        f'state_root = "{tmp_path}/state"\nsandbox_uid = {uid}\nsandbox_gid = {gid}\nsandbox_ids = 2\n'
        f'socket = "{tmp_path}/no-steward.sock"\n'
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(SLEEPERS))
    bundle, sha256 = packed(tmp_path)
    evidence = tmp_path / "evidence"
    process = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "casebox"), "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256, "--plan", str(plan),
         "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(EXAMPLES / "index"), "--attempt", "jobs-stopped",
         "--evidence", str(evidence), "--root", "/", "--jobs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    code, output = interrupt_when_both_stages_run(process)
    assert code == 130, output[-3000:]
    tombstones = tmp_path / "state" / "tombstones"
    notes = [read_journal((tombstones / name / JOURNAL_NAME).read_bytes()).records[-1].fields["note"]
             for name in sorted(os.listdir(tombstones))]
    assert notes == ["session=INTERRUPTED diagnostic=INTERRUPTED"] * 2, notes
    exported = [path for path in evidence.rglob("*") if path.is_file()] if evidence.exists() else []
    assert exported == [], "an interrupted stage exports no receipt"
