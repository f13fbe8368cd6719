"""S5: READY requires a proved drop; the launcher and the starter apply the same check."""

from __future__ import annotations

import errno
import re

import pytest

from launcher import drop

UID = GID = 2_000_000_100


def proved() -> dict:
    return {
        "uids": [str(UID)] * 4,
        "gids": [str(GID)] * 4,
        "groups": "",
        "setuid0_errno": errno.EPERM,
        "securebits": drop.LOCKED_SECUREBITS,
        "cap_inh": 0,
        "cap_prm": 0,
        "cap_eff": 0,
        "cap_bnd": 0,
        "cap_amb": 0,
        "no_new_privs": True,
    }


def test_a_complete_drop_passes():
    drop.check(proved(), UID, GID)


@pytest.mark.parametrize(
    "change, complaint",
    [
        ({"uids": [str(UID), "0", str(UID), str(UID)]}, "Uid is"),
        ({"gids": [str(GID)] * 3 + ["0"]}, "Gid is"),
        ({"groups": "0"}, "supplementary groups 0 remain"),
        ({"setuid0_errno": 0}, "setuid(0) did not fail"),
        ({"securebits": 0}, "securebits are 0x0"),
        ({"cap_inh": 1}, "CapInh is 0x1"),
        ({"cap_prm": 1 << 21}, "CapPrm is"),
        ({"cap_eff": 1}, "CapEff is"),
        ({"cap_bnd": 0x1FFFFFFFFFF}, "CapBnd is"),
        ({"cap_amb": 4}, "CapAmb is"),
        ({"no_new_privs": False}, "NoNewPrivs is not 1"),
    ],
)
def test_any_privilege_left_refuses_ready(change, complaint):
    """S5: setuid(0) must fail, every capability set must be empty, NoNewPrivs must be 1."""
    observations = {**proved(), **change}
    with pytest.raises(drop.DropError, match=re.escape(complaint)):
        drop.check(observations, UID, GID)
