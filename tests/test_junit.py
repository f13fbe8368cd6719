"""E5 positive evidence: the junit report is hostile input, read capped, without DTDs, counted from its test cases."""

from __future__ import annotations

import os

import pytest

from executor.evidence import junit
from executor.evidence.junit import (
    REPORT_MAX_BYTES,
    JunitCounts,
    PytestEvidence,
    counts_from_report,
    evidence_from_bytes,
    evidence_from_directory,
)
from journal.errors import Refused

# What pytest 8 writes (trimmed): a pass, a failure, a skip and a setup error.
PYTEST_REPORT = (
    b'<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1" '
    b'failures="1" skipped="1" tests="4" time="0.028" timestamp="2026-11-29T17:02:10" hostname="vm">'
    b'<testcase classname="test_ok" name="test_a" time="0.000" />'
    b'<testcase classname="test_ok" name="test_b" time="0.000"><failure message="assert 1 == 2">E assert 1 == 2</failure></testcase>'
    b'<testcase classname="test_ok" name="test_c" time="0.000"><skipped type="pytest.skip" message="unconditional skip">'
    b"test_ok.py:4: unconditional skip</skipped></testcase>"
    b'<testcase classname="test_ok" name="test_d" time="0.000"><error message="failed on setup with &quot;RuntimeError: x&quot;">'
    b"RuntimeError</error></testcase></testsuite></testsuites>"
)
COLLECTION_ERROR = (
    b'<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1" failures="0" '
    b'skipped="0" tests="1"><testcase classname="" name="test_broken" time="0.000"><error message="collection failure">'
    b"ImportError while importing test module</error></testcase></testsuite></testsuites>"
)


def suite(cases: bytes, attributes: bytes = b"") -> bytes:
    return b"<testsuites><testsuite " + attributes + b">" + cases + b"</testsuite></testsuites>"


def test_pytest_s_own_report_is_counted_from_its_test_cases():
    assert counts_from_report(PYTEST_REPORT) == JunitCounts(tests=4, skipped=1, failures=1, errors=1, collection_errors=0)
    assert not counts_from_report(PYTEST_REPORT).vacuous


def test_a_bare_testsuite_root_is_read_too():
    assert counts_from_report(b'<testsuite><testcase name="a"/></testsuite>') == JunitCounts(1, 0, 0, 0, 0)


def test_summary_attributes_are_never_trusted():
    """E5: the suite's own tests= and failures= attributes are ignored; only test case elements count."""
    forged = suite(b"", b'tests="900" failures="0" skipped="0" errors="0"')
    counts = counts_from_report(forged)
    assert counts.tests == 0 and counts.vacuous


def test_a_collection_failure_is_counted_and_vacuous():
    """E5: a module that failed to collect makes the run vacuous, whatever else ran."""
    counts = counts_from_report(COLLECTION_ERROR)
    assert counts == JunitCounts(1, 0, 0, 1, 1)
    assert counts.vacuous


@pytest.mark.parametrize(
    "counts, vacuous",
    [
        (JunitCounts(0, 0, 0, 0, 0), True),
        (JunitCounts(3, 3, 0, 0, 0), True),
        (JunitCounts(3, 2, 0, 0, 0), False),
        (JunitCounts(3, 0, 0, 1, 1), True),
        (JunitCounts(1, 0, 1, 0, 0), False),
    ],
)
def test_vacuous_means_nothing_executed_or_a_collection_error(counts, vacuous):
    """E5: no test executed, all skipped, or a collection error is vacuous."""
    assert counts.vacuous is vacuous


@pytest.mark.parametrize(
    "report",
    [
        b'<?xml version="1.0"?><!DOCTYPE testsuites [<!ENTITY a "x">]><testsuites/>',
        b'<?xml version="1.0"?><!doctype testsuites SYSTEM "http://example.invalid/x.dtd"><testsuites/>',
        b'<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]><testsuites>&lol2;</testsuites>',
        b'<testsuites><!ENTITY x "y"></testsuites>',
    ],
)
def test_doctype_and_entity_declarations_are_refused(report):
    """E5: no DTD, so no entity is ever declared or expanded (billion laughs, external entities)."""
    with pytest.raises(Refused, match="DOCTYPE or ENTITY"):
        counts_from_report(report)


@pytest.mark.parametrize(
    "report",
    [b'<!DOCTYPE testsuites SYSTEM "file:///etc/passwd"><testsuites/>', b'<!DOCTYPE t [<!ENTITY a "b">]><testsuites>&a;</testsuites>'],
)
def test_the_expat_handlers_refuse_a_doctype_the_byte_scan_missed(monkeypatch, report):
    """E5, in depth: with the byte scan off, expat's own DOCTYPE and entity handlers still refuse."""
    monkeypatch.setattr(junit, "_FORBIDDEN", ())
    with pytest.raises(Refused, match="declares a DOCTYPE or an entity"):
        counts_from_report(report)


def test_a_report_over_the_cap_is_refused():
    """E5: the report is capped before it is parsed."""
    padding = b"<testcase/>" * (REPORT_MAX_BYTES // 11)
    with pytest.raises(Refused, match="cap"):
        counts_from_report(suite(padding))


@pytest.mark.parametrize(
    "report, rule",
    [
        (b"<testsuites><testsuite><testcase></testsuite>", "not well-formed"),
        (suite(b"<testcase name='\xff'/>"), "UTF-8"),
        ("<testsuites/>".encode("utf-16"), "UTF-8"),
        (b"<html><testcase/></html>", "root element"),
        (b"<testsuites><testcase/></testsuites>", "outside a <testsuite>"),
        (b"<testsuite><testsuite/></testsuite>", "outside <testsuites>"),
        (b"", "not well-formed"),
    ],
)
def test_reports_this_reader_does_not_accept_are_refused(report, rule):
    with pytest.raises(Refused, match=rule):
        counts_from_report(report)


def test_nesting_is_bounded():
    """E5: nesting is bounded so a hostile report cannot grow the parser's stack."""
    deep = b"<testsuites><testsuite><testcase>" + b"<x>" * 10 + b"</x>" * 10 + b"</testcase></testsuite></testsuites>"
    with pytest.raises(Refused, match="deeper"):
        counts_from_report(deep)


def test_the_number_of_test_cases_is_bounded():
    """E5: a report may list at most its cap of test cases (MAX_TESTCASES unless the plan sets another)."""
    with pytest.raises(Refused, match="more than 3"):
        counts_from_report(suite(b"<testcase/>" * 4), max_testcases=3)
    assert counts_from_report(suite(b"<testcase/>" * 3), max_testcases=3).tests == 3
    with pytest.raises(Refused, match=f"more than {junit.MAX_TESTCASES}"):
        counts_from_report(suite(b"<testcase/>" * (junit.MAX_TESTCASES + 1)))


def test_the_report_size_is_bounded_by_its_cap():
    """E5, plan v2 junit.max_bytes: a report over its byte cap is refused; a larger cap admits it."""
    report = suite(b"<testcase/>" * 10)
    with pytest.raises(Refused, match=f"larger than its {len(report) - 1}-byte cap"):
        counts_from_report(report, cap=len(report) - 1)
    assert counts_from_report(report, cap=len(report)).tests == 10


def test_evidence_from_bytes_maps_absence_and_refusal():
    assert evidence_from_bytes(None) == PytestEvidence("missing", None)
    assert evidence_from_bytes(b"<!DOCTYPE x><x/>") == PytestEvidence("refused", None, 16)
    assert evidence_from_bytes(PYTEST_REPORT).report == "read"


@pytest.fixture
def work(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def test_the_report_is_read_from_the_work_directory(work):
    path, fd = work
    assert evidence_from_directory(fd) == PytestEvidence("missing", None)
    (path / "junit.xml").write_bytes(PYTEST_REPORT)
    assert evidence_from_directory(fd) == PytestEvidence("read", counts_from_report(PYTEST_REPORT), len(PYTEST_REPORT))


def test_a_symlinked_report_is_refused_not_followed(work, tmp_path_factory):
    """E5: the candidate could point the report at a host file; the symlink is never followed."""
    path, fd = work
    elsewhere = tmp_path_factory.mktemp("host") / "real.xml"
    elsewhere.write_bytes(PYTEST_REPORT)
    (path / "junit.xml").symlink_to(elsewhere)
    assert evidence_from_directory(fd) == PytestEvidence("refused", None)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_report_that_is_not_a_regular_file_is_refused(work, kind):
    """E5: a FIFO would block the reader; only a regular file is read."""
    path, fd = work
    if kind == "fifo":
        os.mkfifo(path / "junit.xml")
    else:
        (path / "junit.xml").mkdir()
    assert evidence_from_directory(fd) == PytestEvidence("refused", None)


def test_an_oversized_report_file_is_refused_after_reading_one_byte_past_the_cap(work, counted_reads):
    """E5: reading stops at cap + 1 bytes."""
    path, fd = work
    (path / "junit.xml").write_bytes(b" " * (REPORT_MAX_BYTES + 4096))
    assert evidence_from_directory(fd) == PytestEvidence("refused", None, REPORT_MAX_BYTES + 4096, REPORT_MAX_BYTES)
    assert sum(counted_reads) == REPORT_MAX_BYTES + 1


def test_an_oversized_report_is_not_kept_for_publishing_and_says_its_size_and_cap(work):
    """E5, issue 13: a refused oversized report names its size and its cap, and no bytes of it are published."""
    path, fd = work
    (path / "junit.xml").write_bytes(b" " * 5000)
    report = junit.report_from_directory(fd, cap=4096)
    assert report.data is None
    assert (report.evidence.bytes, report.evidence.cap, report.evidence.over_cap) == (5000, 4096, True)


def test_a_report_within_its_cap_is_kept_whole_even_when_refused(work):
    """A malformed report within the cap is kept, so a reviewer can see what the case wrote."""
    path, fd = work
    (path / "junit.xml").write_bytes(b"<x/>")
    report = junit.report_from_directory(fd)
    assert report.data == b"<x/>" and report.evidence.report == "refused" and not report.evidence.over_cap


def test_the_first_failing_tests_are_kept_with_the_first_line_of_their_message():
    """Display only: the ids and first message lines of failing tests, at most SHOWN_FAILURES of them."""
    failing = junit.failing_tests(PYTEST_REPORT)
    assert failing == (
        junit.FailingTest("test_ok::test_b", "assert 1 == 2"),
        junit.FailingTest("test_ok::test_d", 'failed on setup with "RuntimeError: x"'),
    )
    many = suite(b"".join(b'<testcase classname="c" name="t%d"><failure>E  boom %d\nmore</failure></testcase>' % (n, n) for n in range(5)))
    assert [(test.test, test.message) for test in junit.failing_tests(many)] == [("c::t0", "E  boom 0"), ("c::t1", "E  boom 1"), ("c::t2", "E  boom 2")]


def test_failing_tests_are_read_under_the_same_guards_as_the_counts():
    """E5: the display pass refuses what the counting pass refuses (no DTD, bounded depth)."""
    with pytest.raises(Refused):
        junit.failing_tests(b'<!DOCTYPE x [<!ENTITY a "b">]><testsuites/>')
    with pytest.raises(Refused):
        junit.failing_tests(b"<testsuites>" + b"<testsuite>" * 9 + b"</testsuite>" * 9 + b"</testsuites>")
