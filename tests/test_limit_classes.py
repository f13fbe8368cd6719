"""S10: every limit that is hit names the op's class, by one fixed priority."""

from __future__ import annotations

import itertools
import signal

import pytest

from launcher import limits, vocabulary
from launcher.ops import classify
from launcher.protocol import ProtocolError
from steward.cgroups import Counters
from steward.starter import op_class


def test_priority_puts_hit_limits_before_their_consequences():
    """S10: a limit explains the timeout or signal that followed it, so it names the class."""
    assert limits.worst({"TIMEOUT", "PIDS"}) == "PIDS"
    assert limits.worst({"SIGNALLED", "MEMORY", "TIMEOUT"}) == "MEMORY"
    assert limits.worst({"OUTPUT", "SIGNALLED"}) == "OUTPUT"
    assert limits.worst({"EXIT_NONZERO", "DISK"}) == "DISK"
    assert limits.worst({"SIGNALLED", "EXIT_NONZERO"}) == "SIGNALLED"
    assert limits.CLASSES[-1] == "OK" and len(set(limits.CLASSES)) == 8


def test_each_class_names_itself_and_every_set_its_first_class():
    """S10: an op that hit one limit is that class (so OK is OK because it is listed, not by falling through),
    an op that hit several is the first of them in the priority, and an op that hit none is OK."""
    for name in limits.CLASSES:
        assert limits.worst({name}) == name
    for size in range(2, len(limits.CLASSES) + 1):
        for hit in itertools.combinations(limits.CLASSES, size):
            assert limits.worst(set(hit)) == hit[0], hit
    assert limits.worst(set()) == "OK"


# What the launcher observed (the wait status and its flags) and the class it names, one row per way to get there.
OBSERVED = [
    (0, {}, "OK"),
    (1 << 8, {}, "EXIT_NONZERO"),
    (signal.SIGSEGV, {}, "SIGNALLED"),
    (signal.SIGKILL, {"timed_out": True}, "TIMEOUT"),
    (signal.SIGXCPU, {}, "TIMEOUT"),
    (signal.SIGKILL, {"overflowed": True}, "OUTPUT"),
    (0, {"overflowed": True}, "OUTPUT"),
    (signal.SIGXFSZ, {}, "DISK"),
    (1 << 8, {"scratch_full": True}, "DISK"),
    (0, {"scratch_full": True}, "DISK"),
]


@pytest.mark.parametrize("status, flags, expected", OBSERVED)
def test_the_launcher_classifies_what_it_observed(status, flags, expected):
    """S10: time, output and disk limits each get their own class, never OK."""
    observed = {"timed_out": False, "overflowed": False, "scratch_full": False, **flags}
    assert classify(status, **observed) == expected




NOTHING = Counters(oom_kills=0, memory_failures=0, pids_refused=0)


def test_the_starter_adds_the_cgroup_events_to_the_launchers_class():
    """S10: a memory or pids event the cgroup counted names the class, over what the launcher saw."""
    assert op_class("OK", NOTHING, NOTHING) == "OK"
    assert op_class("SIGNALLED", NOTHING, Counters(1, 0, 0)) == "MEMORY"
    assert op_class("OK", NOTHING, Counters(1, 0, 0)) == "MEMORY"
    assert op_class("EXIT_NONZERO", NOTHING, Counters(0, 0, 1)) == "PIDS"


@pytest.mark.parametrize("reported", ["EXIT_NONZERO", "SIGNALLED", "TIMEOUT"])
def test_a_failure_at_the_memory_cap_is_memory_never_the_candidates_failure(reported):
    """S14: an op that did not end OK while the cap refused a charge (a thread, a socket buffer, a tmpfs page)
    is MEMORY, never EXIT_NONZERO and so never FAIL; an op that ended OK despite the pressure stays OK."""
    assert op_class(reported, NOTHING, Counters(0, 3, 0)) == "MEMORY"
    assert op_class("OK", NOTHING, Counters(0, 3, 0)) == "OK"
    assert op_class(reported, Counters(0, 3, 0), Counters(0, 3, 0)) == reported


@pytest.mark.parametrize("reported", ["BOGUS", "ok", "", "MEMORY", "PIDS"])
def test_a_class_the_launcher_may_not_report_is_refused_never_read_as_ok(reported):
    """S10, fail closed: an unknown class (or one only the cgroup may name) ends the sandbox; it never becomes OK."""
    with pytest.raises(ProtocolError, match="limit class"):
        op_class(reported, NOTHING, NOTHING)


def test_every_class_the_launcher_observes_is_accepted_as_itself():
    """S10, the other half of the refusal: the classes the starter accepts from the launcher are exactly those
    the launcher's classify can name, and each, with no cgroup event, stays itself (a starter that refused every
    class, or one that accepted MEMORY or PIDS from the launcher, goes red here)."""
    assert {expected for _, _, expected in OBSERVED} == set(vocabulary.LAUNCHER_CLASSES)
    assert set(limits.CLASSES) - set(vocabulary.LAUNCHER_CLASSES) == {"MEMORY", "PIDS"}
    for reported in vocabulary.LAUNCHER_CLASSES:
        assert op_class(reported, NOTHING, NOTHING) == reported


def test_the_priority_is_the_one_docs_launcher_md_states(repo):
    """S10, docs move with code: every adjacent pair of the documented order is ordered so in the code
    (an output flood that also ran out of time is OUTPUT, a timeout that was also signalled is TIMEOUT)."""
    text = (repo / "docs" / "launcher.md").read_text()
    documented = tuple(text.split("followed: `", 1)[1].split("`", 1)[0].split(", "))
    assert documented == limits.CLASSES
    for higher, lower in zip(documented, documented[1:]):
        assert limits.worst({higher, lower}) == higher


@pytest.mark.parametrize("observed", [{"BOGUS"}, {"ok"}, {"TIMEOUT", "NOT_STARTED"}])
def test_a_name_that_is_no_class_is_refused_never_ranked(observed):
    """S10, fail closed: the priority order ranks only the classes it knows; ranked last, an unknown name
    would read as OK."""
    with pytest.raises(ValueError, match="not a limit class"):
        limits.worst(observed)
