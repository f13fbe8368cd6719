"""scripts/mutation-check: each invariant's guard taken out, and its red test run against what is left.

docs/design.md says, for every numbered invariant, which code enforces it
("Enforced by") and which test turns red when that guard is taken out ("Red
without it"). The table MUTATIONS at the end of this file holds, for each
invariant, the one edit that takes the guard out: an exact piece of the
enforcing file and what replaces it. This script checks the claim itself, in a copy of the checkout:

1. every named red test passes, and none is skipped, on the code as it is
   (the control: a test that cannot pass here proves nothing here);
2. for each invariant, its edit is made in the copy, its red tests run and
   must fail (pytest's exit status 1: tests ran and at least one failed; an
   error before any test, a skip or a pass is not red), then the file is put
   back.

It prints one JSON line per invariant and exits 0 only when every guard's
removal turned its tests red. Run it as root, like scripts/test, so the
sandbox tests run. ``scripts/mutation-check S3 J4`` checks only those.

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




@dataclasses.dataclass(frozen=True)
class Mutation:
    """The edit that takes one invariant's guard out: in ``path``, a file its Enforced-by line names, the
    piece ``old``, which occurs there exactly once, becomes ``new``; ``why`` says what the edit takes away.
    The edit is the smallest one that removes the guard and leaves the file compiling, so a red run says
    the guard is missing, not that the file broke."""

    path: str
    old: str
    new: str
    why: str

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
class Claim:
    """What docs/design.md says of one invariant: the files its guard is in, and its red tests."""

    invariant: str
    enforcing_files: frozenset[str]
    red_tests: tuple[str, ...]


def claims(text: str) -> dict[str, Claim]:
    """Each invariant entry of the design doc, read as a claim the mutation check can test."""
    found = {}
    for match in ENTRY.finditer(text):
        following = NEXT_HEADING.search(text, match.end())
        body = text[match.end():following.start() if following else len(text)]
        enforced, red = ENFORCED_LINE.search(body), RED_LINE.search(body)
        if enforced is None or red is None:
            raise SystemExit(f"scripts/mutation-check: docs/design.md's {match.group(1)} lacks its Enforced-by or Red-without-it line")
        files = frozenset(reference.split("::")[0] for reference in BACKTICKED.findall(enforced.group(1)))
        tests = tuple(reference for reference in BACKTICKED.findall(red.group(1)) if reference.startswith("tests/"))
        found[match.group(1)] = Claim(match.group(1), files, tests)
    return found


def in_order(found: dict[str, Claim]) -> list[str]:
    """The invariants in the design doc's order of families, each family by number."""
    return sorted(found, key=lambda invariant: ("TDSJCEFP".index(invariant[0]), int(invariant[1:])))


def mutated(source: str, mutation: Mutation) -> str:
    """``source`` with the guard taken out; the piece must occur exactly once, so the edit is the one meant."""
    count = source.count(mutation.old)
    if count != 1:
        raise ValueError(f"the piece to replace occurs {count} times in {mutation.path}, not once")
    return source.replace(mutation.old, mutation.new)


def check_catalogue(found: dict[str, Claim], chosen: list[str]) -> list[str]:
    """Why the catalogue does not match the design doc and the code for the ``chosen`` invariants (empty when
    it does): one mutation each, in a file its Enforced-by line names, whose piece occurs exactly once
    there, and whose mutated Python still compiles, so a red run means the guard is missing, not that the
    file broke. Every invariant chosen: the catalogue also names none the design doc does not define."""
    problems = [f"{invariant} is in MUTATIONS only" for invariant in sorted(set(MUTATIONS) - set(found))]
    problems += [f"{invariant} has no mutation in MUTATIONS" for invariant in chosen if invariant not in MUTATIONS]
    for invariant in [invariant for invariant in chosen if invariant in MUTATIONS]:
        mutation, claim = MUTATIONS[invariant], found[invariant]
        if mutation.path not in claim.enforcing_files:
            problems.append(f"{invariant}: {mutation.path} is not named on its Enforced-by line")
            continue
        if not claim.red_tests:
            problems.append(f"{invariant}: its Red-without-it line names no test under tests/")
        try:
            source = (REPO / mutation.path).read_text(encoding="utf-8")
            text = mutated(source, mutation)
        except (OSError, ValueError) as error:
            problems.append(f"{invariant}: {error}")
            continue
        if text == source:
            problems.append(f"{invariant}: the mutation changes nothing")
        elif mutation.path.endswith(".py"):
            try:
                compile(text, mutation.path, "exec")
            except SyntaxError as error:
                problems.append(f"{invariant}: the mutated {mutation.path} does not compile ({error.msg}, line {error.lineno})")
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


def run_tests(copy: pathlib.Path, tests: tuple[str, ...], report: pathlib.Path, timeout: float | None) -> Run:
    environment = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    report.unlink(missing_ok=True)
    argv = [str(copy / ".venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests]
    began = time.monotonic()
    try:
        status = subprocess.run(argv, cwd=copy, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return Run(None, 0, 0, 0, time.monotonic() - began)
    seconds = time.monotonic() - began
    if not report.exists():
        return Run(status, 0, 0, 0, seconds)
    counted = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in ElementTree.parse(report).getroot().iter("testsuite"):
        for key in counted:
            counted[key] += int(suite.get(key, "0"))
    return Run(status, counted["tests"], counted["failures"] + counted["errors"], counted["skipped"], seconds)


def main(arguments: list[str]) -> int:
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
        print(f"scripts/mutation-check: its MUTATIONS table does not match the checkout: {problems[0]}", file=sys.stderr)
        return 1
    every_test = tuple(dict.fromkeys(test for invariant in chosen for test in found[invariant].red_tests))
    red = 0
    with tempfile.TemporaryDirectory(prefix="casebox-mutation-") as directory:
        copy = pathlib.Path(directory) / "checkout"
        copy_checkout(copy)
        report = pathlib.Path(directory) / "report.xml"
        control = run_tests(copy, every_test, report, None)
        print(json.dumps({"control": "unmutated", "status": control.status, "tests": control.tests,
                          "failures": control.failures, "skipped": control.skipped, "seconds": round(control.seconds, 1)}))
        if control.status != 0 or control.skipped or control.tests == 0:
            print("scripts/mutation-check: the red tests do not all pass, unskipped, on the code as it is; "
                  "run them with scripts/test to see why", file=sys.stderr)
            return 1
        for invariant in chosen:
            mutation, claim = MUTATIONS[invariant], found[invariant]
            path = copy / mutation.path
            original = path.read_text(encoding="utf-8")
            path.write_text(mutated(original, mutation), encoding="utf-8")
            try:
                outcome = run_tests(copy, claim.red_tests, report, MUTANT_SECONDS)
            finally:
                path.write_text(original, encoding="utf-8")
            red += is_red(outcome)
            print(json.dumps({"invariant": invariant, "red": is_red(outcome), "mutated": mutation.path, "why": mutation.why,
                              "status": outcome.status, "tests": outcome.tests, "failures": outcome.failures,
                              "seconds": round(outcome.seconds, 1)}), flush=True)
    print(json.dumps({"invariants": len(chosen), "red": red}))
    return 0 if red == len(chosen) else 1


# One entry per invariant of docs/design.md, in its order; tests/test_design.py keeps them in step.
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
