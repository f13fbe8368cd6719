"""C6: REMOVE_AND_PROVE attempts: acceptance, MISSING, INVALID, no retry after failure, zero-progress projection.

The pure rules are tested directly; then real helper processes (small Python
scripts standing in for ``steward.helper``) run through the real runner and a
real journal, once per branch.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from journal.errors import Refused
from journal.reader import Verdict, read_journal
from journal.writer import JournalWriter
from steward import documents, helperattempts
from steward.helperattempts import Attempt, Observation, Timing, classify, may_follow, projection
from steward.helper import Request, Response

STAGE = "s-1"
GOOD = Response(STAGE, "CLEANED", 2, 1, 0, 0, "all gone")
UNVERIFIED = Response(STAGE, "UNVERIFIED", 3, 0, 1, 0, "1 process remains")


def test_a_raw_zero_complete_body_is_accepted():
    """C6: raw-zero exit + complete EOF-terminated body: the response's own outcome, accepted."""
    assert classify(Observation(0, GOOD.encode(), True), stage_id=STAGE) == ("CLEANED", GOOD)
    assert classify(Observation(0, UNVERIFIED.encode(), True), stage_id=STAGE) == ("UNVERIFIED", UNVERIFIED)


def test_a_partial_body_at_the_deadline_is_missing():
    """C6: raw-zero exit, no end of file by the deadline: MISSING, even when the bytes read would parse."""
    assert classify(Observation(0, GOOD.encode()[:10], False), stage_id=STAGE) == ("MISSING", None)
    assert classify(Observation(0, GOOD.encode(), False), stage_id=STAGE) == ("MISSING", None)


@pytest.mark.parametrize("body", [
    b"",
    b"{}",
    GOOD.encode()[:-1],
    GOOD.encode() + b" ",
    GOOD.encode().replace(b'"killed":2', b'"killed":2,"pid":7'),
    Response("s-2", "CLEANED", 0, 0, 0, 0, "x").encode(),
    Response(STAGE, "CLEANED", 0, 0, 1, 0, "x").encode(),
])
def test_an_established_invalid_body_is_invalid(body):
    """C6: a complete body that is not exactly a valid response for this stage is INVALID."""
    assert classify(Observation(0, body, True), stage_id=STAGE) == ("INVALID", None)


def test_statuses_come_before_the_body():
    """C6: UNREAPED, SIGNALLED, NONZERO are decided by the wait status whatever the body says."""
    body = GOOD.encode()
    assert classify(Observation(None, body, True), stage_id=STAGE)[0] == "UNREAPED"
    assert classify(Observation(signal.SIGKILL, body, True), stage_id=STAGE)[0] == "SIGNALLED"
    assert classify(Observation(1 << 8, body, True), stage_id=STAGE)[0] == "NONZERO"


def test_only_missing_permits_a_successor():
    """C6: a nonzero, signalled, unreaped, invalid or unverified attempt ends retry."""
    assert [outcome for outcome in ("CLEANED", "UNVERIFIED", "MISSING", "INVALID", "NONZERO", "SIGNALLED", "UNREAPED")
            if may_follow(outcome)] == ["MISSING"]


def test_no_response_projects_zero_progress_and_an_accepted_one_is_copied():
    """C6: every no-response branch records zero progress; an accepted UNVERIFIED response is copied unchanged."""
    failed = Attempt(1, "NONZERO", "0" * 64, GOOD.encode(), None, 256)
    assert projection([failed]) == helperattempts.Progress(False, 0, 0, None, None, "no accepted helper response (last attempt: NONZERO)")
    accepted = Attempt(1, "UNVERIFIED", "0" * 64, UNVERIFIED.encode(), UNVERIFIED, 0)
    assert projection([accepted]) == helperattempts.Progress(True, 3, 0, 1, 0, "1 process remains")


def test_the_response_round_trips_and_refuses_a_foreign_stage():
    assert Response.decode(GOOD.encode(), stage_id=STAGE) == GOOD
    with pytest.raises(Refused, match="stage_id"):
        Response.decode(GOOD.encode(), stage_id="other")


# Real helper processes through the runner.

HELPERS = {
    "ok": "body = RESPONSE",
    "invalid": "body = b'{}'",
    "nonzero": "sys.exit(3)",
    "signalled": "os.kill(os.getpid(), signal.SIGTERM)",
    "hang": "time.sleep(60)",
    "slow": "os.write(1, RESPONSE[:20]); time.sleep(0.8); sys.exit(0)",
    "slow_then_ok": "count = bump(); body = RESPONSE if count > 1 else None\nif body is None:\n    os.write(1, RESPONSE[:20]); time.sleep(0.8); sys.exit(0)",
    "heavy": "block = bytearray(256 << 20)\nfor index in range(0, len(block), 4096):\n    block[index] = 1\ntime.sleep(60)",
}
SCRIPT = """\
import os, signal, sys, time
RESPONSE = {response!r}
def bump():
    path = {counter!r}
    count = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(count))
    return count
request = sys.stdin.buffer.read()
open({requests!r}, "ab").write(request + b"\\n")
body = None
{behaviour}
if body is not None:
    os.write(1, body)
sys.exit(0)
"""
TIMING = Timing(response_seconds=0.4, exit_seconds=2.0, kill_seconds=2.0)
REQUEST = Request(STAGE, "/nonexistent", "stages", 2000000199, 2000000199, (), (), 100)


@pytest.fixture
def journal(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "documents").mkdir()
    fd = os.open(stage, os.O_RDONLY | os.O_DIRECTORY)
    documents_fd = os.open(stage / "documents", os.O_RDONLY | os.O_DIRECTORY)
    writer = JournalWriter.create(fd, "journal", journal_id="j-1", stage_id=STAGE, attempt_id="a-1")
    yield writer, documents_fd, stage
    writer.close()
    os.close(documents_fd)
    os.close(fd)


def _runner(tmp_path, journal, behaviour: str, timing: Timing = TIMING) -> helperattempts.HelperRunner:
    writer, documents_fd, _ = journal
    script = tmp_path / f"{behaviour}.py"
    script.write_text(SCRIPT.format(
        response=GOOD.encode(), counter=str(tmp_path / "count"), requests=str(tmp_path / "requests"),
        behaviour=HELPERS[behaviour],
    ))
    return helperattempts.HelperRunner(
        writer, documents_fd=documents_fd, shown="documents", reaper="steward", timing=timing,
        command=(sys.executable, "-I", str(script)),
    )


def _records(journal):
    _, _, stage = journal
    reading = read_journal((stage / "journal").read_bytes())
    assert reading.verdict is Verdict.VALID
    return [(record.kind.name, record.fields) for record in reading.records[1:]]


def test_an_accepted_attempt_is_journaled_in_order_behind_its_digest(tmp_path, journal):
    """J1, C6: intent, release, terminal, then HELPER_ATTEMPT with the digest of the exact body, kept as a document."""
    done = _runner(tmp_path, journal, "ok").run(REQUEST)
    assert [attempt.outcome for attempt in done] == ["CLEANED"]
    records = _records(journal)
    assert [kind for kind, _ in records] == ["PROCESS_INTENT", "PROCESS_RELEASED", "PROCESS_TERMINAL", "HELPER_ATTEMPT"]
    assert records[0][1]["role"] == "helper" and records[2][1]["wait_status"] == 0
    assert records[3][1]["response_digest"] == documents.digest(GOOD.encode()) == done[0].digest
    assert (journal[2] / "documents" / done[0].digest).read_bytes() == GOOD.encode()
    assert (tmp_path / "requests").read_bytes() == REQUEST.encode() + b"\n"


def test_a_missing_attempt_gets_a_successor_only_after_it_is_reaped(tmp_path, journal):
    """C6: raw-zero MISSING permits a successor, which starts only once its predecessor's status is recorded."""
    done = _runner(tmp_path, journal, "slow_then_ok").run(REQUEST)
    assert [attempt.outcome for attempt in done] == ["MISSING", "CLEANED"]
    order = [(kind, fields.get("op_id"), fields.get("attempt")) for kind, fields in _records(journal)]
    assert order.index(("PROCESS_TERMINAL", "helper-1", None)) < order.index(("HELPER_ATTEMPT", None, 1))
    assert order.index(("HELPER_ATTEMPT", None, 1)) < order.index(("PROCESS_INTENT", "helper-2", None))


def test_missing_attempts_stop_at_the_cap(tmp_path, journal):
    done = _runner(tmp_path, journal, "slow").run(REQUEST)
    assert [attempt.outcome for attempt in done] == ["MISSING"] * helperattempts.MAX_ATTEMPTS
    assert projection(done).accepted is False


@pytest.mark.parametrize("behaviour, outcome", [("invalid", "INVALID"), ("nonzero", "NONZERO"), ("signalled", "SIGNALLED")])
def test_a_failed_attempt_ends_retry(tmp_path, journal, behaviour, outcome):
    """C6: INVALID, NONZERO and SIGNALLED attempts have no successor."""
    done = _runner(tmp_path, journal, behaviour).run(REQUEST)
    assert [attempt.outcome for attempt in done] == [outcome]
    assert [kind for kind, _ in _records(journal)].count("HELPER_ATTEMPT") == 1


def test_a_helper_that_outlives_its_bounds_is_killed_and_signalled(tmp_path, journal):
    """C6: past the response deadline and the exit bound the runner SIGKILLs it: SIGNALLED, no successor."""
    timing = Timing(response_seconds=0.2, exit_seconds=0.2, kill_seconds=5.0)
    done = _runner(tmp_path, journal, "hang", timing).run(REQUEST)
    assert [(attempt.outcome, attempt.status) for attempt in done] == [("SIGNALLED", signal.SIGKILL)]


def test_an_unreaped_helper_ends_retry_and_is_reaped_later(tmp_path, journal):
    """C6: a helper that cannot be reaped in time is UNREAPED (no status, no successor); reaping it later records its status."""
    timing = Timing(response_seconds=1.5, exit_seconds=0.0, kill_seconds=0.0)
    runner = _runner(tmp_path, journal, "heavy", timing)
    done = runner.run(REQUEST)
    assert [(attempt.outcome, attempt.status) for attempt in done] == [("UNREAPED", None)]
    assert "PROCESS_TERMINAL" not in [kind for kind, _ in _records(journal)]
    runner.reap_late(10.0)
    assert runner.unreaped == {}
    kinds = [kind for kind, _ in _records(journal)]
    assert kinds[-2:] == ["HELPER_ATTEMPT", "PROCESS_TERMINAL"]
    assert kinds.count("HELPER_ATTEMPT") == 1


@pytest.mark.parametrize("mount", ["/live/out", "live/../../../etc", "live//out", "./live", ""])
def test_a_helper_request_names_only_plain_relative_mounts_under_the_stage(mount):
    """C6, F3: the helper unmounts relative to the stage's descriptor; an absolute path or a '..', '.' or
    empty segment in a request is refused before anything is unmounted."""
    from journal.strictjson import canonical
    from steward.helper import REQUEST_VERSION, Request

    value = {"version": REQUEST_VERSION, "stage_id": "s1", "state_root": "/var/lib/casebox", "area": "stages",
             "uid": 7, "gid": 7, "mounts": ["live/ok", mount], "identities": [], "budget_ms": 10}
    with pytest.raises(Refused, match="must be a relative path inside the stage"):
        Request.decode(canonical(value))
    assert Request.decode(canonical({**value, "mounts": ["live/ok"]})).mounts == ("live/ok",)
