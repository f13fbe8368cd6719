"""``casebox stage recover``: drive each stage to a sealed tombstone, or say why it is preserved (C5, J4).

Each state converges (steward/retirement.py has the table):

- ACTIVE: the journal is reopened (only a VALID one ever is); the sandboxes'
  staging files and empty cgroups are removed; unless CLEANUP_EVIDENCE is
  already the last record, cleanup runs as the cleanup writer (helper
  attempts the journal still permits, inventories, CLEANUP_EVIDENCE); then
  retirement and the seal. The session ended without its client, so its
  diagnostic is at best SESSION_RECOVERED and its cleanup evidence UNVERIFIED;
  the outer groups of its sandboxes cannot be claimed by anyone but their
  dead runner (C3).
- INTENT: rename, fsync both parents, RETIRED (the intent's note), seal.
- RENAMED: fsync both parents, RETIRED, seal.
- RETIRED: seal; nothing is appended.
- SEALED: nothing at all.

An UNBORN stage (its journal never begun: nothing in it but, at most, a
journal holding no record) is **removed**, under the UID's lease, once the
host holds no process of the dedicated ids and no mount under it: by J1
nothing ran in it, and it holds no evidence.

Otherwise a stage whose journal is missing, torn, corrupt, substituted or
over the cap is **preserved**: its directory and journal are left exactly as they are,
and only what it left on the host is removed, with no claim written
anywhere: processes of the dedicated ids are killed and mounts under the
stage are detached, under the UID's lease. That is a deliberate outcome
(exit 0). Anything else that stops convergence (a stage and a tombstone both
present, a symlink or foreign owner, a seal marker that does not match) needs
an operator (exit 1). A stage whose journal a live steward holds is in use
and is left alone. Running recovery twice is safe: every step is idempotent
and the sealed state appends nothing.

A state root with no room left stops only the stage that needed it: that
stage is reported with the reason (``StateRoot.space_failure``) and not OK,
and every later stage is still tried.
"""

from __future__ import annotations

import dataclasses
import os

from journal.errors import Refused
from journal import strictjson
from journal.files import JOURNAL_NAME, read_evidence
from journal.format import Kind
from journal.reader import Reading
from journal.writer import JournalWriter
from steward import cgroups, cleanup, dedicated, documents, helper, inventory, retirement
from steward.session import Settings
from steward.stateroot import STAGES, STAGING, TOMBSTONES, StateRoot, open_directory_at


MAX_DOCUMENT = 4 << 20


@dataclasses.dataclass(frozen=True)
class Report:
    stage_id: str
    before: str
    after: str
    verdict: str
    diagnostic: str | None
    detail: str
    ok: bool

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def stage_ids(root: StateRoot) -> list[str]:
    return sorted(set(root.entries(STAGES)) | set(root.entries(TOMBSTONES)))


def diagnostic_of(reading: Reading) -> str | None:
    """The diagnostic the retirement note recorded, if the journal has one."""
    for record in reversed(reading.records):
        if record.kind in (Kind.RETIREMENT_INTENT, Kind.RETIRED):
            parsed = retirement.parse_note(record.fields["note"])
            return parsed[1] if parsed else None
    return None


def remove_sandbox_residue(root: StateRoot, stage_id: str) -> list[str]:
    """The staging files and empty cgroups a killed starter of this stage left; what was removed."""
    removed = []
    staging = root.area(STAGING)
    for name in root.entries(STAGING):
        if name.startswith((f"launcher-{stage_id}-", f"rendezvous-{stage_id}-")):
            os.unlink(name, dir_fd=staging)
            removed.append(root.path_of(STAGING, name))
    for path in cgroups.stage_directories(stage_id):
        try:
            cgroups.remove_sandbox_directory(path)
            removed.append(path)
        except OSError:
            pass  # still busy: the cleanup's process inventory lists it, so nothing is claimed CLEANED
    return removed


def bound_ids(root: StateRoot, area: str, stage_id: str, settings: Settings) -> tuple[int, int]:
    """The sandbox pair the stage's session was bound to (the pool's first when the stage recorded none)."""
    try:
        fd = root.open_entry(area, stage_id)
    except FileNotFoundError:
        return settings.uid, settings.gid
    try:
        return dedicated.recorded_ids(fd, (settings.uid, settings.gid), root.path_of(area, stage_id))
    finally:
        os.close(fd)


def _hygiene(root: StateRoot, area: str, stage_id: str, settings: Settings) -> helper.Response:
    """Kill processes of the stage's sandbox ids and detach mounts under the stage, under the lease; no record is written."""
    with root.lease(bound_ids(root, area, stage_id, settings)[0], wait_seconds=settings.lease_seconds):
        return _remove_and_prove(root, area, stage_id, settings)


def _remove_and_prove(root: StateRoot, area: str, stage_id: str, settings: Settings) -> helper.Response:
    """REMOVE_AND_PROVE in this process for what a stage left on the host; the caller holds the lease."""
    stage = root.path_of(area, stage_id)
    mounted = inventory.mount_document(inventory.read_mountinfo(), root.path, stage)["under_stage"]
    relative = sorted((entry["mount_point"][len(stage) + 1:] for entry in mounted if entry["mount_point"] != stage), reverse=True)
    uid, gid = bound_ids(root, area, stage_id, settings)
    request = helper.Request(
        stage_id=stage_id, state_root=root.path, area=area, uid=uid, gid=gid,
        mounts=tuple(relative), identities=(), budget_ms=max(1, int(settings.timing.response_seconds * 500)),
    )
    return helper.remove_and_prove(request)


class Recovery:
    """Recovery of the stages of one state root."""

    def __init__(self, root: StateRoot, settings: Settings, *, hook=None) -> None:
        self.root = root
        self.settings = settings
        self.hook = hook

    def recover(self, stage_id: str) -> Report:
        assessment = retirement.assess(self.root, stage_id)
        before = assessment.state
        if assessment.in_use:
            return Report(stage_id, before, before, assessment.verdict, None,
                          "in use by a running steward; left alone", True)
        try:
            return self._converge(assessment)
        except Exception as error:
            sentence = self.root.space_failure(error)
            if sentence is None:
                raise
            after = retirement.assess(self.root, stage_id)
            return Report(stage_id, before, after.state, after.verdict, None, f"not finished: {sentence}", False)

    def _converge(self, assessment: retirement.Assessment) -> Report:
        stage_id, before = assessment.stage_id, assessment.state
        if before == retirement.PRESERVED:
            return self._preserved(assessment)
        if before == retirement.UNBORN:
            return self._unborn(assessment)
        reading = assessment.reading
        try:
            if before == retirement.SEALED:
                return Report(stage_id, before, before, assessment.verdict, diagnostic_of(reading), "already sealed; nothing to do", True)
            if before == retirement.ACTIVE:
                reading = self._finish_active(stage_id)
            elif before in (retirement.INTENT, retirement.RENAMED):
                reading = self._finish_retirement(stage_id, before, reading)
            retirement.seal(self.root, stage_id, retirement.marker_for(reading), self.hook)
        except Refused as refusal:
            after = retirement.assess(self.root, stage_id)
            return Report(stage_id, before, after.state, after.verdict, None, refusal.sentence(), False)
        return Report(stage_id, before, retirement.SEALED, "VALID", diagnostic_of(reading), "sealed", True)

    def _preserved(self, assessment: retirement.Assessment) -> Report:
        deliberate = assessment.verdict not in ("", "VALID") and assessment.location in ("stage", "tombstone")
        detail = assessment.reason
        if assessment.location == "stage":
            response = _hygiene(self.root, STAGES, assessment.stage_id, self.settings)
            residue = remove_sandbox_residue(self.root, assessment.stage_id)
            detail += f"; left untouched; on the host {response.diagnostic}"
            if residue:
                detail += f"; removed {len(residue)} staging file(s) and cgroup(s)"
            deliberate = deliberate and response.outcome == "CLEANED"
        return Report(assessment.stage_id, retirement.PRESERVED, retirement.PRESERVED, assessment.verdict, None, detail, deliberate)

    def _unborn(self, assessment: retirement.Assessment) -> Report:
        """Remove a stage whose journal was never begun, once nothing of it is left on the host."""
        stage_id = assessment.stage_id
        with self.root.lease(bound_ids(self.root, STAGES, stage_id, self.settings)[0], wait_seconds=self.settings.lease_seconds):
            response = _remove_and_prove(self.root, STAGES, stage_id, self.settings)
            residue = remove_sandbox_residue(self.root, stage_id)
            removed = response.outcome == "CLEANED" and retirement.remove_unborn(self.root, stage_id)
        detail = f"{assessment.reason}; on the host {response.diagnostic}"
        if residue:
            detail += f"; removed {len(residue)} staging file(s) and cgroup(s)"
        if not removed:
            return Report(stage_id, retirement.UNBORN, retirement.UNBORN, assessment.verdict, None, f"{detail}; not removed", False)
        return Report(stage_id, retirement.UNBORN, retirement.REMOVED, assessment.verdict, None, f"{detail}; removed", True)

    def _finish_active(self, stage_id: str) -> Reading:
        stage_fd = self.root.open_entry(STAGES, stage_id)
        try:
            writer = JournalWriter.reopen(stage_fd, JOURNAL_NAME, stage_id=stage_id, hook=self.hook)
            with writer:
                remove_sandbox_residue(self.root, stage_id)
                reading = cleanup.read_own_journal(stage_fd, stage_id, writer.head)
                last = reading.records[-1]
                documents_fd = _documents(stage_fd, self.root.path_of(STAGES, stage_id))
                try:
                    if last.kind is Kind.CLEANUP_EVIDENCE:
                        # The claim is made; what the host still holds is removed before the rename, claiming nothing.
                        _hygiene(self.root, STAGES, stage_id, self.settings)
                        claims = _outer_claims(documents_fd, last.fields["process_inventory_digest"])
                        diagnostic = cleanup.journal_diagnostic(reading, "RECOVERED", last.fields["outcome"] == "CLEANED", claims)
                    else:
                        uid, gid = dedicated.recorded_ids(stage_fd, (self.settings.uid, self.settings.gid), self.root.path_of(STAGES, stage_id))
                        diagnostic = cleanup.Cleaner(
                            root=self.root, area=STAGES, stage_id=stage_id, stage_fd=stage_fd, documents_fd=documents_fd,
                            writer=writer, uid=uid, gid=gid,
                            lease_seconds=self.settings.lease_seconds, reaper="cleanup", ending="RECOVERED",
                            timing=self.settings.timing, command=self.settings.helper_command, hook=self.hook,
                        ).clean().diagnostic
                finally:
                    os.close(documents_fd)
                head = retirement.retire(self.root, stage_id, writer, retirement.note("RECOVERED", diagnostic), self.hook)
                return cleanup.read_own_journal(stage_fd, stage_id, head)
        finally:
            os.close(stage_fd)

    def _finish_retirement(self, stage_id: str, state: str, reading: Reading) -> Reading:
        text = reading.records[-1].fields["note"]
        if state == retirement.INTENT:
            retirement.rename(self.root, stage_id, self.hook)
        else:
            retirement.fsync_parents(self.root, self.hook)
        fd = self.root.open_entry(TOMBSTONES, stage_id)
        try:
            with JournalWriter.reopen(fd, JOURNAL_NAME, stage_id=stage_id, hook=self.hook) as writer:
                head = writer.retired(text)
            return cleanup.read_own_journal(fd, stage_id, head)
        finally:
            os.close(fd)

    def recover_all(self) -> list[Report]:
        return [self.recover(stage_id) for stage_id in stage_ids(self.root)]


def _outer_claims(documents_fd: int, digest: str) -> list[tuple[str, int, bool]]:
    """The runner's C3 claims, from the process inventory its CLEANUP_EVIDENCE bound (checked against the digest)."""
    data = read_evidence(documents_fd, digest, MAX_DOCUMENT)
    if data is None or documents.digest(data) != digest:
        return []
    try:
        groups = strictjson.loads(data, max_bytes=MAX_DOCUMENT)["outer_groups"]
        return [(group["sandbox"], group["pgid"], group["claim"] == "ABSENT") for group in groups]
    except (Refused, KeyError, TypeError):
        return []


def _documents(stage_fd: int, shown: str) -> int:
    """The stage's documents directory (a stage that crashed before making it gets it now)."""
    try:
        os.mkdir(documents.DOCUMENTS, 0o700, dir_fd=stage_fd)
    except FileExistsError:
        pass
    return open_directory_at(stage_fd, documents.DOCUMENTS, f"{shown}/{documents.DOCUMENTS}")

