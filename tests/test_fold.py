"""C7, C8: one public process diagnostic by a fixed global priority, whatever the order of the outcomes."""

from __future__ import annotations

import itertools
import random
import re

from journal.format import Kind
from journal.reader import read_journal
from journal_support import Chain
from steward import cleanup, fold

CLEAN = dict(journal="VALID", helper=("CLEANED",), privileged_statuses=(0, 0, 0), outer_absent=(True,), cleanup="CLEANED", ending="CLOSED")


def outcomes(**changes) -> fold.Outcomes:
    return fold.Outcomes(**{**CLEAN, **changes})


# One change per code, in the table's order; each warrants exactly its own code.
TRIGGERS = [
    ("JOURNAL_NOT_VALID", dict(journal="TORN")),
    ("HELPER_UNREAPED", dict(helper=("UNREAPED",))),
    ("HELPER_SIGNALLED", dict(helper=("SIGNALLED",))),
    ("HELPER_NONZERO", dict(helper=("NONZERO",))),
    ("HELPER_INVALID", dict(helper=("INVALID",))),
    ("HELPER_MISSING", dict(helper=("MISSING", "MISSING", "MISSING"))),
    ("HELPER_NOT_RUN", dict(helper=())),
    ("PRIVILEGED_UNREAPED", dict(privileged_statuses=(0, None))),
    ("PRIVILEGED_NONZERO", dict(privileged_statuses=(0, 256))),
    ("OUTER_UNPROVEN", dict(outer_absent=(True, False))),
    ("CLEANUP_UNVERIFIED", dict(cleanup="UNVERIFIED")),
    ("INTERRUPTED", dict(ending="INTERRUPTED")),
    ("SESSION_ABANDONED", dict(ending="ABANDONED")),
    ("SESSION_IDLE", dict(ending="IDLE")),
    ("SHUTDOWN", dict(ending="SHUTDOWN")),
    ("SESSION_RECOVERED", dict(ending="RECOVERED")),
]


def test_a_clean_session_is_verified():
    """C8: everything clean, every privileged status 0: VERIFIED."""
    assert fold.diagnostic(outcomes()) == "VERIFIED"


def test_each_outcome_warrants_its_code():
    for code, change in TRIGGERS:
        assert fold.codes(outcomes(**change)) == {code}, code
        assert fold.diagnostic(outcomes(**change)) == code


# The outcomes a session holds several of: two triggers in one of these both happen, side by side. Every other
# field holds one value (one journal verdict, one last helper attempt, one cleanup, one ending).
REPEATED = ("privileged_statuses", "outer_absent")


def both(first: dict, second: dict) -> dict | None:
    """The changes of two triggers in one session, or None where they set the same single-valued outcome (a
    session ends one way, and only its last helper attempt speaks), so no session can warrant both."""
    merged = dict(first)
    for field, value in second.items():
        if field not in merged:
            merged[field] = value
        elif field in REPEATED:
            merged[field] = merged[field] + value
        else:
            return None
    return merged


def test_the_highest_priority_code_wins_over_every_lower_one():
    """C7: for every pair of outcomes one session can hold, both codes apply and the one earlier in the table
    names the diagnostic; the pairs no session can hold are exactly those of one helper or one ending."""
    exclusive = []
    for (high, first), (low, second) in itertools.combinations(TRIGGERS, 2):
        merged = both(first, second)
        if merged is None:
            exclusive.append((high, low))
            continue
        if (high, low) == ("PRIVILEGED_NONZERO", "INTERRUPTED"):
            # The one exception, by design: the interruption's own kills warrant no code.
            assert fold.codes(outcomes(**merged)) == {"INTERRUPTED"}
            continue
        assert fold.codes(outcomes(**merged)) == {high, low}, (high, low)
        assert fold.diagnostic(outcomes(**merged)) == high, (high, low)
    helper = [code for code, change in TRIGGERS if "helper" in change]
    endings = [code for code, change in TRIGGERS if "ending" in change]
    assert len(helper) == 6 and len(endings) == 5
    assert exclusive == [*itertools.combinations(helper, 2), *itertools.combinations(endings, 2)]


def test_the_diagnostic_does_not_depend_on_the_order_outcomes_happened_in():
    """C7: shuffling the privileged statuses and outer claims never changes the answer."""
    generator = random.Random(7)
    for _ in range(200):
        statuses = [generator.choice([0, 0, 0, 256, 9, None]) for _ in range(5)]
        claims = [generator.choice([True, True, False]) for _ in range(3)]
        expected = fold.diagnostic(outcomes(privileged_statuses=tuple(statuses), outer_absent=tuple(claims)))
        for _ in range(5):
            generator.shuffle(statuses)
            generator.shuffle(claims)
            assert fold.diagnostic(outcomes(privileged_statuses=tuple(statuses), outer_absent=tuple(claims))) == expected


def test_a_missing_attempt_that_a_successor_followed_is_superseded():
    """C6: only the last attempt speaks; a MISSING one followed by an accepted one is not a failure."""
    assert fold.diagnostic(outcomes(helper=("MISSING", "CLEANED"))) == "VERIFIED"
    assert fold.diagnostic(outcomes(helper=("MISSING", "NONZERO"))) == "HELPER_NONZERO"


def test_the_table_in_docs_is_the_table_in_code(repo):
    """docs/cleanup.md lists the priority table in exactly the code's order."""
    text = (repo / "docs" / "cleanup.md").read_text()
    section = text[text.index("## The fold"):]
    documented = re.findall(r"^\| \d+ \| `([A-Z_]+)` \|", section, re.MULTILINE)
    assert documented == list(fold.CODES)


def _journal(*statuses: tuple[str, int]):
    chain = Chain(stage_id="s-1")
    for number, (role, status) in enumerate(statuses, 1):
        op = f"sb.{role}-{number}"
        chain.add(Kind.PROCESS_INTENT, op_id=op, role=role, pid=100 + number, starttime=5, pgid=100)
        chain.add(Kind.PROCESS_TERMINAL, op_id=op, wait_status=status, reaper="steward")
    chain.add(Kind.PROCESS_INTENT, op_id="helper-1", role="helper", pid=99, starttime=5, pgid=99)
    chain.add(Kind.PROCESS_TERMINAL, op_id="helper-1", wait_status=0, reaper="steward")
    chain.add(Kind.HELPER_ATTEMPT, attempt=1, response_digest="0" * 64, outcome="CLEANED")
    return read_journal(chain.bytes())


def test_only_privileged_processes_need_status_zero():
    """C8: a nonzero op (role descendant, the candidate's) leaves the session verified; a nonzero launcher does not."""
    claimed = [("sb", 100, True)]
    op_failed = _journal(("launcher", 0), ("namespace", 0), ("descendant", 256))
    assert cleanup.journal_diagnostic(op_failed, "CLOSED", True, claimed) == "VERIFIED"
    launcher_failed = _journal(("launcher", 256), ("namespace", 0), ("descendant", 0))
    assert cleanup.journal_diagnostic(launcher_failed, "CLOSED", True, claimed) == "PRIVILEGED_NONZERO"


def test_an_interrupted_session_is_interrupted_not_a_failed_proof():
    """C7, issue 13: the interruption killed the sandboxes, so a nonzero launcher is no code of its own; a proof
    that failed still comes first."""
    killed = outcomes(ending="INTERRUPTED", privileged_statuses=(0, 9, 9))
    assert fold.codes(killed) == {"INTERRUPTED"} and fold.diagnostic(killed) == "INTERRUPTED"
    assert fold.diagnostic(outcomes(ending="ABANDONED", privileged_statuses=(0, 9))) == "PRIVILEGED_NONZERO"
    assert fold.diagnostic(outcomes(ending="INTERRUPTED", privileged_statuses=(9, None))) == "PRIVILEGED_UNREAPED"
    assert fold.diagnostic(outcomes(ending="INTERRUPTED", cleanup="UNVERIFIED")) == "CLEANUP_UNVERIFIED"
    assert not fold.verified(fold.diagnostic(outcomes(ending="INTERRUPTED")))


def test_a_sandbox_without_an_outer_claim_is_unproven():
    """C3: only the runner claims the outer group; a sandbox the journal knows but nobody claimed is not absent."""
    reading = _journal(("launcher", 0), ("namespace", 0))
    assert cleanup.journal_diagnostic(reading, "CLOSED", True, []) == "OUTER_UNPROVEN"
    assert cleanup.journal_diagnostic(reading, "CLOSED", True, [("sb", 100, True)]) == "VERIFIED"


def test_every_way_a_session_ends_is_a_retirement_note_recovery_reads_back():
    """C5, C7: each ending the session and recovery write (and its diagnostic) parses back from the note, so
    `stage list` and `stage recover` name it; an ending the fold does not know is refused by the session."""
    import pytest

    from steward import retirement
    from steward.session import ENDINGS

    for ending in (*ENDINGS, "CLOSED", "RECOVERED"):
        code = fold.diagnostic(outcomes(ending=ending))
        assert retirement.parse_note(retirement.note(ending, code)) == (ending, code)
    assert set(ENDINGS) < set(fold.SESSION_ENDINGS)
    assert retirement.parse_note("session=LOST diagnostic=VERIFIED") is None
    with pytest.raises(ValueError):
        from steward.session import Session

        Session.end(object.__new__(Session), "CLOSED")
