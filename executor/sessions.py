"""How the CLI reaches the steward: the composition root of steward/ (docs/steward-protocol.md).

- :func:`open_session`: the daemon's session over its socket when one
  answers; otherwise, for root, an embedded steward running the same code in
  this process for this one session (the journal and the evidence are the
  same); otherwise exit 70 with what to do.
- :func:`steward_for`: a :class:`~steward.session.Steward` with this
  configuration and the one capability predicate (F4).
"""

from __future__ import annotations

import os

from executor.capability import check_descriptor
from executor.config import Config
from executor.frontend import InternalFailure
from steward.session import CapabilityCheck, Settings


def capability_check(state_root: str) -> CapabilityCheck:
    """F4's one predicate (``executor.capability``) for every directory a client hands the steward."""

    def check(fd: int, name: str) -> None:
        check_descriptor(fd, name, state_root=state_root)

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
    """A session from the daemon at ``config.socket``, else (as root) from an embedded steward."""
    from steward import client

    try:
        return client.connect(config.socket).open_session(attempt_id)
    except client.Unreachable:
        if os.geteuid() != 0:
            raise InternalFailure(
                f"no steward listens on {config.socket}, and the embedded steward needs root; "
                "start casebox-steward.service or run this with sudo."
            ) from None
    steward = steward_for(config)
    try:
        return steward.open_session(attempt_id, single=True)
    except BaseException:
        steward.close()
        raise
