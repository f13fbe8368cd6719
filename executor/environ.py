"""The one environment builder for trusted-side subprocesses (DESIGN F2, seed 002).

Nothing is inherited by default. A few harmless variables pass through from
the parent; everything else, and above all any ``GIT_*`` variable (they
retarget git: GIT_DIR, GIT_CONFIG_KEY_n/GIT_CONFIG_VALUE_n, GIT_INDEX_FILE,
GIT_OBJECT_DIRECTORY, ...) and anything that looks like a credential, never
reaches a child, even when a caller asks for it explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from launcher.environment import forbidden_variable

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Every sandboxed op's environment starts from these (S7); nothing of the host's passes.
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
PASS_THROUGH = ("TZ", "TERM")


def trusted_env(overrides: Mapping[str, str] | None = None, *, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The complete environment for one trusted-side subprocess."""
    source = os.environ if parent is None else parent
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    for name in PASS_THROUGH:
        if name in source:
            env[name] = source[name]
    for name, value in (overrides or {}).items():
        if forbidden_variable(name):
            raise ValueError(f"{name} may not be passed to a trusted-side subprocess")
        if not name or "\x00" in name or "=" in name or "\x00" in value:
            raise ValueError(f"{name!r} is not a valid environment entry")
        env[name] = value
    return env
