"""How the CLI reaches the steward: the composition root of steward/ (docs/steward-protocol.md).

- :func:`capability_check`: F4's one predicate (``executor/capability.py``),
  installed into the steward for every descriptor a client hands a session.
- :func:`steward_for`: a :class:`~steward.session.Steward` with this
  configuration and that predicate.
- :func:`open_session`: for root, an embedded steward running the session in
  this process (the journal and the evidence are the daemon's own); the
  daemon's socket client (``steward.client``) is the other leg of this
  choice and lands with the daemon.
"""

from __future__ import annotations

import os

from executor.capability import check_directory
from executor.config import Config
from executor.frontend import InternalFailure
from steward.session import CapabilityCheck, Settings


def capability_check(state_root: str) -> CapabilityCheck:
    """F4's one predicate for every directory a client hands the steward: the walk of executor/capability.py."""

    def check(fd: int, name: str) -> None:
        check_directory(fd, name, state_root=state_root)

    return check


def settings_from(config: Config) -> Settings:
    return Settings(state_root=config.state_root, uid=config.sandbox_uid, gid=config.sandbox_gid)


def steward_for(config: Config):
    """A steward over ``config``'s state root (root only: it opens the state root)."""
    from steward.session import Steward

    if os.geteuid() != 0:
        raise InternalFailure("the steward runs as root; run this with sudo.")
    return Steward(settings_from(config), capability_check=capability_check(config.state_root))


def open_session(config: Config, attempt_id: str):
    """A session of an embedded steward for this one attempt (root only); it closes its steward when it ends."""
    if os.geteuid() != 0:
        raise InternalFailure("the embedded steward needs root to create namespaces and mounts; run this with sudo.")
    steward = steward_for(config)
    try:
        return steward.open_session(attempt_id, single=True)
    except BaseException:
        steward.close()
        raise
