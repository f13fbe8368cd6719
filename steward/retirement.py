"""C5: retirement of a stage into a sealed tombstone, its five states, and how each converges.

The cleanup writer, holding the stage's journal writer:

1. appends RETIREMENT_INTENT (its note says how the session ended and its
   diagnostic);
2. renames ``stages/<id>`` to ``tombstones/<id>`` with
   ``renameat2(RENAME_NOREPLACE)``, then fsyncs ``tombstones/`` and
   ``stages/``;
3. appends RETIRED;
4. seals the tombstone: everything root-owned, files 0444, directories 0555,
   each directory fsynced, then the seal marker ``seal.json`` (journal/seal.py)
   holding the final head, created once.

The five states, each decided from what is on disk:

| state | where | journal ends with | next step |
|---|---|---|---|
| ACTIVE | stages/ | anything before retirement | cleanup, then 1 |
| INTENT | stages/ | RETIREMENT_INTENT | 2 |
| RENAMED | tombstones/ | RETIREMENT_INTENT | fsync both parents, 3 |
| RETIRED | tombstones/ | RETIRED, no seal marker | 4 |
| SEALED | tombstones/ | RETIRED, a marker bound to its head | nothing: the sealed state appends nothing |

Anything else is PRESERVED and left untouched: a journal that is not VALID
(J4: missing, torn, corrupt, substituted, over cap), a stage and a tombstone
both present, RETIRED in a stage that was never renamed, a marker that does
not match its journal, a symlink or a foreign owner.

One stage is neither: an UNBORN stage, whose journal was never begun. It
holds nothing but, at most, a journal with no record in it (the steward died,
or the disk was full, between making the directory and its durable GENESIS).
Every effect of a stage follows a durable record of it (J1), and it has none,
so nothing can have run in it and it holds no evidence: the steward that
made it removes it at once, and recovery removes it after proving its host
residue gone (:func:`remove_unborn`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import stat

from journal.createonly import publish_once
from journal.errors import Refused
from journal.files import JOURNAL_NAME, read_evidence
from journal.format import CAP
from journal.format import Kind
from journal.reader import Reading, Verdict, read_journal
from journal.seal import NAME as SEAL_NAME
from journal.seal import SEAL_MAX_BYTES, SealMarker, seal_from_bytes
from launcher import syscalls as sc
from steward import fold, inventory
from steward.stateroot import STAGES, TOMBSTONES, StateRoot

ACTIVE, INTENT, RENAMED, RETIRED, SEALED, PRESERVED = "ACTIVE", "INTENT", "RENAMED", "RETIRED", "SEALED", "PRESERVED"
UNBORN, REMOVED = "UNBORN", "REMOVED"
FILE_MODE = 0o444
DIRECTORY_MODE = 0o555

AFTER_RETIREMENT_INTENT = "after_retirement_intent"
BEFORE_RENAME = "before_rename"
AFTER_RENAME = "after_rename"
AFTER_TOMBSTONES_FSYNC = "after_tombstones_fsync"
AFTER_STAGES_FSYNC = "after_stages_fsync"
AFTER_RETIRED = "after_retired"
AFTER_SEAL_MODES = "after_seal_modes"
AFTER_SEAL_MARKER = "after_seal_marker"
KILL_POINTS = (
    AFTER_RETIREMENT_INTENT, BEFORE_RENAME, AFTER_RENAME, AFTER_TOMBSTONES_FSYNC, AFTER_STAGES_FSYNC,
    AFTER_RETIRED, AFTER_SEAL_MODES, AFTER_SEAL_MARKER,
)
_NOTE = re.compile(rf"session=({'|'.join(fold.SESSION_ENDINGS)}) diagnostic=([A-Z_]+)\Z")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def note(ending: str, diagnostic: str) -> str:
    """The retirement records' note: how the session ended and its public process diagnostic (C7)."""
    return f"session={ending} diagnostic={diagnostic}"


def parse_note(text: str) -> tuple[str, str] | None:
    match = _NOTE.match(text)
    return (match.group(1), match.group(2)) if match else None


def _pass(hook, point: str) -> None:
    if hook is not None:
        hook(point)


def rename(root: StateRoot, stage_id: str, hook=None) -> None:
    """Step 2: stages/<id> becomes tombstones/<id>, never over an existing one; both parents fsynced."""
    require_unmounted(root, stage_id)
    _pass(hook, BEFORE_RENAME)
    try:
        sc.renameat2(root.area(STAGES), stage_id, root.area(TOMBSTONES), stage_id, sc.RENAME_NOREPLACE)
    except FileExistsError:
        raise Refused(root.path_of(TOMBSTONES, stage_id), "already exists; a tombstone is never replaced") from None
    _pass(hook, AFTER_RENAME)
    fsync_parents(root, hook)


def fsync_parents(root: StateRoot, hook=None) -> None:
    os.fsync(root.area(TOMBSTONES))
    _pass(hook, AFTER_TOMBSTONES_FSYNC)
    os.fsync(root.area(STAGES))
    _pass(hook, AFTER_STAGES_FSYNC)


def require_unmounted(root: StateRoot, stage_id: str) -> None:
    """Nothing may be mounted at or under a stage that is renamed: the mount would move into the tombstone."""
    stage = root.path_of(STAGES, stage_id)
    mounted = inventory.mount_document(inventory.read_mountinfo(), root.path, stage)["under_stage"]
    if mounted:
        raise Refused(stage, f"still has {mounted[0]['mount_point']} mounted under it; a stage is retired only once nothing is")


def retire(root: StateRoot, stage_id: str, writer, text: str, hook=None) -> str:
    """Steps 1 to 3 from ACTIVE; the final head (after RETIRED)."""
    require_unmounted(root, stage_id)
    writer.retirement_intent(text)
    _pass(hook, AFTER_RETIREMENT_INTENT)
    rename(root, stage_id, hook)
    head = writer.retired(text)
    _pass(hook, AFTER_RETIRED)
    return head


def _seal_tree(fd: int, shown: str) -> None:
    """Root-owned, files 0444, directories 0555, bottom up; each directory fsynced. Symlinks are refused."""
    for name in sorted(os.listdir(fd)):
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            child = os.open(name, _DIRECTORY, dir_fd=fd)
            try:
                _seal_tree(child, f"{shown}/{name}")
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            try:
                os.fchown(entry, 0, 0)
                os.fchmod(entry, FILE_MODE)
            finally:
                os.close(entry)
        else:
            raise Refused(f"{shown}/{name}", "is not a regular file or directory; a tombstone holds nothing else")
    os.fchown(fd, 0, 0)
    os.fchmod(fd, DIRECTORY_MODE)
    os.fsync(fd)


def seal(root: StateRoot, stage_id: str, marker: SealMarker, hook=None) -> None:
    """Step 4: seal the tombstone's tree, then leave its seal marker, created once."""
    shown = root.path_of(TOMBSTONES, stage_id)
    fd = root.open_entry(TOMBSTONES, stage_id)
    try:
        _seal_tree(fd, shown)
        _pass(hook, AFTER_SEAL_MODES)
        publish_once(fd, SEAL_NAME, marker.canonical_bytes(), mode=FILE_MODE, shown=f"{shown}/{SEAL_NAME}")
        _pass(hook, AFTER_SEAL_MARKER)
    finally:
        os.close(fd)
    os.fsync(root.area(TOMBSTONES))


def marker_for(reading: Reading) -> SealMarker:
    genesis = reading.genesis
    return SealMarker(genesis["attempt_id"], genesis["stage_id"], genesis["journal_id"], reading.head)


@dataclasses.dataclass(frozen=True)
class Assessment:
    """Where a stage is, which of the five states it is in (or PRESERVED), and why."""

    stage_id: str
    location: str
    state: str
    verdict: str
    reason: str
    reading: Reading | None = None
    marker: SealMarker | None = None
    in_use: bool = False


def _read_entry(directory_fd: int, name: str, cap: int, shown: str) -> bytes | None:
    """The bytes of a root-owned regular file in a directory, or None when it is absent (F3)."""
    try:
        info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if info.st_uid != 0:
        raise Refused(shown, f"is owned by uid {info.st_uid}; everything in the state root is owned by root")
    try:
        data = read_evidence(directory_fd, name, cap)
    except Refused as refusal:
        raise Refused(shown, refusal.rule) from None
    if data is not None and len(data) > cap:
        raise Refused(shown, f"is larger than its {cap}-byte cap")
    return data


def journal_in_use(directory_fd: int) -> bool:
    """Whether a live writer holds the journal's lock: then its stage belongs to a running steward."""
    try:
        fd = os.open(JOURNAL_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _unborn(directory_fd: int, shown: str) -> Reading | None:
    """The reading of a stage directory's journal when the stage is UNBORN (nothing in it but, at most, a
    journal holding no record), else None."""
    names = os.listdir(directory_fd)
    if any(name != JOURNAL_NAME for name in names):
        return None
    reading = read_journal(_read_entry(directory_fd, JOURNAL_NAME, CAP + 1, f"{shown}/{JOURNAL_NAME}"))
    if reading.records or reading.verdict not in (Verdict.MISSING, Verdict.TORN):
        return None
    return reading


def remove_unborn(root: StateRoot, stage_id: str) -> bool:
    """Remove ``stages/<id>`` if it is UNBORN (checked again here); whether it was removed.

    The caller holds the dedicated UID's lease, as the steward does while it
    makes a stage, so a stage still being made is never taken for one.
    """
    try:
        fd = root.open_entry(STAGES, stage_id)
    except (OSError, Refused):
        return False
    try:
        if _unborn(fd, root.path_of(STAGES, stage_id)) is None or journal_in_use(fd):
            return False
        try:
            os.unlink(JOURNAL_NAME, dir_fd=fd)
        except FileNotFoundError:
            pass
    finally:
        os.close(fd)
    try:
        os.rmdir(stage_id, dir_fd=root.area(STAGES))
    except OSError:
        return False  # something appeared in it after all; it stays for recovery to judge
    os.fsync(root.area(STAGES))
    return True


def _exists(root: StateRoot, area: str, stage_id: str) -> bool:
    try:
        os.stat(stage_id, dir_fd=root.area(area), follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def assess(root: StateRoot, stage_id: str) -> Assessment:
    """The state of one stage or tombstone, from the disk alone; nothing is changed."""
    in_stages, in_tombstones = _exists(root, STAGES, stage_id), _exists(root, TOMBSTONES, stage_id)
    if in_stages and in_tombstones:
        return Assessment(stage_id, "both", PRESERVED, "", "both stages/ and tombstones/ hold it; nothing is changed until an operator decides")
    if not in_stages and not in_tombstones:
        return Assessment(stage_id, "none", PRESERVED, "MISSING", "neither stages/ nor tombstones/ holds it")
    area = STAGES if in_stages else TOMBSTONES
    location = "stage" if in_stages else "tombstone"
    try:
        fd = root.open_entry(area, stage_id)
    except Refused as refusal:
        return Assessment(stage_id, location, PRESERVED, "", refusal.sentence())
    try:
        shown = root.path_of(area, stage_id)
        in_use = journal_in_use(fd)
        try:
            unborn = _unborn(fd, shown) if in_stages else None
            data = _read_entry(fd, JOURNAL_NAME, CAP + 1, f"{shown}/{JOURNAL_NAME}")
            marker_bytes = None if in_stages else _read_entry(fd, SEAL_NAME, SEAL_MAX_BYTES, f"{shown}/{SEAL_NAME}")
        except Refused as refusal:
            return Assessment(stage_id, location, PRESERVED, "", refusal.sentence(), in_use=in_use)
    finally:
        os.close(fd)
    if unborn is not None:
        why = (f"its journal was never begun ({unborn.verdict}, no record): nothing can have run in it (J1), "
               "so recovery removes it")
        return Assessment(stage_id, location, UNBORN, str(unborn.verdict), why, unborn, None, in_use)
    marker = None
    if marker_bytes is not None:
        try:
            marker = seal_from_bytes(marker_bytes)
        except Refused as refusal:
            return Assessment(stage_id, location, PRESERVED, "", f"its seal marker is refused ({refusal.sentence()})")
    reading = read_journal(
        data,
        expect_stage_id=stage_id,
        expect_journal_id=marker.journal_id if marker else None,
        expect_head=marker.head if marker else None,
    )
    if reading.verdict is not Verdict.VALID:
        why = f"its journal is {reading.verdict} ({reading.reason}); only a VALID journal authorizes cleanup (J4)"
        return Assessment(stage_id, location, PRESERVED, str(reading.verdict), why, reading, marker, in_use)
    last = reading.records[-1].kind
    if marker is not None and (last is not Kind.RETIRED or marker.attempt_id != reading.genesis["attempt_id"]):
        return Assessment(stage_id, location, PRESERVED, "VALID", "its seal marker does not match its journal", reading, marker)
    if in_stages:
        if last is Kind.RETIRED:
            state, why = PRESERVED, "its journal says RETIRED but it was never renamed into tombstones/"
        elif last is Kind.RETIREMENT_INTENT:
            state, why = INTENT, "retirement intent is durable; the rename is next"
        else:
            state, why = ACTIVE, "no retirement intent yet"
    elif last is Kind.RETIREMENT_INTENT:
        state, why = RENAMED, "renamed; RETIRED is next"
    elif last is Kind.RETIRED:
        state, why = (SEALED, "sealed; nothing is left to do") if marker else (RETIRED, "retired; sealing is next")
    else:
        state, why = PRESERVED, "a tombstone whose journal holds no retirement intent"
    return Assessment(stage_id, location, state, "VALID", why, reading, marker, in_use)
