"""The durable writer (J1, J2, J5): create-once, appends, refusals, poisoning, reopening."""

from __future__ import annotations

import os
import stat

import pytest

import journal.writer
from journal.errors import Refused
from journal.format import CAP, MAX_FRAME, MAX_PAYLOAD, RESERVE_START, Kind
from journal.reader import Verdict, read_journal
from journal.sequence import OutOfSequence, OverCap
from journal.writer import JournalPoisoned, JournalWriter
from journal.strictjson import canonical
from journal_support import T0, PowerLossLayer, clock

IDS = dict(journal_id="j-1", stage_id="s-1", attempt_id="a-1")


@pytest.fixture
def stage(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def create(stage, **kwargs) -> JournalWriter:
    return JournalWriter.create(stage[1], "journal", **{**IDS, "clock": clock(), **kwargs})


def stored(stage) -> bytes:
    return (stage[0] / "journal").read_bytes()


def test_create_writes_a_durable_genesis(stage):
    """J5: create leaves a 0600 file holding exactly one VALID GENESIS record bound to its ids."""
    with create(stage) as writer:
        reading = read_journal(stored(stage), expect_stage_id="s-1", expect_journal_id="j-1")
        assert reading.verdict is Verdict.VALID and reading.head == writer.head
        assert reading.genesis == {"prev": reading.records[0].fields["prev"], "created": clock()(), **IDS}
        assert stat.S_IMODE(os.stat(stage[0] / "journal").st_mode) == 0o600


def test_create_sets_mode_0600_whatever_the_umask(stage):
    """J5: the journal is mode 0600 even under a umask that would take the owner's write bit."""
    old = os.umask(0o277)
    try:
        create(stage).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(stage[0] / "journal").st_mode) == 0o600


def test_create_refuses_an_existing_file(stage):
    """J5: O_EXCL: a journal is created once; an existing file is refused and left untouched."""
    (stage[0] / "journal").write_bytes(b"evidence")
    with pytest.raises(Refused, match="already exists"):
        create(stage)
    assert stored(stage) == b"evidence"


def test_create_refuses_a_symlink(stage, tmp_path_factory):
    """J5: O_EXCL|O_NOFOLLOW: a symlink at the journal's name is refused and its target never created."""
    target = tmp_path_factory.mktemp("elsewhere") / "planted"
    os.symlink(target, stage[0] / "journal")
    with pytest.raises(Refused):
        create(stage)
    assert not target.exists()


def test_create_refuses_a_path_as_name(stage):
    """J5: the journal is named relative to the stage directory descriptor, one segment only."""
    with pytest.raises(Refused, match="one plain path segment"):
        JournalWriter.create(stage[1], "../journal", **IDS)


def test_append_returns_the_durable_head(stage):
    """J1: each ledger method returns the head that the stored journal now ends at."""
    with create(stage) as writer:
        heads = [
            writer.process_intent("p-1", "launcher", 4242, 99, 4242),
            writer.process_released("p-1"),
            writer.mount_intent("m-1", "/sandbox/tmp", "tmpfs"),
        ]
        reading = read_journal(stored(stage))
        assert [record.digest for record in reading.records[1:]] == heads
        assert reading.valid_bytes == writer.size and writer.records == 4


def test_append_writes_one_whole_frame_at_the_end(stage, monkeypatch):
    """J1: an append is exactly one pwrite of the whole frame at the end, then one fdatasync."""
    layer = PowerLossLayer()
    monkeypatch.setattr(journal.writer, "os", layer)
    with create(stage) as writer:
        size, writes, syncs = writer.size, layer.writes, layer.syncs
        writer.process_intent("p-1", "launcher", 4242, 99, 4242)
        assert (layer.writes, layer.syncs) == (writes + 1, syncs + 1)
        offset, frame = layer.durable[-1]
        assert offset == size and len(frame) == writer.size - size


def test_refused_append_writes_nothing(stage):
    """J1, J3: a record the reader would reject is refused before anything is written."""
    with create(stage) as writer:
        before = stored(stage)
        with pytest.raises(OutOfSequence):
            writer.process_released("nobody")
        with pytest.raises(Refused):
            writer.process_terminal("p-1", 0x7F, "steward")
        with pytest.raises(Refused):
            writer.append(Kind.GENESIS, IDS)
        assert stored(stage) == before and writer.records == 1


def test_payload_over_4096_bytes_is_refused(stage):
    """J2: a record whose payload would exceed 4,096 bytes is refused."""
    with create(stage) as writer:
        writer.mount_intent("m-1", "/" + "x" * 3_900, "bind")
        with pytest.raises(Refused, match="4096-byte frame limit"):
            writer.mount_intent("m-2", "/" + "x" * 4_000, "bind")


def fill_to_reserve(writer: JournalWriter) -> None:
    """Non-retirement appends until the next would cut into the reserve; the last ends at RESERVE_START."""
    number = 0
    while writer.size < RESERVE_START:
        remaining = RESERVE_START - writer.size
        size = MAX_FRAME if remaining >= MAX_FRAME + 256 else remaining if remaining <= MAX_FRAME else remaining // 16 * 8
        number += 1
        base = len(canonical({"at": T0, "kind": "tmpfs", "op_id": f"f{number}", "prev": "0" * 64, "target": "/"}))
        writer.mount_intent(f"f{number}", "/" + "x" * (size - 8 - base), "tmpfs")
    assert writer.size == RESERVE_START


def test_reserve_refuses_other_records_but_keeps_room_for_retirement(stage):
    """J2: a non-retirement append that would cut into the 8,208-byte reserve is refused; both retirement
    records of the largest size still fit, filling the journal to exactly 262,144 bytes."""
    with create(stage) as writer:
        fill_to_reserve(writer)
        size = writer.size
        with pytest.raises(OverCap, match="reserve"):
            writer.unmount_intent("u-1", "/t", "bind")
        with pytest.raises(OverCap, match="reserve"):
            writer.process_intent("p-1", "launcher", 7, 1, 7)
        assert writer.size == size and len(stored(stage)) == size
        note = MAX_PAYLOAD - len('{"at":1767225600000000,"note":"","prev":""}') - 64
        writer.retirement_intent("n" * note)
        writer.retired("n" * note)
        assert writer.size == CAP == len(stored(stage))
        assert read_journal(stored(stage)).verdict is Verdict.VALID


def test_third_retirement_record_is_refused(stage):
    """C5, J2: after RETIREMENT_INTENT and RETIRED the journal takes nothing, retirement included."""
    with create(stage) as writer:
        writer.retirement_intent("retiring")
        with pytest.raises(OutOfSequence):
            writer.retirement_intent("again")
        writer.retired()
        for append in (writer.retired, writer.retirement_intent, lambda: writer.process_released("x")):
            with pytest.raises(OutOfSequence):
                append()
        assert read_journal(stored(stage)).verdict is Verdict.VALID and writer.records == 3


@pytest.mark.parametrize("fail_at", [2, 3])
def test_fsync_error_poisons_the_writer(stage, monkeypatch, fail_at):
    """J5: a failed fsync/fdatasync poisons the writer: that call fails, every later call is refused, no retry."""
    layer = PowerLossLayer(fail_sync_at=2 + fail_at)
    monkeypatch.setattr(journal.writer, "os", layer)
    writer = create(stage)
    writer.process_intent("p-1", "launcher", 4242, 99, 4242)
    if fail_at == 3:
        writer.process_released("p-1")
    with pytest.raises(JournalPoisoned):
        writer.mount_intent("m-1", "/t", "bind")
    syncs = layer.syncs
    for call in (lambda: writer.mount_intent("m-2", "/t", "bind"), writer.retirement_intent, writer.retired):
        with pytest.raises(JournalPoisoned):
            call()
    assert writer.poisoned and layer.syncs == syncs


def test_fsync_error_during_create_is_poison(stage, monkeypatch):
    """J5: a failed fsync of the new journal or of its directory fails create; nothing is retried."""
    for fail_at in (1, 2):
        layer = PowerLossLayer(fail_sync_at=fail_at)
        monkeypatch.setattr(journal.writer, "os", layer)
        with pytest.raises(JournalPoisoned):
            JournalWriter.create(stage[1], f"journal-{fail_at}", **IDS)
        assert layer.syncs == fail_at


def test_short_write_poisons_the_writer(stage, monkeypatch):
    """J5: a short pwrite is a failed write: the writer is poisoned, not retried."""
    layer = PowerLossLayer(short_write_at=2)
    monkeypatch.setattr(journal.writer, "os", layer)
    writer = create(stage)
    with pytest.raises(JournalPoisoned, match="short write"):
        writer.process_intent("p-1", "launcher", 4242, 99, 4242)
    with pytest.raises(JournalPoisoned):
        writer.process_intent("p-2", "launcher", 4243, 99, 4243)
    assert layer.writes == 2


def test_second_writer_is_refused(stage):
    """J1: a journal has one writer; a second one, even in this process, is refused while the first is open."""
    with create(stage):
        with pytest.raises(Refused, match="another writer"):
            JournalWriter.reopen(stage[1], "journal", stage_id="s-1")
    JournalWriter.reopen(stage[1], "journal", stage_id="s-1").close()


def test_reopen_continues_a_valid_journal(stage):
    """J5: recovery reopens a VALID journal of its stage and appends after its head."""
    with create(stage) as writer:
        writer.process_intent("p-1", "launcher", 4242, 99, 4242)
        head = writer.head
    with JournalWriter.reopen(stage[1], "journal", stage_id="s-1", journal_id="j-1", expect_head=head, clock=clock()) as again:
        assert again.head == head
        with pytest.raises(OutOfSequence):
            again.process_intent("p-1", "launcher", 1, 1, 1)
        again.process_terminal("p-1", 9, "steward")
        again.retirement_intent("recovered")
        new_head = again.retired()
    reading = read_journal(stored(stage), expect_head=new_head)
    assert reading.verdict is Verdict.VALID and len(reading.records) == 5


@pytest.mark.parametrize(
    ("damage", "expect", "verdict"),
    [
        (lambda data: data[:-3], {}, "TORN"),
        (lambda data: data[:200] + bytes([data[200] ^ 0xFF]) + data[201:], {}, "CORRUPT"),
        (lambda data: data, {"stage_id": "s-2"}, "SUBSTITUTED"),
        (lambda data: data, {"journal_id": "j-2"}, "SUBSTITUTED"),
        (lambda data: data, {"expect_head": "0" * 64}, "SUBSTITUTED"),
    ],
)
def test_reopen_refuses_anything_but_valid(stage, damage, expect, verdict):
    """J4: a TORN, CORRUPT or SUBSTITUTED journal is never reopened for writing, and is left as it was."""
    with create(stage) as writer:
        writer.process_intent("p-1", "launcher", 4242, 99, 4242)
    path = stage[0] / "journal"
    data = damage(path.read_bytes())
    path.write_bytes(data)
    with pytest.raises(Refused, match=f"is {verdict}"):
        JournalWriter.reopen(stage[1], "journal", **{"stage_id": "s-1", **expect})
    assert path.read_bytes() == data


def test_reopen_refuses_wrong_mode_link_or_symlink(stage):
    """J5: only a regular, singly linked, 0600 journal owned by the writer is reopened."""
    create(stage).close()
    path = stage[0] / "journal"
    os.chmod(path, 0o644)
    with pytest.raises(Refused, match="mode 0600"):
        JournalWriter.reopen(stage[1], "journal", stage_id="s-1")
    os.chmod(path, 0o600)
    os.link(path, stage[0] / "second")
    with pytest.raises(Refused, match="singly linked"):
        JournalWriter.reopen(stage[1], "journal", stage_id="s-1")
    os.unlink(stage[0] / "second")
    os.rename(path, stage[0] / "real")
    os.symlink("real", path)
    with pytest.raises(Refused, match="symlink"):
        JournalWriter.reopen(stage[1], "journal", stage_id="s-1")


def test_create_reserves_the_whole_cap_on_disk_without_changing_the_file(stage):
    """J2, J5: the cap is allocated before GENESIS (FALLOC_FL_KEEP_SIZE): the file's size is exactly its frames,
    so its bytes are exactly what the format says, and every append up to the cap already has its space."""
    with create(stage) as writer:
        info = os.stat(stage[0] / "journal")
        assert info.st_size == writer.size
        assert info.st_blocks * 512 >= CAP
        assert read_journal(stored(stage)).verdict is Verdict.VALID


@pytest.mark.root
def test_a_reserved_journal_takes_every_record_up_to_its_cap_on_a_full_disk(tmp_path):
    """J2, J5: once created, a journal never runs out of disk: with no byte left on its filesystem, records up
    to the reserve and both retirement records still land whole, and the journal reads VALID, never TORN."""
    from disk_support import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", 1 << 20) as disk:
        fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY)
        try:
            writer = JournalWriter.create(fd, "journal", **IDS)
            fill(disk)
            number = 0
            while writer.size + MAX_FRAME <= RESERVE_START:
                number += 1
                writer.mount_intent(f"m{number}", "/" + "x" * 3_900, "tmpfs")
            writer.retirement_intent("n" * 3_900)
            writer.retired("n" * 3_900)
            writer.close()
            reading = read_journal((disk / "journal").read_bytes())
            assert reading.verdict is Verdict.VALID and len(reading.records) == number + 3
        finally:
            os.close(fd)


@pytest.mark.root
def test_a_journal_whose_cap_cannot_be_reserved_is_never_begun(tmp_path):
    """J5: where the cap does not fit, create says how much it needed and leaves nothing behind (no empty file
    that would read TORN); a reopen that cannot reserve appends nothing."""
    from disk_support import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", 1 << 20) as disk:
        fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY)
        try:
            first = JournalWriter.create(fd, "kept", **IDS)
            first.close()
            fill(disk)
            with pytest.raises(journal.writer.Unreserved) as raised:
                JournalWriter.create(fd, "journal", **IDS)
            assert raised.value.needed == CAP and raised.value.errno == 28
            assert sorted(os.listdir(disk)) == ["filler", "kept"]
            # A journal made before reservation existed (its blocks given back), on a full disk: never appended to.
            data = (disk / "kept").read_bytes()
            os.unlink(disk / "kept")
            (disk / "filler").write_bytes(b"")
            (disk / "kept").write_bytes(data)
            os.chmod(disk / "kept", 0o600)
            fill(disk)
            with pytest.raises(journal.writer.Unreserved):
                JournalWriter.reopen(fd, "kept", stage_id="s-1")
            assert (disk / "kept").read_bytes() == data
        finally:
            os.close(fd)


def test_appends_from_two_threads_are_one_chain(stage):
    """J1, J2 with two writers' threads (a sandbox brought to READY on its own thread while another runs an op):
    each record is admitted, written and synced before the next, so the journal is VALID, holds every record
    once, and each returned head is one of its records (red when appends are not serialized)."""
    import threading

    heads: dict[str, list[str]] = {"a": [], "b": []}
    with create(stage) as writer:

        def append(name: str) -> None:
            for n in range(150):
                heads[name].append(writer.process_intent(f"{name}-{n}", "descendant", 1000 + n, n, 1000 + n))
                heads[name].append(writer.process_released(f"{name}-{n}"))

        threads = [threading.Thread(target=append, args=(name,)) for name in heads]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        reading = read_journal(stored(stage))
    assert reading.verdict is Verdict.VALID and len(reading.records) == 1 + 600
    assert sorted(record.digest for record in reading.records[1:]) == sorted(heads["a"] + heads["b"])
