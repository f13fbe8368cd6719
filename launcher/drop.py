"""S5/S6: the irreversible drop to the dedicated UID/GID, and its proof before READY.

The order matters: the capability bounding set and the securebits can only
be changed while CAP_SETPCAP is held, so they go first; the UID change then
empties the permitted and effective sets (SECBIT_NO_SETUID_FIXUP is locked
off); the parent-death signal is cleared by a credential change, so it is set
again afterwards. The proof reads what the kernel reports, not what was asked
for, and the starter checks the same observations again with the same rule.
"""

import _signal
import errno
import os

# python-prctl's C module, not its wrapper: the wrapper builds a property for every capability name at import,
# about 0.8 ms of each sandbox's start for the seven calls here, which need none of them (docs/pipeline.md).
import _prctl

from launcher import syscalls

_PR_SET_SECUREBITS = 28
_PR_CAPBSET_DROP = 24
SECBIT_NOROOT = 1 << 0
SECBIT_NOROOT_LOCKED = 1 << 1
SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 3
SECBIT_KEEP_CAPS_LOCKED = 1 << 5
SECBIT_NO_CAP_AMBIENT_RAISE = 1 << 6
SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 7
LOCKED_SECUREBITS = (
    SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
)
_UNCATCHABLE = (_signal.SIGKILL, _signal.SIGSTOP)
# Every capability libcap can name; READY's proof reads the kernel's sets, so one it cannot name still fails closed.
_ALL_CAPABILITIES = list(range(_prctl.CAP_LAST_CAP + 1))
CAPABILITY_SETS = (("cap_inh", "CapInh"), ("cap_prm", "CapPrm"), ("cap_eff", "CapEff"), ("cap_bnd", "CapBnd"), ("cap_amb", "CapAmb"))


class DropError(Exception):
    """The drop did not take, or the kernel reports privileges left."""


def last_capability() -> int:
    with open("/proc/sys/kernel/cap_last_cap", "rb") as file:
        return int(file.read())


def close_descriptors_but(*keep: int) -> None:
    """bubblewrap-style hygiene before the drop: only 0, 1, 2 and ``keep`` (the channel, the ops cgroup) stay open."""
    first = 3
    for fd in sorted(keep):
        if fd > first:
            syscalls.close_range(first, fd - 1, 0)
        first = max(first, fd + 1)
    syscalls.close_range(first, syscalls.CLOSE_RANGE_ALL, 0)


def drop(uid: int, gid: int, last_capability: int) -> None:
    """Give up root for good: bounding set, securebits, ambient, groups, ids, caps, then the process flags."""
    for capability in range(last_capability + 1):
        syscalls.prctl(_PR_CAPBSET_DROP, capability)
    syscalls.prctl(_PR_SET_SECUREBITS, LOCKED_SECUREBITS)
    syscalls.prctl(syscalls.PR_CAP_AMBIENT, syscalls.PR_CAP_AMBIENT_CLEAR_ALL)
    # _prctl.set_caps(effective, permitted, inheritable raised; effective, permitted, inheritable cleared)
    _prctl.set_caps([], [], [], [], [], _ALL_CAPABILITIES)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _prctl.set_caps([], [], [], _ALL_CAPABILITIES, _ALL_CAPABILITIES, [])
    _prctl.prctl(_prctl.PR_SET_NO_NEW_PRIVS, 1)
    _prctl.prctl(_prctl.PR_SET_DUMPABLE, 0)
    _prctl.prctl(_prctl.PR_SET_PDEATHSIG, _signal.SIGKILL)
    reset_signals()


def reset_signals() -> None:
    """Every disposition back to default and an empty mask, for pid 1 and every child it forks."""
    for number in range(1, _signal.NSIG):
        if number in _UNCATCHABLE:
            continue
        try:
            _signal.signal(number, _signal.SIG_DFL)
        except (OSError, ValueError):
            continue  # glibc reserves two real-time signals; they cannot be set from Python
    _signal.pthread_sigmask(_signal.SIG_SETMASK, [])


def observe() -> dict:
    """What the kernel says about this process now, as the READY message carries it."""
    try:
        os.setuid(0)
        setuid0_errno = 0
    except OSError as error:
        setuid0_errno = error.errno
    status = {}
    with open("/proc/self/status", "rb") as file:
        for line in file.read().decode("ascii", "replace").splitlines():
            key, _, value = line.partition(":")
            status[key] = value.strip()
    observations = {
        "uids": status.get("Uid", "").split(),
        "gids": status.get("Gid", "").split(),
        "groups": status.get("Groups", ""),
        "setuid0_errno": setuid0_errno,
        "securebits": _prctl.prctl(_prctl.PR_GET_SECUREBITS),
        "no_new_privs": status.get("NoNewPrivs") == "1",
        # The kernel resets the flag to fs.suid_dumpable on the UID change, so only this reading says what holds.
        "dumpable": _prctl.prctl(_prctl.PR_GET_DUMPABLE) != 0,
    }
    for key, name in CAPABILITY_SETS:
        # A missing line reads as all bits set, so it can never pass the check.
        observations[key] = int(status.get(name, "ffffffffffffffff"), 16)
    return observations


def prove(uid: int, gid: int) -> dict:
    """The observations READY carries, once they show a complete drop to ``uid``/``gid``."""
    observations = observe()
    check(observations, uid, gid)
    return observations


def check(observations: dict, uid: int, gid: int) -> None:
    """Refuse READY unless the drop is complete: the one rule, used by the launcher and the starter."""
    problems = []
    if observations["uids"] != [str(uid)] * 4:
        problems.append(f"Uid is {' '.join(observations['uids'])}, not {uid} four times")
    if observations["gids"] != [str(gid)] * 4:
        problems.append(f"Gid is {' '.join(observations['gids'])}, not {gid} four times")
    if observations["groups"] != "":
        problems.append(f"supplementary groups {observations['groups']} remain")
    if observations["securebits"] != LOCKED_SECUREBITS:
        problems.append(f"securebits are {observations['securebits']:#x}, not the locked {LOCKED_SECUREBITS:#x}")
    if observations["setuid0_errno"] != errno.EPERM:
        problems.append(f"setuid(0) did not fail with EPERM (errno {observations['setuid0_errno']})")
    for key, name in CAPABILITY_SETS:
        if observations[key] != 0:
            problems.append(f"{name} is {observations[key]:#x}")
    if observations["no_new_privs"] is not True:
        problems.append("NoNewPrivs is not 1")
    if observations["dumpable"] is not False:
        problems.append("the process is dumpable, so its memory and descriptors could be read through /proc")
    if problems:
        raise DropError("the drop is not proved: " + "; ".join(problems))
