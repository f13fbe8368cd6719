"""Resource limits (S4) and the limit classes an op can end in (S10).

FSIZE, NOFILE, NPROC and CORE=0 are set on the launcher at bootstrap and
inherited; CPU is set per op in the op's child from its timeout. Memory is
no rlimit's: the cgroup caps it (S14; an address-space limit stops thread
creation long before memory runs out, and its failure would read as the
candidate's). How each class is observed is in docs/launcher.md ("Limit
classes").
"""

import resource

from launcher.vocabulary import CLASSES


def worst(observed) -> str:
    """The class of an op that hit every limit in ``observed`` (an empty set is OK), in the order of CLASSES.

    A name that is no class is refused, never ranked: ranked last it would read as OK.
    """
    unknown = set(observed).difference(CLASSES)
    if unknown:
        raise ValueError(f"not a limit class: {', '.join(sorted(unknown))}")
    for name in CLASSES:
        if name in observed:
            return name
    return "OK"


def apply_bootstrap_limits(*, processes: int, files: int, file_size: int) -> None:
    """Set soft = hard for each limit; run as root before the drop, so nothing can raise them later."""
    for kind, value in (
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_NOFILE, files),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(kind, (value, value))


def apply_op_cpu_limit(timeout_ms: int) -> None:
    """CPU seconds for one op: the wall timeout rounded up, plus one second before SIGKILL."""
    seconds = -(-timeout_ms // 1000)
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
