"""The names the launcher, the steward and the evaluator must agree on, in one module that imports nothing.

The evaluator runs unprivileged from ``executor/`` and ``journal/`` plus this
one file (it never loads the launcher's cffi bindings), so every list that
both sides check lives here once and the others derive from it.
"""

# The limit classes an op can end in (S10, S14), each with who observes it: the
# launcher from the op's wait status and its own counters, or the steward's
# starter from the sandbox's cgroup counters. When an op hits several, the
# first in this order names it: a limit that was hit explains the timeout or
# the signal that followed it.
OBSERVERS = (
    ("MEMORY", "cgroup"),
    ("PIDS", "cgroup"),
    ("DISK", "launcher"),
    ("OUTPUT", "launcher"),
    ("TIMEOUT", "launcher"),
    ("SIGNALLED", "launcher"),
    ("EXIT_NONZERO", "launcher"),
    ("OK", "launcher"),
)
CLASSES = tuple(name for name, _ in OBSERVERS)
# What a launcher's OP_RESULT may name; anything else is a protocol failure.
LAUNCHER_CLASSES = tuple(name for name, observer in OBSERVERS if observer == "launcher")
# The classes of an op that ended by itself, within every limit: only these are
# judged by their exit code, and so only these can PASS or FAIL (S14: a limit
# never turns into a FAIL).
ENDED_BY_ITSELF = ("EXIT_NONZERO", "OK")

# S12: the SHA-256 of the syscall filter programs launcher.seccomp builds, per
# machine: one per verified libseccomp build that exports other bytes from the
# same rules (docs/launcher.md, "Verified libseccomp versions"). A host whose
# libseccomp builds anything else gets no sandbox, and the evaluator refuses a
# receipt that names any other digest. scripts/seccomp-digest prints a host's
# digest; there is none yet for aarch64.
SHIPPED_DIGESTS = {
    # libseccomp 2.5.0 to 2.6.1 all build these same bytes.
    "x86_64": frozenset({"0daa26d305e6d1fcc1b5390316de43bc6c0f8724be28b40513053ab9b3dea79f"}),
}
