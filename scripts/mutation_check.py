"""scripts/mutation-check: each invariant's guard taken out, and its red test run against what is left.

docs/design.md says, for every numbered invariant, which code enforces it
("Enforced by") and which test turns red when that guard is taken out ("Red
without it"). The table MUTATIONS at the end of this file holds, for each
invariant, the one edit that takes that guard out: an exact piece of the
enforcing file and what replaces it. Most invariants hold by more than one
guard: docs/threat-model.md lists the layers, each with the tests that hold
it, and the table LAYERS holds an edit for each further guard with the tests
that must catch its removal. This script checks every such claim, in a copy
of the checkout:

1. every test named by either table passes, and none is skipped, on the code
   as it is (the control: a test that cannot pass here proves nothing here);
2. for each edit, the edit is made in the copy, its tests run and must fail
   (pytest's exit status 1: tests ran and at least one failed; an error
   before any test, a skip or a pass is not red), then the file is put back.

It prints one JSON line per edit and exits 0 only when every guard's removal
turned its tests red. Run it as root, like scripts/test, so the sandbox
tests run. ``scripts/mutation-check S3 J4`` checks only those invariants'
edits.

The copy holds the checkout's tracked files as they are on disk, with no
bytecode, and its ``.venv`` is a link to this checkout's. Every pytest runs
with the copy first on PYTHONPATH, so a subprocess a test starts imports the
mutated code too, and with PYTHONDONTWRITEBYTECODE, so no cached .pyc of the
code as it was can stand in for the mutated source.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

REPO = pathlib.Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"
ENTRY = re.compile(r"^#### ([TDSJCEFP]\d{1,2})[ \t]*$", re.MULTILINE)
NEXT_HEADING = re.compile(r"^#{1,4} ", re.MULTILINE)
ENFORCED_LINE = re.compile(r"^- \*\*Enforced by\*\* (.*)$", re.MULTILINE)
RED_LINE = re.compile(r"^- \*\*Red without it\*\* (.*)$", re.MULTILINE)
BACKTICKED = re.compile(r"`([^`]+)`")
# A mutant whose tests run longer than this is reported as such, never as red.
MUTANT_SECONDS = 900
USAGE = "usage: scripts/mutation-check [INVARIANT...]"


@dataclasses.dataclass(frozen=True)
class Mutation:
    """An edit that takes one guard out: in ``path``, the piece ``old``, which occurs there exactly once,
    becomes ``new``; ``why`` says what the edit takes away. The edit is the smallest one that removes the
    guard and leaves the file compiling, so a red run says the guard is missing, not that the file broke."""

    path: str
    old: str
    new: str
    why: str


@dataclasses.dataclass(frozen=True)
class Layer:
    """A further guard of ``invariant`` (a layer of docs/threat-model.md): its edit, and the tests that must
    go red without it, each a test function whose docstring names the invariant."""

    invariant: str
    mutation: Mutation
    tests: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Claim:
    """What docs/design.md says of one invariant: the files its guard is in, and its red tests."""

    enforcing_files: frozenset[str]
    red_tests: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Check:
    """One edit and the tests that must fail without what it takes out; ``source`` says who claims so."""

    invariant: str
    source: str
    mutation: Mutation
    tests: tuple[str, ...]


def entries(text: str) -> dict[str, str]:
    """Each invariant id the design doc defines and its entry: from its ``####`` heading to the next heading.
    tests/test_design.py reads the doc through this too."""
    found: dict[str, str] = {}
    for match in ENTRY.finditer(text):
        following = NEXT_HEADING.search(text, match.end())
        if match.group(1) in found:
            raise SystemExit(f"scripts/mutation-check: docs/design.md defines {match.group(1)} twice")
        found[match.group(1)] = text[match.end():following.start() if following else len(text)]
    return found


def claims(text: str) -> dict[str, Claim]:
    """Each invariant entry of the design doc, read as a claim the mutation check can test."""
    found = {}
    for invariant, body in entries(text).items():
        enforced, red = ENFORCED_LINE.search(body), RED_LINE.search(body)
        if enforced is None or red is None:
            raise SystemExit(f"scripts/mutation-check: docs/design.md's {invariant} lacks its Enforced-by or Red-without-it line")
        files = frozenset(reference.split("::")[0] for reference in BACKTICKED.findall(enforced.group(1)))
        tests = tuple(reference for reference in BACKTICKED.findall(red.group(1)) if reference.startswith("tests/"))
        found[invariant] = Claim(files, tests)
    return found


def in_order(found: dict[str, Claim]) -> list[str]:
    """The invariants in the design doc's order of families, each family by number."""
    return sorted(found, key=lambda invariant: ("TDSJCEFP".index(invariant[0]), int(invariant[1:])))


def checks(found: dict[str, Claim], chosen: list[str]) -> list[Check]:
    """The edits of the ``chosen`` invariants, each design-doc edit first and then its layers'."""
    made = []
    for invariant in chosen:
        if invariant in MUTATIONS:
            made.append(Check(invariant, "docs/design.md", MUTATIONS[invariant], found[invariant].red_tests))
        made += [Check(invariant, "docs/threat-model.md", layer.mutation, layer.tests) for layer in LAYERS if layer.invariant == invariant]
    return made


def mutated(source: str, mutation: Mutation) -> str:
    """``source`` with the guard taken out; the piece must occur exactly once, so the edit is the one meant."""
    count = source.count(mutation.old)
    if count != 1:
        raise ValueError(f"the piece to replace occurs {count} times in {mutation.path}, not once")
    return source.replace(mutation.old, mutation.new)


def _edit_problem(mutation: Mutation) -> str | None:
    """Why the edit is not one the check can make (its piece not exactly once in its file, a change of
    nothing, a result that does not compile), or None."""
    try:
        source = (REPO / mutation.path).read_text(encoding="utf-8")
        text = mutated(source, mutation)
    except (OSError, ValueError) as error:
        return str(error)
    if text == source:
        return "the mutation changes nothing"
    if mutation.path.endswith(".py"):
        try:
            compile(text, mutation.path, "exec")
        except SyntaxError as error:
            return f"the mutated {mutation.path} does not compile ({error.msg}, line {error.lineno})"
    return None


def check_catalogue(found: dict[str, Claim], chosen: list[str]) -> list[str]:
    """Why the tables do not match the design doc and the code for the ``chosen`` invariants (empty when
    they do): one design-doc edit each, in a file its Enforced-by line names; every edit's piece occurring
    exactly once in its file, and its result still compiling, so a red run means the guard is missing, not
    that the file broke; every layer naming an invariant of the design doc and tests of its own, and no
    two edits the same. Every invariant chosen: the tables also name none the design doc does not define."""
    problems = [f"{invariant} is in MUTATIONS only" for invariant in sorted(set(MUTATIONS) - set(found))]
    problems += [f"a layer names {layer.invariant}, which docs/design.md does not define" for layer in LAYERS if layer.invariant not in found]
    problems += [f"{invariant} has no mutation in MUTATIONS" for invariant in chosen if invariant not in MUTATIONS]
    for invariant in [invariant for invariant in chosen if invariant in MUTATIONS]:
        mutation, claim = MUTATIONS[invariant], found[invariant]
        if mutation.path not in claim.enforcing_files:
            problems.append(f"{invariant}: {mutation.path} is not named on its Enforced-by line")
            continue
        if not claim.red_tests:
            problems.append(f"{invariant}: its Red-without-it line names no test under tests/")
        problem = _edit_problem(mutation)
        if problem is not None:
            problems.append(f"{invariant}: {problem}")
    for layer in [layer for layer in LAYERS if layer.invariant in chosen]:
        if not layer.tests or not all(test.startswith("tests/test_") and "::test_" in test for test in layer.tests):
            problems.append(f"{layer.invariant} ({layer.mutation.why}): a layer names one or more tests, each tests/test_*.py::test_*")
        problem = _edit_problem(layer.mutation)
        if problem is not None:
            problems.append(f"{layer.invariant} ({layer.mutation.why}): {problem}")
    edits = [(mutation.path, mutation.old) for mutation in [*MUTATIONS.values(), *(layer.mutation for layer in LAYERS)]]
    problems += [f"two edits of {path} replace the same piece" for path, _ in sorted({edit for edit in edits if edits.count(edit) > 1})]
    return problems


def copy_checkout(destination: pathlib.Path) -> None:
    """The tracked files as they are on disk (local edits included), and a link to this checkout's .venv."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True, capture_output=True).stdout
    for name in filter(None, listed.decode("utf-8").split("\0")):
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    (destination / ".venv").symlink_to(REPO / ".venv")


@dataclasses.dataclass(frozen=True)
class Run:
    status: int | None  # None: timed out
    tests: int
    failures: int
    skipped: int
    seconds: float


def is_red(run: Run) -> bool:
    """Tests ran and at least one failed: pytest's status 1. A collection error or a usage error (2 to 5), a
    timeout, a pass or a run where every test was skipped is not red: none of them says a test caught the
    missing guard."""
    return run.status == 1 and run.failures > 0


# How long the processes a run left behind (a sandbox's pid 1 dying of its parent's death) may take to end.
LEFTOVER_SECONDS = 60


def become_subreaper() -> None:
    """Every process a test run leaves behind becomes this process's child, not init's, and :func:`_reap`
    reaps it as it ends: a zombie left on the dedicated ids would meet the next sandbox test's S6 check."""
    import prctl

    prctl.set_child_subreaper(True)


def _reap(pid: int | None, deadline: float | None) -> int | None:
    """Reap each child of this process as it ends, until ``pid`` has ended (its exit status) or, with ``pid``
    None, until none is left (0); None once ``deadline`` has passed."""
    while True:
        try:
            reaped, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            if pid is None:
                return 0
            raise SystemExit(f"scripts/mutation-check: process {pid} was reaped by someone else") from None
        if pid is not None and reaped == pid:
            return os.waitstatus_to_exitcode(status)
        if reaped == 0:
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(0.02)


def run_tests(copy: pathlib.Path, scratch: pathlib.Path, tests: tuple[str, ...], timeout: float | None) -> Run:
    """``tests`` run by pytest in the copy, with ``scratch`` as their TMPDIR (a failed run keeps its own
    directories there), counted from pytest's junit report; whatever the run leaves behind is reaped."""
    report = scratch / "report.xml"
    report.unlink(missing_ok=True)
    environment = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(scratch)}
    argv = [str(copy / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests]
    began = time.monotonic()
    process = subprocess.Popen(argv, cwd=copy, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status = _reap(process.pid, None if timeout is None else began + timeout)
    if status is None:
        process.kill()
        _reap(process.pid, None)
    process.returncode = -1 if status is None else status  # reaped here, so Popen must not wait for it
    seconds = time.monotonic() - began
    if _reap(None, time.monotonic() + LEFTOVER_SECONDS) is None:
        raise SystemExit(f"scripts/mutation-check: processes started by the tests {' '.join(tests)} outlived them by {LEFTOVER_SECONDS} s")
    if status is None or not report.exists():
        return Run(status, 0, 0, 0, seconds)
    counted = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in ElementTree.parse(report).getroot().iter("testsuite"):
        for key in counted:
            counted[key] += int(suite.get(key, "0"))
    return Run(status, counted["tests"], counted["failures"] + counted["errors"], counted["skipped"], seconds)


HELP = f"""{USAGE}

Take each guard out of a copy of this checkout, one at a time, and run the tests that must turn red
without it: the guard each invariant of docs/design.md names (the table MUTATIONS) and the further
layers of docs/threat-model.md (the table LAYERS). First every named test must pass, unskipped, on the
code as it is. Prints one JSON line per edit; exits 0 when every edit turned its tests red, 1 when one
did not (or a table no longer matches the code), 64 for an argument that is not an invariant. Run it as
root, like scripts/test. INVARIANT (S3, J4, ...) limits the check to those invariants' edits."""


def main(arguments: list[str]) -> int:
    if arguments in (["-h"], ["--help"]):
        print(HELP)
        return 0
    found = claims(DESIGN.read_text(encoding="utf-8"))
    unknown = [argument for argument in arguments if argument not in found]
    if unknown:
        print(f"scripts/mutation-check: {unknown[0]} is not an invariant of docs/design.md; {USAGE}", file=sys.stderr)
        return 64
    if os.geteuid() != 0:
        print("scripts/mutation-check: run it as root, like scripts/test: the red tests of the sandbox invariants start sandboxes", file=sys.stderr)
        return 1
    chosen = arguments or in_order(found)
    problems = check_catalogue(found, chosen)
    if problems:
        print(f"scripts/mutation-check: its tables do not match the checkout: {problems[0]}", file=sys.stderr)
        return 1
    made = checks(found, chosen)
    every_test = tuple(dict.fromkeys(test for check in made for test in check.tests))
    red = 0
    become_subreaper()
    # The runs' TMPDIR has a short name of its own: a test's Unix socket path under it must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="casebox-mutation-") as directory, tempfile.TemporaryDirectory(prefix="cbm") as runs:
        # Some tests run casebox as another user, who must reach the copy and the runs' TMPDIR.
        os.chmod(directory, 0o755)
        os.chmod(runs, 0o1777)
        copy = pathlib.Path(directory) / "checkout"
        copy_checkout(copy)
        scratch = pathlib.Path(runs)
        control = run_tests(copy, scratch, every_test, None)
        print(json.dumps({"control": "unmutated", "status": control.status, "tests": control.tests,
                          "failures": control.failures, "skipped": control.skipped, "seconds": round(control.seconds, 1)}))
        if control.status != 0 or control.skipped or control.tests == 0:
            print("scripts/mutation-check: the red tests do not all pass, unskipped, on the code as it is; "
                  "run them with scripts/test to see why", file=sys.stderr)
            return 1
        for check in made:
            path = copy / check.mutation.path
            original = path.read_text(encoding="utf-8")
            path.write_text(mutated(original, check.mutation), encoding="utf-8")
            try:
                outcome = run_tests(copy, scratch, check.tests, MUTANT_SECONDS)
            finally:
                path.write_text(original, encoding="utf-8")
            red += is_red(outcome)
            print(json.dumps({"invariant": check.invariant, "claimed_in": check.source, "red": is_red(outcome),
                              "mutated": check.mutation.path, "why": check.mutation.why, "status": outcome.status,
                              "tests": outcome.tests, "failures": outcome.failures, "seconds": round(outcome.seconds, 1)}), flush=True)
    print(json.dumps({"invariants": len(chosen), "edits": len(made), "red": red}))
    return 0 if red == len(made) else 1


# One edit per invariant of docs/design.md, in its order, for the guard its Enforced-by line names;
# tests/test_design.py keeps them in step.
MUTATIONS = {
    "T1": Mutation(
        "executor/transport/pack.py",
        "    members.sort(key=lambda member: member[0].encode(\"ascii\"))\n",
        "",
        "the bundle's entries are written in the order they were gathered, not sorted",
    ),
    "T2": Mutation(
        "executor/transport/preflight.py",
        "os.read(fd, min(_READ_CHUNK, cap + 1 - size))",
        "os.read(fd, _READ_CHUNK)",
        "a read is not bounded by what is left of the cap, so it can go past the cap before the size is checked",
    ),
    "T3": Mutation(
        "executor/transport/preflight.py",
        "            coordinate = measure(fd)\n",
        "            from executor.transport.ustar import scan\n            scan(lambda offset, length: os.pread(fd, length, offset), status.st_size)\n            coordinate = measure(fd)\n",
        "the trusted side parses the archive's headers before it sizes and hashes it",
    ),
    "T4": Mutation(
        "executor/transport/extract.py",
        "    checked = reader.open_bundle(archive_fd)\n    written = _Written(target_fd)\n    buffer = memoryview(bytearray(reader.CHUNK_BYTES))\n    try:\n        for member in checked.members:\n",
        "    written = _Written(target_fd)\n    buffer = memoryview(bytearray(reader.CHUNK_BYTES))\n    try:\n        _make_directory(written, Member(\"candidate\", True, 0, 0))\n        checked = reader.open_bundle(archive_fd)\n        for member in checked.members[1:]:\n",
        "the top directory is created before the whole preflight has passed",
    ),
    "T5": Mutation(
        "executor/transport/identity.py",
        "struct.pack(\">BH\", state, len(encoded)) + encoded",
        "struct.pack(\">B\", state) + encoded",
        "a record's path is hashed without its length prefix",
    ),
    "T6": Mutation(
        "executor/cases/service.py",
        "        for wheel in wheels:\n            wheel_project(wheel, f\"the sealed candidate's {wheel}\")\n",
        "",
        "the names of the sealed files are taken as wheels without checking they are valid wheel file names",
    ),
    "D1": Mutation(
        "journal/strictjson.py",
        "    _check_depth(text)\n",
        "",
        "the nesting depth of a document is not checked",
    ),
    "D2": Mutation(
        "journal/strictjson.py",
        "ensure_ascii=False",
        "ensure_ascii=True",
        "the writer escapes every non-ASCII character, so a string is no longer written with minimal escapes",
    ),
    "S1": Mutation(
        "steward/provision.py",
        "        if sha256_of_fd(fd, hashlib.sha256) != digest:\n",
        "        if False:\n",
        "the provisioned launcher's SHA-256 is not compared with the shipped launcher's",
    ),
    "S2": Mutation(
        "launcher/protocol.py",
        "            if seq != self.recv_seq:\n",
        "            if False:\n",
        "a message's number is not compared with the next one expected, so a replayed or out-of-order message is taken",
    ),
    "S3": Mutation(
        "launcher/reexec.py",
        "    if seals & REQUIRED_SEALS != REQUIRED_SEALS:\n        raise SealError(",
        "    if False:\n        raise SealError(",
        "the memfd's seals are not checked",
    ),
    "S4": Mutation(
        "launcher/mounts.py",
        "CAPABILITY_ATTRIBUTES = sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV\n",
        "CAPABILITY_ATTRIBUTES = sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV\n",
        "capabilities and /usr are attached without the read-only attribute",
    ),
    "S5": Mutation(
        "launcher/drop.py",
        "        if observations[key] != 0:\n",
        "        if False:\n",
        "a capability left in any set, bounding and ambient included, does not refuse READY",
    ),
    "S6": Mutation(
        "steward/dedicated.py",
        "    if users:\n        pid, name = users[0]\n",
        "    if False:\n        pid, name = users[0]\n",
        "a live process running as the dedicated ids does not refuse the session or the sandbox",
    ),
    "S7": Mutation(
        "launcher/ops.py",
        "        if fields[cap] > MAX_OUTPUT_CAP:\n",
        "        if False:\n",
        "an op whose output caps exceed the protocol's is run instead of refused",
    ),
    "S8": Mutation(
        "launcher/reexec.py",
        "    | syscalls.CLONE_NEWPID\n",
        "",
        "the launcher is not cloned into a new pid namespace, so it is not pid 1 of the sandbox",
    ),
    "S9": Mutation(
        "launcher/reexec.py",
        "    | syscalls.CLONE_NEWNET\n",
        "",
        "the sandbox shares the host's network namespace",
    ),
    "S10": Mutation(
        "launcher/ops.py",
        "    if scratch_full:\n        observed.add(\"DISK\")\n",
        "",
        "a full /tmp or /work is not classed as DISK",
    ),
    "S11": Mutation(
        "launcher/seccomp.py",
        "    except OSError:\n        raise FilterError(f\"{LIBRARY} cannot be loaded, and casebox never runs a sandbox without its syscall filter; \"\n                          f\"{INSTALL_HINT}\") from None\n",
        "    except OSError:\n        return None\n",
        "a libseccomp that cannot be loaded is passed over instead of ending with a sentence",
    ),
    "S12": Mutation(
        "launcher/seccomp.py",
        "    if (reason := unshipped_reason(observations[\"filter_digest\"].hex(), machine)) is not None:\n        problems.append(f\"the loaded filter's {reason}\")\n",
        "",
        "a loaded filter whose digest is not a shipped one is not refused",
    ),
    "S13": Mutation(
        "launcher/kernel.py",
        "    syscalls.keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0)\n",
        "    pass\n",
        "pid 1 keeps its caller's session keyring instead of joining a fresh one",
    ),
    "S14": Mutation(
        "steward/starter.py",
        "    if after.oom_kills > before.oom_kills or (reported != \"OK\" and after.memory_failures > before.memory_failures):\n",
        "    if after.oom_kills > before.oom_kills:\n",
        "a charge refused at the memory cap does not make an op that failed MEMORY",
    ),
    "S15": Mutation(
        "steward/stateroot.py",
        "            fd = self._lock_file(f\"bound-{uid}\")\n            try:\n                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
        "            fd = self._lock_file(f\"bound-{uid}\")\n            try:\n                pass\n",
        "a uid another live session is bound to is not locked, so it is bound again",
    ),
    "J1": Mutation(
        "journal/writer.py",
        "            os.fdatasync(self._fd)\n",
        "",
        "an appended record is not synced before its head is returned",
    ),
    "J2": Mutation(
        "journal/sequence.py",
        "        if kind not in RETIREMENT_KINDS and end > RESERVE_START:\n",
        "        if False:\n",
        "a record of another kind may end inside the retirement reserve",
    ),
    "J3": Mutation(
        "journal/format.py",
        "    fields.done()\n",
        "",
        "a payload key the kind does not freeze is not refused",
    ),
    "J4": Mutation(
        "journal/reader.py",
        "        if differences:\n",
        "        if False:\n",
        "a chain that differs from the stage, journal id or head it is expected to have is not SUBSTITUTED",
    ),
    "J5": Mutation(
        "journal/writer.py",
        "os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW",
        "os.O_CREAT | os.O_NOFOLLOW",
        "the journal is created without O_EXCL, so an existing file is opened and written over",
    ),
    "J6": Mutation(
        "scripts/golden_reference.py",
        "        return 1 if stale else 0\n",
        "        return 0\n",
        "the reference's check passes whatever the committed vectors hold",
    ),
    "C1": Mutation(
        "steward/inventory.py",
        "        return TERMINATED if self.wait_status is not None else STARTED\n",
        "        return TERMINATED\n",
        "a process with no recorded wait status is called TERMINATED all the same",
    ),
    "C2": Mutation(
        "steward/procfs.py",
        "        return parse_stat(text)[2] != self.starttime\n",
        "        return False\n",
        "a pid that now holds a process with another start time is taken for the recorded process",
    ),
    "C3": Mutation(
        "steward/starter.py",
        "            others = [pid for pid in procfs.group_members(group) if pid not in zombies]\n",
        "            others = []\n",
        "the outer group is claimed absent without the procfs scan for its other members",
    ),
    "C4": Mutation(
        "journal/sequence.py",
        "        if fields[\"journal_head\"] not in self.heads:\n",
        "        if False:\n",
        "cleanup evidence may bind a journal head this journal never had",
    ),
    "C5": Mutation(
        "steward/retirement.py",
        "root.area(TOMBSTONES), stage_id, sc.RENAME_NOREPLACE)",
        "root.area(TOMBSTONES), stage_id, 0)",
        "the rename of a stage into the tombstones is made without RENAME_NOREPLACE",
    ),
    "C6": Mutation(
        "steward/helperattempts.py",
        "    return outcome == MISSING\n",
        "    return outcome != \"CLEANED\"\n",
        "any outcome short of CLEANED, not only a raw-zero MISSING, permits another helper attempt",
    ),
    "C7": Mutation(
        "steward/fold.py",
        "    return next(code for code in CODES if code in found)\n",
        "    return min(found)\n",
        "the diagnostic is the code first by name, not the one first in the priority table",
    ),
    "C8": Mutation(
        "steward/fold.py",
        "    if outcomes.ending != \"INTERRUPTED\" and any(status not in (None, 0) for status in outcomes.privileged_statuses):\n",
        "    if False:\n",
        "a privileged process that ended with a nonzero raw wait status leaves the session verified",
    ),
    "C9": Mutation(
        "executor/cases/ownership.py",
        "        if self.state != OPEN:\n            raise OwnershipError(f\"{self.what} was already {self.state}; it is taken or closed exactly once\")\n",
        "        if False:\n            raise OwnershipError(f\"{self.what} was already {self.state}; it is taken or closed exactly once\")\n",
        "a capability already taken or closed can be taken or closed again",
    ),
    "E1": Mutation(
        "executor/evidence/evaluate.py",
        " or terminal[1][\"wait_status\"] != receipt.outcome.wait_status",
        "",
        "a receipt's wait status is not compared with its op's PROCESS_TERMINAL",
    ),
    "E2": Mutation(
        "executor/evidence/evaluate.py",
        "    if binding.attempt_id != expected.attempt_id or expected.attempt_number",
        "    if expected.attempt_number",
        "a receipt's own attempt id is not compared with the attempt being evaluated",
    ),
    "E3": Mutation(
        "executor/evidence/evaluate.py",
        "        return FAIL if FAIL in statuses else PASS\n",
        "        return PASS\n",
        "a FAIL among passing cases folds to a PASS verdict",
    ),
    "E4": Mutation(
        "journal/createonly.py",
        "            _accept_existing(dir_fd, name, data, shown)\n",
        "            pass\n",
        "a file already there under the evidence name is taken for the one being published, whatever it holds",
    ),
    "E5": Mutation(
        "executor/evidence/junit.py",
        "        return self.executed <= 0 or self.collection_errors > 0\n",
        "        return False\n",
        "no junit counts are ever vacuous, so a run that executed nothing, skipped everything or failed to collect can pass",
    ),
    "E6": Mutation(
        "executor/cases/service.py",
        "            runs.append(run)\n",
        "            runs.append(run)\n            if run.receipt.outcome.limit != \"OK\":\n                break\n",
        "the first case that hits a limit, fails to start or fails stops every later one",
    ),
    "E7": Mutation(
        "executor/deps/shadowing.py",
        "    project = _first(candidate_projects, runner_projects)\n",
        "    return None\n    project = _first(candidate_projects, runner_projects)\n",
        "a candidate that ships a runner project or a module named like the standard library's or the runner's is not refused",
    ),
    "E8": Mutation(
        "journal/untrusted.py",
        "    if not kept.isprintable():\n",
        "    if False:\n",
        "characters that are not printable reach the sink unescaped",
    ),
    "F1": Mutation(
        "executor/cli/frontend.py",
        "    except Refused as refusal:\n        return say_refused(refusal)\n",
        "",
        "a refusal inside a command is not turned into exit 64 and its sentence",
    ),
    "F2": Mutation(
        "executor/environ.py",
        "    for name in PASS_THROUGH:\n",
        "    for name in source:\n",
        "every variable of the parent's environment passes to a trusted-side child, not only the allowlisted ones",
    ),
    "F3": Mutation(
        "executor/inputs.py",
        "    if real != perimeter and not real.startswith(perimeter.rstrip(\"/\") + \"/\"):\n",
        "    if False:\n",
        "a path that resolves outside its perimeter is not refused",
    ),
    "F4": Mutation(
        "executor/capability.py",
        "    if _same_name(name, GIT):\n",
        "    if False:\n",
        "an entry named .git below a capability is not refused",
    ),
    "P1": Mutation(
        ".ci/run",
        "for release in bookworm noble; do\n",
        "for release in bookworm; do\n",
        "the run boots only the bookworm guest, never noble, the hosted runners' own release",
    ),
}


# Further guards, each a layer of docs/threat-model.md, in the design doc's order of invariants.
LAYERS: list[Layer] = [
    Layer(
        "T2",
        Mutation(
            "executor/transport/ustar.py",
            "        if self.total > TOTAL_MAX_BYTES:\n",
            "        if False:\n",
            "members that each fit the member cap may together expand past the total cap",
        ),
        ("tests/test_ustar.py::test_total_expanded_size_over_cap_is_refused",),
    ),
    Layer(
        "T3",
        Mutation(
            "executor/scratch.py",
            "            preflight.preflight(copy, expected_sha256)\n",
            "            preflight.preflight(source, expected_sha256)\n",
            "the bundle file given is hashed instead of the private copy the sandbox gets, so bytes swapped in after the copy pass",
        ),
        ("tests/test_preflight.py::test_the_bundle_is_hashed_as_its_private_copy_never_as_the_file_it_was_copied_from",),
    ),
    Layer(
        "T4",
        Mutation(
            "executor/transport/ustar.py",
            "        if segment in (\".\", \"..\"):\n",
            "        if segment == \".\":\n",
            "a member name with a '..' segment is not refused by the name rule",
        ),
        (
            "tests/test_ustar.py::test_bad_member_names_are_refused",
            "tests/test_transport_corpus.py::test_hostile_layouts_inside_candidate_are_refused_for_their_hostile_part",
        ),
    ),
    Layer(
        "T4",
        Mutation(
            "executor/transport/extract.py",
            "FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC\n",
            "FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC\n",
            "the extractor creates files without O_EXCL, so an existing name is opened and written over",
        ),
        ("tests/test_extract.py::test_file_creation_never_reuses_or_follows_an_existing_name",),
    ),
    Layer(
        "T4",
        Mutation(
            "executor/transport/extract.py",
            "    except BaseException:\n        written.undo()\n        raise\n",
            "    except BaseException:\n        raise\n",
            "a refused extraction leaves behind what it had written",
        ),
        ("tests/test_extract.py::test_a_digest_mismatch_in_the_last_wheel_leaves_the_target_empty",),
    ),
    Layer(
        "T5",
        Mutation(
            "executor/transport/manifest.py",
            "        if wheel is None or member.directory:\n            raise Refused(where, \"is not listed in the manifest\")\n",
            "        if wheel is None or member.directory:\n            continue\n",
            "a file or directory the manifest does not list is passed over instead of refused",
        ),
        (
            "tests/test_manifest.py::test_file_not_listed_in_the_manifest_is_refused",
            "tests/test_manifest.py::test_directory_not_listed_in_the_manifest_is_refused",
        ),
    ),
    Layer(
        "T5",
        Mutation(
            "executor/transport/manifest.py",
            "    if digest != wheel.sha256:\n",
            "    if False:\n",
            "a wheel whose bytes hash to another sha256 than its manifest lists is accepted",
        ),
        (
            "tests/test_manifest.py::test_wheel_digest_other_than_listed_is_refused_as_it_streams",
            "tests/test_bundle_check.py::test_check_verifies_wheel_digests",
        ),
    ),
    Layer(
        "T5",
        Mutation(
            "executor/transport/identity.py",
            "        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)\n",
            "        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)\n",
            "the trusted recomputation of the identity follows a symlink in the sealed extraction",
        ),
        ("tests/test_identity.py::test_directory_digest_refuses_anything_but_regular_files",),
    ),
    Layer(
        "D1",
        Mutation(
            "journal/strictjson.py",
            "            if key in result:\n                raise _refused(member_where, \"is a duplicate key\")\n",
            "",
            "an object with a duplicate key is read, its last member winning, instead of refused",
        ),
        ("tests/test_strictjson.py::test_duplicate_keys_are_compared_after_unescaping",),
    ),
    Layer(
        "S1",
        Mutation(
            "steward/provision.py",
            "os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC",
            "os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC",
            "the launcher is created without O_EXCL, so a file already at its name is opened and written over",
        ),
        ("tests/test_provision.py::test_an_existing_file_is_refused",),
    ),
    Layer(
        "S1",
        Mutation(
            "steward/stateroot.py",
            "    if private and info.st_mode & 0o077:\n",
            "    if False:\n",
            "a staging directory open to group or others is not refused",
        ),
        ("tests/test_provision.py::test_a_staging_directory_open_to_group_or_other_is_refused",),
    ),
    Layer(
        "S1",
        Mutation(
            "steward/interpreter.py",
            "    if info.st_uid != 0 or info.st_mode & 0o022:\n        raise SandboxFailure(\n",
            "    if False:\n        raise SandboxFailure(\n",
            "the launcher's interpreter and module directory are not checked root-only, so root imports code another user can change",
        ),
        ("tests/test_provision.py::test_a_module_directory_another_user_can_change_is_refused",),
    ),
    Layer(
        "S2",
        Mutation(
            "steward/starter.py",
            "        if nonce is None or not hmac.compare_digest(message.fields[\"nonce\"], nonce):\n",
            "        if nonce is None:\n",
            "the nonce in HELLO is not compared with the one stage 1 was given",
        ),
        ("tests/test_sandbox.py::test_the_nonce_must_match_and_is_single_use",),
    ),
    Layer(
        "S2",
        Mutation(
            "steward/starter.py",
            "        if uid != 0 or pid != self.outer_launcher.pid:\n",
            "        if False:\n",
            "the starter takes any peer on its rendezvous socket for its launcher, whatever SO_PEERCRED shows",
        ),
        ("tests/test_sandbox.py::test_the_starter_refuses_a_peer_that_is_not_its_launcher",),
    ),
    Layer(
        "S2",
        Mutation(
            "launcher/protocol.py",
            "            if len(fds) != fd_count:\n",
            "            if False:\n",
            "a message carrying descriptors its type does not carry is taken",
        ),
        ("tests/test_launcher_protocol.py::test_descriptors_travel_only_where_the_message_carries_them",),
    ),
    Layer(
        "S2",
        Mutation(
            "launcher/protocol.py",
            "            if name not in expected:\n",
            "            if False:\n",
            "a message of a kind the state machine does not expect next is taken",
        ),
        ("tests/test_launcher_protocol.py::test_an_unexpected_message_aborts",),
    ),
    Layer(
        "S3",
        Mutation(
            "launcher/reexec.py",
            "    if sha256_of_fd(fd) != digest:\n",
            "    if False:\n",
            "a sealed memfd whose bytes are not the authenticated launcher's is not refused",
        ),
        ("tests/test_reexec_seals.py::test_sealed_copy_refuses_bytes_that_are_not_the_authenticated_launcher",),
    ),
    Layer(
        "S3",
        Mutation(
            "launcher/reexec.py",
            "source}\")\n    verify_sealed(memfd, digest)\n",
            "source}\")\n",
            "on re-entry pid 1 does not check its memfd's seals and digest again",
        ),
        ("tests/test_reexec_seals.py::test_reentry_requires_running_from_the_sealed_descriptor",),
    ),
    Layer(
        "S4",
        Mutation(
            "launcher/mounts.py",
            "        sc.mount(None, \"/\", None, sc.MS_REC | sc.MS_PRIVATE)\n",
            "",
            "pid 1 does not make its mount propagation private, so the sandbox's mounts reach a shared host",
        ),
        ("tests/test_sandbox.py::test_no_sandbox_mount_propagates_even_when_the_starters_mounts_are_shared",),
    ),
    Layer(
        "S4",
        Mutation(
            "launcher/mounts.py",
            "        sc.umount2(\".\", sc.MNT_DETACH)\n",
            "",
            "the host's old root is left stacked over the new root instead of detached",
        ),
        (
            "tests/test_escape.py::test_dot_dot_out_of_a_mount_leads_to_the_new_root_not_the_host",
            "tests/test_sandbox.py::test_the_bootstrap_builds_the_documented_filesystem",
        ),
    ),
    Layer(
        "S4",
        Mutation(
            "launcher/mounts.py",
            "            sc.mount_setattr(sc.AT_FDCWD, \"dev\", 0, sc.MOUNT_ATTR_RDONLY)\n",
            "",
            "the sandbox's /dev is left writable",
        ),
        ("tests/test_sandbox.py::test_the_bootstrap_builds_the_documented_filesystem",),
    ),
    Layer(
        "S5",
        Mutation(
            "launcher/drop.py",
            "    if observations[\"dumpable\"] is not False:\n",
            "    if False:\n",
            "a process left dumpable does not refuse READY",
        ),
        ("tests/test_drop_proof.py::test_any_privilege_left_refuses_ready",),
    ),
    Layer(
        "S5",
        Mutation(
            "launcher/drop.py",
            "    observations = observe()\n    check(observations, uid, gid)\n",
            "    observations = observe()\n",
            "the launcher sends READY without checking its own drop",
        ),
        ("tests/test_drop_proof.py::test_the_launcher_refuses_ready_when_nothing_was_dropped",),
    ),
    Layer(
        "S5",
        Mutation(
            "steward/starter.py",
            "                    drop.check(observations, self.spec.uid, self.spec.gid)\n",
            "",
            "the starter does not check READY's drop observations again before it acknowledges them",
        ),
        ("tests/test_drop_proof.py::test_the_starter_refuses_ready_with_privileges_left",),
    ),
    Layer(
        "S5",
        Mutation(
            "launcher/drop.py",
            "    _prctl.prctl(_prctl.PR_SET_PDEATHSIG, _signal.SIGKILL)\n",
            "",
            "the parent-death signal the UID change cleared is not armed again, so pid 1 outlives its starter",
        ),
        ("tests/test_sandbox.py::test_the_sandbox_dies_with_its_starter",),
    ),
    Layer(
        "S6",
        Mutation(
            "steward/dedicated.py",
            "not ids.isdisjoint(fields[:3])",
            "not ids.isdisjoint(fields[:1])",
            "the scan reads only the real id of each process, so one keeping the pair as its effective or saved id passes",
        ),
        ("tests/test_dedicated.py::test_a_squatter_hiding_behind_another_user_s_ids_is_found",),
    ),
    Layer(
        "S6",
        Mutation(
            "steward/dedicated.py",
            "    return bool(flags & _PF_EXITING)\n",
            "    return True\n",
            "beside a sandbox started ahead, every process on the pair is passed over, not only the session's own and exiting ones",
        ),
        ("tests/test_ahead.py::test_s6_beside_a_start_ahead_still_refuses_a_live_stranger_on_the_pair",),
    ),
    Layer(
        "S6",
        Mutation(
            "executor/cli/config.py",
            "    if name in (\"sandbox_uid\", \"sandbox_gid\"):\n        if type(value) is not int or not 1 <= value <= MAX_ID:\n",
            "    if name in (\"sandbox_uid\", \"sandbox_gid\"):\n        if type(value) is not int or not 0 <= value <= MAX_ID:\n",
            "0, root's id, is taken as the sandbox uid or gid",
        ),
        ("tests/test_config.py::test_neither_sandbox_id_is_ever_root",),
    ),
    Layer(
        "S6",
        Mutation(
            "steward/stateroot.py",
            "                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
            "                        pass\n",
            "the lease on a dedicated uid takes no lock, so two sessions hold it at once",
        ),
        ("tests/test_stateroot.py::test_the_lease_admits_one_holder_at_a_time",),
    ),
    Layer(
        "S7",
        Mutation(
            "steward/starter.py",
            "            if forbidden_variable(name):\n",
            "            if False:\n",
            "the starter sends an op whose environment holds a GIT_* or credential variable instead of refusing it",
        ),
        ("tests/test_environ.py::test_the_starter_refuses_a_git_variable_or_a_credential_in_any_op",),
    ),
    Layer(
        "S7",
        Mutation(
            "launcher/ops.py",
            "        syscalls.close_range(3, syscalls.CLOSE_RANGE_ALL, syscalls.CLOSE_RANGE_CLOEXEC)\n",
            "",
            "the op's child execs without marking every descriptor above 2 close-on-exec, so it inherits pid 1's control descriptors",
        ),
        ("tests/test_escape.py::test_no_control_descriptor_reaches_an_op",),
    ),
    Layer(
        "S8",
        Mutation(
            "steward/starter.py",
            "        if found.ppid != os.getpid() or procfs.namespace_pids(pid)[-1] != 1:\n",
            "        if False:\n",
            "the starter releases the pid 1 stage 1 names without checking it is its child and pid 1 of a new pid namespace",
        ),
        ("tests/test_sandbox.py::test_the_starter_releases_only_its_own_child_that_is_pid_one_of_a_new_namespace",),
    ),
    Layer(
        "S8",
        Mutation(
            "launcher/mounts.py",
            "sc.mount(\"proc\", \"proc\", \"proc\", flags, \"hidepid=2\")",
            "sc.mount(\"proc\", \"proc\", \"proc\", flags, None)",
            "the sandbox's /proc is mounted without hidepid=2, so ops see pid 1 and read what it shows",
        ),
        (
            "tests/test_escape.py::test_host_processes_are_invisible",
            "tests/test_escape.py::test_pid_one_descriptors_and_environment_are_closed_to_ops",
        ),
    ),
    Layer(
        "S8",
        Mutation(
            "launcher/ops.py",
            "        os.kill(-1, _signal.SIGKILL)\n",
            "        pass\n",
            "pid 1 kills nothing of the namespace after an op, so it waits for what outlived the op",
        ),
        ("tests/test_escape.py::test_a_double_forked_daemon_is_killed_and_counted",),
    ),
    Layer(
        "S9",
        Mutation(
            "launcher/reexec.py",
            "    | syscalls.CLONE_NEWIPC\n",
            "",
            "the sandbox shares the host's IPC namespace, so host SysV objects are reachable",
        ),
        ("tests/test_escape.py::test_host_sysv_ipc_and_dev_shm_are_unreachable",),
    ),
    Layer(
        "S9",
        Mutation(
            "steward/starter.py",
            "                if procfs.shares_network_namespace(self.init_netns_fd):\n",
            "                if False:\n",
            "the starter acknowledges READY from a pid 1 in its own network namespace",
        ),
        ("tests/test_network_index.py::test_a_launcher_whose_pid_1_shares_the_stewards_network_namespace_never_gets_ready",),
    ),
    Layer(
        "S9",
        Mutation(
            "executor/cases/ownership.py",
            "        if (network != LOOPBACK or index is not None) and self.role != PREPARER:\n",
            "        if False:\n",
            "the case service's starter may ask for the index network",
        ),
        ("tests/test_network_index.py::test_the_case_service_never_gets_the_network",),
    ),
    Layer(
        "S9",
        Mutation(
            "steward/forwarder.py",
            "            if network_namespace_of(listener) != (expected.st_dev, expected.st_ino):\n",
            "            if False:\n",
            "a forwarder socket outside the sandbox's network namespace is not refused",
        ),
        ("tests/test_network_index.py::test_a_forwarder_socket_outside_the_sandboxs_namespace_fails_the_start",),
    ),
    Layer(
        "S9",
        Mutation(
            "steward/forwarder.py",
            "        if target != self.index and target not in self.file_hosts:\n            raise Refusal(403,",
            "        if False:\n            raise Refusal(403,",
            "a destination that is neither the index nor an allowed file host is resolved and reached at any public address",
        ),
        (
            "tests/test_forwarder.py::test_the_index_on_loopback_is_reached_and_every_other_loopback_port_is_refused",
            "tests/test_forwarder.py::test_a_request_to_the_index_is_carried_and_one_to_another_loopback_port_is_refused_and_logged",
        ),
    ),
    Layer(
        "S9",
        Mutation(
            "steward/forwarder.py",
            "                if not public(address):\n",
            "                if False:\n",
            "an allowed file host is reached at whatever address its name resolves to, loopback and the metadata address included",
        ),
        (
            "tests/test_forwarder.py::test_an_allowed_file_host_that_resolves_to_a_non_public_address_is_refused",
            "tests/test_forwarder.py::test_one_non_public_address_among_public_ones_refuses_the_name",
            "tests/test_forwarder.py::test_an_allowed_file_host_whose_real_name_resolves_to_loopback_is_refused",
        ),
    ),
    Layer(
        "S9",
        Mutation(
            "steward/session.py",
            "            suffix = NETWORK_SANDBOX_SUFFIX if network == api.INDEX_NETWORK else \"\"\n",
            "            suffix = \"\"\n",
            "a sandbox with the index network is not named -net, so its ops look like a loopback sandbox's in the journal",
        ),
        ("tests/test_network_index.py::test_an_index_network_sandbox_reaches_the_index_through_its_forwarder_and_nothing_else",),
    ),
    Layer(
        "S10",
        Mutation(
            "launcher/ops.py",
            "        self.data += chunk[:room]\n",
            "        self.data += chunk\n",
            "pid 1 keeps all of an op's output, past its cap",
        ),
        ("tests/test_escape.py::test_an_output_flood_is_capped_and_reported_as_output",),
    ),
    Layer(
        "S10",
        Mutation(
            "steward/starter.py",
            "rlimit_nproc=caps.processes + 2 + spec.companions,",
            "rlimit_nproc=caps.processes + 2,",
            "a sandbox's RLIMIT_NPROC leaves no room for the pid 1s started ahead beside it, so a fork bomb is refused uncounted",
        ),
        ("tests/test_ahead.py::test_a_fork_bomb_beside_sandboxes_started_ahead_is_classified_as_its_process_limit",),
    ),
    Layer(
        "S11",
        Mutation(
            "launcher/seccomp.py",
            "    if (reason := unshipped_reason(digest(data), machine)) is not None:\n        raise FilterError(\n",
            "    if False:\n        raise FilterError(\n",
            "a host whose libseccomp builds a filter other than the shipped ones gets it, not a sentence",
        ),
        ("tests/test_seccomp.py::test_a_host_that_builds_other_bytes_gets_a_sentence_not_a_sandbox",),
    ),
    Layer(
        "S11",
        Mutation(
            "executor/cli/commands/sandbox.py",
            "        require_root(\"casebox sandbox run creates namespaces and mounts\")\n",
            "",
            "casebox sandbox run without root goes on instead of exiting 77 with the command to run under sudo",
        ),
        ("tests/test_sandbox_cli.py::test_without_root_it_fails_with_a_sentence",),
    ),
    Layer(
        "S12",
        Mutation(
            "steward/starter.py",
            "                    seccomp.check(observations, seccomp.inherited_filters())\n",
            "",
            "the starter takes READY's filter proof on the launcher's word instead of checking it again before its ACK",
        ),
        ("tests/test_seccomp.py::test_the_starter_refuses_ready_without_the_filter_proved",),
    ),
    Layer(
        "S12",
        Mutation(
            "executor/evidence/evaluate.py",
            "    if receipt.filter_digest not in SHIPPED_FILTER_DIGESTS or ready is None or ready[1][\"filter_digest\"] != receipt.filter_digest:\n",
            "    if False:\n",
            "a receipt's filter digest is not held to the shipped ones and to its sandbox's SANDBOX_READY",
        ),
        ("tests/test_evaluate.py::test_a_receipt_without_the_shipped_filter_proved_by_its_sandbox_is_unverified",),
    ),
    Layer(
        "S13",
        Mutation(
            "steward/inventory.py",
            "    if extra > 0:\n",
            "    if False:\n",
            "a key the dedicated UID owns beyond its base keyrings is not residue, so cleanup says CLEANED",
        ),
        ("tests/test_kernel_objects.py::test_a_key_the_dedicated_uid_still_owns_makes_cleanup_unverified",),
    ),
    Layer(
        "S14",
        Mutation(
            "steward/starter.py",
            "        self._make_killable_first(found)\n",
            "",
            "the steward does not give an op oom_score_adj 1000 before its release, so the op keeps pid 1's score",
        ),
        ("tests/test_pid_one.py::test_an_op_is_the_oom_killers_first_choice_and_pid_1_its_last",),
    ),
    Layer(
        "S14",
        Mutation(
            "launcher/ops.py",
            "    kill_everything()\n    _, status, usage = reaped or os.wait4(pid, 0)\n",
            "    _, status, usage = reaped or os.wait4(pid, 0)\n",
            "at the deadline pid 1 waits on the op before it kills the rest, so a traced zombie stalls it",
        ),
        ("tests/test_pid_one.py::test_a_traced_zombie_returns_within_the_timeout_as_timeout",),
    ),
    Layer(
        "S14",
        Mutation(
            "steward/starter.py",
            "        return \"MEMORY\" if self.cgroup.counters().oom_kills > self.op_counters.oom_kills else None\n",
            "        return None\n",
            "an op under which pid 1 died while the sandbox's cgroups counted an OOM kill is not MEMORY",
        ),
        ("tests/test_pid_one.py::test_a_pid_1_that_dies_anyway_under_an_oom_kill_is_memory_never_an_internal_failure",),
    ),
    Layer(
        "J1",
        Mutation(
            "steward/starter.py",
            "        record(op_id, target, kind)\n        self.channel.ack(message)\n",
            "        self.channel.ack(message)\n        record(op_id, target, kind)\n",
            "a mount or unmount is permitted before its record is durable",
        ),
        ("tests/test_sandbox.py::test_blocked_processes_and_mounts_wait_for_their_durable_intent",),
    ),
    Layer(
        "J1",
        Mutation(
            "steward/starter.py",
            "        self.ledger.process_intent(op_id, \"descendant\", found.pid, found.starttime, found.pgid)\n        self._make_killable_first(found)\n        self.channel.ack(message)\n",
            "        self._make_killable_first(found)\n        self.channel.ack(message)\n        self.ledger.process_intent(op_id, \"descendant\", found.pid, found.starttime, found.pgid)\n",
            "an op is released before its process intent is durable",
        ),
        ("tests/test_sandbox.py::test_blocked_processes_and_mounts_wait_for_their_durable_intent",),
    ),
    Layer(
        "J1",
        Mutation(
            "journal/writer.py",
            "            _lock(fd, name)\n            reading = read_journal(",
            "            reading = read_journal(",
            "a reopened journal is not locked, so a second writer appends beside the first",
        ),
        ("tests/test_journal_writer.py::test_second_writer_is_refused",),
    ),
    Layer(
        "J2",
        Mutation(
            "journal/reader.py",
            "                if fields[\"prev\"] != previous_hex:\n",
            "                if False:\n",
            "a record's prev is not compared with the digest of the chain before it",
        ),
        ("tests/test_journal_reader.py::test_chain_break_is_corrupt",),
    ),
    Layer(
        "J2",
        Mutation(
            "journal/format.py",
            "        GENESIS_DOMAIN + bytes((len(journal),)) + journal + bytes((len(stage),)) + stage\n",
            "        GENESIS_DOMAIN + bytes((len(journal),)) + journal\n",
            "the chain's starting digest does not bind the stage id",
        ),
        ("tests/test_journal_reader.py::test_genesis_binds_journal_and_stage",),
    ),
    Layer(
        "J3",
        Mutation(
            "journal/format.py",
            "    if strictjson.canonical(value) != payload:\n",
            "    if False:\n",
            "a payload that decodes to the right fields but is not their canonical encoding is accepted",
        ),
        ("tests/test_journal_reader.py::test_payload_must_be_canonical",),
    ),
    Layer(
        "J4",
        Mutation(
            "journal/reader.py",
            "    if len(data) > CAP:\n",
            "    if False:\n",
            "a journal longer than the cap is judged by its first 262,144 bytes, so a full journal with more after it reads VALID",
        ),
        ("tests/test_journal_golden.py::test_reader_gives_each_expected_verdict[over_cap_file]",),
    ),
    Layer(
        "J4",
        Mutation(
            "steward/retirement.py",
            "    if reading.verdict is not Verdict.VALID:\n",
            "    if False:\n",
            "recovery takes a stage's state from a journal that is not VALID instead of preserving it",
        ),
        ("tests/test_retirement.py::test_a_journal_that_is_not_valid_preserves_the_stage_untouched",),
    ),
    Layer(
        "J4",
        Mutation(
            "steward/retirement.py",
            "        expect_head=marker.head if marker else None,\n",
            "        expect_head=None,\n",
            "a tombstone's journal is not checked against the head its seal marker holds",
        ),
        ("tests/test_retirement.py::test_a_seal_marker_that_does_not_match_preserves_the_tombstone",),
    ),
    Layer(
        "J5",
        Mutation(
            "journal/writer.py",
            "            writer._reserve(dir_fd)\n",
            "",
            "a new journal's cap is not reserved on disk before its GENESIS",
        ),
        (
            "tests/test_journal_writer.py::test_create_reserves_the_whole_cap_on_disk_without_changing_the_file",
            "tests/test_journal_writer.py::test_a_reserved_journal_takes_every_record_up_to_its_cap_on_a_full_disk",
        ),
    ),
    Layer(
        "J5",
        Mutation(
            "steward/session.py",
            "            retirement.remove_unborn(self.root, self.stage_id)\n",
            "",
            "a stage whose journal could not be begun is left behind instead of removed at once",
        ),
        ("tests/test_full_disk.py::test_a_full_state_root_opens_no_session_and_says_how_much_it_needs",),
    ),
    Layer(
        "J5",
        Mutation(
            "journal/writer.py",
            "        self._poisoned = error.strerror or str(error)\n        self.close()\n        raise JournalPoisoned(f\"{self._name}: a write or sync failed ({self._poisoned}); the writer is poisoned\") from error\n",
            "        raise JournalPoisoned(f\"{self._name}: a write or sync failed ({error.strerror or str(error)}); the writer is poisoned\") from error\n",
            "a failed write or sync is reported but leaves the writer usable, so a later append retries",
        ),
        (
            "tests/test_journal_writer.py::test_fsync_error_poisons_the_writer",
            "tests/test_journal_writer.py::test_short_write_poisons_the_writer",
        ),
    ),
    Layer(
        "J6",
        Mutation(
            "scripts/golden_reference.py",
            "    \"\"\"RFC 8785 for a flat object of ASCII strings and integers: sorted keys, no spaces.\"\"\"\n",
            "    \"\"\"RFC 8785 for a flat object of ASCII strings and integers: sorted keys, no spaces.\"\"\"\n    from journal.strictjson import canonical as casebox_canonical\n\n    return casebox_canonical(obj)\n",
            "the reference encoder writes payloads with casebox's own canonical encoder",
        ),
        ("tests/test_journal_golden.py::test_reference_encoder_imports_only_the_standard_library",),
    ),
    Layer(
        "C2",
        Mutation(
            "steward/procfs.py",
            "        if handle.gone():\n",
            "        if False:\n",
            "a /proc handle is opened for a pid without checking it holds the process with the recorded start time",
        ),
        ("tests/test_session.py::test_a_process_handle_proves_a_non_child_absent_without_waiting_for_it",),
    ),
    Layer(
        "C3",
        Mutation(
            "steward/starter.py",
            "            for pid in members:\n                pidfd = _await_zombie(pid, SHUTDOWN_SECONDS if pid == self.init_pid else 0)\n                if pidfd is None:\n                    stuck.append(pid)\n                else:\n                    zombies[pid] = pidfd\n            others = [pid for pid in procfs.group_members(group) if pid not in zombies]\n",
            "            others = [pid for pid in procfs.group_members(group) if pid not in members]\n            for pid in members:\n                pidfd = _await_zombie(pid, SHUTDOWN_SECONDS if pid == self.init_pid else 0)\n                if pidfd is None:\n                    stuck.append(pid)\n                else:\n                    zombies[pid] = pidfd\n",
            "the outer group is scanned for other members before its own members are shown to be zombies",
        ),
        ("tests/test_session.py::test_the_outer_group_is_claimed_only_after_zombie_scan_then_reap",),
    ),
    Layer(
        "C3",
        Mutation(
            "steward/starter.py",
            "            self.outer_absent = not others and not stuck\n",
            "            self.outer_absent = not others\n",
            "a member of the outer group never shown to be a zombie does not keep the group from being claimed absent",
        ),
        ("tests/test_session.py::test_a_member_never_shown_a_zombie_leaves_the_outer_group_unproven",),
    ),
    Layer(
        "C4",
        Mutation(
            "steward/recovery.py",
            "    if data is None or documents.digest(data) != digest:\n",
            "    if data is None:\n",
            "recovery takes outer-group claims from a document without checking it hashes to the digest the evidence bound",
        ),
        ("tests/test_retirement.py::test_outer_claims_are_read_only_from_the_document_the_cleanup_evidence_bound",),
    ),
    Layer(
        "C5",
        Mutation(
            "steward/retirement.py",
            "    writer.retirement_intent(text)\n    _pass(hook, AFTER_RETIREMENT_INTENT)\n    rename(root, stage_id, hook)\n",
            "    rename(root, stage_id, hook)\n    writer.retirement_intent(text)\n    _pass(hook, AFTER_RETIREMENT_INTENT)\n",
            "a stage is renamed into the tombstones before its RETIREMENT_INTENT is durable",
        ),
        ("tests/test_retirement.py::test_every_state_converges_to_a_sealed_tombstone_and_stays_there",),
    ),
    Layer(
        "C6",
        Mutation(
            "steward/helperattempts.py",
            "    if status != 0:\n        return NONZERO, None\n",
            "",
            "a helper that exited nonzero has its response accepted all the same",
        ),
        ("tests/test_attempts.py::test_statuses_come_before_the_body",),
    ),
    Layer(
        "C9",
        Mutation(
            "steward/session.py",
            "        except BaseException:\n            os.close(fd)\n            raise\n        self.capabilities[name] = fd\n",
            "        except BaseException:\n            raise\n        self.capabilities[name] = fd\n",
            "a capability the session refuses is left open instead of closed at once",
        ),
        (
            "tests/test_session.py::test_a_refused_capability_is_closed_and_never_mounted",
            "tests/test_session.py::test_a_capability_must_be_a_directory_under_a_name_not_yet_used",
        ),
    ),
    Layer(
        "E1",
        Mutation(
            "executor/evidence/evaluate.py",
            "        or binding.bundle_sha256 != expected.bundle_sha256\n",
            "",
            "a receipt's bundle sha256 is not compared with the one the command line gives",
        ),
        (
            "tests/test_evaluate.py::test_a_bundle_other_than_the_command_line_s_is_unverified",
            "tests/test_evaluate.py::test_a_receipt_bound_to_another_plan_bundle_stage_or_case_is_unverified",
        ),
    ),
    Layer(
        "E1",
        Mutation(
            "executor/evidence/evaluate.py",
            "    if intent is None or intent[1][\"role\"] != OP_ROLE or (\n        intent[1][\"pid\"], intent[1][\"starttime\"], intent[1][\"pgid\"]\n    ) != (process.pid, process.starttime, process.pgid):\n",
            "    if intent is None or intent[1][\"role\"] != OP_ROLE:\n",
            "a receipt's pid, start time and process group are not compared with its op's PROCESS_INTENT",
        ),
        ("tests/test_evaluate.py::test_a_process_identity_the_journal_never_recorded_is_unverified",),
    ),
    Layer(
        "E1",
        Mutation(
            "executor/evidence/evaluate.py",
            "    if networked_op(process.op_id):\n        return \"network_sandbox\"\n",
            "",
            "a receipt whose op ran in a sandbox with the index network is judged like any other",
        ),
        ("tests/test_evaluate.py::test_a_receipt_from_a_sandbox_that_had_the_index_network_is_unverified",),
    ),
    Layer(
        "E1",
        Mutation(
            "journal/files.py",
            "        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)\n",
            "        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)\n",
            "an evidence file is opened following a symlink, so a receipt or journal linked from elsewhere is read",
        ),
        (
            "tests/test_evaluate.py::test_unreadable_or_non_canonical_receipts_are_unverified_malformed",
            "tests/test_evaluate.py::test_a_missing_or_corrupt_journal_is_unverified",
        ),
    ),
    Layer(
        "E2",
        Mutation(
            "executor/evidence/evaluate.py",
            "    elif reading.genesis[\"attempt_id\"] != expected.attempt_id:\n        stage.problem = \"stale\"\n",
            "",
            "a journal whose GENESIS names another attempt counts under a marker rewritten to this one",
        ),
        ("tests/test_evaluate.py::test_a_journal_of_another_attempt_under_a_fresh_marker_is_stale",),
    ),
    Layer(
        "E2",
        Mutation(
            "executor/evidence/evaluate.py",
            "        elif len(found) > 1:\n            reasons[case.id] = \"duplicated\"\n",
            "",
            "a case with receipts in two directories is judged by the first one instead of being duplicated",
        ),
        ("tests/test_evaluate.py::test_a_duplicated_case_is_unverified",),
    ),
    Layer(
        "E2",
        Mutation(
            "executor/evidence/evaluate.py",
            "        if self.problems or UNVERIFIED in statuses:\n",
            "        if UNVERIFIED in statuses:\n",
            "a problem of the evaluation as a whole, such as a receipt for a case outside the plan, leaves a passing verdict PASS",
        ),
        ("tests/test_evaluate.py::test_a_receipt_for_a_case_outside_the_plan_beside_passing_cases_never_lets_the_verdict_pass",),
    ),
    Layer(
        "E4",
        Mutation(
            "journal/createonly.py",
            "        if not stat.S_ISREG(os.fstat(fd).st_mode):\n            raise EvidenceConflict(shown, \"already exists and is not a regular file\")\n",
            "",
            "a FIFO or directory already under an evidence name is read as if it were the file being published",
        ),
        ("tests/test_evidence_files.py::test_create_once_refuses_a_fifo_or_directory_under_its_name_without_waiting",),
    ),
    Layer(
        "E5",
        Mutation(
            "executor/evidence/junit.py",
            "    if any(marker in lowered for marker in _FORBIDDEN):\n",
            "    if False:\n",
            "the junit report is not scanned for DOCTYPE and ENTITY declarations before it is parsed",
        ),
        ("tests/test_junit.py::test_doctype_and_entity_declarations_are_refused",),
    ),
    Layer(
        "E5",
        Mutation(
            "executor/evidence/evaluate.py",
            "        if _SEVERITY[again[0]] > _SEVERITY[status]:\n            return again\n",
            "        return again\n",
            "the counts recomputed from the published junit report may raise a status, not only lower it",
        ),
        ("tests/test_evaluate.py::test_the_published_report_only_ever_downgrades",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/deps/resolver.py",
            "resolve(list(request.runner), index, scratch=scratch, direct={})",
            "resolve(list(request.runner), [*index, \"--find-links\", candidate_dir], scratch=scratch, direct={})",
            "the runner's resolution is offered the bundle's wheels too, so the candidate's own pytest can be pinned as the runner's",
        ),
        ("tests/test_resolver.py::test_the_runner_is_resolved_from_the_index_never_from_the_bundle",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/deps/shadowing.py",
            "        module = _first(names, STDLIB_OPTIONAL_IMPORTS)\n",
            "        module = None\n",
            "a candidate module named like one the standard library imports when it finds one (sitecustomize, org) is not refused",
        ),
        ("tests/test_shadowing.py::test_a_candidate_module_the_standard_library_imports_when_present_is_refused_with_its_name",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/deps/resolver.py",
            "    for name in names:\n        try:\n            check_relative_path(name.removesuffix(\"/\"), name)\n        except Refused as refusal:\n"
            "            raise Failure(\"layout\", f\"{file} holds the member {name[:200]!r}: {refusal.rule}\") from None\n",
            "",
            "a candidate wheel's member name need not be a clean relative path, so a module it installs at the top of the tree goes unlisted",
        ),
        ("tests/test_resolver.py::test_a_member_name_that_is_not_a_clean_relative_path_refuses_the_wheel",
         "tests/test_hostile_candidates.py::test_a_module_a_member_name_climbs_to_the_top_of_the_tree_is_refused"),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/runner_boot.py",
            "        if path is not None or name not in self.own:\n",
            "        if True:\n",
            "the runner boot's finder refuses a module of the candidate's own projects to no importer, the runner's own code included",
        ),
        ("tests/test_runner_boot.py::test_an_interpreter_started_with_site_finds_the_candidate_for_its_program_and_the_verifier_only",
         "tests/test_runner_boot.py::test_the_runner_gets_the_strict_finder_and_refuses_to_start_beside_another_sitecustomize"),
    ),
    Layer(
        "E7",
        Mutation(
            "steward/outputs.py",
            "                os.fchmod(writer, FILE_MODE)\n",
            "                os.fchmod(writer, FILE_MODE | (os.fstat(reader).st_mode & 0o111))\n",
            "a sealed file keeps the execute bits its source had, so a candidate console script on PATH can stand in for a system command",
        ),
        ("tests/test_hostile_candidates.py::test_a_candidate_script_named_like_a_system_command_never_stands_in_for_it",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/service.py",
            "    \"HYPOTHESIS_NO_PLUGINS\": \"1\",\n",
            "",
            "cases run without HYPOTHESIS_NO_PLUGINS, so importing hypothesis in the runner runs the candidate's hypothesis entry points",
        ),
        ("tests/test_hostile_candidates.py::test_a_hypothesis_entry_point_in_a_candidate_the_verifier_imports_never_runs_in_the_runner",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/service.py",
            "    \"PYTHONNOUSERSITE\": \"1\",\n",
            "",
            "cases run without PYTHONNOUSERSITE, so every interpreter of a case reads a user site the candidate can write under HOME",
        ),
        ("tests/test_hostile_candidates.py::test_a_user_site_the_candidate_plants_in_home_never_loads_into_the_verifiers_checker",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/service.py",
            "    return \":\".join([*runtime.stdlib_path, *trees])\n",
            "    return \":\".join([*trees, *runtime.stdlib_path])\n",
            "a case's search path puts the runner and the candidate before the standard library",
        ),
        ("tests/test_pipeline.py::test_the_search_path_is_the_stdlib_then_the_runner_then_the_candidate",
         "tests/test_hostile_candidates.py::test_the_search_path_is_stdlib_then_runner_then_candidate_in_a_real_sandbox"),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/runner_boot.py",
            "    install(programs_import=True)\n    drop_site_packages()\n",
            "    install(programs_import=True)\n",
            "an interpreter started with site keeps the runtime's and the host's site-packages on its search path",
        ),
        ("tests/test_runner_boot.py::test_an_interpreter_started_with_site_searches_no_site_packages_of_its_runtime",),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/service.py",
            "    \"PYTEST_DISABLE_PLUGIN_AUTOLOAD\": \"1\",\n",
            "",
            "cases run without PYTEST_DISABLE_PLUGIN_AUTOLOAD, so pytest loads every pytest11 entry point on the search path, the candidate's among them",
        ),
        ("tests/test_pipeline.py::test_the_search_path_is_the_stdlib_then_the_runner_then_the_candidate",
         "tests/test_hostile_candidates.py::test_a_pytest11_entry_point_in_the_candidate_never_loads"),
    ),
    Layer(
        "E7",
        Mutation(
            "executor/cases/runner_boot.py",
            "    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:\n",
            "    if False:\n",
            "the runner does not make itself non-dumpable, so a process of the same UID can ptrace it wherever its interpreter leaves it dumpable",
        ),
        ("tests/test_runner_boot.py::test_the_runner_makes_itself_non_dumpable_whatever_binary_runs_it",),
    ),
    Layer(
        "E7",
        Mutation(
            "steward/session.py",
            "executables=() if self.interpreter is None else (self.interpreter,),",
            "executables=(),",
            "no sandbox mounts the execute-only copy over the interpreter's path, so every process that execs the interpreter stays dumpable",
        ),
        ("tests/test_session.py::test_every_sandbox_runs_the_interpreter_from_an_execute_only_copy_so_its_processes_are_not_dumpable",),
    ),
    Layer(
        "F3",
        Mutation(
            "steward/stateroot.py",
            "DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC\n",
            "DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC\n",
            "the state root's directories are opened without O_NOFOLLOW, so a planted symlink is followed",
        ),
        (
            "tests/test_stateroot.py::test_a_symlinked_area_is_refused",
            "tests/test_stateroot.py::test_an_entry_that_is_a_symlink_or_foreign_is_refused",
        ),
    ),
    Layer(
        "F3",
        Mutation(
            "steward/stateroot.py",
            "    if info.st_uid != 0:\n        raise Refused(shown, f\"is owned by uid {info.st_uid}; everything in the state root is owned by root\")\n",
            "",
            "a directory or lock file in the state root owned by another user is not refused",
        ),
        ("tests/test_stateroot.py::test_a_foreign_owner_inside_is_refused",),
    ),
    Layer(
        "F4",
        Mutation(
            "steward/session.py",
            "            self.steward.capability_check(fd, f\"capability {name}\")\n",
            "",
            "a capability the session accepts does not pass the F4 predicate",
        ),
        ("tests/test_session.py::test_a_refused_capability_is_closed_and_never_mounted",),
    ),
    Layer(
        "F4",
        Mutation(
            "executor/capability.py",
            "                if link_leaves(target, depth):\n",
            "                if False:\n",
            "a symlink below a capability whose target leaves it is not refused",
        ),
        (
            "tests/test_capability.py::test_a_symlink_to_etc_is_refused",
            "tests/test_capability.py::test_a_relative_symlink_climbing_out_is_refused",
            "tests/test_capability.py::test_dotdot_after_a_name_is_refused",
        ),
    ),
    Layer(
        "F4",
        Mutation(
            "executor/capability.py",
            "            if here == state:\n",
            "            if False:\n",
            "a directory inside the state root is not refused when its parents are climbed",
        ),
        (
            "tests/test_capability.py::test_a_path_inside_the_state_root_is_refused",
            "tests/test_capability.py::test_a_path_inside_the_state_root_reached_through_a_symlink_is_refused",
        ),
    ),
]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
