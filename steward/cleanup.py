"""C4, C6, C7, C8: the cleanup writer's proof, bound into CLEANUP_EVIDENCE.

Under the dedicated UID's lease (so no other session's sandbox is alive):

1. the preceding process inventory is taken and kept (its digest is the
   evidence's ``preceding_process_digest``);
2. REMOVE_AND_PROVE attempts run while the journal's rules permit one
   (steward/helperattempts.py);
3. the process and mount inventories are taken again and kept;
4. the proof holds when the last helper response was accepted as CLEANED,
   the process inventory shows nothing alive and no mount remains at or under
   the stage;
5. CLEANUP_EVIDENCE binds the head before it, both inventory digests and the
   preceding digest. Its outcome is CLEANED only when the session is fully
   verified (steward/fold.py, C8): the proof holds, every started privileged
   process has raw wait status 0, every outer group was proved absent, and
   the client closed the session. Otherwise it is UNVERIFIED, and the
   diagnostic says why.

Every identity's presence is judged through its ``/proc/<pid>`` handle from
intent time when the caller still has it (a live session), else through a
fresh ``/proc/<pid>`` with the recorded start time (recovery); never through
a wait call on a process that is not our child (C2).
"""

from __future__ import annotations

import dataclasses

from journal.errors import Refused
from journal.files import JOURNAL_NAME, read_evidence
from journal.format import CAP, Kind, sandbox_of
from journal.reader import Reading, Verdict, read_journal
from steward import cgroups, documents, fold, helperattempts, inventory
from steward.helper import Request, remove_and_prove
from steward.stateroot import StateRoot

LATE_REAP_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Result:
    outcome: str
    diagnostic: str
    head: str
    preceding_digest: str
    process_digest: str
    mount_digest: str
    progress: helperattempts.Progress


def read_own_journal(stage_fd: int, stage_id: str, head: str) -> Reading:
    """The journal as stored, which must be VALID and end at the writer's own head."""
    reading = read_journal(read_evidence(stage_fd, JOURNAL_NAME, CAP), expect_stage_id=stage_id, expect_head=head)
    if reading.verdict is not Verdict.VALID:
        raise Refused("journal", f"is {reading.verdict} on disk ({reading.reason}); the cleanup claim is refused (J4)")
    return reading


def host_mounts(reading: Reading, stage_path: str) -> list[str]:
    """Stage-relative paths of the host mounts the journal says were made under the stage and not unmounted."""
    mounted: dict[str, str] = {}
    prefix = stage_path.rstrip("/") + "/"
    for record in reading.records:
        target = record.fields.get("target", "")
        if not target.startswith(prefix):
            continue
        if record.kind is Kind.MOUNT_INTENT:
            mounted[target] = record.fields["op_id"]
        elif record.kind is Kind.UNMOUNT_DONE:
            mounted.pop(target, None)
    return sorted(target[len(prefix):] for target in mounted)


def helper_outcomes(reading: Reading) -> tuple[str, ...]:
    return tuple(record.fields["outcome"] for record in reading.records if record.kind is Kind.HELPER_ATTEMPT)


@dataclasses.dataclass
class Cleaner:
    """Everything one cleanup needs; ``clean`` runs it once."""

    root: StateRoot
    area: str
    stage_id: str
    stage_fd: int
    documents_fd: int
    writer: object
    uid: int
    gid: int
    lease_seconds: float
    reaper: str
    ending: str
    timing: helperattempts.Timing = helperattempts.Timing()
    command: tuple[str, ...] = helperattempts.HELPER_COMMAND
    handles: dict = dataclasses.field(default_factory=dict)
    outer: list = dataclasses.field(default_factory=list)
    hook: object = None

    @property
    def stage_path(self) -> str:
        return self.root.path_of(self.area, self.stage_id)

    def _settle_interrupted(self, reading: Reading) -> bool:
        """Classify a helper attempt whose runner died before its HELPER_ATTEMPT; True if one was recorded.

        Its response is lost, so it is judged with no body, by the pure rule
        (C6): its recorded wait status, or none (UNREAPED: its runner can no
        longer reap it); a raw-zero status without a complete body is
        MISSING. The digest is that of the empty body, kept as a document.
        """
        attempted = len(helper_outcomes(reading))
        started = [identity for identity in inventory.identities(reading.records) if identity.role == "helper"]
        if len(started) <= attempted:
            return False
        interrupted = started[attempted]
        outcome, _ = helperattempts.classify(helperattempts.Observation(interrupted.wait_status, b"", False), stage_id=self.stage_id)
        digest = documents.keep(self.documents_fd, b"", shown=f"{self.stage_path}/{documents.DOCUMENTS}")
        self.writer.helper_attempt(attempted + 1, digest, outcome)
        return True

    def _keep(self, value: object) -> str:
        data, _ = documents.encode(value)
        return documents.keep(self.documents_fd, data, shown=f"{self.stage_path}/{documents.DOCUMENTS}")

    def _presence(self, identity: inventory.Identity) -> bool:
        handle = self.handles.get(identity.op_id)
        return not handle.gone() if handle is not None else inventory.present_now(identity)

    def _process_inventory(self, reading: Reading) -> tuple[dict, str]:
        recorded = [(identity, self._presence(identity)) for identity in inventory.identities(reading.records)]
        document = inventory.process_document(
            self.uid, self.gid, inventory.dedicated_processes(self.uid, self.gid), recorded, self.outer,
            inventory.dedicated_keys(self.uid),
            [(path, cgroups.populated(path)) for path in cgroups.stage_directories(self.stage_id)],
        )
        return document, self._keep(document)

    def clean(self) -> Result:
        head = self.writer.head
        with self.root.lease(self.uid, wait_seconds=self.lease_seconds):
            reading = read_own_journal(self.stage_fd, self.stage_id, head)
            _, preceding = self._process_inventory(reading)
            if self._settle_interrupted(reading):
                reading = read_own_journal(self.stage_fd, self.stage_id, self.writer.head)
            outcomes = helper_outcomes(reading)
            runner = helperattempts.HelperRunner(
                self.writer, documents_fd=self.documents_fd, shown=f"{self.stage_path}/{documents.DOCUMENTS}",
                reaper=self.reaper, timing=self.timing, command=self.command, hook=self.hook,
            )
            previous = outcomes[-1] if outcomes else None
            recorded = inventory.identities(reading.records)
            request = Request(
                stage_id=self.stage_id,
                state_root=self.root.path,
                area=self.area,
                uid=self.uid,
                gid=self.gid,
                mounts=tuple(host_mounts(reading, self.stage_path)),
                identities=tuple((identity.pid, identity.starttime) for identity in recorded if identity.wait_status is None),
                budget_ms=max(1, int(self.timing.response_seconds * 500)),
            )
            if len(outcomes) < helperattempts.MAX_ATTEMPTS and (previous is None or helperattempts.may_follow(previous)):
                done = runner.run(request, first=len(outcomes) + 1, previous=previous)
            else:
                # Retry has ended (C6): no helper may run, so the cleanup writer removes what is left itself,
                # in this process, and claims nothing from it: progress stays zero.
                done = []
                remove_and_prove(request)
            runner.reap_late(LATE_REAP_SECONDS if runner.unreaped else 0)
            progress = helperattempts.projection(done)
            reading = read_own_journal(self.stage_fd, self.stage_id, self.writer.head)
            processes, process_digest = self._process_inventory(reading)
            mounts = inventory.mount_document(inventory.read_mountinfo(), self.root.path, self.stage_path)
            mount_digest = self._keep(mounts)
        proved = progress.accepted and progress.remaining_processes == 0 and progress.remaining_mounts == 0
        proved = proved and done[-1].outcome == "CLEANED" and not inventory.residue(processes) and not mounts["under_stage"]
        diagnostic = journal_diagnostic(reading, self.ending, proved, self.outer)
        outcome = "CLEANED" if fold.verified(diagnostic) else "UNVERIFIED"
        before = self.writer.head
        head = self.writer.cleanup_evidence(outcome, before, process_digest, mount_digest, preceding)
        return Result(outcome, diagnostic, head, preceding, process_digest, mount_digest, progress)


def journal_diagnostic(reading: Reading, ending: str, proved: bool, outer: list = ()) -> str:
    """The fold (C7) of a VALID journal's outcomes, the physical proof, the outer claims and how the session ended.

    A sandbox the journal knows without a claim in ``outer`` counts as an
    outer group not proved absent: only its runner could have claimed it (C3).
    """
    identities = inventory.identities(reading.records)
    claimed = {sandbox for sandbox, _, _ in outer}
    unclaimed = {sandbox_of(identity.op_id) for identity in identities} - {None} - claimed
    return fold.diagnostic(fold.Outcomes(
        journal=Verdict.VALID,
        helper=helper_outcomes(reading),
        privileged_statuses=tuple(identity.wait_status for identity in identities if identity.role in inventory.PRIVILEGED_ROLES),
        outer_absent=tuple(absent for _, _, absent in outer) + (False,) * len(unclaimed),
        cleanup="CLEANED" if proved else "UNVERIFIED",
        ending=ending,
    ))
