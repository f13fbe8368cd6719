"""The evaluator (executor/evidence/evaluate.py, docs/receipts.md): E1–E4 and E6 on real journals and real receipts, then tampered."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from casebox_cli import run as run_cli
from evidence_support import (
    ATTEMPT,
    BUNDLE,
    DESIGNED_RUNS,
    DESIGNED_STATUS,
    SHIPPED_FILTER,
    Run,
    Stage,
    build_attempt,
    exited,
    junit,
    rewrite_json,
)
from hypothesis import given
from hypothesis import strategies as st

from executor.evidence import evaluate as evaluate_module
from executor.evidence.evaluate import FAIL, PASS, PROBLEMS, REASONS, UNVERIFIED, Expected, evaluate, outcome_status, publish_report
from executor.evidence.junit import JunitCounts, PytestEvidence
from executor.plan import Plan, plan_from_bytes
from executor.evidence.receipts import LIMIT_CLASSES, NOT_STARTED, SHIPPED_FILTER_DIGESTS, Binding, Outcome, Receipt
from journal.errors import Refused
from launcher.vocabulary import ENDED_BY_ITSELF
from plan_support import case as case_doc
from plan_support import plan as make_plan

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo_plan() -> Plan:
    return plan_from_bytes((REPO / "examples" / "plan.json").read_bytes())


def simple_plan(*ops: str) -> Plan:
    """A plan of applicable cases c0, c1, ... with the given ops, each expecting exit 0."""
    return make_plan(*(case_doc(f"c{index}", op, ("x",), 1000, True, 0) for index, op in enumerate(ops)))


PASSING = {"pytest": Run(pytest=junit(3)), "python-module": Run(), "console-script": Run()}


def passing_runs(plan: Plan) -> dict[str, Run]:
    return {case.id: PASSING[case.op] for case in plan.cases}


def judge(plan: Plan, directories, **expected) -> dict:
    expected.setdefault("attempt_id", ATTEMPT)
    expected.setdefault("bundle_sha256", BUNDLE)
    report = evaluate(Expected(plan, **expected), [str(path) for path in directories])
    return {"report": report, "cases": {r.case_id: (r.status, r.reason) for r in report.cases}, "verdict": report.verdict}


def one_stage(tmp_path, plan: Plan, runs: dict[str, Run] | None = None, **stage_options) -> Stage:
    """A stage that ran every case of ``plan`` (not yet sealed, so a test can journal more)."""
    stage = Stage(tmp_path / "evidence", plan, **stage_options)
    for case in plan.cases:
        stage.run(case.id, (runs or passing_runs(plan))[case.id])
    return stage


def tampered_receipt(tmp_path, change, plan: Plan | None = None) -> tuple[str, str]:
    """Case c0's status and reason after ``change`` rewrites its receipt in an otherwise passing attempt."""
    plan = plan or simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    rewrite_json(stage.receipt_path("c0"), change)
    return judge(plan, [stage.directory])["cases"]["c0"]


def judge_single_run(tmp_path, op: str, run: Run, **journal) -> tuple[str, str]:
    """The status and reason of a one-case attempt whose op ``op`` ended as ``run`` (journaled per ``journal``)."""
    plan = simple_plan(op)
    stage = Stage(tmp_path / "evidence", plan)
    stage.run("c0", run, **journal)
    stage.seal()
    return judge(plan, [stage.directory])["cases"]["c0"]


# --- the designed demo attempt ---------------------------------------------------


def test_the_demo_plan_gets_each_designed_status_and_the_verdict_unverified(tmp_path, demo_plan):
    """E3: each case of the reference plan folds to its designed status; UNVERIFIED over FAIL over PASS."""
    result = judge(demo_plan, build_attempt(tmp_path, demo_plan, DESIGNED_RUNS))
    assert result["cases"] == DESIGNED_STATUS
    assert result["verdict"] == UNVERIFIED


def test_every_case_passing_is_a_pass(tmp_path):
    """E3 control: authenticated, complete evidence for every case is PASS."""
    plan = simple_plan("pytest", "python-module", "console-script")
    result = judge(plan, build_attempt(tmp_path, plan, passing_runs(plan)))
    assert set(result["cases"].values()) == {(PASS, "passed")}
    assert result["verdict"] == PASS


def test_a_failure_and_passes_fold_to_fail(tmp_path):
    """E3: FAIL over PASS; the FAIL is an authenticated exit other than expect_exit."""
    plan = simple_plan("pytest", "python-module")
    runs = {"c0": Run("EXIT_NONZERO", exited(1), junit(2, failures=1)), "c1": Run()}
    result = judge(plan, build_attempt(tmp_path, plan, runs))
    assert result["cases"] == {"c0": (FAIL, "exit_mismatch"), "c1": (PASS, "passed")}
    assert result["verdict"] == FAIL


def test_not_applicable_is_only_where_the_plan_says_so(tmp_path, demo_plan):
    """E3: N/A comes from applicable: false; a receipt for such a case is UNVERIFIED, not N/A."""
    runs = dict(DESIGNED_RUNS, **{"not-applicable": Run(pytest=junit(1))})
    stage = Stage(tmp_path / "evidence", demo_plan)
    for case in demo_plan.cases:
        stage.run(case.id, runs[case.id])
    stage.seal()
    assert judge(demo_plan, [stage.directory])["cases"]["not-applicable"] == (UNVERIFIED, "unexpected_receipt")


def test_a_plan_with_nothing_applicable_is_unverified(tmp_path):
    """E5 for the verdict: no applicable case means nothing was verified."""
    plan = make_plan(case_doc("c0", "pytest", (), 1000, False, 0))
    stage = Stage(tmp_path / "evidence", plan)
    stage.seal()
    result = judge(plan, [stage.directory])
    assert result["verdict"] == UNVERIFIED
    assert result["report"].problems == ("nothing_applicable",)


# --- shards -----------------------------------------------------------------------


def test_shards_in_several_directories_fold_like_one(tmp_path, demo_plan):
    """Scale-out: the shards of one attempt, one evidence directory each, fold to the same statuses."""
    single = judge(demo_plan, build_attempt(tmp_path / "one", demo_plan, DESIGNED_RUNS))
    sharded = judge(demo_plan, build_attempt(tmp_path / "three", demo_plan, DESIGNED_RUNS, shards=3))
    assert sharded["cases"] == single["cases"] == DESIGNED_STATUS
    assert len(sharded["report"].stages) == 3


def test_a_missing_shard_leaves_its_cases_missing(tmp_path, demo_plan):
    """E2: a shard never evaluated leaves its cases UNVERIFIED missing, whatever the others say."""
    directories = build_attempt(tmp_path, demo_plan, DESIGNED_RUNS, shards=3)
    result = judge(demo_plan, directories[:2])
    missing = {case_id for case_id, (status, reason) in result["cases"].items() if reason == "missing"}
    assert missing == {case.id for case in demo_plan.cases[2::3] if case.applicable}


def test_the_same_directory_twice_is_refused(tmp_path):
    """F1: an evidence directory given twice is refused (exit 64), naming it."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    with pytest.raises(Refused) as caught:
        evaluate(Expected(plan, ATTEMPT, BUNDLE), [str(directory), str(directory) + "/"])
    assert caught.value.where == str(directory) + "/"


# --- E2: presence and freshness ----------------------------------------------------


def test_a_missing_case_is_unverified(tmp_path):
    """E2: every plan case appears; a deleted receipt leaves its case UNVERIFIED missing."""
    plan = simple_plan("python-module", "python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    stage.receipt_path("c1").unlink()
    assert judge(plan, [stage.directory])["cases"] == {"c0": (PASS, "passed"), "c1": (UNVERIFIED, "missing")}


def test_a_duplicated_case_is_unverified(tmp_path):
    """E2: a case with receipts in two shards is UNVERIFIED duplicated, even when both would pass."""
    plan = simple_plan("python-module", "python-module")
    first, second = build_attempt(tmp_path, plan, passing_runs(plan), shards=2)
    extra = Stage(tmp_path / "third", plan, stage_id="stage-x")
    extra.run("c0", Run())
    extra.seal()
    result = judge(plan, [first, second, extra.directory])
    assert result["cases"]["c0"] == (UNVERIFIED, "duplicated")
    assert result["cases"]["c1"] == (PASS, "passed")


def test_a_receipt_from_another_attempt_is_stale(tmp_path):
    """E2: only receipts of this attempt count; a case whose only receipt is from another attempt is stale."""
    plan = simple_plan("python-module", "python-module")
    old = build_attempt(tmp_path / "old", plan, passing_runs(plan), attempt="run-41-1")[0]
    current = one_stage(tmp_path, plan)
    current.seal()
    current.receipt_path("c1").unlink()
    os.link(old / "run-41-1.c1.receipt.json", current.directory / "run-41-1.c1.receipt.json")
    assert judge(plan, [current.directory])["cases"]["c1"] == (UNVERIFIED, "stale")


def test_an_old_receipt_beside_a_fresh_one_is_ignored(tmp_path):
    """E2: a receipt of another attempt (by its name) is not a second receipt for the case."""
    plan = simple_plan("python-module")
    old = build_attempt(tmp_path / "old", plan, passing_runs(plan), attempt="run-41-1")[0]
    current = one_stage(tmp_path, plan)
    current.seal()
    os.link(old / "run-41-1.c0.receipt.json", current.directory / "run-41-1.c0.receipt.json")
    assert judge(plan, [current.directory])["cases"]["c0"] == (PASS, "passed")


def test_a_receipt_renamed_into_this_attempt_is_stale(tmp_path):
    """E2: the receipt's own attempt id decides, not its file name."""
    assert tampered_receipt(tmp_path, lambda value: value.update(attempt_id="run-41-1")) == (UNVERIFIED, "stale")


def test_evidence_of_another_attempt_is_stale(tmp_path):
    """E2: a whole directory from another attempt does not count for this one."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan), attempt="run-41-1")[0]
    result = judge(plan, [directory])
    assert result["cases"]["c0"] == (UNVERIFIED, "stale")
    assert result["report"].stages[0]["problem"] == "stale"


def test_a_journal_of_another_attempt_under_a_fresh_marker_is_stale(tmp_path):
    """E2: the journal's GENESIS binds the attempt; a marker rewritten to this attempt does not make it fresh."""
    plan = simple_plan("python-module")
    stage = Stage(tmp_path / "evidence", plan, attempt="run-41-1")
    stage.run("c0", Run())
    stage.seal()
    rewrite_json(stage.path("seal.json"), lambda value: value.update(attempt_id=ATTEMPT))
    rewrite_json(stage.receipt_path("c0", "run-41-1"), lambda value: value.update(attempt_id=ATTEMPT))
    os.rename(stage.receipt_path("c0", "run-41-1"), stage.receipt_path("c0"))
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "stale")


def test_an_attempt_number_other_than_the_one_given_is_stale(tmp_path):
    """E2: with --attempt-number, every receipt must carry it."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    assert judge(plan, [directory], attempt_number=1)["verdict"] == PASS
    assert judge(plan, [directory], attempt_number=2)["cases"]["c0"] == (UNVERIFIED, "stale")


def test_receipts_disagreeing_on_the_attempt_number_are_stale(tmp_path):
    """E2: a partial rerun (another attempt number in one shard) is UNVERIFIED."""
    plan = simple_plan("python-module", "python-module")
    first = Stage(tmp_path / "a", plan, stage_id="s-a")
    first.run("c0", Run())
    first.seal()
    second = Stage(tmp_path / "b", plan, stage_id="s-b", attempt_number=2)
    second.run("c1", Run())
    second.seal()
    assert set(judge(plan, [first.directory, second.directory])["cases"].values()) == {(UNVERIFIED, "stale")}


# --- the stage: marker and journal -------------------------------------------------


def test_a_torn_journal_is_unverified(tmp_path):
    """E1/J4: only a VALID journal authorizes; a torn tail makes every case of the stage journal_torn."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    with open(stage.path("journal"), "ab") as journal:
        journal.write(b"\x00\x00\x10\x00")
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "journal_torn")


def test_a_truncated_journal_does_not_match_its_marker(tmp_path):
    """E1/J4: a journal cut at a frame boundary ends at another head than the marker's: SUBSTITUTED."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    from journal.reader import read_journal

    data = stage.path("journal").read_bytes()
    retired = read_journal(data).records[-1]
    os.chmod(stage.path("journal"), 0o600)
    stage.path("journal").write_bytes(data[: retired.offset])
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "journal_substituted")


def test_another_sealed_journal_of_the_same_stage_does_not_match_the_marker(tmp_path):
    """E1/J4: same stage and journal ids, another history: its head is not the marker's."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    rerun = Stage(tmp_path / "rerun", plan)
    rerun.run("c0", Run("EXIT_NONZERO", exited(1)))
    rerun.seal()
    os.unlink(stage.path("journal"))
    os.link(rerun.path("journal"), stage.path("journal"))
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "journal_substituted")


@pytest.mark.parametrize("field", ["stage_id", "journal_id"])
def test_a_marker_naming_another_stage_or_journal_than_the_journal_s_genesis_is_substituted(tmp_path, field):
    """E1/J4: the journal is read bound to the marker's stage and journal ids, not only its head."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    rewrite_json(stage.path("seal.json"), lambda value: value.update({field: "forged-9"}))
    if field == "stage_id":
        rewrite_json(stage.receipt_path("c0"), lambda value: value.update(stage_id="forged-9"))
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "journal_substituted")


def test_a_marker_of_another_attempt_is_stale(tmp_path):
    """E2: the seal marker names the attempt; one naming another attempt makes its stage stale."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    rewrite_json(stage.path("seal.json"), lambda value: value.update(attempt_id="run-41-1"))
    result = judge(plan, [stage.directory])
    assert result["cases"]["c0"] == (UNVERIFIED, "stale")
    assert result["report"].stages[0]["problem"] == "stale"


def test_a_fifo_journal_is_missing_not_read(tmp_path):
    """E1: the journal copy must be a regular file; a FIFO is never read as one."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    stage.path("journal").unlink()
    os.mkfifo(stage.path("journal"))
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "journal_missing")


def test_evidence_files_are_read_at_most_one_byte_past_their_cap(tmp_path, counted_reads):
    """E1: a huge receipt is refused after reading its cap plus one byte, never read whole."""
    from executor.evidence.receipts import RECEIPT_MAX_BYTES

    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    path = stage.receipt_path("c0")
    path.unlink()
    path.write_bytes(b" " * (4 << 20))
    others = sum(entry.stat().st_size for entry in stage.directory.iterdir() if entry != path)
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "malformed")
    assert sum(counted_reads) == others + RECEIPT_MAX_BYTES + 1


def test_a_journal_of_another_stage_is_substituted(tmp_path):
    """E1/J4: the journal must be the one the marker names."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    other = Stage(tmp_path / "other", plan, stage_id="stage-other")
    other.run("c0", Run())
    other.seal()
    os.unlink(directory / "journal")
    os.link(other.path("journal"), directory / "journal")
    assert judge(plan, [directory])["cases"]["c0"] == (UNVERIFIED, "journal_substituted")


@pytest.mark.parametrize("damage, reason", [("delete", "journal_missing"), ("flip", "journal_corrupt"), ("symlink", "journal_missing")])
def test_a_missing_or_corrupt_journal_is_unverified(tmp_path, damage, reason):
    """E1/J4: MISSING and CORRUPT journals authorize nothing; a symlinked journal is never followed."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    journal = stage.path("journal")
    if damage == "delete":
        journal.unlink()
    elif damage == "flip":
        data = bytearray(journal.read_bytes())
        data[60] ^= 0x01
        os.chmod(journal, 0o600)
        journal.write_bytes(bytes(data))
    else:
        moved = tmp_path / "elsewhere"
        os.rename(journal, moved)
        journal.symlink_to(moved)
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, reason)


def test_an_unsealed_journal_is_unverified(tmp_path):
    """E1: the journal must be sealed: its last record RETIRED."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal(retire=False)
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "journal_unsealed")


def test_cleanup_that_is_not_cleaned_is_unverified(tmp_path):
    """C4/E1: a stage whose last cleanup evidence is UNVERIFIED verifies nothing."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal(cleanup="UNVERIFIED")
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "cleanup_unverified")


@pytest.mark.parametrize(
    "damage, reason",
    [("delete", "seal_missing"), ("field", "seal_malformed"), ("spaces", "seal_malformed"), ("directory", "seal_malformed")],
)
def test_a_missing_or_malformed_seal_marker_is_unverified(tmp_path, damage, reason):
    """E1/D1: the seal marker is strict closed canonical JSON; without it nothing binds the journal's head."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    marker = stage.path("seal.json")
    if damage == "delete":
        marker.unlink()
    elif damage == "field":
        rewrite_json(marker, lambda value: value.update(sealed=True))
    elif damage == "spaces":
        value = json.loads(marker.read_bytes())
        os.chmod(marker, 0o644)
        marker.write_text(json.dumps(value))
    else:
        marker.unlink()
        marker.mkdir()
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, reason)


# --- E1: the receipt against the journal -------------------------------------------


def test_a_wait_status_that_disagrees_with_the_journal_is_unverified_never_pass(tmp_path):
    """E1: the receipt claims exit 0 but the journal's PROCESS_TERMINAL says exit 1: never PASS."""
    assert judge_single_run(tmp_path, "python-module", Run(), journal_wait=exited(1)) == (UNVERIFIED, "wait_status_mismatch")


@pytest.mark.parametrize("sandbox, expected", [("stage-1-4-net", (UNVERIFIED, "network_sandbox")), ("stage-1-4", (PASS, "passed"))])
def test_a_receipt_from_a_sandbox_that_had_the_index_network_is_unverified(tmp_path, sandbox, expected):
    """S9, E1: only the resolver and fetch of a network index get the index network (a sandbox named
    <stage>-<n>-net in the journal); a case's receipt whose op ran in one is never a PASS."""
    assert judge_single_run(tmp_path, "python-module", Run(), sandbox=sandbox) == expected


OTHER_FILTER = "ee" * 32
ANOTHER_SHIPPED_FILTER = "dd" * 32


@pytest.mark.parametrize("shipped", sorted(SHIPPED_FILTER_DIGESTS))
def test_a_receipt_of_each_shipped_filter_its_sandbox_proved_passes(tmp_path, shipped):
    """S12, E1: every digest this casebox ships (one per libseccomp build that exports other bytes from the
    rules) is accepted, when the receipt names the one its sandbox's SANDBOX_READY recorded."""
    assert judge_single_run(tmp_path, "python-module", Run(), receipt_filter=shipped, journal_filter=shipped) == (PASS, "passed")


@pytest.mark.parametrize("receipt_filter, journal_filter", [
    (None, SHIPPED_FILTER),                       # the receipt names no filter
    (OTHER_FILTER, OTHER_FILTER),                 # a filter this casebox does not ship, even if the journal agrees
    (SHIPPED_FILTER, None),                       # the sandbox's pid 1 never proved a filter (no SANDBOX_READY)
    (SHIPPED_FILTER, OTHER_FILTER),               # the sandbox proved another filter than the receipt names
    (SHIPPED_FILTER, ANOTHER_SHIPPED_FILTER),     # both shipped, but not the one its sandbox proved
    (ANOTHER_SHIPPED_FILTER, SHIPPED_FILTER),
])
def test_a_receipt_without_the_shipped_filter_proved_by_its_sandbox_is_unverified(tmp_path, monkeypatch, receipt_filter, journal_filter):
    """S12, E1: the evaluator refuses a receipt with no filter digest, with one this casebox does not ship, or
    with one its sandbox's SANDBOX_READY did not record: such an op cannot be shown to have run filtered. With
    several shipped digests (``ANOTHER_SHIPPED_FILTER`` stands for a second one), any shipped digest is not
    enough: it must be the one its own sandbox proved."""
    monkeypatch.setattr(evaluate_module, "SHIPPED_FILTER_DIGESTS", SHIPPED_FILTER_DIGESTS | {ANOTHER_SHIPPED_FILTER})
    result = judge_single_run(tmp_path, "python-module", Run(), receipt_filter=receipt_filter, journal_filter=journal_filter)
    assert result == (UNVERIFIED, "filter_mismatch")


def test_a_process_identity_the_journal_never_recorded_is_unverified(tmp_path):
    """E1: the receipt's (pid, starttime, pgid) must be its op's PROCESS_INTENT."""
    assert tampered_receipt(tmp_path, lambda value: value["process"].update(starttime=value["process"]["starttime"] + 1)) == (UNVERIFIED, "identity_mismatch")


@pytest.mark.parametrize(
    "journal, reason",
    [({"journal_role": "launcher"}, "identity_mismatch"), ({"journal_reaper": "steward"}, "wait_status_mismatch")],
)
def test_an_op_recorded_with_another_role_or_reaper_is_unverified(tmp_path, journal, reason):
    """E1/C2: an op counts only as journaled with the op role and reaped by its parent, the launcher
    (receipts.OP_ROLE and OP_REAPER, the one place both are named)."""
    assert judge_single_run(tmp_path, "python-module", Run(), **journal) == (UNVERIFIED, reason)


def test_a_descendant_count_that_disagrees_with_the_journal_is_unverified(tmp_path):
    """E1: the receipt's descendant count must be its op's DESCENDANTS_TERMINAL."""
    assert judge_single_run(tmp_path, "python-module", Run(), journal_descendants=3) == (UNVERIFIED, "descendants_mismatch")


def test_a_journal_head_from_before_the_op_ended_is_unverified(tmp_path):
    """E1: the receipt's head is the journal's head after its op's terminal records."""
    plan = simple_plan("python-module")
    stage = Stage(tmp_path / "evidence", plan)
    stage.writer.process_intent("op-early", "launcher", 4000, 1, 4000)
    early = stage.writer.head
    stage.run("c0", Run())
    stage.seal()
    rewrite_json(stage.receipt_path("c0"), lambda value: value.update(journal_head=early))
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "head_mismatch")


def test_a_journal_head_the_journal_never_had_is_unverified(tmp_path):
    """E1: a head that is no record's digest binds nothing."""
    assert tampered_receipt(tmp_path, lambda value: value.update(journal_head="f" * 64)) == (UNVERIFIED, "head_mismatch")


def test_two_receipts_claiming_one_op_are_unverified(tmp_path):
    """E1: one op is one case; a receipt copied onto another case's op does not count twice."""
    plan = simple_plan("python-module", "python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    first = json.loads(stage.receipt_path("c0").read_bytes())
    rewrite_json(stage.receipt_path("c1"), lambda value: value.update(process=first["process"], journal_head=first["journal_head"]))
    assert set(judge(plan, [stage.directory])["cases"].values()) == {(UNVERIFIED, "identity_mismatch")}


# --- E1: bindings ------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("plan_digest", "sha256:" + "0" * 64),
        ("bundle_sha256", "0" * 64),
        ("stage_id", "stage-9"),
        ("case_id", "c1"),
    ],
)
def test_a_receipt_bound_to_another_plan_bundle_stage_or_case_is_unverified(tmp_path, field, value):
    """E1: every binding is compared with the value from the plan, the command line or the stage's marker."""
    assert tampered_receipt(tmp_path, lambda receipt: receipt.update({field: value}), simple_plan("python-module", "python-module")) == (UNVERIFIED, "binding_mismatch")


def test_a_bundle_other_than_the_command_line_s_is_unverified(tmp_path):
    """E1: the expected bundle sha256 comes from the command line, never from a receipt."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    assert judge(plan, [directory], bundle_sha256="a" * 64)["cases"]["c0"] == (UNVERIFIED, "binding_mismatch")


def test_a_plan_other_than_the_one_given_is_unverified(tmp_path):
    """E1: the plan digest comes from the plan file given, never from a receipt."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    other = make_plan(case_doc("c0", "python-module", ("y",), 1000, True, 0))
    assert judge(other, [directory])["cases"]["c0"] == (UNVERIFIED, "binding_mismatch")


def test_receipts_disagreeing_on_the_inventories_are_unverified(tmp_path):
    """E1: one attempt has one candidate, one dependency bundle and one runtime across every shard."""
    plan = simple_plan("python-module", "python-module")
    first = Stage(tmp_path / "a", plan, stage_id="s-a")
    first.run("c0", Run())
    first.seal()
    second = Stage(tmp_path / "b", plan, stage_id="s-b", dependency_inventory_digest="sha256:" + "9" * 64)
    second.run("c1", Run())
    second.seal()
    result = judge(plan, [first.directory, second.directory])
    assert set(result["cases"].values()) == {(UNVERIFIED, "binding_mismatch")}
    assert result["report"].as_dict()["dependency_inventory_digest"] is None


def test_a_pytest_case_without_pytest_evidence_is_a_binding_mismatch(tmp_path):
    """E1: a receipt for a pytest case carries the junit evidence field; one made for another op does not fit."""
    assert judge_single_run(tmp_path, "pytest", Run()) == (UNVERIFIED, "binding_mismatch")


# --- strict parsing ------------------------------------------------------------------


def test_an_unknown_field_is_unverified_malformed(tmp_path):
    """D1/E1: a receipt with a field the schema does not know is refused: malformed."""
    assert tampered_receipt(tmp_path, lambda value: value.update(verdict="PASS")) == (UNVERIFIED, "malformed")


def test_a_bool_where_an_int_belongs_is_unverified_malformed(tmp_path):
    """D1/E1: `false` is not the integer 0, even where 0 would verify."""
    assert tampered_receipt(tmp_path, lambda value: value.update(wait_status=False)) == (UNVERIFIED, "malformed")


@pytest.mark.parametrize("damage", ["spaces", "symlink", "huge", "directory", "not-json"])
def test_unreadable_or_non_canonical_receipts_are_unverified_malformed(tmp_path, damage):
    """D1/D2/E1: a receipt is its one canonical encoding, a regular file within its cap, never a symlink."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    path = stage.receipt_path("c0")
    data = path.read_bytes()
    path.unlink()
    if damage == "spaces":
        path.write_text(json.dumps(json.loads(data), indent=1))
    elif damage == "symlink":
        (tmp_path / "real.json").write_bytes(data)
        path.symlink_to(tmp_path / "real.json")
    elif damage == "huge":
        path.write_bytes(data[:-1] + b"," + b'"x":"' + b"y" * 20_000 + b'"}')
    elif damage == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"PASS")
    assert judge(plan, [stage.directory])["cases"]["c0"] == (UNVERIFIED, "malformed")


def test_a_refused_receipt_never_puts_its_own_text_in_the_report(tmp_path):
    """E1: a refused receipt gives a fixed reason code; nothing from the receipt reaches the report."""
    plan = simple_plan("python-module")
    stage = one_stage(tmp_path, plan)
    stage.seal()
    rewrite_json(stage.receipt_path("c0"), lambda value: value.update(injected="\x1b[2J PASS everything"))
    report = judge(plan, [stage.directory])["report"]
    assert b"injected" not in report.canonical_bytes() and b"everything" not in report.canonical_bytes()
    assert set(REASONS) >= {r.reason for r in report.cases}


# --- the evidence directory layout ----------------------------------------------------


def test_a_stray_file_in_an_evidence_directory_makes_the_verdict_unverified(tmp_path):
    """E1: the layout is closed; a file that is neither journal, marker nor receipt is a problem."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    (directory / "notes.txt").write_text("trust me")
    result = judge(plan, [directory])
    assert result["cases"]["c0"] == (PASS, "passed")
    assert result["report"].problems == ("unexpected_file",)
    assert result["verdict"] == UNVERIFIED


def test_a_receipt_of_this_attempt_for_a_case_outside_the_plan_makes_the_verdict_unverified(tmp_path):
    """E2: an attempt ran exactly the plan; a receipt naming another case is a problem."""
    plan = simple_plan("python-module", "python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    smaller = simple_plan("python-module")
    result = judge(smaller, [directory])
    assert "unexpected_receipt" in result["report"].problems
    assert result["verdict"] == UNVERIFIED


def test_a_receipt_for_a_case_outside_the_plan_beside_passing_cases_never_lets_the_verdict_pass(tmp_path):
    """E2: every case the plan names passed, and a receipt of this attempt names one more (a copy of a passing
    one): the attempt did not run exactly the plan, so the problem alone keeps the verdict UNVERIFIED."""
    plan = simple_plan("python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    os.link(directory / f"{ATTEMPT}.c0.receipt.json", directory / f"{ATTEMPT}.c9.receipt.json")
    result = judge(plan, [directory])
    assert result["cases"] == {"c0": (PASS, "passed")}
    assert result["report"].problems == ("unexpected_receipt",)
    assert result["verdict"] == UNVERIFIED


def test_an_evidence_directory_with_too_many_entries_is_not_read(tmp_path, monkeypatch):
    """E1: the listing of an evidence directory is bounded."""
    from executor.evidence import evaluate as evaluator

    monkeypatch.setattr(evaluator, "MAX_EVIDENCE_ENTRIES", 3)
    plan = simple_plan("python-module", "python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    result = judge(plan, [directory])
    assert result["report"].problems == ("evidence_overflow",)
    assert set(result["cases"].values()) == {(UNVERIFIED, "missing")}


# --- S10, E5, E6: outcomes ------------------------------------------------------------


@pytest.mark.parametrize(
    "run, reason",
    [
        (Run("TIMEOUT", 9), "timeout"),
        (Run("MEMORY", 9), "memory"),
        (Run("PIDS", exited(1)), "pids"),
        (Run("OUTPUT", 9), "output"),
        (Run("DISK", exited(0)), "disk"),
        (Run("SIGNALLED", 11), "signalled"),
        (Run("NOT_STARTED", exited(127)), "not_started"),
    ],
)
def test_every_limit_class_is_unverified_with_its_reason(tmp_path, run, reason):
    """S10/E3: a resource-limited, timed-out, signalled or never-started op is never PASS, even with exit 0."""
    assert judge_single_run(tmp_path, "python-module", run) == (UNVERIFIED, reason)


def test_every_case_is_reported_after_earlier_failures(tmp_path):
    """E6: no fail-fast in the fold: a timeout and a failure do not hide the cases after them."""
    plan = simple_plan("python-module", "python-module", "python-module")
    runs = {"c0": Run("TIMEOUT", 9), "c1": Run("EXIT_NONZERO", exited(3)), "c2": Run()}
    result = judge(plan, build_attempt(tmp_path, plan, runs))
    assert result["cases"] == {"c0": (UNVERIFIED, "timeout"), "c1": (FAIL, "exit_mismatch"), "c2": (PASS, "passed")}


@pytest.mark.parametrize(
    "run, reason",
    [
        (Run(pytest=junit(0)), "vacuous"),
        (Run(pytest=junit(4, skipped=4)), "vacuous"),
        (Run("EXIT_NONZERO", exited(2), junit(1, errors=1, collection_errors=1)), "vacuous"),
        (Run(pytest=junit(2, collection_errors=1, errors=1)), "vacuous"),
        (Run("EXIT_NONZERO", exited(5), junit(0)), "vacuous"),
        (Run(pytest=PytestEvidence("missing", None)), "junit_missing"),
        (Run(pytest=PytestEvidence("refused", None)), "junit_refused"),
        (Run(pytest=junit(2, failures=1)), "junit_contradicts"),
        (Run("EXIT_NONZERO", exited(1), junit(2)), "junit_contradicts"),
        (Run("EXIT_NONZERO", exited(3), junit(2, errors=1)), "pytest_incomplete"),
    ],
)
def test_a_pytest_case_needs_positive_evidence(tmp_path, run, reason):
    """E5: a pytest case that ran no test, skipped all, failed to collect or left no report is UNVERIFIED, never PASS."""
    assert judge_single_run(tmp_path, "pytest", run) == (UNVERIFIED, reason)


def _receipt(limit: str, wait_status: int, counts: JunitCounts | None, report: str = "read") -> Receipt:
    binding = Binding(ATTEMPT, 1, "sha256:" + "0" * 64, "sha256:" + "0" * 64, BUNDLE, "sha256:" + "0" * 64, "sha256:" + "0" * 64, "cpython 3.11.2", None, "s")
    outcome = Outcome(limit, wait_status, 0, None, None)
    return Receipt(binding, "c0", None, outcome, PytestEvidence(report, counts), "0" * 64)


counts_strategy = st.builds(
    JunitCounts,
    tests=st.integers(0, 6),
    skipped=st.integers(0, 6),
    failures=st.integers(0, 6),
    errors=st.integers(0, 6),
    collection_errors=st.integers(0, 2),
)


@given(exit_code=st.integers(0, 255), expect_exit=st.integers(0, 255), counts=counts_strategy, report=st.sampled_from(["read", "missing", "refused"]))
def test_junit_counts_only_ever_downgrade(exit_code, expect_exit, counts, report):
    """E5: whatever the candidate writes in its report, a FAIL never becomes a PASS, and counts never upgrade."""
    limit = "OK" if exit_code == 0 else "EXIT_NONZERO"
    case = make_plan(case_doc("c0", "pytest", (), 1000, True, expect_exit)).cases[0]
    receipt = _receipt(limit, exited(exit_code), counts if report == "read" else None, report)
    status, _ = outcome_status(case, receipt)
    base = PASS if exit_code == expect_exit else FAIL
    assert status in (base, UNVERIFIED)
    if base == FAIL:
        assert status != PASS


LIMITED = [limit for limit in LIMIT_CLASSES if limit not in ENDED_BY_ITSELF]


@given(limit=st.sampled_from(LIMITED), counts=counts_strategy, expect_exit=st.sampled_from([0, 1, 9]))
def test_a_limited_op_is_never_pass_whatever_its_counts(limit, counts, expect_exit):
    """S10/E3/S14: every class but those of an op that ended by itself is UNVERIFIED, whatever exit, expected
    exit or counts come with it: no limit turns into a PASS or a FAIL."""
    case = make_plan(case_doc("c0", "pytest", (), 1000, True, expect_exit)).cases[0]
    assert outcome_status(case, _receipt(limit, 0 if limit != "SIGNALLED" else 9, counts))[0] == UNVERIFIED


def test_every_limited_class_has_its_documented_reason():
    """S10, E3: a limited op's reason is its class's name, and every such reason is one the report documents;
    a class added to launcher/vocabulary.py without its reason is caught here, not in a report."""
    assert LIMITED and "OK" not in LIMITED and "EXIT_NONZERO" not in LIMITED
    case = make_plan(case_doc("c0", "python-module", (), 1000, True, 0)).cases[0]
    for limit in LIMITED:
        if limit != NOT_STARTED:
            assert outcome_status(case, _receipt(limit, 0, None)) == (UNVERIFIED, limit.lower())
            assert limit.lower() in REASONS


# --- E4: the report ------------------------------------------------------------------


def test_the_report_is_created_once_and_never_overwritten(tmp_path):
    """E4: a second evaluation of the same attempt leaves the first report byte-identical."""
    plan = simple_plan("python-module", "python-module")
    directory = build_attempt(tmp_path, plan, passing_runs(plan))[0]
    reports = tmp_path / "reports"
    reports.mkdir()
    expected = Expected(plan, ATTEMPT, BUNDLE)
    path = publish_report(str(reports), evaluate(expected, [str(directory)]))
    first = pathlib.Path(path).read_bytes()
    assert json.loads(first)["verdict"] == PASS
    publish_report(str(reports), evaluate(expected, [str(directory)]))
    os.chmod(directory, 0o755)
    (directory / f"{ATTEMPT}.c1.receipt.json").unlink()
    with pytest.raises(Refused) as caught:
        publish_report(str(reports), evaluate(expected, [str(directory)]))
    assert pathlib.Path(path).read_bytes() == first
    assert os.listdir(reports) == [f"report-{ATTEMPT}.json"]
    # Issue 13: the refusal does not hide the answer: it says how the two differ and what this one's verdict is.
    sentence = caught.value.sentence()
    assert sentence.startswith(f"{path}: already holds another evaluation of attempt {ATTEMPT}")
    assert "it differs in cases, verdict; its verdict is PASS" in sentence
    assert "this evaluation's verdict is UNVERIFIED and was not written" in sentence


def test_the_report_does_not_depend_on_the_order_of_the_directories(tmp_path, demo_plan):
    """E4: the report is a function of the evidence, so a rerun with shards listed in another order is identical."""
    directories = [str(path) for path in build_attempt(tmp_path, demo_plan, DESIGNED_RUNS, shards=3)]
    expected = Expected(demo_plan, ATTEMPT, BUNDLE)
    assert evaluate(expected, directories).canonical_bytes() == evaluate(expected, directories[::-1]).canonical_bytes()


def test_every_reason_and_problem_is_documented(repo):
    """Docs move with code: docs/receipts.md lists every reason code and problem."""
    text = (repo / "docs" / "receipts.md").read_text()
    for code in list(REASONS) + list(PROBLEMS):
        assert f"`{code}`" in text, code


# --- the command -------------------------------------------------------------------


def test_evaluate_prints_the_table_and_exits_with_the_verdict(tmp_path, capsys, demo_plan):
    """E3: exit 3 for UNVERIFIED; the table has every case, status, reason and time; the report is written."""
    directories = build_attempt(tmp_path, demo_plan, DESIGNED_RUNS, shards=2)
    args = ["evaluate", "--plan", str(REPO / "examples/plan.json"), "--attempt", ATTEMPT, "--bundle-sha256", BUNDLE]
    args += ["--report-dir", str(tmp_path), "--evidence", *map(str, directories)]
    code, out, err = run_cli(capsys, *args)
    assert (code, err) == (3, "")
    lines = out.splitlines()
    assert lines[0].split() == ["case", "status", "reason", "time"]
    for case_id, (status, reason) in DESIGNED_STATUS.items():
        assert any(line.split()[:3] == [case_id, status, reason] for line in lines), case_id
    assert lines[-1] == f"verdict: UNVERIFIED (report: {tmp_path}/report-{ATTEMPT}.json)"
    code, out, _ = run_cli(capsys, *args, "--json")
    assert code == 3
    assert out.encode() == (tmp_path / f"report-{ATTEMPT}.json").read_bytes() + b"\n"


def test_a_second_evaluate_with_other_evidence_is_refused_and_the_report_kept(tmp_path, casebox, repo):
    """E4/F1 from outside: a differing second report is refused (exit 64, nothing on stdout), the first kept."""
    plan = plan_from_bytes((REPO / "examples/plan.json").read_bytes())
    directory = build_attempt(tmp_path, plan, DESIGNED_RUNS)[0]
    args = ["evaluate", "--plan", str(REPO / "examples/plan.json"), "--attempt", ATTEMPT, "--bundle-sha256", BUNDLE,
            "--report-dir", str(tmp_path), "--evidence", str(directory)]
    assert casebox(*args).returncode == 3
    report = tmp_path / f"report-{ATTEMPT}.json"
    first = report.read_bytes()
    assert casebox(*args).returncode == 3
    os.chmod(directory, 0o755)
    (directory / f"{ATTEMPT}.pass.receipt.json").unlink()
    casebox.refused(*args, naming=str(report))
    assert report.read_bytes() == first


@pytest.mark.parametrize("verdict_runs, code", [("pass", 0), ("fail", 1)])
def test_evaluate_exits_0_for_pass_and_1_for_fail(tmp_path, capsys, verdict_runs, code):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"schema": "casebox.plan.v1", "cases": [
        {"id": "c0", "op": "python-module", "args": ["x"], "timeout_ms": 1000, "applicable": True, "expect_exit": 0}]}))
    plan = plan_from_bytes(plan_path.read_bytes())
    run = Run() if verdict_runs == "pass" else Run("EXIT_NONZERO", exited(2))
    directory = build_attempt(tmp_path, plan, {"c0": run})[0]
    result = run_cli(capsys, "evaluate", "--plan", str(plan_path), "--attempt", ATTEMPT, "--bundle-sha256", BUNDLE,
                     "--report-dir", str(tmp_path), "--evidence", str(directory))
    assert result[0] == code


@pytest.mark.parametrize(
    "change, naming",
    [
        ({"--attempt": "bad id!"}, "--attempt"),
        ({"--bundle-sha256": "XYZ"}, "--bundle-sha256"),
        ({"--evidence": "/nonexistent/evidence"}, "/nonexistent/evidence"),
        ({"--report-dir": "/nonexistent/reports"}, "/nonexistent/reports"),
        ({"--attempt-number": "0"}, "--attempt-number"),
    ],
)
def test_evaluate_refuses_bad_command_line_input(tmp_path, casebox, change, naming):
    """F1: a bad attempt id, digest or directory is refused: exit 64, one sentence naming it, nothing written."""
    plan = plan_from_bytes((REPO / "examples/plan.json").read_bytes())
    directory = build_attempt(tmp_path, plan, DESIGNED_RUNS)[0]
    options = {"--plan": str(REPO / "examples/plan.json"), "--attempt": ATTEMPT, "--bundle-sha256": BUNDLE,
               "--report-dir": str(tmp_path), "--evidence": str(directory)}
    options.update(change)
    args = [item for pair in options.items() for item in pair]
    casebox.refused("evaluate", *args, naming=naming)
    assert not (tmp_path / f"report-{ATTEMPT}.json").exists()


# --- published output (docs/receipts.md, "Published output") ---------------------------------------------


def _published_stage(tmp_path, plan: Plan | None = None, runs: dict[str, Run] | None = None) -> Stage:
    plan = plan or simple_plan("pytest", "python-module")
    stage = one_stage(tmp_path, plan, runs or {"c0": Run("EXIT_NONZERO", exited(1), junit(2, failures=1)), "c1": Run(stdout=b"hi\n")})
    stage.seal()
    os.chmod(stage.directory, 0o755)
    return stage


def _judge_published(stage: Stage, plan: Plan | None = None) -> dict:
    return judge(plan or simple_plan("pytest", "python-module"), [stage.directory])


def test_every_published_file_is_bound_and_the_fail_shows_its_failing_tests(tmp_path):
    """Issue 13: the evidence holds each case's stdout, stderr and junit; the FAIL shows what failed."""
    stage = _published_stage(tmp_path)
    names = sorted(os.listdir(stage.directory))
    assert f"{ATTEMPT}.c0.junit.xml" in names and f"{ATTEMPT}.c0.stdout" in names and f"{ATTEMPT}.c1.stderr" in names
    assert f"{ATTEMPT}.c1.junit.xml" not in names
    result = _judge_published(stage)
    assert result["cases"] == {"c0": (FAIL, "exit_mismatch"), "c1": (PASS, "passed")}
    detail = result["report"].cases[0].detail
    assert [(test.test, test.message) for test in detail.failing] == [("tests.test_x::test_0", "assert 0 == 1")]
    assert detail.sentence == "exit code 1, expected 0" and result["report"].cases[1].detail is None


@pytest.mark.parametrize("tamper", ["missing", "changed", "symlink", "extra", "fifo"])
def test_published_output_that_is_not_what_the_receipt_binds_is_unverified(tmp_path, tamper):
    """E1, issue 13: a bound file missing, changed, a symlink or not regular, or a file the receipt does not
    bind, makes the case UNVERIFIED (output_mismatch); the other case is untouched."""
    stage = _published_stage(tmp_path)
    target = stage.path(f"{ATTEMPT}.c1.stdout")
    if tamper == "missing":
        target.unlink()
    elif tamper == "changed":
        os.chmod(target, 0o644)
        target.write_bytes(b"HI\n")
    elif tamper == "symlink":
        target.unlink()
        target.symlink_to(stage.path(f"{ATTEMPT}.c1.stderr"))
    elif tamper == "fifo":
        target.unlink()
        os.mkfifo(target)
    else:
        stage.path(f"{ATTEMPT}.c1.junit.xml").write_bytes(b"<testsuites/>")
    result = _judge_published(stage)
    assert result["cases"] == {"c0": (FAIL, "exit_mismatch"), "c1": (UNVERIFIED, "output_mismatch")}


def test_published_output_of_another_case_or_attempt(tmp_path):
    """E2: an output of another attempt is ignored like its receipt; one for a case outside the plan is a
    stray file (unexpected_file)."""
    stage = _published_stage(tmp_path)
    stage.path("other-attempt.c1.stdout").write_bytes(b"stale")
    assert _judge_published(stage)["report"].problems == ()
    stage.path(f"{ATTEMPT}.c9.stdout").write_bytes(b"who?")
    result = _judge_published(stage)
    assert result["report"].problems == ("unexpected_file",) and result["cases"]["c1"] == (PASS, "passed")


def test_the_published_report_only_ever_downgrades(tmp_path, monkeypatch):
    """E5: counts recomputed from the published junit that say vacuous turn a PASS into UNVERIFIED; counts that
    would pass never turn a FAIL into a PASS."""
    from executor.evidence import published
    from executor.evidence.junit import JunitCounts, READ

    plan = simple_plan("pytest", "pytest")
    stage = _published_stage(tmp_path, plan, {"c0": Run(pytest=junit(2)), "c1": Run("EXIT_NONZERO", exited(1), junit(2, failures=1))})
    assert _judge_published(stage, plan)["cases"] == {"c0": (PASS, "passed"), "c1": (FAIL, "exit_mismatch")}
    monkeypatch.setattr(published, "evidence_from_bytes", lambda data, cap: PytestEvidence(READ, JunitCounts(2, 2, 0, 0, 0), len(data), cap))
    assert _judge_published(stage, plan)["cases"] == {"c0": (UNVERIFIED, "vacuous"), "c1": (UNVERIFIED, "vacuous")}
    monkeypatch.setattr(published, "evidence_from_bytes", lambda data, cap: PytestEvidence(READ, JunitCounts(2, 0, 0, 0, 0), len(data), cap))
    assert _judge_published(stage, plan)["cases"] == {"c0": (PASS, "passed"), "c1": (UNVERIFIED, "junit_contradicts")}
    vacuous = _published_stage(tmp_path / "vacuous", plan, {"c0": Run(pytest=junit(0)), "c1": Run(pytest=junit(3, skipped=3))})
    assert _judge_published(vacuous, plan)["cases"] == {"c0": (UNVERIFIED, "vacuous"), "c1": (UNVERIFIED, "vacuous")}, \
        "a report that would pass never lifts a vacuous receipt"


def test_a_refused_junit_report_names_its_size_and_cap(tmp_path):
    """Issue 13: junit_refused says which cap was hit and by how much; a malformed report within its cap says why."""
    plan = simple_plan("pytest", "pytest")
    big = PytestEvidence("refused", None, 2_000_000, 1_048_576)
    bad = b"<testsuites><testsuite>"
    stage = _published_stage(tmp_path, plan, {"c0": Run(pytest=big), "c1": Run(pytest=PytestEvidence("refused", None, len(bad)), report=bad)})
    report = _judge_published(stage, plan)["report"]
    assert [(case.reason, case.detail.sentence) for case in report.cases] == [
        ("junit_refused", "the junit report is 2000000 bytes, over its 1048576-byte cap"),
        ("junit_refused", f"the junit report ({len(bad)} bytes, cap 1048576) is not well-formed XML (no element found)"),
    ]


def test_a_junit_missing_case_shows_the_last_line_of_stderr(tmp_path):
    """Issue 13: 24 x junit_missing said nothing; the last stderr line says a test dependency was missing."""
    plan = simple_plan("pytest")
    stderr = b"Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'hypothesis'\n"
    stage = _published_stage(tmp_path, plan, {"c0": Run("EXIT_NONZERO", exited(4), PytestEvidence("missing", None), stderr=stderr)})
    (case,) = _judge_published(stage, plan)["report"].cases
    assert (case.status, case.reason) == (UNVERIFIED, "junit_missing")
    assert case.detail.output_tail == "ModuleNotFoundError: No module named 'hypothesis'"


def test_a_full_stage_s_evidence_fits_the_directory_and_the_steward_s_bounds():
    """E1, E4: the most cases one stage's journal holds, each with a receipt and three published files, plus the
    journal and the seal marker, stay within the evaluator's and the steward's evidence counts."""
    from executor.evidence.evaluate import MAX_EVIDENCE_ENTRIES
    from executor.evidence.receipts import OUTPUTS
    from executor.attempt import cases_per_stage
    from steward import api

    most = cases_per_stage("/s", "/usr/bin/python3")
    assert most * (1 + len(OUTPUTS)) <= api.MAX_EVIDENCE_FILES
    assert 2 + most * (1 + len(OUTPUTS)) <= MAX_EVIDENCE_ENTRIES
