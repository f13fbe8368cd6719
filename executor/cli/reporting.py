"""What a CI user and a reviewer see of an attempt: progress, why a case failed, the job summary, annotations.

- :class:`Progress`: one line per step with the time since the command
  started, and one per finished case (``[ 3/10] import-core PASS 0.012 s``),
  on standard error whether or not it is a terminal; ``--quiet`` silences
  it. Its total is the number of rows of the verdict table, N/A cases
  included, and every row is counted once.
- :func:`detail_lines`: for each case that is not PASS (or N/A), its status,
  reason and casebox's own sentence, then the failing tests of its junit
  report with the first line of each message and the last line of its
  output, from the evaluator's :class:`~executor.evidence.published.Detail`.
- :func:`summary_markdown` and :func:`annotations`: the same in GitHub
  Actions' terms, a Markdown job summary (a table of every case, the
  verdict, the attempt, the evidence) and one ``::error`` (FAIL) or
  ``::warning`` (UNVERIFIED) workflow command per case. :func:`publish_ci`
  writes the summary to ``--summary FILE`` and, under ``GITHUB_ACTIONS=true``,
  appends it to ``$GITHUB_STEP_SUMMARY`` and prints the annotations.

Every case id, test id, message and output line is untrusted text: it
reaches a terminal through :func:`executor.cli.frontend.say`, the summary
through :func:`journal.untrusted.markdown_text` and an annotation through
:func:`journal.untrusted.workflow_command`, never any other way (E8).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Sequence

from executor import VERSION
from executor.evidence.evaluate import FAIL, NOT_APPLICABLE, UNVERIFIED, CaseResult, Report, outcome_status
from executor.cli.frontend import say
from executor.plan import Case
from executor.evidence.receipts import Receipt
from journal.createonly import open_directory, publish_once
from journal.untrusted import escape, markdown_text, workflow_command

ANNOTATED = {FAIL: "error", UNVERIFIED: "warning"}


def seconds(wall_ms: int | None) -> str:
    return "-" if wall_ms is None else f"{wall_ms / 1000:.3f} s"


class Progress:
    """Progress lines on standard error; a callable, so every step that says what it does calls it."""

    def __init__(self, *, quiet: bool = False, stream=None, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet = quiet
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.rows: list[Case] = []
        self.told: set[str] = set()
        # verify --jobs: stages on worker threads report here at once; one line and one count at a time.
        self._lock = threading.RLock()

    def _say(self, line: str) -> None:
        if self.quiet:
            return
        stream = sys.stderr if self.stream is None else self.stream
        with self._lock:
            say(line, file=stream)
            stream.flush()

    def __call__(self, step: str) -> None:
        self._say(f"[{self.clock() - self.started:6.1f} s] {step}")

    def expect(self, cases: Sequence[Case]) -> None:
        """The cases the verdict table will show, in its order: the counter's total."""
        self.rows = list(cases)

    def _case(self, case_id: str, status: str, wall_ms: int | None) -> None:
        self.told.add(case_id)
        width = len(str(len(self.rows)))
        shown = "" if wall_ms is None else f" {seconds(wall_ms)}"
        self._say(f"[{len(self.told):>{width}}/{len(self.rows)}] {case_id} {status}{shown}")

    def _not_applicable_before(self, case_id: str) -> None:
        for case in self.rows:
            if case.id == case_id:
                return
            if not case.applicable and case.id not in self.told:
                self._case(case.id, NOT_APPLICABLE, None)

    def finished(self, case: Case, receipt: Receipt) -> None:
        """A case's receipt is stored: its status as the receipt alone gives it (the evaluator's step 5; the
        table's status also checks the journal and may be lower)."""
        status, _ = outcome_status(case, receipt)
        observed = receipt.outcome.observed
        with self._lock:
            self._not_applicable_before(case.id)
            self._case(case.id, status, observed.wall_ms if observed else None)

    def judged(self, report: Report) -> None:
        """The evaluation is done: every row not told yet (N/A, or a case that never got a receipt)."""
        for result in report.cases:
            if result.case_id not in self.told:
                self._case(result.case_id, result.status, result.wall_ms)


# -- why a case failed ------------------------------------------------------------------------------


def _headline(result: CaseResult) -> str:
    sentence = result.detail.sentence if result.detail is not None else None
    return f"{result.status} {result.reason}" + (f": {sentence}" if sentence else "")


def _evidence_lines(result: CaseResult) -> list[str]:
    """The untrusted lines of a case's detail: failing tests with their message, the last output line."""
    detail = result.detail
    if detail is None:
        return []
    lines = [f"{test.test}: {test.message}" if test.message else test.test for test in detail.failing]
    if detail.output_tail:
        lines.append(f"output: {detail.output_tail}")
    return lines


def _explained(report: Report) -> list[CaseResult]:
    return [result for result in report.cases if result.status in (FAIL, UNVERIFIED)]


def detail_lines(report: Report) -> list[str]:
    """For a terminal: each FAIL and UNVERIFIED case, its reason, failing tests and last output line."""
    lines = []
    for result in _explained(report):
        lines.append(f"{escape(result.case_id)}: {escape(_headline(result))}")
        lines += [f"  {escape(line)}" for line in _evidence_lines(result)]
    return lines


# -- GitHub Actions ----------------------------------------------------------------------------------


def summary_markdown(report: Report, *, evidence: Sequence[str], command: str) -> str:
    """The job summary: a table of every case, then why each case that is not PASS got its reason, then the
    verdict, the attempt and the evidence."""
    text = markdown_text
    expected = report.expected
    lines = [
        f"### {text(command)}: {text(report.verdict)}",
        "",
        "| case | status | reason | time |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {text(r.case_id)} | {text(r.status)} | {text(r.reason)} | {text(seconds(r.wall_ms))} |" for r in report.cases]
    explained = _explained(report)
    if explained or report.problems:
        lines.append("")
    for result in explained:
        lines.append(f"- **{text(result.case_id)}** {text(_headline(result))}")
        lines += [f"  - {text(line)}" for line in _evidence_lines(result)]
    lines += [f"- problem: {text(problem)}" for problem in report.problems]
    number = "any" if report.attempt_number is None else str(report.attempt_number)
    lines += [
        "",
        f"Verdict **{text(report.verdict)}** for attempt {text(expected.attempt_id)} (number {text(number)}), "
        f"bundle sha256 {text(expected.bundle_sha256)}; evidence: {text(', '.join(evidence))}; casebox {text(VERSION)}.",
        "",
    ]
    return "\n".join(lines)


def annotations(report: Report) -> list[str]:
    """One workflow command per case that is not PASS: ``::error`` for FAIL, ``::warning`` for UNVERIFIED."""
    return [
        workflow_command(ANNOTATED[result.status], {"title": f"casebox {result.case_id}"}, [_headline(result), *_evidence_lines(result)])
        for result in _explained(report)
    ]


def github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def _append_step_summary(markdown: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, markdown.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError as error:
        # The verdict is decided; a summary the runner gave us no room for does not change it.
        say(f"casebox: the job summary {path} cannot be written ({os.strerror(error.errno)}); the verdict stands.", file=sys.stderr)


def publish_ci(report: Report, *, evidence: Sequence[str], command: str, summary: str | None, annotate_to) -> None:
    """The Markdown summary to ``summary`` (created once) and, under GitHub Actions, to the job summary; then the
    annotations, one line each, on ``annotate_to``."""
    markdown = summary_markdown(report, evidence=evidence, command=command)
    if summary is not None:
        directory, name = os.path.split(os.path.abspath(summary))
        fd = open_directory(directory)
        try:
            publish_once(fd, name, markdown.encode("utf-8"), mode=0o644, shown=summary)
        finally:
            os.close(fd)
    if github_actions():
        _append_step_summary(markdown)
        for line in annotations(report):
            # Built whole by workflow_command: the one line a workflow command may be. say() would rightly
            # neutralize its leading "::".
            print(line, file=annotate_to)
