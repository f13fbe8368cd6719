"""C1, C4: identities from a journal, their states, and the two inventories, canonical and digested."""

from __future__ import annotations

from journal.format import Kind, sandbox_of
from journal.reader import read_journal
from journal_support import Chain
from steward import documents, inventory

MOUNTINFO = b"\n".join([
    b"22 27 0:21 / /proc rw,relatime - proc proc rw",
    b"40 27 0:40 / /var/lib/casebox/stages/s1/live/out rw,nosuid - tmpfs casebox-output rw,size=1024k",
    b"41 27 0:41 / /var/lib/casebox/stages/s2/live/x rw - tmpfs casebox-output rw",
    b"42 27 0:42 / /var/lib/casebox-other rw - tmpfs other rw",
    b"43 27 0:43 / /var/lib/casebox/stages/s1/live/with\\040space rw - tmpfs casebox-output rw",
    b"44 27 0:44 / /var/lib/casebox rw - ext4 /dev/sda1 rw",
])


def test_the_mount_inventory_keeps_what_lies_under_the_state_root_and_the_stage():
    """C4: entries at or under the state root, and those under the stage; a sibling with a common prefix is not under it."""
    document = inventory.mount_document(MOUNTINFO, "/var/lib/casebox", "/var/lib/casebox/stages/s1")
    points = [entry["mount_point"] for entry in document["under_state_root"]]
    assert points == [
        "/var/lib/casebox",
        "/var/lib/casebox/stages/s1/live/out",
        "/var/lib/casebox/stages/s1/live/with space",
        "/var/lib/casebox/stages/s2/live/x",
    ]
    assert [entry["mount_point"] for entry in document["under_stage"]] == points[1:3]
    assert document["under_stage"][0] == {"mount_point": points[1], "fstype": "tmpfs", "source": "casebox-output"}


def test_inventories_are_canonical_so_their_digests_reproduce():
    """D2, C4: the same inventory in another order has the same bytes and digest."""
    first = inventory.mount_document(MOUNTINFO, "/var/lib/casebox", "/var/lib/casebox/stages/s1")
    shuffled = inventory.mount_document(b"\n".join(reversed(MOUNTINFO.split(b"\n"))), "/var/lib/casebox", "/var/lib/casebox/stages/s1")
    assert documents.encode(first) == documents.encode(shuffled)
    processes = inventory.process_document(7, 7, [{"pid": 9, "ppid": 1, "status": "zombie", "uids": [7, 7, 7], "gids": [7, 7, 7]},
                                                  {"pid": 3, "ppid": 1, "status": "sleeping", "uids": [7, 7, 7], "gids": [7, 7, 7]}], [], [], 2)
    assert [entry["pid"] for entry in processes["dedicated"]] == [3, 9]
    assert inventory.residue(processes) == ["process 3 of the dedicated ids", "process 9 of the dedicated ids"]


KEY_USERS = """\
    0:     9 8/8 3/1000000 48/25000000
2000000011:     3 3/3 3/200 60/20000
"""


def test_a_key_beyond_the_base_keyrings_is_residue():
    """S13: the dedicated UID's keys are read from /proc/key-users; its two base keyrings are expected, any
    other key is left over from a case, so the proof fails (and cleanup is UNVERIFIED)."""
    assert inventory.owned_keys(KEY_USERS, 2000000011) == 3
    assert inventory.owned_keys(KEY_USERS, 0) == 8
    assert inventory.owned_keys(KEY_USERS, 42) == 0
    base = inventory.process_document(7, 7, [], [], [], inventory.BASE_KEYRINGS)
    assert base["keys"] == {"owned": 2, "base_keyrings": 2} and inventory.residue(base) == []
    assert inventory.residue(inventory.process_document(7, 7, [], [], [], 0)) == []
    assert inventory.residue(inventory.process_document(7, 7, [], [], [], 3)) == ["1 key(s) of the dedicated UID beyond its base keyrings"]


def test_a_sandbox_cgroup_still_on_the_host_is_residue():
    """S14, C4: a sandbox cgroup of the stage that still exists is residue, populated or not (its teardown
    removes it), so the proof fails."""
    left = [("/sys/fs/cgroup/casebox/casebox-s1-2", True), ("/sys/fs/cgroup/casebox/casebox-s1-1", False)]
    document = inventory.process_document(7, 7, [], [], [], inventory.BASE_KEYRINGS, left)
    assert document["cgroups"] == [{"path": "/sys/fs/cgroup/casebox/casebox-s1-1", "populated": False},
                                   {"path": "/sys/fs/cgroup/casebox/casebox-s1-2", "populated": True}]
    assert inventory.residue(document) == ["cgroup /sys/fs/cgroup/casebox/casebox-s1-1",
                                           "cgroup /sys/fs/cgroup/casebox/casebox-s1-2 with a process in it"]


def _reading(chain: Chain):
    return read_journal(chain.bytes())


def test_identities_follow_the_journal():
    """C1: STARTED without a terminal record, TERMINATED with the raw status its parent read."""
    chain = Chain()
    chain.add(Kind.PROCESS_INTENT, op_id="sb.launcher", role="launcher", pid=10, starttime=5, pgid=10)
    chain.add(Kind.PROCESS_RELEASED, op_id="sb.launcher")
    chain.add(Kind.PROCESS_TERMINAL, op_id="sb.launcher", wait_status=0, reaper="steward")
    chain.add(Kind.PROCESS_INTENT, op_id="sb.init", role="namespace", pid=11, starttime=6, pgid=10)
    found = {identity.op_id: identity for identity in inventory.identities(_reading(chain).records)}
    assert found["sb.launcher"].state == "TERMINATED" and found["sb.launcher"].wait_status == 0
    assert found["sb.init"].state == "STARTED" and found["sb.init"].wait_status is None
    assert found["sb.init"].released is False


def test_a_pid_1_never_reported_is_unknown_until_discovery_says_otherwise():
    """C1: without pid 1's intent, UNKNOWN; stage 1's DESCENDANTS_TERMINAL decides NEVER_STARTED (0) or TERMINATED."""
    chain = Chain()
    chain.add(Kind.PROCESS_INTENT, op_id="sb.launcher", role="launcher", pid=10, starttime=5, pgid=10)
    recorded = inventory.identities(_reading(chain).records)
    assert inventory.namespace_state(recorded, "sb") == "UNKNOWN"
    chain.add(Kind.PROCESS_TERMINAL, op_id="sb.launcher", wait_status=256, reaper="steward")
    chain.add(Kind.DESCENDANTS_TERMINAL, op_id="sb.launcher", count=0)
    assert inventory.namespace_state(inventory.identities(_reading(chain).records), "sb") == "NEVER_STARTED"
    other = Chain()
    other.add(Kind.PROCESS_INTENT, op_id="sb.launcher", role="launcher", pid=10, starttime=5, pgid=10)
    other.add(Kind.DESCENDANTS_TERMINAL, op_id="sb.launcher", count=1)
    assert inventory.namespace_state(inventory.identities(_reading(other).records), "sb") == "TERMINATED"


def test_only_sandbox_operations_belong_to_a_sandbox():
    assert sandbox_of("abc-1.op-3") == "abc-1"
    assert sandbox_of("helper-2") is None
    assert sandbox_of("output-extract-mount") is None
