"""S13: kernel objects are per sandbox: keyrings, probed from inside real sandboxes and proved at cleanup.

An op sees a key when its process possesses it (through its session keyring)
or when the key's owner permissions let its UID view it: /proc/keys lists
exactly those, with no system call the filter could deny, so it is the
probe's eye. Every key these tests make for the dedicated UID is cleared
again by the ``clear_dedicated_keys`` fixture, so no later test inherits it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from launcher import seccomp, syscalls
from sandbox_support import PYTHON, contained, hostile, state_root  # noqa: F401
from steward import inventory
from steward_support import one_session, steward, state_path  # noqa: F401

pytestmark = [pytest.mark.root]
NUMBERS = seccomp.NUMBERS[syscalls.MACHINE]
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
# ctypes' syscall for the key calls, in any Python that gets the numbers as its first argument.
KEYS_PY = """
import ctypes, errno, json, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = json.loads(sys.argv[1])

def call(name, *args):
    result = libc.syscall(ctypes.c_long(NR[name]), *(ctypes.c_char_p(arg) if isinstance(arg, bytes) else ctypes.c_long(arg) for arg in args))
    return result if result >= 0 else errno.errorcode[ctypes.get_errno()]

def add_key(description, keyring):
    return call('add_key', b'user\\0', description.encode() + b'\\0', b'secret', 6, keyring)
"""


def _owned(uid: int) -> int:
    return inventory.dedicated_keys(uid)


def _as_dedicated_uid(sandbox_ids, source: str) -> str:
    """Run ``source`` (after KEYS_PY) on the host as the dedicated ids, outside any sandbox; its stdout."""
    uid, gid = sandbox_ids
    done = subprocess.run(
        [PYTHON, "-I", "-c", KEYS_PY + textwrap.dedent(source), json.dumps(NUMBERS)],
        user=uid, group=gid, extra_groups=[], capture_output=True, text=True, timeout=30, check=True,
    )
    return done.stdout


@pytest.fixture
def clear_dedicated_keys(sandbox_ids):
    """Afterwards the dedicated UID owns its base keyrings and nothing else, however the test ended."""
    yield
    _as_dedicated_uid(sandbox_ids, f"call('keyctl', {KEYCTL_CLEAR}, {KEY_SPEC_USER_KEYRING})")
    deadline = time.monotonic() + 10
    while _owned(sandbox_ids[0]) > inventory.BASE_KEYRINGS:  # the kernel collects an unlinked key a moment later
        assert time.monotonic() < deadline, "a key of the dedicated UID outlived its test"
        time.sleep(0.05)


def _proc_keys_op() -> str:
    return """
        import json
        print(json.dumps(open('/proc/keys').read()))
    """


@pytest.mark.usefixtures("contained")
def test_the_callers_session_key_is_invisible_to_an_op(sandbox_ids, state_root, repo):
    """S13: pid 1 joins a fresh session keyring before the drop, so an op never possesses its caller's: a key
    the caller holds in its session keyring does not appear in the op's /proc/keys."""
    uid, gid = sandbox_ids
    caller = KEYS_PY + textwrap.dedent(f"""
        import os
        assert call('keyctl', {KEYCTL_JOIN_SESSION_KEYRING}, b'casebox-test-caller\\0') != 'EPERM'
        assert isinstance(add_key('casebox-caller-secret', {KEY_SPEC_SESSION_KEYRING}), int)
        casebox = sys.argv[2]
        os.execv(casebox, [casebox, 'sandbox', 'run', '--uid', '{uid}', '--gid', '{gid}', '--state-root', sys.argv[3],
                           '--', '/usr/bin/cat', '/proc/keys'])
    """)
    done = subprocess.run(
        [sys.executable, "-I", "-c", caller, json.dumps(NUMBERS), str(repo / ".venv" / "bin" / "casebox"), state_root],
        capture_output=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["class"] == "OK", report
    assert "casebox-caller-secret" not in report["stdout"] and "casebox-test-caller" not in report["stdout"]


@pytest.mark.usefixtures("contained", "clear_dedicated_keys")
def test_a_key_added_in_one_sandbox_is_invisible_in_the_next(sandbox_ids, state_root):
    """S12, S13: the filter denies every key call, so a case cannot leave a key in its UID's user keyring (or
    anywhere) for the next case, attempt or tenant to read; the next sandbox's /proc/keys shows none."""
    first, added = hostile(sandbox_ids, state_root, KEYS_PY + f"""
print(json.dumps([add_key('casebox-left-behind', {KEY_SPEC_USER_KEYRING}), add_key('casebox-session', {KEY_SPEC_SESSION_KEYRING}),
                  call('request_key', b'user\\\\0', b'casebox-left-behind\\\\0', 0, {KEY_SPEC_USER_KEYRING})]))
""", json.dumps(NUMBERS))
    assert added == ["EPERM", "EPERM", "EPERM"], first.stderr
    _, seen = hostile(sandbox_ids, state_root, _proc_keys_op())
    assert "casebox-left-behind" not in seen and "casebox-session" not in seen
    assert _owned(sandbox_ids[0]) <= inventory.BASE_KEYRINGS


@pytest.mark.usefixtures("clear_dedicated_keys")
def test_a_key_the_dedicated_uid_still_owns_makes_cleanup_unverified(steward, state_path, sandbox_ids):
    """S13: cleanup counts the keys the dedicated UID owns in /proc/key-users and binds the count in the
    process inventory its CLEANUP_EVIDENCE names; one key beyond the two base keyrings makes it UNVERIFIED."""
    session = steward.open_session("attempt-keys")
    session.start_sandbox()
    session.close_sandbox()
    planted = _as_dedicated_uid(sandbox_ids, f"print(add_key('casebox-planted', {KEY_SPEC_USER_KEYRING}))")
    assert planted.strip().isdigit()
    closed = session.close()
    assert (closed.cleanup, closed.diagnostic) == ("UNVERIFIED", "CLEANUP_UNVERIFIED")
    documents = os.path.join(closed.tombstone, "documents")
    inventories = [json.loads(open(os.path.join(documents, name)).read()) for name in os.listdir(documents)]
    keys = [document["keys"] for document in inventories if document.get("version") == inventory.PROCESSES_VERSION]
    assert keys and keys[-1] == {"owned": inventory.BASE_KEYRINGS + 1, "base_keyrings": inventory.BASE_KEYRINGS}


def test_a_session_whose_uid_owns_only_its_base_keyrings_is_cleaned(steward, state_path, sandbox_ids):
    """S13, the control: after a sandbox, the dedicated UID owns exactly its two base keyrings, and cleanup is
    CLEANED."""
    _, _, closed = one_session(steward)
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    assert _owned(sandbox_ids[0]) == inventory.BASE_KEYRINGS


@pytest.mark.cgroup2
def test_a_sandbox_cgroup_left_on_the_host_makes_cleanup_unverified(steward, state_path, sandbox_ids):
    """S14, C4, on v1 and v2 alike: cleanup lists every sandbox cgroup of the stage still on the host in the process inventory its
    CLEANUP_EVIDENCE binds, with whether a process is in it; a cgroup left behind with a process in it (here
    planted where the stage's own sandbox cgroups live, as a teardown that failed would leave one) makes the
    cleanup UNVERIFIED. Its control: a closed sandbox leaves no cgroup, and the inventory says so."""
    import subprocess

    from steward import cgroups

    session = steward.open_session("attempt-cgroup")
    session.start_sandbox()
    session.close_sandbox()
    hierarchy = cgroups.detect()
    assert cgroups.stage_directories(session.stage_id) == [], "a closed sandbox leaves no cgroup"
    left = os.path.join(hierarchy.memory_dir, cgroups.sandbox_name(f"{session.stage_id}-99"))
    os.mkdir(left)
    sleeper = subprocess.Popen(["/usr/bin/sleep", "600"])
    try:
        with open(os.path.join(left, "cgroup.procs"), "w") as file:
            file.write(str(sleeper.pid))
        closed = session.close()
    finally:
        sleeper.kill()
        sleeper.wait()
        cgroups.remove_sandbox_directory(left)
    assert (closed.cleanup, closed.diagnostic) == ("UNVERIFIED", "CLEANUP_UNVERIFIED")
    documents = os.path.join(closed.tombstone, "documents")
    inventories = [json.loads(open(os.path.join(documents, name)).read()) for name in os.listdir(documents)]
    listed = [document["cgroups"] for document in inventories if document.get("version") == inventory.PROCESSES_VERSION]
    assert listed and listed[-1] == [{"path": left, "populated": True}]


@pytest.mark.cgroup2
def test_a_closed_session_lists_no_cgroup_of_its_stage(steward, state_path, sandbox_ids):
    """S14, the control, on v1 and v2 alike: after its sandboxes, no cgroup of the stage is left, the inventory's cgroups are empty
    and cleanup is CLEANED."""
    _, _, closed = one_session(steward)
    assert (closed.cleanup, closed.diagnostic) == ("CLEANED", "VERIFIED")
    documents = os.path.join(closed.tombstone, "documents")
    inventories = [json.loads(open(os.path.join(documents, name)).read()) for name in os.listdir(documents)]
    assert [document["cgroups"] for document in inventories if document.get("version") == inventory.PROCESSES_VERSION][-1] == []
