"""S13, S14: the kernel state pid 1 sets up for itself and its ops: the OOM killer's view, and the keyrings.

- pid 1 sets its own ``oom_score_adj`` to -1000 while it is root, so the OOM
  killer never chooses it. That takes CAP_SYS_RESOURCE, which a host may
  withhold even from root (the development VM does); pid 1 then keeps its
  score. Each op is given ``OOM_SCORE_ADJ_MAX`` by the steward before its
  release (steward.starter), never by itself: an op is always the OOM
  killer's first choice, pid 1 its last. pid 1 is outside the ops cgroup
  besides, so the memory cap's OOM killer never sees it (S14).
- pid 1 joins a fresh, empty session keyring while it is root: no op ever
  possesses the caller's session keyring or its keys.
- After the drop, pid 1 makes sure the dedicated UID's two base keyrings exist
  (its user keyring and user session keyring), so cleanup's count of the keys
  that UID owns (/proc/key-users) has a fixed floor: any key beyond those two
  is one a case left (steward/keys.py). The syscall filter then denies every
  key call (S12).
"""

from launcher import syscalls

OOM_SCORE_ADJ_MIN = -1000
OOM_SCORE_ADJ_MAX = 1000
_KEYCTL_GET_KEYRING_ID = 0
_KEYCTL_JOIN_SESSION_KEYRING = 1
_KEY_SPEC_USER_KEYRING = -4


def _write_own(name: str, text: str) -> None:
    with open(f"/proc/self/{name}", "w") as file:
        file.write(text)


def exempt_from_oom_killer() -> bool:
    """-1000 for pid 1; False where the host withholds CAP_SYS_RESOURCE and the kernel refuses (EACCES)."""
    try:
        _write_own("oom_score_adj", str(OOM_SCORE_ADJ_MIN))
    except PermissionError:
        return False
    return True


def join_fresh_session_keyring() -> None:
    syscalls.keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0)


def create_user_keyrings() -> None:
    syscalls.keyctl(_KEYCTL_GET_KEYRING_ID, _KEY_SPEC_USER_KEYRING, 1)
