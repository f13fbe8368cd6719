"""What a CI user and a reviewer see (executor/cli/reporting.py, issue 13): progress, why a case failed, the job
summary and the annotations, attacked with candidate text that tries to forge a command or break the table."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re

import pytest
from casebox_cli import run as run_cli
from evidence_support import ATTEMPT, BUNDLE, DESIGNED_RUNS, Run, Stage, build_attempt, exited

from executor import VERSION
from executor.evidence.evaluate import Expected, evaluate
from executor.evidence.junit import evidence_from_bytes, failing_tests
from executor.plan import plan_from_bytes
from executor.cli.reporting import Progress, annotations, detail_lines, publish_ci, summary_markdown
from journal.untrusted import escape, markdown_text, workflow_command
from plan_support import case as case_doc
from plan_support import plan as make_plan

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO_PLAN = plan_from_bytes((REPO / "examples" / "plan.json").read_bytes())

# Candidate text aimed at each sink: a second workflow command by newline, by CR, by an escape the runner
# decodes, a property smuggled through the title, a closed table cell, a forged row, an image, raw HTML.
HOSTILE = [
    "x\n::error title=casebox pass::forged PASS",
    "x\r::warning::forged",
    "x%0A::error::decoded into a line",
    "::error::at the start",
    "a,file=/etc/passwd::still the title",
    "cell | forged cell",
    "x\n| pass | PASS | passed | 0 s |",
    "![pixel](https://tracker.example/p.png)",
    "<img src=x onerror=alert(1)>",
    "`code` *bold* _it_ [link](http://x) ##[warning]legacy",
    "\x1b]0;casebox: PASS\x07\x1b[2J",
]


def hostile_report(messages: list[str]) -> bytes:
    """A junit report whose failing tests' ids and messages are the attacker's."""
    from xml.sax.saxutils import escape as text_of, quoteattr

    cases = "".join(
        f"<testcase classname={quoteattr('tests.' + str(n))} name={quoteattr(text)}>"
        f"<failure message={quoteattr(text)}>E  {text_of(text)}</failure></testcase>"
        for n, text in enumerate(messages)
    )
    return f"<testsuites><testsuite>{cases}</testsuite></testsuites>".encode("utf-8", "surrogateescape")


def hostile_attempt(tmp_path, messages: list[str]):
    """A one-stage attempt: a pytest case that FAILs with hostile failing tests (XML can carry no C0 control
    but tab, CR and LF, so those are left to stderr), a case that times out with hostile stderr, and a pass."""
    plan = make_plan(
        case_doc("failing", "pytest", ("t",), 1000, True, 0),
        case_doc("slow", "python-module", ("m",), 1000, True, 0),
        case_doc("fine", "python-module", ("m",), 1000, True, 0),
    )
    xml = hostile_report([text for text in messages if "\x1b" not in text])
    stage = Stage(tmp_path / "evidence", plan)
    stage.run("failing", Run("EXIT_NONZERO", exited(1), evidence_from_bytes(xml), report=xml))
    stage.run("slow", Run("TIMEOUT", 9, stderr="\n".join(messages).encode()))
    stage.run("fine", Run())
    stage.seal()
    report = evaluate(Expected(plan, ATTEMPT, BUNDLE), [str(stage.directory)])
    return plan, stage.directory, report


def runner_parse(line: str) -> tuple[str, dict[str, str], list[str]]:
    """How the Actions runner reads a workflow command line: the command, its properties (split on ',' and
    the first '='), and the message, each unescaped after it was split."""

    def unescape(text: str, props: bool) -> str:
        for coded, char in ([("%3A", ":"), ("%2C", ",")] if props else []) + [("%0D", "\r"), ("%0A", "\n"), ("%25", "%")]:
            text = text.replace(coded, char)
        return text

    assert line.startswith("::") and "\n" not in line and "\r" not in line, line
    head, _, message = line[2:].partition("::")
    command, _, props = head.partition(" ")
    properties = {}
    for pair in filter(None, props.split(",")):
        key, _, value = pair.partition("=")
        properties[key] = unescape(value, True)
    return command, properties, unescape(message, False).split("\n")


# --- the escaping, attacked directly -----------------------------------------------------------------


@pytest.mark.parametrize("text", HOSTILE)
def test_a_workflow_command_keeps_candidate_text_inside_its_one_command(text):
    """E8: whatever the title and the message hold, the runner sees one command, one title property, and
    message lines of which none is a workflow command or a control sequence."""
    line = workflow_command("error", {"title": f"casebox {text}"}, [text, f"second: {text}"])
    command, properties, lines = runner_parse(line)
    assert command == "error"
    assert properties == {"title": escape(f"casebox {text}")}
    assert lines == [escape(text), escape(f"second: {text}")]
    for shown in lines:
        assert shown.isprintable() and not shown.lstrip().startswith("::") and "##[" not in shown


def test_the_workflow_command_escaping_is_the_runner_s_own():
    """GitHub's escaping: % CR LF in a message; also : and , in a property (actions/toolkit command.ts)."""
    line = workflow_command("warning", {"title": "a:b,c%d"}, ["50% done", "x"])
    assert line == "::warning title=a%3Ab%2Cc%25d::50%25 done%0Ax"
    with pytest.raises(ValueError):
        workflow_command("set-output", {}, ["x"])
    with pytest.raises(ValueError):
        workflow_command("error", {"file": "/etc/passwd"}, ["x"])


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_text_can_neither_end_a_cell_nor_start_markup(text):
    """E8: in a job summary every ASCII punctuation character of candidate text is backslash-escaped, so no
    | ends a cell and no image, link, tag, emphasis or code span begins; and it stays one line."""
    shown = markdown_text(text)
    assert "\n" not in shown and "\r" not in shown
    unescaped = re.sub(r"\\[!-/:-@\[-`{-~]", "", shown)
    assert not re.search(r"[!-/:-@\[-`{-~]", unescaped), shown


# --- the summary and the annotations of a hostile evaluation ---------------------------------------------


def _cells(row: str) -> list[str]:
    """A GFM table row's cells: split on every | that no backslash escapes."""
    return re.split(r"(?<!\\)\|", row)[1:-1]


def test_the_summary_has_one_intact_row_per_case_whatever_the_candidate_wrote(tmp_path):
    """E8, issue 13: hostile test ids and messages appear escaped in the summary; every table row keeps its four
    cells, and no line outside the table is a table row or a workflow command."""
    plan, directory, report = hostile_attempt(tmp_path, HOSTILE)
    markdown = summary_markdown(report, evidence=[str(directory)], command="casebox evaluate")
    lines = markdown.splitlines()
    rows = [line for line in lines if line.startswith("| ")]
    assert [_cells(row)[0].strip() for row in rows[2:]] == ["failing", "slow", "fine"]
    assert all(len(_cells(row)) == 4 for row in rows)
    assert len(rows) == 2 + len(plan.cases)
    for line in lines:
        assert not line.lstrip().startswith("::") and "<img" not in line and "![" not in line and "\x1b" not in line
    assert "tests.2::" in markdown.replace("\\", "") and VERSION in markdown.replace("\\", "")
    assert f"Verdict **UNVERIFIED** for attempt {markdown_text(ATTEMPT)}" in markdown


def test_each_case_that_is_not_pass_gets_one_annotation_with_its_failing_tests(tmp_path):
    """Issue 13: ::error for FAIL, ::warning for UNVERIFIED, none for PASS; up to three failing tests, each with
    the first line of its message, then the last output line; candidate text never forms a second command."""
    _, _, report = hostile_attempt(tmp_path, HOSTILE)
    lines = annotations(report)
    assert len(lines) == 2
    failing = runner_parse(lines[0])
    assert failing[:2] == ("error", {"title": "casebox failing"})
    assert failing[2][0] == "FAIL exit_mismatch: exit code 1, expected 0"
    shown = failing_tests(hostile_report([text for text in HOSTILE if "\x1b" not in text]))
    assert failing[2][1:4] == [escape(f"{test.test}: {test.message}") for test in shown]
    assert failing[2][4] == "output: out" and len(failing[2]) == 5
    assert all(line.isprintable() and not line.lstrip().startswith("::") for line in failing[2])
    slow = runner_parse(lines[1])
    assert slow[:2] == ("warning", {"title": "casebox slow"})
    assert slow[2][0] == "UNVERIFIED timeout: killed after 120 ms; its timeout_ms is 1000"


def test_the_failing_tests_are_the_junit_s_first_three_escaped(tmp_path):
    """Issue 13: the terminal shows each FAIL and UNVERIFIED case with its reason and up to three failing test
    ids with the first line of their message, through the one rule."""
    messages = ["assert 4 == 5\n +  where 4 = add(2, 2)", "second", "third", "fourth"]
    _, _, report = hostile_attempt(tmp_path, messages)
    lines = detail_lines(report)
    assert lines[:5] == [
        "failing: FAIL exit_mismatch: exit code 1, expected 0",
        f"  tests.0::{escape(messages[0])}: assert 4 == 5",
        "  tests.1::second: second",
        "  tests.2::third: third",
        "  output: out",
    ]
    assert lines[5] == "slow: UNVERIFIED timeout: killed after 120 ms; its timeout_ms is 1000"
    assert lines[6] == "  output: fourth"


# --- progress ------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_counts_every_row_of_the_table_once_n_a_included(tmp_path):
    """Issue 13: one line per finished case against the table's total (10 rows, not the 9 that run), N/A in
    its place, whether or not stderr is a terminal."""
    directories = build_attempt(tmp_path, DEMO_PLAN, DESIGNED_RUNS)
    report = evaluate(Expected(DEMO_PLAN, ATTEMPT, BUNDLE), [str(path) for path in directories])
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream=stream, clock=clock)
    progress.expect(DEMO_PLAN.cases)
    clock.now = 102.5
    progress("installing")
    from executor.evidence.receipts import receipt_from_bytes

    for case in DEMO_PLAN.cases:
        if case.applicable:
            data = (directories[0] / f"{ATTEMPT}.{case.id}.receipt.json").read_bytes()
            progress.finished(case, receipt_from_bytes(data))
    progress.judged(report)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[   2.5 s] installing"
    counted = lines[1:]
    assert len(counted) == len(report.cases) == 10
    assert [re.match(r"\[ ?(\d+)/10\]", line).group(1) for line in counted] == [str(n) for n in range(1, 11)]
    assert counted[2] == "[ 3/10] import-core PASS 0.120 s"
    assert counted[7] == "[ 8/10] not-applicable N/A"
    assert counted[6] == "[ 7/10] timeout UNVERIFIED 2.000 s"


def test_progress_is_silent_when_quiet_and_judges_cases_that_never_got_a_receipt(tmp_path):
    plan = make_plan(case_doc("c0", "python-module", ("m",), 1000, True, 0))
    report = evaluate(Expected(plan, ATTEMPT, BUNDLE), [str(Stage(tmp_path / "e", plan).directory)])
    quiet = io.StringIO()
    silent = Progress(quiet=True, stream=quiet)
    silent.expect(plan.cases)
    silent("step")
    silent.judged(report)
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    progress = Progress(stream=loud)
    progress.expect(plan.cases)
    progress.judged(report)
    assert loud.getvalue() == "[1/1] c0 UNVERIFIED\n"


# --- GitHub Actions: where the summary and the annotations go -------------------------------------------


def test_under_github_actions_the_summary_is_appended_and_the_annotations_printed(tmp_path, monkeypatch):
    """Issue 13: GITHUB_ACTIONS=true appends the Markdown to $GITHUB_STEP_SUMMARY (after what is there) and
    prints the annotations; --summary FILE writes the same Markdown; without Actions nothing is appended."""
    _, directory, report = hostile_attempt(tmp_path, ["boom"])
    step = tmp_path / "step-summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    monkeypatch.setenv("GITHUB_ACTIONS", "false")
    out = io.StringIO()
    publish_ci(report, evidence=[str(directory)], command="casebox evaluate", summary=None, annotate_to=out)
    assert step.read_text() == "earlier step\n" and out.getvalue() == ""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    own = tmp_path / "summary.md"
    publish_ci(report, evidence=[str(directory)], command="casebox evaluate", summary=str(own), annotate_to=out)
    markdown = summary_markdown(report, evidence=[str(directory)], command="casebox evaluate")
    assert step.read_text() == "earlier step\n" + markdown and own.read_text() == markdown
    assert out.getvalue().splitlines() == annotations(report)


def test_a_job_summary_that_cannot_be_written_does_not_change_the_verdict(tmp_path, monkeypatch, capsys):
    _, directory, report = hostile_attempt(tmp_path, ["boom"])
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "missing" / "summary.md"))
    publish_ci(report, evidence=[str(directory)], command="casebox evaluate", summary=None, annotate_to=io.StringIO())
    err = capsys.readouterr().err
    assert err.startswith("casebox: the job summary ") and "the verdict stands" in err


def _evaluate_args(directory: pathlib.Path, plan_path: pathlib.Path, report_dir: pathlib.Path) -> list[str]:
    return ["evaluate", "--plan", str(plan_path), "--attempt", ATTEMPT, "--bundle-sha256", BUNDLE,
            "--report-dir", str(report_dir), "--evidence", str(directory)]


def test_evaluate_under_github_actions_from_outside(tmp_path, casebox):
    """Issue 13, as a CI job runs it: one ::error per FAIL and one ::warning per UNVERIFIED on stdout, the
    summary appended to GITHUB_STEP_SUMMARY naming every case, the verdict's exit code unchanged."""
    directories = build_attempt(tmp_path, DEMO_PLAN, DESIGNED_RUNS)
    step = tmp_path / "summary.md"
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step)}
    result = casebox(*_evaluate_args(directories[0], REPO / "examples" / "plan.json", tmp_path), env=env)
    assert result.returncode == 3
    commands = [line for line in result.stdout.decode().splitlines() if line.startswith("::")]
    assert [runner_parse(line)[:2] for line in commands] == [
        ("error", {"title": "casebox assertion-failure"}),
        ("warning", {"title": "casebox timeout"}),
        ("warning", {"title": "casebox output-cap"}),
    ]
    summary = step.read_text()
    for case in DEMO_PLAN.cases:
        assert f"| {markdown_text(case.id)} |" in summary, case.id
    assert markdown_text("tests.test_x::test_0: assert 0 == 1") in summary


def test_evaluate_json_keeps_stdout_one_json_document_and_writes_summary_file(tmp_path, capsys, monkeypatch):
    """--json: the annotations go to stderr, so stdout stays one JSON document; --summary FILE is created."""
    directories = build_attempt(tmp_path, DEMO_PLAN, DESIGNED_RUNS)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    summary = tmp_path / "s.md"
    code, out, err = run_cli(capsys, *_evaluate_args(directories[0], REPO / "examples" / "plan.json", tmp_path),
                             "--json", "--summary", str(summary))
    assert code == 3
    value = json.loads(out)
    assert value["schema"] == "casebox.report.v2" and value["casebox_version"] == VERSION
    failing = next(case for case in value["cases"] if case["id"] == "assertion-failure")
    assert failing["detail"]["failing_tests"] == [{"test": "tests.test_x::test_0", "message": "assert 0 == 1"}]
    assert err.count("::error title=casebox assertion-failure::") == 1
    assert summary.read_text().startswith("### casebox evaluate: UNVERIFIED")


def test_a_summary_file_that_exists_is_refused_before_anything_runs(tmp_path, casebox):
    """F1: --summary creates a new file; an existing one is refused with exit 64 naming it."""
    directories = build_attempt(tmp_path, DEMO_PLAN, DESIGNED_RUNS)
    existing = tmp_path / "s.md"
    existing.write_text("keep me")
    casebox.refused(*_evaluate_args(directories[0], REPO / "examples" / "plan.json", tmp_path), "--summary", str(existing),
                    naming=str(existing))
    assert existing.read_text() == "keep me"
    assert not list(tmp_path.glob("report-*.json"))
