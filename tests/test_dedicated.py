"""S6's scan of the host: a process that holds the dedicated pair in any of its real, effective or saved ids is
found, however it arranged its ids to look like another user's; a status it cannot read counts as a use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from journal.errors import Refused
from steward import dedicated

# A squatter that keeps one id of the pair and shows another user's ids everywhere else, then says so.
_SQUATTER = """
import os, sys
uid, gid, other_uid, other_gid, which = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
os.setgroups([])
if which == "saved uid":
    os.setresgid(other_gid, other_gid, other_gid)
    os.setresuid(other_uid, other_uid, uid)
elif which == "effective gid":
    os.setresgid(other_gid, gid, other_gid)
    os.setresuid(other_uid, other_uid, other_uid)
elif which == "real uid":
    os.setresgid(other_gid, other_gid, other_gid)
    os.setresuid(uid, other_uid, other_uid)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.root
@pytest.mark.parametrize("which", ["saved uid", "effective gid", "real uid"])
def test_a_squatter_hiding_behind_another_user_s_ids_is_found(sandbox_ids, other_ids, which):
    """S6: a process whose ids show another user but keep one of the pair (here only its saved UID, only its
    effective GID, or only its real UID, so it can switch back at will) uses the pair, and the sandbox is
    refused; red when the scan reads fewer than the three ids of each line."""
    uid, gid = sandbox_ids
    squatter = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _SQUATTER, str(uid), str(gid), *map(str, other_ids), which],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert squatter.stdout.readline() == "ready\n"
        assert squatter.pid in [pid for pid, _ in dedicated.processes_using(uid, gid)]
        with pytest.raises(Refused, match=f"process {squatter.pid} \\(python"):
            dedicated.require_unused(uid, gid)
    finally:
        squatter.kill()
        squatter.wait()
    assert squatter.pid not in [pid for pid, _ in dedicated.processes_using(uid, gid)]


def test_a_status_without_its_id_lines_counts_as_a_use():
    """S6 fails closed: a status whose Uid or Gid line is missing or not four ids is a process using the pair;
    an ordinary status of other ids is not."""
    wanted = {b"Uid": {b"2000000000"}, b"Gid": {b"2000000000"}}
    ordinary = b"Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t64\n"
    assert dedicated._uses(ordinary, wanted) is False
    assert dedicated._uses(ordinary.replace(b"\t0\t0\t0\t0\nGid", b"\t0\t0\t2000000000\t0\nGid"), wanted) is True
    assert dedicated._uses(ordinary.replace(b"Gid:\t0\t0\t0\t0\n", b""), wanted) is True
    assert dedicated._uses(ordinary.replace(b"Uid:\t0\t0\t0\t0", b"Uid:\t0\t0"), wanted) is True
    assert dedicated._name(ordinary) == "sleep"
