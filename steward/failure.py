"""The one failure type of the root side: the host or the sandbox failed, not the input (exit 70)."""

from __future__ import annotations


class SandboxFailure(Exception):
    """A sandbox could not be built or ended abnormally; the message is one sentence saying why.

    ``limit`` is the limit class of the op the sandbox was running when it ended, where the kernel counted
    one (MEMORY: its cgroup counted an OOM kill), else None (S14: a limit is never an internal failure)."""

    def __init__(self, sentence: str, limit: str | None = None) -> None:
        super().__init__(sentence)
        self.limit = limit
