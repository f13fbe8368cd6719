"""Receipts and seal markers (executor/evidence/receipts.py, journal/seal.py, docs/receipts.md): closed canonical JSON, create-once."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re

import pytest

from executor.evidence.junit import JunitCounts, PytestEvidence
from executor.evidence.receipts import (
    OUTPUT_EDGE_BYTES,
    SHIPPED_FILTER_DIGESTS,
    Binding,
    Bound,
    CaseOutput,
    ProcessIdentity,
    Receipt,
    Stream,
    build_receipt,
    kept_output,
    name_parts,
    never_started,
    output_name,
    output_name_parts,
    outcome_from_launcher,
    receipt_from_bytes,
    receipt_name,
)
from journal.createonly import EvidenceConflict, publish_once
from journal.errors import Refused
from journal.seal import SealMarker, seal_from_bytes
from journal.strictjson import canonical
from steward.starter import OpNotStarted, OpResult

BINDING = Binding(
    attempt_id="run-42-1",
    attempt_number=1,
    plan_digest="sha256:" + "1" * 64,
    candidate_digest="sha256:" + "2" * 64,
    bundle_sha256="3" * 64,
    dependency_inventory_digest="sha256:" + "4" * 64,
    runtime_inventory_digest="sha256:" + "5" * 64,
    runtime_version="cpython 3.11.2",
    runner_inventory_digest="sha256:" + "6" * 64,
    stage_id="stage-1",
    phases=(("extract", "stage-1-1"), ("resolve", "stage-1-2"), ("fetch", "stage-1-3"), ("install", "stage-1-4")),
)
PROCESS = ProcessIdentity("op-3", 4242, 987654, 4242)
HEAD = "a" * 64
SHIPPED_FILTER = min(SHIPPED_FILTER_DIGESTS)


def ran(limit="OK", wait_status=0, **fields) -> OpResult:
    values = dict(descendants_reaped=2, wall_ms=1500, cpu_ms=700, max_rss_kib=30_000, memory_peak_bytes=40_960_000, stdout=b"hello\n", stderr=b"",
                  stdout_truncated=False, stderr_truncated=False)
    values.update(fields)
    return OpResult(limit, wait_status, **values)


REPORT = b'<testsuites><testsuite><testcase name="a"/><testcase name="b"/><testcase name="c"><skipped/></testcase></testsuite></testsuites>'


def built(case_id: str, observation, pytest=None, head: str = HEAD, binding: Binding = BINDING, junit: bytes | None = None,
          filter_digest: str | None = SHIPPED_FILTER) -> Receipt:
    """A receipt as the case service builds it: an op that ran binds its published output and its filter."""
    output = CaseOutput.of(observation, junit) if isinstance(observation, OpResult) else None
    return build_receipt(binding, case_id, PROCESS, outcome_from_launcher(observation), pytest, head, output, filter_digest)


def pytest_receipt(**changes) -> Receipt:
    evidence = PytestEvidence("read", JunitCounts(3, 1, 0, 0, 0), len(REPORT))
    receipt = built("pass", ran(), evidence, junit=REPORT)
    return dataclasses.replace(receipt, **changes)


def valid_value() -> dict:
    return json.loads(pytest_receipt().canonical_bytes())


def test_a_receipt_round_trips_through_its_canonical_bytes():
    """D2: a built receipt reads back equal, from exactly its canonical encoding."""
    receipt = pytest_receipt()
    data = receipt.canonical_bytes()
    assert data == canonical(json.loads(data))
    assert receipt_from_bytes(data) == receipt


def test_the_documented_example_receipt_parses(repo):
    """docs/receipts.md's example is a valid receipt, hand-written bytes and all."""
    text = (repo / "docs" / "receipts.md").read_text()
    example = re.search(r"<!-- example receipt -->\n```json\n(.*?)\n```", text, re.S).group(1)
    receipt = receipt_from_bytes(canonical(json.loads(example)))
    assert receipt.case_id == "pass" and receipt.exit_code == 0


def test_the_launcher_s_observation_maps_to_the_receipt_fields():
    """S10: the limit class, raw wait status, times, RSS, output digests and truncation come from the observation."""
    outcome = outcome_from_launcher(ran("OUTPUT", 9, stdout=b"x" * 10, stdout_truncated=True))
    assert (outcome.limit, outcome.wait_status, outcome.descendants_reaped) == ("OUTPUT", 9, 2)
    assert outcome.observed.stdout.bytes == 10 and outcome.observed.stdout.truncated
    assert outcome.observed.stdout.sha256 == hashlib.sha256(b"x" * 10).hexdigest()
    assert outcome.observed.stderr == Stream(hashlib.sha256(b"").hexdigest(), 0, False)
    assert (outcome.observed.wall_ms, outcome.observed.cpu_ms, outcome.observed.max_rss_kib) == (1500, 700, 30_000)
    assert outcome.observed.memory_peak_bytes == 40_960_000
    assert outcome.not_started is None


@pytest.mark.parametrize("peak", [0, 40_960_000, None])
def test_the_memory_peak_round_trips_and_null_is_a_kernel_without_one(peak):
    """S14 / issue 12: the ops cgroup's memory high-water mark lands in observed.memory_peak_bytes and reads back
    from the canonical bytes; null (a v2 kernel before 5.19 keeps no memory.peak) is kept as null, never 0."""
    receipt = built("pass", ran(memory_peak_bytes=peak))
    data = receipt.canonical_bytes()
    assert json.loads(data)["observed"]["memory_peak_bytes"] == peak
    assert receipt_from_bytes(data).outcome.observed.memory_peak_bytes == peak
    assert receipt_from_bytes(data) == receipt


def test_an_op_that_failed_before_exec_has_no_exit_code():
    """C1: a not-started op keeps its raw wait status and process identity, but has no exit code and no measurements."""
    receipt = built("c", OpNotStarted("exec", 2, 127 << 8, 0))
    assert receipt.published is None
    assert receipt.outcome.limit == "NOT_STARTED" and receipt.outcome.wait_status == 127 << 8
    assert receipt.exit_code is None
    assert receipt_from_bytes(receipt.canonical_bytes()) == receipt


def test_not_started_is_closed_too():
    """D1: the not_started object refuses fields it does not know."""
    receipt = built("c", OpNotStarted("exec", 2, 127 << 8, 0))
    value = json.loads(receipt.canonical_bytes())
    value["not_started"]["message"] = "exec failed"
    with pytest.raises(Refused) as caught:
        receipt_from_bytes(canonical(value))
    assert caught.value.where == "$.not_started.message"


def test_a_case_whose_op_never_had_a_process_has_null_identity_and_status():
    """C1: no wait status is synthesized: never started means null process and null status."""
    receipt = build_receipt(BINDING, "c", None, never_started("install"), None, HEAD)
    value = json.loads(receipt.canonical_bytes())
    assert (value["process"], value["wait_status"], value["descendants_reaped"]) == (None, None, None)
    assert value["not_started"] == {"step": "install", "errno": 0}


@pytest.mark.parametrize("status, code", [(0, 0), (1 << 8, 1), (255 << 8, 255), (9, None), (0x8B, None)])
def test_the_exit_code_is_derived_from_the_raw_wait_status(status, code):
    limit = "OK" if status == 0 else ("EXIT_NONZERO" if status & 0x7F == 0 else "SIGNALLED")
    receipt = built("c", ran(limit, status))
    assert receipt.exit_code == code


def _set(path, value):
    def change(receipt):
        target = receipt
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _delete(path):
    def change(receipt):
        target = receipt
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


REFUSALS = [
    ("unknown top-level field", _set(["verdict"], "PASS"), "$.verdict"),
    ("unknown nested field", _set(["process", "uid"], 0), "$.process.uid"),
    ("unknown field in counts", _set(["pytest", "counts", "passed"], 1), "$.pytest.counts.passed"),
    ("unknown field in pytest", _set(["pytest", "xml"], "<x/>"), "$.pytest.xml"),
    ("unknown field in a stream", _set(["observed", "stdout", "text"], "hi"), "$.observed.stdout.text"),
    ("unknown field in observed", _set(["observed", "exit_code"], 0), "$.observed.exit_code"),
    ("missing field", _delete(["journal_head"]), "$.journal_head"),
    ("missing nested field", _delete(["observed", "stdout", "truncated"]), "$.observed.stdout.truncated"),
    ("bool for attempt_number", _set(["attempt_number"], True), "$.attempt_number"),
    ("bool for pid", _set(["process", "pid"], True), "$.process.pid"),
    ("bool for wait_status", _set(["wait_status"], False), "$.wait_status"),
    ("bool for a count", _set(["pytest", "counts", "tests"], True), "$.pytest.counts.tests"),
    ("string for an int", _set(["observed", "wall_ms"], "1500"), "$.observed.wall_ms"),
    ("int for a bool", _set(["observed", "stderr", "truncated"], 0), "$.observed.stderr.truncated"),
    ("schema", _set(["schema"], "casebox.receipt.v1"), "$.schema"),
    ("schema v2 (before memory_peak_bytes)", _set(["schema"], "casebox.receipt.v2"), "$.schema"),
    ("missing memory peak (issue 12)", _delete(["observed", "memory_peak_bytes"]), "$.observed.memory_peak_bytes"),
    ("negative memory peak (issue 12)", _set(["observed", "memory_peak_bytes"], -1), "$.observed.memory_peak_bytes"),
    ("string for the memory peak (issue 12)", _set(["observed", "memory_peak_bytes"], "67108864"), "$.observed.memory_peak_bytes"),
    ("bool for the memory peak (issue 12)", _set(["observed", "memory_peak_bytes"], True), "$.observed.memory_peak_bytes"),
    ("casebox version", _set(["casebox_version"], "1 2"), "$.casebox_version"),
    ("missing casebox version", _delete(["casebox_version"]), "$.casebox_version"),
    ("unknown phase", _set(["phases", 0, "phase"], "case"), "$.phases[0].phase"),
    ("unknown field in a phase", _set(["phases", 0, "pid"], 1), "$.phases[0].pid"),
    ("phase sandbox not an id", _set(["phases", 0, "sandbox"], "../x"), "$.phases[0].sandbox"),
    ("report size over its cap when read", _set(["pytest", "bytes"], 2 << 20), "$.pytest.bytes"),
    ("report size for a missing report", _set(["pytest"], {"report": "missing", "counts": None, "bytes": 10, "cap": 100}), "$.pytest.bytes"),
    ("unknown field in published", _set(["published", "stdin"], None), "$.published.stdin"),
    ("published stdout of another size", _set(["published", "stdout", "bytes"], 5), "$.published.stdout"),
    ("published stdout of another digest", _set(["published", "stdout", "sha256"], "0" * 64), "$.published.stdout"),
    ("published junit of another size", _set(["published", "junit", "bytes"], 3), "$.published.junit"),
    ("published without an op that ran", _set(["observed"], None), "$.observed"),
    ("no published output for an op that ran", _set(["published"], None), "$.published"),
    ("published output over its cap", _set(["published", "stderr", "bytes"], 2 * OUTPUT_EDGE_BYTES + 1), "$.published.stderr.bytes"),
    ("missing filter digest", _delete(["filter_digest"]), "$.filter_digest"),
    ("filter digest format", _set(["filter_digest"], "A" * 64), "$.filter_digest"),
    ("plan digest format", _set(["plan_digest"], "1" * 64), "$.plan_digest"),
    ("bundle sha256 format", _set(["bundle_sha256"], "sha256:" + "3" * 64), "$.bundle_sha256"),
    ("uppercase head", _set(["journal_head"], "A" * 64), "$.journal_head"),
    ("case id", _set(["case_id"], "Pass"), "$.case_id"),
    ("limit class", _set(["limit"], "PASS"), "$.limit"),
    ("OK with a nonzero status", _set(["wait_status"], 1 << 8), "$.limit"),
    ("stopped status", _set(["wait_status"], 0x137F), "$.wait_status"),
    ("status out of range", _set(["wait_status"], 0x10000), "$.wait_status"),
    ("process without status", _set(["wait_status"], None), "$.process"),
    ("observed null for a run op", _set(["observed"], None), "$.observed"),
    ("not_started for a run op", _set(["not_started"], {"step": "exec", "errno": 2}), "$.not_started"),
    ("counts without a read report", _set(["pytest", "report"], "missing"), "$.pytest.counts"),
    ("unknown report state", _set(["pytest", "report"], "forged"), "$.pytest.report"),
    ("skipped over tests", _set(["pytest", "counts", "skipped"], 9), "$.pytest.counts.skipped"),
    ("collection errors over errors", _set(["pytest", "counts", "collection_errors"], 1), "$.pytest.counts.collection_errors"),
    ("negative time", _set(["observed", "cpu_ms"], -1), "$.observed.cpu_ms"),
    ("pid zero", _set(["process", "pid"], 0), "$.process.pid"),
]


@pytest.mark.parametrize("label, change, path", REFUSALS, ids=[refusal[0] for refusal in REFUSALS])
def test_the_strict_parser_refuses_naming_the_field(label, change, path):
    """D1/E1: every receipt field is closed and exactly typed; the refusal names the JSON path."""
    value = copy.deepcopy(valid_value())
    change(value)
    with pytest.raises(Refused) as caught:
        receipt_from_bytes(canonical(value))
    assert caught.value.where == path, caught.value.sentence()


@pytest.mark.parametrize(
    "data",
    [
        lambda v: json.dumps(v).encode(),
        lambda v: canonical(v) + b"\n",
        lambda v: canonical(v).replace(b'"run-42-1"', b'"\\u0072un-42-1"'),
        lambda v: canonical(v).replace(b'"wall_ms":1500', b'"wall_ms":1500.0'),
        lambda v: b"\xef\xbb\xbf" + canonical(v),
    ],
    ids=["whitespace", "trailing newline", "escaped letter", "float", "bom"],
)
def test_only_the_one_canonical_encoding_is_a_receipt(data):
    """D2: a receipt has one encoding; any other spelling of the same value is refused."""
    with pytest.raises(Refused):
        receipt_from_bytes(data(valid_value()))


def test_the_filter_digest_is_bound_exactly_when_the_case_had_a_process():
    """S12: a receipt of an op names the syscall filter it ran under (the evaluator judges a null one); a case
    that never had a process names none, and one that claims a filter anyway is refused."""
    assert receipt_from_bytes(built("c", ran()).canonical_bytes()).filter_digest == SHIPPED_FILTER
    assert receipt_from_bytes(built("c", ran(), filter_digest=None).canonical_bytes()).filter_digest is None
    with pytest.raises(Refused, match=r"\$\.filter_digest: is null when the case had no process"):
        build_receipt(BINDING, "c", None, never_started("install"), None, HEAD, None, SHIPPED_FILTER)
    with pytest.raises(Refused, match=r"\$\.filter_digest: must be null or 64 lowercase hex digits"):
        built("c", ran(), filter_digest=SHIPPED_FILTER.upper())


def test_the_builder_refuses_what_the_parser_refuses():
    """D1/D2: the writer never writes a receipt the reader would refuse."""
    with pytest.raises(Refused):
        built("pass", ran(), head="not hex")
    with pytest.raises(Refused):
        built("pass", ran("OK", 1 << 8))
    with pytest.raises(Refused):
        built("pass", ran(), binding=dataclasses.replace(BINDING, plan_digest="md5:x"))
    with pytest.raises(Refused, match="published"):
        build_receipt(BINDING, "pass", PROCESS, outcome_from_launcher(ran()), None, HEAD)


def test_receipts_are_published_create_once(tmp_path):
    """E4: a receipt is created once; an identical retry is accepted, different bytes are refused and the first kept."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        receipt = pytest_receipt()
        assert publish_once(fd, receipt.name, receipt.canonical_bytes()) is True
        assert publish_once(fd, receipt.name, receipt.canonical_bytes()) is False
        other = dataclasses.replace(receipt, journal_head="b" * 64)
        with pytest.raises(EvidenceConflict):
            publish_once(fd, other.name, other.canonical_bytes())
    finally:
        os.close(fd)
    path = tmp_path / "run-42-1.pass.receipt.json"
    assert path.read_bytes() == receipt.canonical_bytes()
    assert os.stat(path).st_mode & 0o777 == 0o444
    assert os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("attempt, case", [("run-42-1", "pass"), ("v1.2.3", "a_b-c"), ("A", "0")])
def test_receipt_names_split_back_into_attempt_and_case(attempt, case):
    """E4: receipts are named by attempt and case; a case id has no dot, so the split is exact."""
    assert name_parts(receipt_name(attempt, case)) == (attempt, case)


@pytest.mark.parametrize("name", ["journal", "seal.json", "pass.receipt.json", ".x.receipt.json", "a.B.receipt.json", "a.b.receipt.json~"])
def test_other_names_are_not_receipts(name):
    assert name_parts(name) is None


@pytest.mark.parametrize("kind", ["stdout", "stderr", "junit"])
def test_published_output_names_split_back_into_attempt_case_and_kind(kind):
    """E4: a published output is named by attempt, case and kind, like the receipt it sits beside."""
    assert output_name_parts(output_name("v1.2.3", "a_b-c", kind)) == ("v1.2.3", "a_b-c", kind)
    assert output_name_parts(receipt_name("v1.2.3", "a_b-c")) is None
    assert output_name_parts("a.B.stdout") is None and output_name_parts("x.stdout") is None


def test_a_stream_is_published_whole_or_as_its_first_and_last_64_kib():
    """Issue 13: what a reviewer gets of a case's output is bounded; a short stream is kept byte for byte."""
    short = b"x" * (2 * OUTPUT_EDGE_BYTES)
    assert kept_output(short) == short
    long = b"a" * OUTPUT_EDGE_BYTES + b"middle" + b"z" * OUTPUT_EDGE_BYTES
    assert kept_output(long) == b"a" * OUTPUT_EDGE_BYTES + b"z" * OUTPUT_EDGE_BYTES


def test_the_receipt_binds_each_published_file_and_a_short_stream_twice():
    """Issue 13: the published files are bound by SHA-256 and size; a stream kept whole is the captured one."""
    receipt = pytest_receipt()
    assert receipt.published.stdout == Bound(hashlib.sha256(b"hello\n").hexdigest(), 6) == Bound.of(b"hello\n")
    assert receipt.published.stdout.sha256 == receipt.outcome.observed.stdout.sha256
    assert receipt.published.junit == Bound.of(REPORT)
    flood = built("c", ran("OUTPUT", 9, stdout=b"y" * (256 << 10), stdout_truncated=True))
    assert flood.published.stdout.bytes == 2 * OUTPUT_EDGE_BYTES
    assert receipt_from_bytes(flood.canonical_bytes()) == flood


def test_a_report_too_large_to_publish_is_counted_but_not_published():
    """The junit report is published whole or not at all; its counts stand either way."""
    from executor.evidence.receipts import PUBLISHED_JUNIT_MAX_BYTES
    from steward import api, wire

    assert PUBLISHED_JUNIT_MAX_BYTES <= api.MAX_EVIDENCE_BYTES
    assert (api.MAX_EVIDENCE_BYTES + 2) // 3 * 4 + 1024 < wire.MAX_MESSAGE
    big = b" " * (PUBLISHED_JUNIT_MAX_BYTES + 1)
    assert CaseOutput.of(ran(), big).junit is None and CaseOutput.of(ran(), REPORT).junit == REPORT


# --- the seal marker ------------------------------------------------------------------

MARKER = SealMarker("run-42-1", "stage-1", "journal-stage-1", "c" * 64)


def test_a_seal_marker_round_trips():
    assert seal_from_bytes(MARKER.canonical_bytes()) == MARKER


def test_the_documented_example_seal_marker_parses(repo):
    text = (repo / "docs" / "receipts.md").read_text()
    example = re.search(r"<!-- example seal -->\n```json\n(.*?)\n```", text, re.S).group(1)
    assert seal_from_bytes(canonical(json.loads(example))).stage_id == "run-42-1-stage-1"


@pytest.mark.parametrize(
    "change, path",
    [
        (lambda v: v.update(extra=1), "$.extra"),
        (lambda v: v.pop("head"), "$.head"),
        (lambda v: v.update(head="C" * 64), "$.head"),
        (lambda v: v.update(stage_id="../x"), "$.stage_id"),
        (lambda v: v.update(attempt_id=7), "$.attempt_id"),
    ],
)
def test_the_seal_marker_is_closed(change, path):
    """D1: the marker is closed; a refusal names the field."""
    value = json.loads(MARKER.canonical_bytes())
    change(value)
    with pytest.raises(Refused) as caught:
        seal_from_bytes(canonical(value))
    assert caught.value.where == path


def test_the_seal_marker_is_canonical():
    """D2: one encoding per marker."""
    with pytest.raises(Refused, match="canonical"):
        seal_from_bytes(json.dumps(MARKER.as_dict()).encode())
