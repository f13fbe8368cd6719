"""The one failure type of the root side: the host or the sandbox failed, not the input (exit 70)."""

from __future__ import annotations


class SandboxFailure(Exception):
    """A sandbox could not be built or ended abnormally; the message is one sentence saying why."""
