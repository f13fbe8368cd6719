"""C7, C8: one public process diagnostic per session, by a fixed global priority (docs/cleanup.md, "The fold").

Every outcome the session produced (the journal's verdict, each helper
attempt, each privileged process's raw wait status, each outer-group claim,
the cleanup evidence, how the session ended) contributes the codes it
warrants; the diagnostic is the code that comes first in :data:`PRIORITY`.
Because the answer depends only on which codes apply, never on the order the
outcomes happened in, a waitpid, nonzero or group failure stays visible
whatever came before or after it. Only ``VERIFIED`` is a fully verified
session (C8: every started privileged process has raw wait status 0, the
helper's response was accepted as CLEANED, every outer group was proved
absent, the cleanup evidence says CLEANED and the client closed the session).

An interrupted session (its client was stopped by SIGINT or SIGTERM and
retired it on the way out) is ``INTERRUPTED``: the steward killed its
sandboxes on purpose, so a privileged process's nonzero status is what the
interruption did and warrants no code of its own, while every code of a
failed proof still comes first.
"""

from __future__ import annotations

import dataclasses

from journal.reader import Verdict

# (code, when it applies), highest priority first. docs/cleanup.md holds the same table.
PRIORITY: tuple[tuple[str, str], ...] = (
    ("JOURNAL_NOT_VALID", "the journal's verdict is not VALID; no cleanup claim is authorized (J4)"),
    ("HELPER_UNREAPED", "a REMOVE_AND_PROVE helper could not be reaped"),
    ("HELPER_SIGNALLED", "a helper was killed by a signal"),
    ("HELPER_NONZERO", "a helper exited with a nonzero status"),
    ("HELPER_INVALID", "a helper's complete response was invalid"),
    ("HELPER_MISSING", "no helper attempt produced a complete response in time"),
    ("HELPER_NOT_RUN", "no helper attempt was recorded"),
    ("PRIVILEGED_UNREAPED", "a started privileged process has no recorded wait status (C1, C8)"),
    ("PRIVILEGED_NONZERO", "a privileged process ended with a raw wait status other than 0 (C8)"),
    ("OUTER_UNPROVEN", "an outer process group was not proved absent (C3)"),
    ("CLEANUP_UNVERIFIED", "the cleanup evidence is UNVERIFIED, or there is none (C4)"),
    ("INTERRUPTED", "the client was interrupted and retired the session on its way out; its sandboxes were killed"),
    ("RUNTIME_CHANGED", "the case runtime changed during the session, so its client ended it without exporting the receipts"),
    ("SESSION_ABANDONED", "the client went away before closing its session"),
    ("SESSION_IDLE", "the client sent nothing for the daemon's idle timeout; the daemon ended its session"),
    ("SHUTDOWN", "the daemon was stopped mid-session; it ended the running op and retired the session"),
    ("SESSION_RECOVERED", "the steward stopped mid-session; recovery closed it"),
    ("VERIFIED", "everything above is clean: the session is fully verified"),
)
CODES = tuple(code for code, _ in PRIORITY)
SESSION_ENDINGS = {
    "CLOSED": None, "ABANDONED": "SESSION_ABANDONED", "IDLE": "SESSION_IDLE", "SHUTDOWN": "SHUTDOWN",
    "INTERRUPTED": "INTERRUPTED", "RUNTIME_CHANGED": "RUNTIME_CHANGED", "RECOVERED": "SESSION_RECOVERED",
}
_HELPER_FAILURES = {
    "UNREAPED": "HELPER_UNREAPED",
    "SIGNALLED": "HELPER_SIGNALLED",
    "NONZERO": "HELPER_NONZERO",
    "INVALID": "HELPER_INVALID",
    "MISSING": "HELPER_MISSING",
}


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """Everything the fold reads, in no particular order."""

    journal: str
    helper: tuple[str, ...]
    privileged_statuses: tuple[int | None, ...]
    outer_absent: tuple[bool, ...]
    cleanup: str | None
    ending: str


def codes(outcomes: Outcomes) -> set[str]:
    """Every code the outcomes warrant."""
    found = set()
    if outcomes.journal != Verdict.VALID:
        found.add("JOURNAL_NOT_VALID")
    if not outcomes.helper:
        found.add("HELPER_NOT_RUN")
    # Only MISSING permits a successor, so every other failure is the last attempt; a MISSING that a
    # successor followed is superseded by it.
    if outcomes.helper and outcomes.helper[-1] in _HELPER_FAILURES:
        found.add(_HELPER_FAILURES[outcomes.helper[-1]])
    if any(status is None for status in outcomes.privileged_statuses):
        found.add("PRIVILEGED_UNREAPED")
    if outcomes.ending != "INTERRUPTED" and any(status not in (None, 0) for status in outcomes.privileged_statuses):
        found.add("PRIVILEGED_NONZERO")
    if not all(outcomes.outer_absent):
        found.add("OUTER_UNPROVEN")
    if outcomes.cleanup != "CLEANED":
        found.add("CLEANUP_UNVERIFIED")
    ending = SESSION_ENDINGS[outcomes.ending]
    if ending is not None:
        found.add(ending)
    return found


def diagnostic(outcomes: Outcomes) -> str:
    """The one public process diagnostic: the highest-priority code the outcomes warrant."""
    found = codes(outcomes) | {"VERIFIED"}
    return next(code for code in CODES if code in found)


def verified(code: str) -> bool:
    return code == "VERIFIED"
