"""``casebox journal verify|show|replay`` (J4, F1): verdict lines, exit codes, JSON, tombstones, the timeline."""

from __future__ import annotations

import dataclasses
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence_support import Run, Stage
from executor import VERSION
from executor.cli.main import main
from journal.format import CAP, MAX_PAYLOAD, RESERVE_START, Kind, sandbox_of
from journal.reader import Verdict, read_journal
from journal.strictjson import canonical
from journal.replay import render_text
from journal.replay_html import MAX_ROWS, render_html
from journal.timeline import Process, Sandbox, since, timeline
from journal.writer import JournalWriter
from plan_support import case as case_doc
from plan_support import plan as make_plan
from journal_support import (
    GOLDEN,
    REPO,
    ChainLedger,
    clock,
    golden,
    mount_output,
    unmount_output,
    vectors,
    write_sandbox,
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["journal", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("name", "verdict", "code"),
    [
        ("every_kind.bin", "VALID", 0),
        ("torn_payload.bin", "TORN", 1),
        ("flip_payload_middle.bin", "CORRUPT", 1),
        ("over_cap_file.bin", "OVER_CAP", 1),
        ("reserve_plus_8.bin", "OVER_CAP", 1),
    ],
)
def test_verify_exits_zero_only_for_valid(capsys, name, verdict, code):
    """J4: verify prints one verdict line and exits 0 only for VALID, 1 for any other verdict."""
    result, out, err = run(capsys, "verify", str(GOLDEN / name))
    assert (result, err) == (code, "")
    shown = "VALID (unanchored)" if verdict == "VALID" else verdict
    assert out.count("\n") == 1 and f": {shown}, " in out


def test_verify_json_fields(capsys):
    """J4: verify --json prints verdict, records, valid_bytes, head and reason."""
    result, out, _ = run(capsys, "verify", "--json", str(GOLDEN / "torn_header.bin"))
    reading = read_journal(golden("torn_header.bin"))
    assert result == 1
    assert json.loads(out) == {
        "schema": "casebox.journal-verify.v1", "casebox_version": VERSION,
        "verdict": "TORN", "records": len(reading.records), "valid_bytes": reading.valid_bytes,
        "head": reading.head, "reason": reading.reason, "anchored": False, "anchors": [],
    }


def test_verify_expect_head_and_stage(capsys):
    """J4: a head or stage other than the expected one is SUBSTITUTED, exit 1."""
    path = str(GOLDEN / "every_kind.bin")
    head = read_journal(golden("every_kind.bin")).head
    assert run(capsys, "verify", path, "--expect-head", head, "--expect-stage", "stage-1")[0] == 0
    code, out, _ = run(capsys, "verify", path, "--expect-head", "0" * 64)
    assert code == 1 and "SUBSTITUTED" in out
    code, out, _ = run(capsys, "verify", path, "--expect-stage", "stage-2")
    assert code == 1 and "SUBSTITUTED" in out


@pytest.mark.parametrize("argv", [["verify", "/nonexistent/journal"], ["show", "/nonexistent/journal"],
                                  ["replay", "/nonexistent/journal"]])
def test_unreadable_path_exits_64(capsys, argv):
    """F1: a path that cannot be read (one that does not exist included) is exit 64 with one sentence naming it;
    MISSING is only a directory that holds no journal (docs/journal-format.md, "Journals on disk")."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (64, "")
    assert err.count("\n") == 1 and "/nonexistent/journal" in err


def test_bad_expect_head_exits_64(capsys):
    """F1: --expect-head must be 64 lowercase hex digits."""
    code, _, err = run(capsys, "verify", str(GOLDEN / "minimal.bin"), "--expect-head", "ABC")
    assert code == 64 and "64 lowercase hex" in err


def test_tombstone_directory(capsys, tmp_path):
    """J4: a stage or tombstone directory names its journal 'journal'; without one the verdict is MISSING."""
    code, out, _ = run(capsys, "verify", str(tmp_path))
    assert code == 1 and "MISSING" in out and str(tmp_path / "journal") in out
    shutil.copy(GOLDEN / "every_kind.bin", tmp_path / "journal")
    code, out, _ = run(capsys, "verify", "--json", str(tmp_path))
    assert code == 0 and json.loads(out)["verdict"] == "VALID"


def test_tombstone_journal_symlink_is_refused(capsys, tmp_path):
    """F3: a tombstone's journal is read without following a symlink."""
    os.symlink(GOLDEN / "every_kind.bin", tmp_path / "journal")
    code, _, err = run(capsys, "verify", str(tmp_path))
    assert code == 64 and "symlink" in err


def test_show_prints_each_record_with_its_offset(capsys):
    """J4: show prints every record of the valid prefix on its own line with its offset, then the verdict."""
    reading = read_journal(golden("every_kind.bin"))
    code, out, _ = run(capsys, "show", str(GOLDEN / "every_kind.bin"))
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(reading.records) + 1
    for line, record in zip(lines, reading.records):
        offset, kind = line.split()[:2]
        assert (int(offset), kind) == (record.offset, record.kind.name)
    assert 'note="cleanup CLEANED; retiring"' in out
    code, out, _ = run(capsys, "show", "--json", str(GOLDEN / "torn_payload.bin"))
    shown = json.loads(out)
    assert code == 1 and shown["verdict"] == "TORN"
    assert [entry["offset"] for entry in shown["entries"]] == [record.offset for record in reading.records[:-1]]


def test_replay_prints_the_timeline(capsys):
    """J4: replay shows processes with their wait status, mounts and unmounts, durations and the final verdict."""
    code, out, _ = run(capsys, "replay", str(GOLDEN / "every_kind.bin"))
    assert code == 0
    assert "process  proc-1  launcher    pid 4242" in out and "exit 0 (raw 0), reaped by steward  lived 5.000 ms" in out
    assert "host mount  mnt-1  tmpfs /sandbox/tmp" in out and "unmount umnt-1" in out and "mounted 6.250 ms" in out
    assert "helper attempt 2: CLEANED" in out
    assert out.rstrip().endswith("verdict   cleanup CLEANED, journal VALID")


def test_replay_of_a_torn_journal_claims_nothing(capsys):
    """J4: only a VALID journal supports a cleanup claim; a torn one preserves the stage."""
    code, out, _ = run(capsys, "replay", str(GOLDEN / "torn_payload.bin"))
    assert code == 1 and "journal TORN: no cleanup claim is authorized" in out


def write_session(directory, *, crashed: bool = False) -> bytes:
    """A steward session's journal written through JournalWriter: two outputs, their sandboxes, cleanup.

    ``crashed`` ends it as a steward crash would: the second output is never
    unmounted, a third sandbox's pid 1 and op are never reaped, a helper is
    never reaped and its attempt is MISSING, and nothing is retired.
    """
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with JournalWriter.create(dir_fd, "journal", journal_id="j-1", stage_id="s-1", attempt_id="a-1",
                                  clock=clock(step=7_000)) as writer:
            mount_output(writer, "candidate")
            write_sandbox(writer, "s-1-1", 100)
            unmount_output(writer, "candidate")
            mount_output(writer, "junit-0")
            write_sandbox(writer, "s-1-2", 200, mounts=("/usr", "/cap/site", "/out/junit-0"), op_statuses=(256, 9))
            if crashed:
                write_sandbox(writer, "s-1-3", 300, op_statuses=(None,), pid1="open")
                writer.process_intent("helper-1", "helper", 400, 1, 400)
                writer.helper_attempt(1, "ab" * 32, "MISSING")
            else:
                unmount_output(writer, "junit-0")
                writer.process_intent("helper-1", "helper", 400, 1, 400)
                writer.process_released("helper-1")
                writer.process_terminal("helper-1", 0, "steward")
                writer.helper_attempt(1, "ab" * 32, "CLEANED")
                writer.cleanup_evidence("CLEANED", writer.head, "11" * 32, "22" * 32, "33" * 32)
                writer.retirement_intent("session=CLOSED")
                writer.retired("session=CLOSED")
    finally:
        os.close(dir_fd)
    return (directory / "journal").read_bytes()


def test_replay_groups_each_sandbox_and_summarises_its_namespace_mounts(capsys, tmp_path):
    """J4: one block per sandbox (launcher, pid 1, ops), its mounts in one line, host mounts with their unmounts."""
    reading = read_journal(write_session(tmp_path))
    code, out, _ = run(capsys, "replay", str(tmp_path))
    start = timeline(reading).start
    reaped = {record.fields["op_id"]: record.fields["at"] for record in reading.records if record.kind is Kind.PROCESS_TERMINAL}
    lines = out.splitlines()
    starts = [number for number, line in enumerate(lines) if line.startswith("+")]
    assert code == 0 and [lines[number].split()[1:3] for number in starts] == [
        ["host", "mount"], ["sandbox", "s-1-1"], ["host", "mount"], ["sandbox", "s-1-2"], ["process", "helper-1"],
        ["helper", "attempt"], ["cleanup", "evidence:"], ["retirement", "intent"], ["retired", "(note"],
    ]
    sandbox_one = lines[starts[1] + 1 : starts[2]]
    assert [line.split()[0] for line in sandbox_one] == ["launcher", "init", "op-1", "mounts", "unmount", "ends"]
    assert "mounts    3 mounts done in the namespace" in out and ": tree /usr /cap/site /out/junit-0\n" in out
    assert out.count("unmount   tree /.old-root") == 2
    for sandbox in ("s-1-1", "s-1-2"):
        assert (f"3 mounts with no unmount record ended with the namespace: pid 1 ({sandbox}.init) was reaped at "
                f"{since(start, reaped[sandbox + '.init'])}") in out
    assert "op-2      descendant  pid 203" in out and "killed by SIGKILL (9) (raw 9), reaped by launcher" in out
    assert "never unmounted" not in out and "not reaped" not in out
    assert out.rstrip().endswith("verdict   cleanup CLEANED, journal VALID")


def test_replay_claims_no_unmount_or_terminal_status_the_journal_lacks(capsys, tmp_path):
    """C1, J4: no wait status, unmount or namespace end is shown that the journal does not record."""
    reading = read_journal(write_session(tmp_path, crashed=True))
    terminals = sum(1 for record in reading.records if record.kind is Kind.PROCESS_TERMINAL)
    code, out, _ = run(capsys, "replay", str(tmp_path))
    assert code == 0 and out.count("reaped by ") == terminals
    assert "pid 1 (s-1-3.init) is not reaped in this journal: its namespace and 3 mounts may still exist" in out
    assert out.count("ended with the namespace") == 2
    assert "unmount output-junit-0" not in out and "never unmounted in this journal" in out
    assert out.count("not reaped in this journal") == 3 + out.count("is not reaped in this journal") == 4
    assert out.rstrip().endswith("verdict   journal VALID, but it holds no cleanup evidence")
    page = render_html(reading, "journal")
    assert page.count("end with pid 1") == 2 and page.count("3 mounts, pid 1 not reaped") == 1
    assert page.count("unmounted after") == 1 and "never unmounted in this journal" in page
    assert page.count(">not reaped<") == 1 and "op-1 not reaped, pid 1 not reaped" in page
    bars = re.findall(r"<rect ([^>]*)><title>([^<]*)</title>", page)
    open_bars = [bar for bar, title in bars if re.search("not reaped in|may still exist|never unmounted in", title)]
    unreaped = [bar for bar, title in bars if "\nnot reaped in this journal" in title]
    assert len(open_bars) == 5 and all('fill="#fff"' in bar and "stroke-dasharray" in bar for bar in open_bars)
    assert len(unreaped) == 3 and all('stroke="#57606a"' in bar for bar in unreaped)
    line = timeline(reading)
    reaped = {record.fields["op_id"]: record.fields["at"] for record in reading.records if record.kind is Kind.PROCESS_TERMINAL}
    assert {sandbox.name: sandbox.namespace_end for sandbox in line.sandboxes} == {
        "s-1-1": reaped["s-1-1.init"], "s-1-2": reaped["s-1-2.init"], "s-1-3": None,
    }


def test_stacked_mounts_of_one_target_are_unmounted_last_first():
    """J4: an unmount pairs with the latest mount of its target and kind that no earlier unmount claimed."""
    ledger = ChainLedger()
    for op in ("a", "b"):
        ledger.mount_intent(op_id=f"output-{op}-mount", target="/t", kind="tmpfs")
        ledger.mount_done(op_id=f"output-{op}-mount", target="/t", kind="tmpfs")
    for op in ("b", "a"):
        ledger.unmount_intent(op_id=f"output-{op}-unmount", target="/t", kind="tmpfs")
        ledger.unmount_done(op_id=f"output-{op}-unmount", target="/t", kind="tmpfs")
    line = timeline(read_journal(ledger.chain.bytes()))
    assert [(mount.op_id, mount.unmount_op_id) for mount in line.host_mounts] == [
        ("output-a-mount", "output-a-unmount"), ("output-b-mount", "output-b-unmount"),
    ]


def test_a_namespace_without_a_recorded_pid1_has_no_end():
    """C1: without pid 1's records, nothing says when the namespace of a sandbox's mounts ended."""
    ledger = ChainLedger()
    write_sandbox(ledger, "s-1-1", 100, op_statuses=(), pid1="none")
    reading = read_journal(ledger.chain.bytes())
    text = render_text(reading, "journal")
    assert "no pid 1 is recorded for this sandbox: the journal does not say when the namespace of its 3 mounts ended" in text
    assert "ended with the namespace" not in text and "with pid 1" not in render_html(reading, "journal")


def test_a_sandbox_that_had_the_index_network_says_so():
    """S9: a sandbox named <stage>-<n>-net had the index network (the forwarder); its lane says so, and no other
    lane does."""
    ledger = ChainLedger()
    write_sandbox(ledger, "s-1-1-net", 100)
    write_sandbox(ledger, "s-1-2", 200)
    reading = read_journal(ledger.chain.bytes())
    assert [sandbox.networked for sandbox in timeline(reading).sandboxes] == [True, False]
    text = render_text(reading, "journal")
    assert text.count("with the index network") == 1 and "sandbox s-1-1-net  spans" in text.split("with the index")[0]
    page = render_html(reading, "journal")
    assert page.count(">op-1 exit 0 (2.000 ms) · had the index network<") == 1 and page.count("it had the index network") == 1


def test_a_mount_unmounted_in_its_namespace_does_not_end_with_it():
    """J4: only the mounts that no unmount record ends are said to end with the namespace."""
    ledger = ChainLedger()
    write_sandbox(ledger, "s-1-1", 100, mounts=("/a", "/b"), op_statuses=(), pid1="open")
    ledger.unmount_intent(op_id="s-1-1.mount-4", target="/b", kind="tree")
    ledger.unmount_done(op_id="s-1-1.mount-4", target="/b", kind="tree")
    ledger.process_terminal(op_id="s-1-1.init", wait_status=0, reaper="steward")
    reading = read_journal(ledger.chain.bytes())
    (sandbox,) = timeline(reading).sandboxes
    assert [mount.target for mount in sandbox.lasting_mounts] == ["/a"]
    text = render_text(reading, "journal")
    assert "ends      1 mount with no unmount record ended with the namespace" in text
    assert "unmount   tree /b +" in text and "1 mount ends with pid 1 · 2 unmounts" in render_html(reading, "journal")


def lane_facts(reading) -> dict:
    """What each op id became in the timeline: where it sits and what the timeline says happened to it."""
    line = timeline(reading)
    facts = {}
    lanes = [(None, lane) for lane in line.lanes if not isinstance(lane, Sandbox)]
    lanes += [(sandbox.name, lane) for sandbox in line.sandboxes for lane in sandbox.processes + sandbox.mounts]
    for sandbox, lane in lanes:
        if isinstance(lane, Process):
            facts[lane.op_id] = (sandbox, "process", lane.released_at is not None, lane.wait_status, lane.descendants, lane.filter_digest)
        else:
            if lane.op_id is not None:
                facts[lane.op_id] = (sandbox, "mount", lane.done_at is not None, lane.target, lane.kind)
            if lane.unmount_op_id is not None:
                facts[lane.unmount_op_id] = (sandbox, "unmount", lane.unmount_done_at is not None, lane.target, lane.kind)
    return facts


def record_facts(reading) -> dict:
    """The same facts read straight from the records."""
    facts, by_kind = {}, {}
    for record in reading.records:
        fields = record.fields
        by_kind.setdefault(record.kind, {})[fields.get("op_id")] = fields
    for op, fields in by_kind.get(Kind.PROCESS_INTENT, {}).items():
        terminal = by_kind.get(Kind.PROCESS_TERMINAL, {}).get(op)
        descendants = by_kind.get(Kind.DESCENDANTS_TERMINAL, {}).get(op)
        ready = by_kind.get(Kind.SANDBOX_READY, {}).get(op)
        facts[op] = (sandbox_of(op), "process", op in by_kind.get(Kind.PROCESS_RELEASED, {}),
                     terminal and terminal["wait_status"], descendants and descendants["count"], ready and ready["filter_digest"])
    for intent, done, word in ((Kind.MOUNT_INTENT, Kind.MOUNT_DONE, "mount"), (Kind.UNMOUNT_INTENT, Kind.UNMOUNT_DONE, "unmount")):
        for op, fields in by_kind.get(intent, {}).items():
            facts[op] = (sandbox_of(op), word, op in by_kind.get(done, {}), fields["target"], fields["kind"])
    return facts


@pytest.mark.parametrize("vector", [vector for vector in vectors() if vector["records"]], ids=lambda vector: vector["id"])
def test_every_golden_vector_folds_into_lanes_that_hold_exactly_its_records(vector):
    """J4, C1: each intent of a vector's valid prefix is in exactly one lane, with only what its own records say."""
    reading = read_journal(golden(vector["file"]))
    line = timeline(reading)
    intents = [record for record in reading.records if record.kind in (Kind.PROCESS_INTENT, Kind.MOUNT_INTENT, Kind.UNMOUNT_INTENT)]
    assert lane_facts(reading) == record_facts(reading) and len(lane_facts(reading)) == len(intents)
    assert [(event.kind, event.at) for event in line.events] == [
        (record.kind, record.fields["at"]) for record in reading.records
        if record.kind >= Kind.HELPER_ATTEMPT and record.kind is not Kind.SANDBOX_READY  # READY is its pid 1's
    ]


def test_the_golden_lifecycle_has_one_host_process_and_one_host_mount_with_its_unmount():
    """J4: ops without a sandbox prefix are the steward's own: host lanes, each mount paired with its unmount;
    the one sandbox's pid 1 carries its READY's filter digest (S12)."""
    line = timeline(read_journal(golden("every_kind.bin")))
    (sandbox,) = line.sandboxes
    assert sandbox.name == "sbx-1" and sandbox.pid1.filter_digest == "44" * 32
    (process,) = line.host_processes
    (mount,) = line.host_mounts
    assert (process.op_id, process.wait_status, process.descendants) == ("proc-1", 0, 3)
    assert (mount.op_id, mount.unmount_op_id, mount.target) == ("mnt-1", "umnt-1", "/sandbox/tmp")


statuses = st.one_of(st.none(), st.sampled_from([0, 256, 9, 137]))
lane_plans = st.one_of(
    st.tuples(st.just("sandbox"), st.lists(st.sampled_from(["/usr", "/cap/a", "/out/b"]), max_size=3),
              st.lists(statuses, max_size=3), st.sampled_from(["reaped", "open", "none"])),
    st.tuples(st.just("output"), st.sampled_from(["none", "intent", "done"])),
    st.tuples(st.just("helper"), statuses),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(lane_plans, max_size=8))
def test_random_sessions_fold_and_render_only_what_their_records_say(plans):
    """C1, J4: for any session, the lanes hold exactly the records, and neither rendering claims a reap, an
    unmount or a namespace end that no record holds."""
    ledger = ChainLedger()
    for number, plan in enumerate(plans):
        if plan[0] == "sandbox":
            write_sandbox(ledger, f"s-1-{number}", 100 * (number + 1), mounts=plan[1], op_statuses=plan[2], pid1=plan[3])
        elif plan[0] == "output":
            mount_output(ledger, f"o{number}")
            if plan[1] != "none":
                unmount_output(ledger, f"o{number}", done=plan[1] == "done")
        else:
            ledger.process_intent(op_id=f"helper-{number}", role="helper", pid=9000 + number, starttime=1, pgid=9000 + number)
            if plan[1] is not None:
                ledger.process_terminal(op_id=f"helper-{number}", wait_status=plan[1], reaper="steward")
    reading = read_journal(ledger.chain.bytes())
    assert reading.verdict is Verdict.VALID and lane_facts(reading) == record_facts(reading)
    terminals = sum(1 for record in reading.records if record.kind is Kind.PROCESS_TERMINAL)
    processes = sum(1 for record in reading.records if record.kind is Kind.PROCESS_INTENT)
    ended = sum(1 for plan in plans if plan[0] == "sandbox" and plan[1] and plan[3] == "reaped")
    unmounted = sum(1 for plan in plans if plan[0] == "output" and plan[1] == "done")
    text, page = render_text(reading, "journal"), render_html(reading, "journal")
    unreaped = text.count("not reaped in this journal") - text.count("is not reaped in this journal")
    assert text.count("reaped by ") == terminals and unreaped == processes - terminals
    assert text.count("ended with the namespace") == ended == len(re.findall("mounts? ends? with pid 1", page))
    assert text.count("mounted ") - text.count("mounted in") == unmounted == page.count("unmounted after")


def test_replay_html_is_one_self_contained_file(capsys, tmp_path):
    """replay --html writes one HTML file with an inline SVG timeline and no network or script assets, and
    prints one line naming it with the verdict instead of the text timeline."""
    out_path = tmp_path / "timeline.html"
    code, out, _ = run(capsys, "replay", str(GOLDEN / "every_kind.bin"), "--html", str(out_path))
    page = out_path.read_text()
    assert code == 0 and out == f"{out_path}: cleanup CLEANED, journal VALID\n"
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1 and "<rect" in page
    for banned in ("http:", "https:", "//", "<script", "src=", "href=", "url(", "@import", "@font-face"):
        assert banned not in page.replace("<!DOCTYPE", ""), banned
    assert ["listdir", *sorted(os.listdir(tmp_path))] == ["listdir", "timeline.html"]
    code, out, _ = run(capsys, "replay", str(GOLDEN / "torn_payload.bin"), "--html", str(tmp_path / "torn.html"))
    assert code == 1 and out.endswith(": journal TORN: no cleanup claim is authorized; the stage is preserved\n")


class Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attributes |= {name for name, _ in attrs}

    def handle_data(self, data):
        self.text.append(data)


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "svg", "g", "rect", "path", "line", "text", "details",
             "summary", "table", "tr", "th", "td", "code"}


def test_replay_html_escapes_journal_strings(tmp_path):
    """Strings from an untrusted journal are data: they add no element or attribute and read back unchanged."""
    hostile_target = '/<script>alert(1)</script>/"onload="x"/&amp;/\'<b>'
    hostile_note = '</title></text></svg><script src=//x>alert(1)</script> & "quoted"'
    ledger = ChainLedger()
    mount_output(ledger, "a")
    ledger.unmount_intent(op_id="u-1", target=hostile_target, kind="bind")
    write_sandbox(ledger, "s-1-1", 100, mounts=(hostile_target,))
    ledger.retirement_intent(note=hostile_note)
    reading = read_journal(ledger.chain.bytes())
    assert reading.verdict is Verdict.VALID
    page = render_html(reading, '/tmp/<i>"shown"')
    parsed = Tags()
    parsed.feed(page)
    assert parsed.tags <= PAGE_TAGS and "<script" not in page and "onload=" not in parsed.attributes
    text = "".join(parsed.text)
    assert hostile_target in text and f"note {canonical(hostile_note).decode()}" in text and '/tmp/<i>"shown"' in text


def full_journal_of_tiny_sandboxes() -> bytes:
    """Exactly 262,144 bytes: as many one-record sandboxes as fit before the reserve, then both retirement records."""
    ledger = ChainLedger()
    chain = ledger.chain
    number = 0
    while RESERVE_START - len(chain.data) >= 2 * 200:
        number += 1
        ledger.process_intent(op_id=f"s{number}.launcher", role="launcher", pid=number, starttime=1, pgid=number)
    base = len(chain.payload(Kind.MOUNT_INTENT, op_id="pad", target="/", kind="tmpfs"))
    ledger.mount_intent(op_id="pad", target="/" + "x" * (RESERVE_START - len(chain.data) - 8 - base), kind="tmpfs")
    note = MAX_PAYLOAD - len(chain.payload(Kind.RETIREMENT_INTENT, note=""))
    ledger.retirement_intent(note="<" * note)
    ledger.retired(note="&" * note)
    return chain.bytes()


def full_journal_of_ampersand_targets() -> bytes:
    """Filled to the reserve with host mounts whose 4,000-byte targets are all '&', the costliest byte to escape."""
    ledger = ChainLedger()
    chain = ledger.chain
    number = 0
    while True:
        number += 1
        base = len(chain.payload(Kind.MOUNT_INTENT, op_id=f"m{number}", target="/", kind="tmpfs"))
        room = min(MAX_PAYLOAD - base, RESERVE_START - len(chain.data) - 8 - base)
        if room < 1:
            return chain.bytes()
        ledger.mount_intent(op_id=f"m{number}", target="/" + "&" * room, kind="tmpfs")


def test_a_journal_of_costly_strings_gives_a_bounded_page():
    """J2: every byte of a full journal needing escape makes the page at most six times the cap, the SVG small."""
    data = full_journal_of_ampersand_targets()
    reading = read_journal(data)
    assert reading.verdict is Verdict.VALID and len(data) == RESERVE_START
    page = render_html(reading, "journal")
    svg = re.search(r"<svg.*?</svg>", page, re.S).group(0)
    assert len(page) < 6 * CAP and len(svg) < CAP / 2


def test_replay_of_a_full_journal_is_bounded():
    """J2: a full 262,144-byte journal of over a thousand lanes renders a page of bounded height and size: the
    first and the last rows, and a count of the rows not drawn."""
    data = full_journal_of_tiny_sandboxes()
    reading = read_journal(data)
    assert (len(data), reading.verdict) == (CAP, Verdict.VALID) and len(reading.records) > 1_000
    page = render_html(reading, "journal")
    height = int(re.search(r'<svg[^>]* height="(\d+)"', page).group(1))
    sandboxes = len(reading.records) - 4
    rows = sandboxes + 3
    assert page.count('class="b">sandbox s') == MAX_ROWS - 1 - 3
    assert f"… {rows - (MAX_ROWS - 1)} rows not drawn" in page
    assert height < 500 + MAX_ROWS * 50 and len(page) < 2 * CAP
    assert '"b">sandbox s1<' in page and f'"b">sandbox s{sandboxes}<' in page and ">retired<" in page
    text = render_text(reading, "journal")
    assert text.count("\n") <= 2 * len(reading.records) + 10 and len(text) < 2 * CAP


def test_replay_is_deterministic(tmp_path):
    """The same journal gives the same bytes, whatever the hash seed or the process."""
    write_session(tmp_path, crashed=True)
    program = (
        f"import hashlib, sys; sys.path.insert(0, {str(REPO)!r}); from journal.files import load_for_review; "
        "from journal.reader import read_journal; from journal.replay import render_text; "
        "from journal.replay_html import render_html; reading = read_journal(load_for_review(sys.argv[1])[1]); "
        "print(hashlib.sha256((render_html(reading, 'j') + render_text(reading, 'j')).encode()).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-I", "-c", program, str(tmp_path)], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    reading = read_journal((tmp_path / "journal").read_bytes())
    local = hashlib.sha256((render_html(reading, "j") + render_text(reading, "j")).encode()).hexdigest() + "\n"
    assert digests == {local}


def test_replay_html_never_overwrites_a_different_file(capsys, tmp_path):
    """E4, F1: an existing identical page is accepted, a different one refused with 64 and left alone."""
    out_path = tmp_path / "timeline.html"
    assert run(capsys, "replay", str(GOLDEN / "every_kind.bin"), "--html", str(out_path))[0] == 0
    assert run(capsys, "replay", str(GOLDEN / "every_kind.bin"), "--html", str(out_path))[0] == 0
    before = out_path.read_bytes()
    code, _, err = run(capsys, "replay", str(GOLDEN / "minimal.bin"), "--html", str(out_path))
    assert code == 64 and "different bytes" in err and out_path.read_bytes() == before


def interpreter_for(uid: int, gid: int) -> str:
    """A Python of at least 3.11 that ``uid`` may execute (the venv's may live under root's home)."""
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3") or "", "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            probe = subprocess.run([candidate, "-I", "-c", "import sys; assert sys.version_info >= (3, 11)"],
                                   capture_output=True, user=uid, group=gid, extra_groups=[], timeout=30)
        except PermissionError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip("no Python 3.11 on this host is executable by the unprivileged test uid")


@pytest.mark.root
def test_verify_runs_unprivileged(sandbox_ids):
    """The reviewer tools need no privileges: verify runs as the unprivileged sandbox uid."""
    uid, gid = sandbox_ids
    python = interpreter_for(uid, gid)
    directory = tempfile.mkdtemp()
    try:
        os.chmod(directory, 0o755)
        shutil.copy(GOLDEN / "every_kind.bin", os.path.join(directory, "journal"))
        os.chmod(os.path.join(directory, "journal"), 0o644)
        program = f"import sys; sys.path.insert(0, {str(REPO)!r}); from executor.cli.main import main; sys.exit(main(sys.argv[1:]))"
        result = subprocess.run(
            [python, "-I", "-c", program, "journal", "verify", "--json", directory],
            capture_output=True, text=True, cwd="/", user=uid, group=gid, extra_groups=[], timeout=60,
        )
    finally:
        shutil.rmtree(directory)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "VALID"


def test_an_oversized_file_is_read_only_one_byte_past_the_cap(capsys, tmp_path):
    """J2: the tools read at most 262,145 bytes, enough to call a longer file OVER_CAP without reading it whole."""
    from journal.files import load_for_review
    from journal.format import CAP

    path = tmp_path / "journal"
    path.write_bytes(golden("full_to_cap.bin") + b"\x01" * 100_000)
    assert len(load_for_review(str(path))[1]) == CAP + 1
    code, out, _ = run(capsys, "verify", "--json", str(tmp_path))
    assert code == 1 and json.loads(out)["verdict"] == "OVER_CAP" and json.loads(out)["records"] == 65


def test_workflow_commands_in_a_handed_in_journal_are_neutralized_in_every_view(capsys, tmp_path):
    """E8: a journal handed to a reviewer is untrusted (zone 4); its printable text fields can still hold GitHub
    workflow commands (a mount target, a retirement note). show, replay and the HTML replay neutralize them."""
    hostile = "::error title=casebox::forged ##[warning]forged"
    ledger = ChainLedger()
    write_sandbox(ledger, "s-1-1", 100, mounts=("/usr", "/cap/##[warning]forged", "/::error::x"))
    ledger.retirement_intent(note=hostile)
    path = tmp_path / "journal"
    path.write_bytes(ledger.chain.bytes())
    for command in ("show", "replay"):
        _, out, err = run(capsys, command, str(path))
        for line in (out + err).splitlines():
            assert not line.lstrip().startswith("::") and "##[" not in line, line
        assert "#\\x23[warning]forged" in out
    page = render_html(read_journal(path.read_bytes()), "journal")
    assert "##[" not in page and "#\\x23[warning]forged" in page


# --- anchors: the seal marker and the caller's expectations (docs/journal-format.md, "Anchors") ----------

PLAN = make_plan(case_doc("c0", "pytest", ("t",), 1000, True, 0), case_doc("c1", "python-module", ("m",), 1000, True, 0))
PHASES = (("extract", "s-1"), ("resolve", "s-2"), ("fetch", "s-3"), ("install", "s-4"))


def sealed_evidence(tmp_path):
    """An evidence directory as verify leaves it: journal, seal.json, receipts and outputs of two cases."""
    stage = Stage(tmp_path / "evidence", PLAN, phases=PHASES)
    stage.journal_op(Run(), sandbox="s-1")
    stage.run("c0", Run("TIMEOUT", 9), sandbox="s-5")
    stage.run("c1", Run("OUTPUT", 9), sandbox="s-6")
    marker = stage.seal()
    return stage.directory, marker


def edit_last_time(path) -> None:
    """One digit of the last record's ``at`` changed in place: the chain still decodes, only its head moves."""
    data = bytearray(path.read_bytes())
    last = read_journal(bytes(data)).records[-1]
    start = last.offset + 8 + last.payload.index(b'"at":') + len(b'"at":')
    end = start + last.payload[start - last.offset - 8:].index(b",")
    data[end - 1] = ord("1") if data[end - 1] != ord("1") else ord("2")
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def test_a_sealed_directory_is_anchored_by_its_seal_marker(capsys, tmp_path):
    """J4, issue 13: verify of a tombstone or evidence directory checks the journal against seal.json."""
    directory, marker = sealed_evidence(tmp_path)
    code, out, _ = run(capsys, "verify", str(directory))
    assert code == 0 and f": VALID (anchored by {directory}/seal.json), " in out
    code, out, _ = run(capsys, "verify", "--json", str(directory / "journal"))
    value = json.loads(out)
    assert code == 0 and value["anchored"] is True
    assert value["anchors"] == [{"source": f"{directory}/seal.json", "stage_id": marker.stage_id,
                                 "journal_id": marker.journal_id, "head": marker.head}]


def test_a_journal_whose_last_record_was_edited_is_substituted_against_its_seal(capsys, tmp_path):
    """J4, issue 13: one digit of RETIRED's at changed; alone the chain is VALID (unanchored), against its seal
    marker it is SUBSTITUTED and the reason names the head and the marker."""
    directory, marker = sealed_evidence(tmp_path)
    edit_last_time(directory / "journal")
    code, out, _ = run(capsys, "verify", str(directory))
    head = read_journal((directory / "journal").read_bytes()).head
    assert code == 1 and ": SUBSTITUTED, " in out
    assert f"the head is {head}, not {marker.head} as {directory}/seal.json says" in out
    for command in ("show", "replay"):
        assert run(capsys, command, str(directory))[0] == 1
    alone = tmp_path / "alone.bin"
    shutil.copy(directory / "journal", alone)
    code, out, _ = run(capsys, "verify", str(alone))
    assert code == 0 and ": VALID (unanchored), " in out
    assert json.loads(run(capsys, "verify", "--json", str(alone))[1])["anchored"] is False


def test_a_seal_marker_of_another_stage_names_every_difference(capsys, tmp_path):
    """J4: the reason says what differed: the stage, the journal id and the head, each against its source."""
    directory, marker = sealed_evidence(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(directory / "journal", other / "journal")
    forged = dataclasses.replace(marker, stage_id="s-other", journal_id="j-other", head="0" * 64)
    (other / "seal.json").write_bytes(forged.canonical_bytes())
    code, out, _ = run(capsys, "verify", str(other))
    assert code == 1 and "SUBSTITUTED" in out
    for clause in (f"bound to stage {marker.stage_id!r}, not 's-other'", f"journal {marker.journal_id!r}, not 'j-other'",
                   f"not {'0' * 64} as {other}/seal.json says"):
        assert clause in out, clause


def test_expect_journal_and_the_caller_s_anchor_beside_the_seal(capsys, tmp_path):
    """J4: --expect-journal is checked like --expect-stage; a flag that contradicts the seal is SUBSTITUTED."""
    directory, marker = sealed_evidence(tmp_path)
    assert run(capsys, "verify", str(directory), "--expect-journal", marker.journal_id)[0] == 0
    code, out, _ = run(capsys, "verify", str(directory), "--expect-journal", "j-other")
    assert code == 1 and f"the chain is journal {marker.journal_id!r}, not 'j-other' as --expect-journal says" in out
    code, out, _ = run(capsys, "verify", str(directory), "--expect-stage", marker.stage_id, "--expect-head", "1" * 64)
    assert code == 1 and "as --expect-stage and --expect-head says" in out
    code, out, _ = run(capsys, "verify", str(GOLDEN / "every_kind.bin"), "--expect-stage", "stage-1")
    assert code == 0 and ": VALID (unanchored), " in out, "a stage alone does not fix the head"


@pytest.mark.parametrize("seal", [b"{}", b"not json", b"x" * 5000])
def test_an_unreadable_seal_marker_is_refused_naming_it(capsys, tmp_path, seal):
    """F1: a seal marker that cannot anchor the journal is refused input, never silently ignored."""
    directory, _ = sealed_evidence(tmp_path)
    os.chmod(directory, 0o755)
    os.chmod(directory / "seal.json", 0o644)
    (directory / "seal.json").write_bytes(seal)
    code, out, err = run(capsys, "verify", str(directory))
    assert (code, out) == (64, "") and f"{directory}/seal.json" in err and err.count("\n") == 1


def test_show_prints_times_in_iso_8601(capsys):
    """Issue 13: a reviewer reads times, not microseconds; the JSON keeps both."""
    code, out, _ = run(capsys, "show", str(GOLDEN / "minimal.bin"))
    assert code == 0 and "created=2026-01-01T00:00:00.000000Z" in out and "1767225600000000" not in out
    value = json.loads(run(capsys, "show", "--json", str(GOLDEN / "minimal.bin"))[1])
    assert value["schema"] == "casebox.journal-show.v1"
    assert value["entries"][0]["time"] == "2026-01-01T00:00:00.000000Z"
    assert value["entries"][0]["fields"]["created"] == 1767225600000000


def test_replay_with_evidence_names_each_sandbox_and_the_limit_of_each_kill(capsys, tmp_path):
    """Issue 13: the receipts say which sandbox was which phase or case, and why a SIGKILL happened."""
    directory, _ = sealed_evidence(tmp_path)
    code, out, _ = run(capsys, "replay", str(directory), "--evidence", str(directory))
    assert code == 0 and f"VALID (anchored by {directory}/seal.json)" in out
    assert "sandbox s-1 (extract)" in out and "sandbox s-5 (case c0)" in out and "sandbox s-6 (case c1)" in out
    assert "killed by SIGKILL (9) (raw 9), reaped by launcher, limit class TIMEOUT" in out
    assert "limit class OUTPUT" in out
    html = tmp_path / "replay.html"
    assert run(capsys, "replay", str(directory), "--evidence", str(directory), "--html", str(html))[0] == 0
    assert "SIGKILL (TIMEOUT)" in html.read_text()
    plain = run(capsys, "replay", str(directory))[1]
    assert "limit class" not in plain
