"""C5, J4: the five retirement states, idempotent convergence, and what is preserved untouched.

States are made by stopping a real session at a named point (an exception
from the hook; the SIGKILL versions are in test_steward_crash.py), then
``Recovery`` converges them.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

from journal.errors import Refused
from journal.files import JOURNAL_NAME
from journal.format import Kind
from sandbox_support import contained  # noqa: F401
from steward import recovery, retirement
from steward.session import AFTER_CLEANUP_EVIDENCE, Steward
from steward.stateroot import STAGES, TOMBSTONES
from steward_support import accept_all, kinds, one_session, read_dir_journal, sealed_reading, settings, state_path, steward  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]


class Stop(Exception):
    pass


def _stopped_at(state_path: str, sandbox_ids, point: str, **overrides) -> str:
    """Run one session and stop it at ``point``; the stage id."""
    def hook(name: str) -> None:
        if name == point:
            raise Stop(point)

    made = Steward(settings(state_path, sandbox_ids, **overrides), capability_check=accept_all, hook=hook)
    try:
        with pytest.raises(Stop):
            one_session(made)
    finally:
        made.close()
    (stage_id,) = _ids(state_path)
    return stage_id


def _ids(state_path: str) -> list[str]:
    root = pathlib.Path(state_path)
    return sorted({*os.listdir(root / STAGES), *os.listdir(root / TOMBSTONES)})


def _journal_bytes(state_path: str, stage_id: str) -> bytes:
    root = pathlib.Path(state_path)
    for area in (STAGES, TOMBSTONES):
        path = root / area / stage_id / JOURNAL_NAME
        if path.exists():
            return path.read_bytes()
    raise AssertionError("no journal")


@pytest.mark.parametrize("point, state", [
    (AFTER_CLEANUP_EVIDENCE, retirement.ACTIVE),
    (retirement.AFTER_RETIREMENT_INTENT, retirement.INTENT),
    (retirement.BEFORE_RENAME, retirement.INTENT),
    (retirement.AFTER_RENAME, retirement.RENAMED),
    (retirement.AFTER_TOMBSTONES_FSYNC, retirement.RENAMED),
    (retirement.AFTER_STAGES_FSYNC, retirement.RENAMED),
    (retirement.AFTER_RETIRED, retirement.RETIRED),
    (retirement.AFTER_SEAL_MODES, retirement.RETIRED),
    (retirement.AFTER_SEAL_MARKER, retirement.SEALED),
])
def test_every_state_converges_to_a_sealed_tombstone_and_stays_there(state_path, sandbox_ids, point, state):
    """C5: from each state recovery converges, keeps every record, and a second run appends nothing."""
    stage_id = _stopped_at(state_path, sandbox_ids, point)
    with Steward(settings(state_path, sandbox_ids), capability_check=accept_all) as made:
        assert retirement.assess(made.root, stage_id).state == state
        before = _journal_bytes(state_path, stage_id)
        work = recovery.Recovery(made.root, made.settings)
        report = work.recover(stage_id)
        assert (report.before, report.after, report.ok) == (state, retirement.SEALED, True)
        after = _journal_bytes(state_path, stage_id)
        assert after.startswith(before), "an acknowledged record was lost"
        reading = sealed_reading(state_path, stage_id)
        assert reading.verdict == "VALID" and kinds(reading)[-1] is Kind.RETIRED
        assert kinds(reading).count(Kind.RETIREMENT_INTENT) == 1
        again = work.recover(stage_id)
        assert (again.before, again.after, again.ok) == (retirement.SEALED, retirement.SEALED, True)
        assert _journal_bytes(state_path, stage_id) == after, "the sealed state appended something"
        assert not (pathlib.Path(state_path) / STAGES / stage_id).exists()


def _sealed_session(steward) -> str:
    return one_session(steward)[2].stage_id


def _back_to_stage(state_path: str, stage_id: str) -> pathlib.Path:
    """Make an ACTIVE-looking stage out of a tombstone by hand: move it back and cut the journal after its GENESIS."""
    root = pathlib.Path(state_path)
    os.rename(root / TOMBSTONES / stage_id, root / STAGES / stage_id)
    stage = root / STAGES / stage_id
    for path in [stage, *stage.rglob("*")]:
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
    (stage / "seal.json").unlink()
    return stage


@pytest.mark.parametrize("damage, verdict", [
    (lambda journal: journal.write_bytes(journal.read_bytes()[:-5]), "TORN"),
    (lambda journal: journal.write_bytes(journal.read_bytes()[:200] + b"X" + journal.read_bytes()[201:]), "CORRUPT"),
    (lambda journal: journal.unlink(), "MISSING"),
])
def test_a_journal_that_is_not_valid_preserves_the_stage_untouched(steward, state_path, damage, verdict):
    """J4: a missing, torn or corrupt journal authorizes no cleanup claim; recovery changes nothing in the stage."""
    stage_id = _sealed_session(steward)
    stage = _back_to_stage(state_path, stage_id)
    damage(stage / JOURNAL_NAME)
    listing = sorted(str(path.relative_to(stage)) for path in stage.rglob("*"))
    journal = (stage / JOURNAL_NAME).read_bytes() if (stage / JOURNAL_NAME).exists() else None
    report = recovery.Recovery(steward.root, steward.settings).recover(stage_id)
    assert (report.before, report.after, report.verdict, report.ok) == ("PRESERVED", "PRESERVED", verdict, True)
    assert "left untouched" in report.detail
    assert sorted(str(path.relative_to(stage)) for path in stage.rglob("*")) == listing
    assert ((stage / JOURNAL_NAME).read_bytes() if (stage / JOURNAL_NAME).exists() else None) == journal
    assert not (pathlib.Path(state_path) / TOMBSTONES / stage_id).exists()


def test_a_journal_of_another_stage_is_substituted_and_preserved(steward, state_path):
    """J4: a chain bound to another stage is SUBSTITUTED; the stage is preserved."""
    first, second = _sealed_session(steward), _sealed_session(steward)
    stage = _back_to_stage(state_path, first)
    other = pathlib.Path(state_path) / TOMBSTONES / second / JOURNAL_NAME
    (stage / JOURNAL_NAME).write_bytes(other.read_bytes())
    report = recovery.Recovery(steward.root, steward.settings).recover(first)
    assert (report.after, report.verdict) == ("PRESERVED", "SUBSTITUTED")


def test_a_seal_marker_that_does_not_match_preserves_the_tombstone(steward, state_path):
    """J4: the head kept outside the journal must be its head; otherwise SUBSTITUTED."""
    stage_id = _sealed_session(steward)
    marker = pathlib.Path(state_path) / TOMBSTONES / stage_id / "seal.json"
    os.chmod(marker.parent, 0o755)
    text = marker.read_text()
    head = text.split('"head":"')[1][:64]
    marker.unlink()
    marker.write_text(text.replace(head, "0" * 64))
    report = recovery.Recovery(steward.root, steward.settings).recover(stage_id)
    assert (report.after, report.verdict, report.ok) == ("PRESERVED", "SUBSTITUTED", True)


def test_a_stage_and_a_tombstone_both_present_need_an_operator(steward, state_path):
    """C5: never both present; if a crash or a hand left both, nothing is changed and recovery says so (exit 1)."""
    stage_id = _sealed_session(steward)
    shutil.copytree(pathlib.Path(state_path) / TOMBSTONES / stage_id, pathlib.Path(state_path) / STAGES / stage_id)
    report = recovery.Recovery(steward.root, steward.settings).recover(stage_id)
    assert (report.after, report.ok) == ("PRESERVED", False)
    assert "both" in report.detail


def test_the_rename_never_replaces_a_tombstone(steward, state_path):
    """C5: RENAME_NOREPLACE: an existing tombstone is never overwritten by a stage, not even an empty one,
    which a plain rename(2) of a directory would replace without a word."""
    stage_id = _sealed_session(steward)
    stage = pathlib.Path(state_path) / STAGES / stage_id
    stage.mkdir()
    (stage / "marker").write_text("stage")
    with pytest.raises(Refused, match="already exists; a tombstone is never replaced"):
        retirement.rename(steward.root, stage_id)
    assert (stage / "marker").exists() and (pathlib.Path(state_path) / TOMBSTONES / stage_id / "seal.json").exists()
    other = "empty-tombstone"
    (pathlib.Path(state_path) / STAGES / other).mkdir()
    (pathlib.Path(state_path) / STAGES / other / "marker").write_text("stage")
    (pathlib.Path(state_path) / TOMBSTONES / other).mkdir()
    with pytest.raises(Refused, match="already exists; a tombstone is never replaced"):
        retirement.rename(steward.root, other)
    assert (pathlib.Path(state_path) / STAGES / other / "marker").exists()
    assert list((pathlib.Path(state_path) / TOMBSTONES / other).iterdir()) == []


def test_a_live_stage_is_left_alone(steward, state_path):
    """A stage whose journal a running steward holds is in use: recovery does not touch it."""
    session = steward.open_session("attempt-1")
    report = recovery.Recovery(steward.root, steward.settings).recover(session.stage_id)
    assert (report.after, report.ok) == ("ACTIVE", True) and "in use" in report.detail
    assert session.close().cleanup == "CLEANED"


def test_sealing_makes_everything_root_owned_and_read_only(steward, state_path):
    """C5: files 0444, directories 0555, root-owned, the marker last."""
    stage_id = _sealed_session(steward)
    place = pathlib.Path(state_path) / TOMBSTONES / stage_id
    for path in [place, *place.rglob("*")]:
        info = path.lstat()
        assert info.st_uid == 0 and (info.st_mode & 0o7777) == (0o555 if path.is_dir() else 0o444), path
    reading = read_dir_journal(place)
    assert reading.records[-1].kind is Kind.RETIRED


def test_once_retry_has_ended_recovery_still_removes_residue_itself(state_path, sandbox_ids, tmp_path):
    """C6: after a NONZERO attempt no helper may run; the cleanup writer kills what is left in process, and claims nothing."""
    failing = tmp_path / "failing_helper.py"
    failing.write_text("import sys\nsys.stdin.buffer.read()\nsys.exit(3)\n")
    stage_id = _stopped_at(state_path, sandbox_ids, "helper_after_attempt", helper_command=(sys.executable, "-I", str(failing)))
    uid, gid = sandbox_ids
    stray = subprocess.Popen(["/usr/bin/sleep", "60"], user=uid, group=gid, start_new_session=True)
    parent = threading.Thread(target=stray.wait)
    parent.start()
    try:
        with Steward(settings(state_path, sandbox_ids), capability_check=accept_all) as steward:
            report = recovery.Recovery(steward.root, steward.settings).recover(stage_id)
        parent.join(10)
        assert stray.returncode == -9
    finally:
        stray.kill()
        parent.join()
    assert (report.after, report.diagnostic) == ("SEALED", "HELPER_NONZERO")
    reading = sealed_reading(state_path, stage_id)
    assert [record.fields["outcome"] for record in reading.records if record.kind is Kind.HELPER_ATTEMPT] == ["NONZERO"]
    assert [record.fields["outcome"] for record in reading.records if record.kind is Kind.CLEANUP_EVIDENCE] == ["UNVERIFIED"]


def test_a_stage_with_a_mount_left_under_it_is_never_renamed(steward, state_path):
    """C5: a mount under a stage would move into its tombstone; retirement refuses until it is gone."""
    from launcher import syscalls as sc

    session = steward.open_session("attempt-1")
    point = pathlib.Path(state_path) / STAGES / session.stage_id / "live" / "stray"
    point.mkdir()
    sc.mount("stray", str(point), "tmpfs", 0, "size=64k")
    try:
        with pytest.raises(Refused, match="stray mounted under it; a stage is retired only once nothing is"):
            retirement.rename(steward.root, session.stage_id)
        assert point.exists() and not (pathlib.Path(state_path) / TOMBSTONES / session.stage_id).exists()
    finally:
        sc.umount2(str(point), 0)
    assert session.close().cleanup == "CLEANED"


def test_a_preserved_stage_whose_host_residue_cannot_be_proved_gone_needs_an_operator(steward, state_path, monkeypatch):
    """J4, C6: recovery of a preserved stage is deliberate (exit 0) only when its host residue was proved
    removed; if the REMOVE_AND_PROVE pass leaves something, the report says so and is not ok."""
    from steward import helper

    stage_id = _sealed_session(steward)
    stage = _back_to_stage(state_path, stage_id)
    (stage / JOURNAL_NAME).write_bytes((stage / JOURNAL_NAME).read_bytes()[:-5])
    residue = helper.Response(stage_id, "UNVERIFIED", 0, 0, 1, 0, "1 process(es) of the dedicated ids or recorded identities remain")
    monkeypatch.setattr(recovery.helper, "remove_and_prove", lambda request: residue)
    report = recovery.Recovery(steward.root, steward.settings).recover(stage_id)
    assert (report.before, report.after, report.verdict, report.ok) == ("PRESERVED", "PRESERVED", "TORN", False)
    assert "remain" in report.detail


def test_outer_claims_are_read_only_from_the_document_the_cleanup_evidence_bound(tmp_path):
    """C3, C4: recovery takes the runner's outer-group claims from the process inventory whose digest
    CLEANUP_EVIDENCE bound; a document under that name holding other bytes gives no claim at all."""
    from journal.strictjson import canonical
    from steward import documents

    genuine = canonical({"outer_groups": [{"sandbox": "s-1", "pgid": 42, "claim": "ABSENT"}]})
    forged = canonical({"outer_groups": [{"sandbox": "s-1", "pgid": 42, "claim": "ABSENT"}, {"sandbox": "s-2", "pgid": 43, "claim": "ABSENT"}]})
    (tmp_path / documents.digest(genuine)).write_bytes(genuine)
    (tmp_path / documents.digest(b"other")).write_bytes(forged)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert recovery._outer_claims(fd, documents.digest(genuine)) == [("s-1", 42, True)]
        assert recovery._outer_claims(fd, documents.digest(b"other")) == []
        assert recovery._outer_claims(fd, "0" * 64) == []
    finally:
        os.close(fd)


def test_recovery_removes_only_its_own_stages_sandbox_residue(steward, state_path):
    """C5, S1: the staging files a killed starter left are removed for the stage being recovered alone;
    another session's launcher and rendezvous socket stay where they are."""
    staging = pathlib.Path(state_path) / "staging"
    mine = ["launcher-aaaa-1.pyc", "rendezvous-aaaa-1.sock"]
    theirs = ["launcher-bbbb-1.pyc", "rendezvous-bbbb-2.sock", "launcher-aaaab-1.pyc"]
    for name in mine + theirs:
        (staging / name).write_bytes(b"")
    removed = recovery.remove_sandbox_residue(steward.root, "aaaa")
    assert sorted(os.path.basename(path) for path in removed) == sorted(mine)
    assert sorted(os.listdir(staging)) == sorted(theirs)


def test_a_seal_marker_naming_another_attempt_preserves_the_tombstone(steward, state_path):
    """C5, E2: a seal marker bound to the journal's head but naming another attempt than its GENESIS does
    not match its journal; the tombstone is preserved for an operator, never taken as sealed."""
    stage_id = _sealed_session(steward)
    marker = pathlib.Path(state_path) / TOMBSTONES / stage_id / "seal.json"
    os.chmod(marker.parent, 0o755)
    text = marker.read_text()
    marker.unlink()
    marker.write_text(text.replace('"attempt_id":"attempt-1"', '"attempt_id":"attempt-2"'))
    assessment = retirement.assess(steward.root, stage_id)
    assert (assessment.state, assessment.verdict) == ("PRESERVED", "VALID")
    assert "seal marker does not match its journal" in assessment.reason


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_sealing_refuses_anything_but_files_and_directories(tmp_path, kind):
    """C5: a tombstone holds regular files and directories only; a FIFO or a symlink in it refuses the seal."""
    tree = tmp_path / "tree"
    (tree / "outputs").mkdir(parents=True)
    strange = tree / "outputs" / "strange"
    os.mkfifo(strange) if kind == "fifo" else os.symlink("/etc/shadow", strange)
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match="outputs/strange: is not a regular file or directory"):
            retirement._seal_tree(fd, str(tree))
    finally:
        os.close(fd)


def _unborn_stage(state_path: str, name: str = "0123456789abcdef") -> pathlib.Path:
    stage = pathlib.Path(state_path) / STAGES / name
    stage.mkdir(mode=0o700)
    return stage


@pytest.mark.parametrize("journal, verdict", [(None, "MISSING"), (b"", "TORN"), (b"\x00\x00\x00\xad\x00\x01\x01\x00{\"att", "TORN")])
def test_a_stage_whose_journal_was_never_begun_is_removed_by_recovery(steward, state_path, journal, verdict):
    """J1, J4: a stage holding nothing but a journal with no record (none, empty, or a GENESIS cut short) never
    ran anything: recovery proves the host holds nothing of it and removes it; running it again finds nothing."""
    stage = _unborn_stage(state_path)
    if journal is not None:
        (stage / JOURNAL_NAME).write_bytes(journal)
    assert retirement.assess(steward.root, stage.name).state == retirement.UNBORN
    report = recovery.Recovery(steward.root, steward.settings).recover(stage.name)
    assert (report.before, report.after, report.verdict, report.ok) == ("UNBORN", "REMOVED", verdict, True)
    assert report.detail.endswith("; removed") and "no process of the dedicated ids" in report.detail
    assert not stage.exists()
    assert recovery.Recovery(steward.root, steward.settings).recover_all() == []


@pytest.mark.parametrize("extra", ["documents", "evidence.json"])
def test_a_stage_holding_anything_besides_an_unbegun_journal_is_preserved_not_removed(steward, state_path, extra):
    """J4: only a stage with nothing in it but a record-less journal counts as never begun; anything else beside
    it (a directory, a file) may be evidence, so the stage is preserved untouched."""
    stage = _unborn_stage(state_path)
    (stage / JOURNAL_NAME).write_bytes(b"")
    (stage / extra).mkdir() if "." not in extra else (stage / extra).write_bytes(b"{}")
    report = recovery.Recovery(steward.root, steward.settings).recover(stage.name)
    assert (report.before, report.after, report.verdict) == ("PRESERVED", "PRESERVED", "TORN")
    assert sorted(os.listdir(stage)) == sorted([JOURNAL_NAME, extra])


def test_a_stage_being_made_is_never_taken_for_one_never_begun(state_path, sandbox_ids):
    """J1, C5: the steward makes a stage and its journal under the dedicated UID's lease, and recovery removes
    an UNBORN stage only under it: a recovery that runs while the directory exists and its GENESIS does not
    yet cannot take the stage from under the session being made."""
    answers = []

    def hook(name: str) -> None:
        if name == "after_stage_directory":
            (stage_id,) = os.listdir(pathlib.Path(state_path) / STAGES)
            quick = Steward(settings(state_path, sandbox_ids, lease_seconds=0.2), capability_check=accept_all)
            try:
                answers.append(recovery.Recovery(quick.root, quick.settings).recover(stage_id))
            except Refused as refusal:
                answers.append(refusal.rule)
            finally:
                quick.close()

    made = Steward(settings(state_path, sandbox_ids), capability_check=accept_all, hook=hook)
    try:
        session = made.open_session("attempt-1")
        assert session.close().cleanup == "CLEANED"
    finally:
        made.close()
    assert len(answers) == 1 and "is leased by another session" in str(answers[0]), answers
