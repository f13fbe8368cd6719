"""How the CLI reaches the steward: the composition root of steward/ (docs/steward-protocol.md).

- :func:`open_session`: the daemon's session over its socket when one
  answers; otherwise, for root, an embedded steward running the same code in
  this process for this one session (the journal and the evidence are the
  same); otherwise exit 77 with what to do. ``embedded=True`` (verify's and
  demo's explicit ``--state-root``) skips the daemon: that state root is
  this process's, never the daemon's.
- :func:`steward_for`: a :class:`~steward.session.Steward` with this
  configuration and the one capability predicate (F4).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from executor.capability import check_descriptor
from executor.cli.config import Config
from executor.cli.frontend import NeedsRoot, as_root_command, require_root

if TYPE_CHECKING:
    from steward.session import CapabilityCheck, Settings

# The root side (steward.session: psutil, the starter, the cleanup helper) is imported only where a steward
# is made, so an unprivileged client of the daemon runs on the standard library, journal/ and steward.client.


def capability_check(state_root: str) -> "CapabilityCheck":
    """F4's one predicate (``executor.capability``) for every directory a client hands the steward."""

    def check(fd: int, name: str) -> None:
        check_descriptor(fd, name, state_root=state_root)

    return check


def settings_from(config: Config) -> "Settings":
    from steward.session import Settings

    return Settings(
        state_root=config.state_root, uid=config.sandbox_uid, gid=config.sandbox_gid, ids=config.sandbox_ids,
        index_file_hosts=config.index_file_hosts, ahead=config.sandboxes_ahead,
    )


def steward_for(config: Config):
    """A steward over ``config``'s state root (root only: it opens the state root)."""
    from steward.session import Steward

    require_root("the steward runs as root")
    return Steward(settings_from(config), capability_check=capability_check(config.state_root))


def open_session(config: Config, attempt_id: str, *, embedded: bool = False):
    """A session from the daemon at ``config.socket``, else (as root) from an embedded steward."""
    from steward import client

    if not embedded:
        try:
            return client.connect(config.socket).open_session(attempt_id)
        except client.Unreachable:
            if os.geteuid() != 0:
                raise NeedsRoot(
                    f"no steward listens on {config.socket}, and the embedded steward needs root; "
                    f"start casebox-steward.service, or run it as root: {as_root_command()}"
                ) from None
    steward = steward_for(config)
    try:
        return steward.open_session(attempt_id, single=True)
    except BaseException:
        steward.close()
        raise


def steward_of(session, config: Config) -> str:
    """Which steward serves ``session``, for verify's and demo's output."""
    from steward.client import RemoteSession

    if isinstance(session, RemoteSession):
        return f"the daemon at {config.socket}"
    return f"embedded in this process, state root {config.state_root}"
