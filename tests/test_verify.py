"""casebox verify and casebox demo, end to end as root, and every refusal before anything is written (docs/pipeline.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from evidence_support import DESIGNED_STATUS
from sandbox_support import mount_table, processes_of

from executor.transport import bundle as bundles
from executor.cases import runtime
from executor.transport import pack, wheelbuild
from executor.cli.commands.demo import DEMO_INSTALLER, DESIGNED, DESIGNED_VERDICT
from executor.evidence.receipts import receipt_from_bytes
from journal.errors import Refused
from journal.reader import read_journal

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
NOBODY = 65534
# The spec of the demo (examples/README.md, checked by tests/test_demo.py): each case's status and reason.
EXPECTED = DESIGNED_STATUS


def scratch_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("casebox-scratch-")}


def table(stdout: str) -> dict[str, tuple[str, ...]]:
    """The rows of a verdict table: case -> the other columns."""
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0] in EXPECTED:
            rows[cells[0]] = tuple(cells[1:])
    return rows


def value(stdout: str, key: str) -> str:
    return re.search(rf"^{key}: (\S+)", stdout, re.M).group(1)


@pytest.fixture(scope="module")
def world(tmp_path_factory, sandbox_ids):
    """A private state root and configuration: never /var/lib/casebox, never the default sandbox ids."""
    base = tmp_path_factory.mktemp("verify")
    config = base / "casebox.toml"
    uid, gid = sandbox_ids
    config.write_text(
        f'state_root = "{base}/state"\nsandbox_uid = {uid}\nsandbox_gid = {gid}\nsocket = "{base}/no-steward.sock"\n'
        # Whatever this host's cores: the demo starts each case's sandbox ahead, as a CI runner's does.
        "sandboxes_ahead = 1\n"
    )
    return base, config


@pytest.fixture(scope="module")
def demo(world, casebox):
    """The demo as a CI job runs it: piped (stdout and stderr are no terminal), GITHUB_ACTIONS=true, and a job
    summary file of its own."""
    base, config = world
    before = mount_table(str(base))
    staged = scratch_dirs()
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(base / "step-summary.md")}
    result = casebox("--config", str(config), "demo", timeout=180, env=env)
    yield result, before, staged
    bundle = re.search(r"^bundle: (\S+)", result.stdout.decode(), re.M)
    if bundle:
        shutil.rmtree(os.path.dirname(bundle.group(1)))


def test_the_demo_command_designs_what_examples_readme_designs():
    """casebox demo judges itself against the README's table: the same status for every case, and UNVERIFIED."""
    assert DESIGNED == {case: status for case, (status, _) in EXPECTED.items()}
    assert DESIGNED_VERDICT == "UNVERIFIED"


@pytest.mark.root
def test_the_demo_gets_every_designed_status(demo):
    """The main job: each of the ten cases gets its designed status and reason, and the verdict is UNVERIFIED."""
    result, _, _ = demo
    stdout = result.stdout.decode()
    assert result.returncode == 0, stdout + result.stderr.decode()
    rows = table(stdout)
    assert {case: (row[1], row[2]) for case, row in rows.items()} == EXPECTED
    assert {case: row[0] for case, row in rows.items()} == DESIGNED
    assert "verdict: UNVERIFIED (designed: UNVERIFIED)" in stdout and DESIGNED_VERDICT == "UNVERIFIED"


@pytest.mark.root
def test_the_demo_as_a_ci_job_sees_it(demo, world, casebox, tmp_path):
    """Issue 13, "Done when": on the demo, piped, with GITHUB_ACTIONS=true and a temporary GITHUB_STEP_SUMMARY:
    the summary names all ten cases; an ::error names assertion-failure; progress lines are on stderr; the
    evidence holds the junit that names test_deliberate_failure; a tombstone whose journal was edited is not
    VALID."""
    from journal.untrusted import markdown_text
    from test_journal_cli import edit_last_time

    result, _, _ = demo
    base, _ = world
    stdout, stderr = result.stdout.decode(), result.stderr.decode()
    summary = (base / "step-summary.md").read_text()
    assert summary.startswith("### casebox demo: UNVERIFIED")
    for case in EXPECTED:
        assert f"| {markdown_text(case)} |" in summary, case
    assert "::error title=casebox assertion-failure::FAIL exit_mismatch: exit code 1, expected 0%0A" in stdout
    assert "::warning title=casebox timeout::UNVERIFIED timeout" in stdout and "::warning title=casebox output-cap::" in stdout
    assert not any(line.startswith("::") and "casebox pass::" in line for line in stdout.splitlines())
    progress = [line for line in stderr.splitlines() if line.startswith("[")]
    assert any(line.endswith("s] running 9 applicable cases of 10, each in a sandbox of its own") for line in progress)
    counted = [line for line in progress if re.match(r"\[ ?\d+/10\] ", line)]
    assert len(counted) == 10 and counted[-1].startswith("[10/10] ")
    assert "[ 8/10] not-applicable N/A" in counted
    assert "  tests.test_core::test_deliberate_failure: assert 4 == 5" in stdout.splitlines()
    evidence = pathlib.Path(value(stdout, "evidence"))
    attempt = value(stdout, "attempt")
    assert b'name="test_deliberate_failure"' in (evidence / f"{attempt}.assertion-failure.junit.xml").read_bytes()
    assert (evidence / f"{attempt}.output-cap.stdout").stat().st_size == 128 * 1024
    tombstone = tmp_path / "tombstone"
    shutil.copytree(value(stdout, "tombstone"), tombstone)
    assert casebox("journal", "verify", str(tombstone)).returncode == 0
    edit_last_time(tombstone / "journal")
    edited = casebox("journal", "verify", str(tombstone))
    assert edited.returncode == 1 and b": SUBSTITUTED, " in edited.stdout and b"seal.json says" in edited.stdout


@pytest.mark.root
def test_the_demo_replay_names_its_sandboxes_by_phase_and_case(demo, casebox):
    """Issue 13: with the evidence, the reviewer's replay says which sandbox extracted, resolved, fetched,
    installed or ran which case, and why the timeout and output-cap ops were killed."""
    stdout = demo[0].stdout.decode()
    replay = casebox("journal", "replay", value(stdout, "tombstone"), "--evidence", value(stdout, "evidence")).stdout.decode()
    for label in ("(extract)", "(resolve)", "(fetch)", "(install)", "(case pass)", "(case network-denied)"):
        assert label in replay, label
    assert "limit class TIMEOUT" in replay and "limit class OUTPUT" in replay


@pytest.mark.root
def test_demo_json_is_one_document_and_quiet_is_silent(world, casebox):
    """Issue 13: demo --json prints one JSON object (the verify document plus the designed statuses); --quiet
    leaves stderr without progress lines."""
    _, config = world
    result = casebox("--config", str(config), "demo", "--json", "--quiet", timeout=180)
    assert result.returncode == 0, result.stderr
    value_ = json.loads(result.stdout)
    assert value_["schema"] == "casebox.demo.v1" and value_["as_designed"] is True
    assert value_["report"]["schema"] == "casebox.report.v2" and value_["report"]["verdict"] == "UNVERIFIED"
    assert {case["id"]: case["status"] for case in value_["report"]["cases"]} == DESIGNED
    assert not [line for line in result.stderr.decode().splitlines() if line.startswith("[")]
    shutil.rmtree(os.path.dirname(value_["bundle"]))


@pytest.mark.root
def test_an_interrupted_demo_retires_its_session_as_interrupted(world, casebox):
    """Issue 13: Ctrl-C (SIGINT to the foreground group) in the middle of the cases: exit 130, and the tombstone's
    diagnostic is INTERRUPTED, never a failed proof such as PRIVILEGED_NONZERO."""
    import signal
    import time

    _, config = world
    # As a terminal's foreground job has it: SIGINT delivered, not ignored. A suite started in the background by a
    # script inherits SIGINT ignored (POSIX shells do that to background jobs), and casebox rightly keeps it so.
    process = subprocess.Popen([str(REPO / ".venv/bin/casebox"), "--config", str(config), "demo"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = b""
    deadline = time.monotonic() + 120
    while b"[ 3/10]" not in seen and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen += line
    # Interrupt only a demo seen in the middle of its cases: one that ended first proves nothing about Ctrl-C.
    assert b"[ 3/10]" in seen, f"the demo never reported its third case before the interrupt: {seen[-2000:]!r}"
    os.killpg(process.pid, signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 130
    listing = json.loads(casebox("--config", str(config), "stage", "list", "--json").stdout)
    attempt = re.search(rb"opening a session for attempt (\S+)", seen).group(1).decode()
    (row,) = [row for row in listing["stages"] if row["attempt_id"] == attempt]
    assert (row["state"], row["diagnostic"], row["cleanup"]) == ("SEALED", "INTERRUPTED", "UNVERIFIED")
    building = re.search(rb"building the demo candidate in (\S+)", seen)
    if building:
        shutil.rmtree(building.group(1).decode(), ignore_errors=True)


@pytest.mark.root
def test_two_installs_of_the_same_wheels_are_one_runner_tree(demo, world, casebox):
    """Issue 14 (5): a second demo is another session and another install of the same runner wheels, and its
    receipts name the very runner inventory digest the first's do. pip's own compile writes its random
    --target directory into every .pyc; with that, each install is a tree of its own, and the stages of one
    verify --jobs, or the shards of one plan on two runners, could never fold (the evaluator admits one runner)."""
    _, config = world
    again = casebox("--config", str(config), "demo", timeout=180)
    try:
        runners = []
        for result in (demo[0], again):
            evidence = pathlib.Path(value(result.stdout.decode(), "evidence"))
            receipts = [receipt_from_bytes(path.read_bytes()) for path in evidence.glob("*.receipt.json")]
            runners.append({receipt.binding.runner_inventory_digest for receipt in receipts} - {None})
        assert len(runners[0]) == 1 and runners[0] == runners[1], runners
    finally:
        bundle = re.search(r"^bundle: (\S+)", again.stdout.decode(), re.M)
        if bundle:
            shutil.rmtree(os.path.dirname(bundle.group(1)))


@pytest.mark.root
def test_the_demo_starts_each_case_sandbox_while_the_case_before_it_runs(demo):
    """Issue 14 through the real verify: after the first case, each case's sandbox was spawned (its launcher's
    PROCESS_INTENT) while the op of a case before it ran (between that op's PROCESS_RELEASED and its
    PROCESS_TERMINAL), so it comes to READY beside that op; and still every receipt names an op of a sandbox
    of its own, which no other receipt names."""
    evidence = pathlib.Path(value(demo[0].stdout.decode(), "evidence"))
    reading = read_journal((evidence / "journal").read_bytes())
    position = {(record.kind.name, record.fields.get("op_id")): n for n, record in enumerate(reading.records)}
    ran = sorted(
        (position[("PROCESS_INTENT", receipt.process.op_id)], receipt.process.op_id)
        for receipt in (receipt_from_bytes(path.read_bytes()) for path in evidence.glob("*.receipt.json"))
        if receipt.process is not None
    )
    sandboxes = [op_id.rsplit(".", 1)[0] for _, op_id in ran]
    assert len(ran) >= 3 and len(set(sandboxes)) == len(sandboxes)
    running = [(position[("PROCESS_RELEASED", op_id)], position[("PROCESS_TERMINAL", op_id)]) for _, op_id in ran]
    early = [
        any(released < position[("PROCESS_INTENT", f"{sandbox}.launcher")] < ended for released, ended in running[:n])
        for n, sandbox in enumerate(sandboxes[1:], start=1)
    ]
    assert all(early), early


@pytest.mark.root
def test_every_receipt_of_an_op_that_ran_carries_its_memory_peak(demo):
    """S14 / issue 12: the case service takes the op's memory high-water mark, as the sandbox's ops cgroup
    measured it, into the receipt: every case whose op ran names a positive observed.memory_peak_bytes (the
    hosts casebox supports run 6.x kernels, all of which keep one: docs/platforms.md)."""
    evidence = pathlib.Path(value(demo[0].stdout.decode(), "evidence"))
    observed = [receipt_from_bytes(path.read_bytes()).outcome.observed for path in evidence.glob("*.receipt.json")]
    peaks = [item.memory_peak_bytes for item in observed if item is not None]
    assert peaks and all(type(peak) is int and peak > 0 for peak in peaks), peaks


@pytest.mark.root
def test_the_demo_leaves_nothing_running_or_mounted(demo, world, sandbox_ids):
    """S6, C4: no process of the dedicated UID survives the attempt, no mount of it remains, no scratch directory is left."""
    _, before, staged = demo
    base, _ = world
    assert processes_of(*sandbox_ids) == []
    assert mount_table(str(base)) == before
    assert scratch_dirs() <= staged, "a verification left a scratch directory"


@pytest.mark.root
def test_the_tombstone_is_sealed_and_valid(demo, casebox):
    """C5, J4: casebox journal verify calls the tombstone's journal VALID, and the tombstone is read-only."""
    stdout = demo[0].stdout.decode()
    tombstone = pathlib.Path(value(stdout, "tombstone"))
    verdict = casebox("journal", "verify", str(tombstone / "journal"))
    assert verdict.returncode == 0 and b"VALID" in verdict.stdout
    assert (tombstone / "seal.json").is_file() and not os.stat(tombstone).st_mode & 0o222
    evidence = pathlib.Path(value(stdout, "evidence"))
    assert (evidence / "journal").read_bytes() == (tombstone / "journal").read_bytes()


@pytest.mark.root
@pytest.mark.parametrize("tree", ["runner", "site"])
def test_each_sealed_tree_holds_checked_hash_bytecode_for_every_module(demo, tree):
    """Issue 14: each sealed tree carries, for every module installed in it, a .pyc compiled in its install
    sandbox before the seal and validated by its source's hash (PEP 552 flags 0b11), so
    no case compiles the runner or the candidate again and a .pyc whose source differs never runs."""
    root = pathlib.Path(value(demo[0].stdout.decode(), "tombstone")) / "outputs" / tree
    sources = [path for path in root.rglob("*.py") if "bin" not in path.relative_to(root).parts]
    assert sources
    for source in sources:
        cached = pathlib.Path(importlib.util.cache_from_source(str(source)))
        header = cached.read_bytes()[:16]
        assert header[:4] == importlib.util.MAGIC_NUMBER, cached
        assert int.from_bytes(header[4:8], "little") == 0b11, f"{cached} is not a checked-hash .pyc"
        assert header[8:16] == importlib.util.source_hash(source.read_bytes()), f"{cached} is stale"


@pytest.mark.root
def test_the_evidence_is_evaluated_alone_by_an_unprivileged_user(demo, tmp_path):
    """E1–E4: a copy of the evidence, evaluated as nobody, gives the same statuses; every binding is recomputable."""
    stdout = demo[0].stdout.decode()
    attempt = value(stdout, "attempt")
    sha256 = value(stdout, "sha256")
    copy = pathlib.Path(tempfile.mkdtemp(prefix="casebox-evidence-"))
    try:
        os.chmod(copy, 0o755)
        shutil.copytree(value(stdout, "evidence"), copy / "evidence")
        shutil.copy(EXAMPLES / "plan.json", copy / "plan.json")
        for package in ("executor", "journal"):
            shutil.copytree(REPO / package, copy / "code" / package, ignore=shutil.ignore_patterns("__pycache__"))
        # Of launcher/, the evaluator needs only the vocabulary it shares, which imports nothing.
        (copy / "code" / "launcher").mkdir()
        for name in ("__init__.py", "vocabulary.py"):
            shutil.copy(REPO / "launcher" / name, copy / "code" / "launcher" / name)
        (copy / "reports").mkdir()
        for path in [copy, *copy.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        os.chown(copy / "reports", NOBODY, NOBODY)
        script = f"import sys; sys.path.insert(0, {str(copy / 'code')!r}); from executor.cli.main import main; sys.exit(main())"
        answer = subprocess.run(
            [runtime.choose_interpreter(), "-I", "-S", "-c", script, "evaluate", "--evidence", str(copy / "evidence"),
             "--plan", str(copy / "plan.json"), "--attempt", attempt, "--bundle-sha256", sha256, "--report-dir", str(copy / "reports")],
            capture_output=True, cwd=copy, env={"PATH": "/usr/bin:/bin"}, timeout=60,
            preexec_fn=lambda: (os.setgroups([]), os.setgid(NOBODY), os.setuid(NOBODY)),
        )
        assert answer.returncode == 3, answer.stderr
        assert {case: tuple(row[:2]) for case, row in table(answer.stdout.decode()).items()} == EXPECTED
        report = json.loads((copy / "reports" / f"report-{attempt}.json").read_bytes())
        receipts = [receipt_from_bytes(path.read_bytes()) for path in (copy / "evidence").glob("*.receipt.json")]
    finally:
        shutil.rmtree(copy)
    assert len(receipts) == 9 and report["verdict"] == "UNVERIFIED"
    bundle = pathlib.Path(value(stdout, "bundle"))
    fd = os.open(bundle, os.O_RDONLY)
    try:
        identity = bundles.identity_of(bundles.open_bundle(fd))
    finally:
        os.close(fd)
    runtime_digest = runtime.inspect(str(EXAMPLES / "index" / DEMO_INSTALLER)).digest
    for receipt in receipts:
        assert receipt.binding.candidate_digest == identity == report["candidate_digest"]
        assert receipt.binding.bundle_sha256 == hashlib.sha256(bundle.read_bytes()).hexdigest()
        assert receipt.binding.runtime_inventory_digest == runtime_digest


@pytest.mark.root
def test_unresolvable_dependencies_leave_every_case_unverified(world, casebox, tmp_path):
    """Step 4: with six missing from the index, pip's resolution fails and every case says so (no_match)."""
    _, config = world
    index = tmp_path / "index"
    shutil.copytree(EXAMPLES / "index", index)
    (index / "six-1.17.0-py2.py3-none-any.whl").unlink()
    bundle, sha256 = packed(tmp_path)
    result = casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256, "--plan", str(EXAMPLES / "plan.json"),
        "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(index), "--attempt", "unresolved-1",
        "--evidence", str(tmp_path / "evidence"), "--root", "/", timeout=120,
    )
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    rows = table(stdout)
    assert {case: row[:2] for case, row in rows.items() if case != "not-applicable"} == {
        case: ("UNVERIFIED", "no_match") for case in EXPECTED if case != "not-applicable"
    }
    assert "dependencies unresolved (no_match)" in stdout and "six" in stdout


@pytest.mark.root
def test_a_bundle_the_extractor_refuses_leaves_every_case_unverified(world, casebox, tmp_path):
    """T3, T4: a bundle with its expected sha256 but a wheel that differs from its manifest passes preflight
    (the trusted side never parses it) and is refused inside the sandbox; no case runs or gets a receipt."""
    _, config = world
    bundle, _ = packed(tmp_path)
    data = bytearray(bundle.read_bytes())
    data[data.index(b"demo_core/__init__.py") + 200] ^= 0x01
    bundle.write_bytes(bytes(data))
    result = casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", hashlib.sha256(data).hexdigest(),
        "--plan", str(EXAMPLES / "plan.json"), "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(EXAMPLES / "index"),
        "--attempt", "refused-bundle-1", "--evidence", str(tmp_path / "evidence"), "--root", "/", timeout=120,
    )
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    assert "the extractor refused" in stdout
    assert {row[1] for case, row in table(stdout).items() if case != "not-applicable"} == {"missing"}
    assert sorted(os.listdir(tmp_path / "evidence")) == ["journal", "seal.json"]


# --- refusals: exit 64, one sentence, nothing written --------------------------------------------


def packed(directory: pathlib.Path) -> tuple[pathlib.Path, str]:
    wheels = wheelbuild.build_demo(str(EXAMPLES / "candidate"), str(directory / "wheels"))
    data = pack.build(pack.read_wheels(sorted(wheels)))
    path = directory / "candidate.tar"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture
def attempt(tmp_path, world):
    """A valid verify command line inside tmp_path; a test changes one thing and expects a refusal."""
    _, config = world
    bundle, sha256 = packed(tmp_path)
    shutil.copy(EXAMPLES / "plan.json", tmp_path / "plan.json")
    shutil.copytree(EXAMPLES / "verifier", tmp_path / "verifier")
    shutil.copytree(EXAMPLES / "index", tmp_path / "index")
    return {
        "--config": str(config), "--bundle": str(bundle), "--sha256": sha256, "--plan": str(tmp_path / "plan.json"),
        "--verifier-tree": str(tmp_path / "verifier"), "--index": str(tmp_path / "index"), "--attempt": "refused-1",
        "--evidence": str(tmp_path / "evidence"), "--root": str(tmp_path),
    }


def refused(casebox, options: dict, naming: str) -> str:
    staged = scratch_dirs()
    argv = ["--config", options["--config"], "verify"]
    for flag, given in options.items():
        if flag != "--config":
            argv += [flag, given]
    sentence = casebox.refused(*argv, naming=naming)
    assert not os.path.exists(options["--evidence"]), "a refusal leaves nothing behind"
    assert scratch_dirs() <= staged, "a verification left a scratch directory"
    return sentence


def test_a_malformed_sha256_is_refused(casebox, attempt):
    """F1: --sha256 must be 64 lowercase hex digits."""
    refused(casebox, {**attempt, "--sha256": "XYZ"}, "--sha256")


def test_a_bundle_with_another_sha256_is_refused(casebox, attempt):
    """T3: the bundle's sha256, hashed from the private copy, must be the expected one."""
    sentence = refused(casebox, {**attempt, "--sha256": "0" * 64}, attempt["--bundle"])
    assert "not the expected" in sentence


@pytest.mark.parametrize("segment", ["deep/er/.git", "a/.GIT"])
def test_a_verifier_tree_holding_git_is_refused(casebox, attempt, segment):
    """F4: a .git at depth 3, or .GIT in capitals, never enters a sandbox (actions/checkout leaves a token there)."""
    git = pathlib.Path(attempt["--verifier-tree"]) / segment
    git.mkdir(parents=True)
    (git / "config").write_text("[http]\n\textraheader = AUTHORIZATION: basic c2VjcmV0\n")
    refused(casebox, attempt, segment.split("/")[-1])


def test_an_index_with_a_symlink_leaving_it_is_refused(casebox, attempt):
    """F4: a symlink to /etc in the index would hand the host's /etc to the resolver."""
    (pathlib.Path(attempt["--index"]) / "etc").symlink_to("/etc")
    refused(casebox, attempt, "etc")


def test_the_state_root_is_never_a_capability(casebox, attempt, world):
    """F4: the state root, or anything inside it, is refused as a verifier tree."""
    base, _ = world
    (base / "state").mkdir(exist_ok=True)
    refused(casebox, {**attempt, "--verifier-tree": str(base / "state"), "--root": "/"}, "state root")


@pytest.mark.parametrize("url, rule", [
    ("http://casebox:s3cret@127.0.0.1:8080/simple/", "no user information"),
    ("https://ghp_token@pypi.example/simple/", "no user information"),
    ("http://127.0.0.1:8080/simple/?token=x", "no query"),
    ("http://127.0.0.1:8080/simple/#frag", "no fragment"),
    ("http://127.0.0.1:8080/simple/\\@evil/", "no spaces or quotes"),
    ("file:///srv/index/", "not an http or https URL"),
    ("ftp://127.0.0.1/simple/", "not an http or https URL"),
    ("http:///simple/", "names no host"),
    ("http://127.0.0.1:99999/simple/", "names no host, or an invalid port"),
])
def test_an_index_url_other_than_plain_http_or_https_is_refused(casebox, attempt, url, rule):
    """Issue 7, no token ever passes into the networked sandbox: user information, a query, a fragment, another
    scheme, no host or a bad port are refused with exit 64 before anything is written."""
    sentence = refused(casebox, {**attempt, "--index": url}, "--index")
    assert rule in sentence


def test_a_path_that_resolves_outside_the_perimeter_is_refused(casebox, attempt, tmp_path):
    """F3: a symlink pointing outward is outside, whatever its own path."""
    outside = pathlib.Path(tempfile.mkdtemp(prefix="casebox-outside-"))
    try:
        shutil.copy(attempt["--plan"], outside / "plan.json")
        (tmp_path / "linked-plan.json").symlink_to(outside / "plan.json")
        refused(casebox, {**attempt, "--plan": str(tmp_path / "linked-plan.json")}, "--plan")
    finally:
        shutil.rmtree(outside)


def test_an_evidence_directory_that_is_not_empty_is_refused(casebox, attempt):
    """E4: an evidence directory holds one stage; a used one is refused, and left as it was."""
    evidence = pathlib.Path(attempt["--evidence"])
    evidence.mkdir()
    (evidence / "journal").write_bytes(b"an earlier stage")
    staged = scratch_dirs()
    casebox.refused("--config", attempt["--config"], "verify", *[x for flag, given in attempt.items() if flag != "--config" for x in (flag, given)], naming="not empty")
    assert os.listdir(evidence) == ["journal"] and scratch_dirs() == staged


def test_a_case_that_cannot_be_materialized_is_refused(casebox, attempt):
    plan = pathlib.Path(attempt["--plan"])
    value = json.loads(plan.read_text())
    value["cases"][2]["args"] = []
    plan.write_text(json.dumps(value))
    refused(casebox, attempt, "$.cases[2].args")


def test_an_evidence_path_swapped_for_a_link_after_it_was_resolved_is_refused(tmp_path):
    """F3: root walks the resolved evidence path without following links, so a directory replaced by a
    symlink after resolve_inside is refused and nothing is created where the link points."""
    from executor.attempt import _evidence_directory

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    resolved = str(workspace / "evidence")
    workspace.rmdir()
    workspace.symlink_to(elsewhere)
    with pytest.raises(Refused) as refusal:
        _evidence_directory(resolved)
    assert refusal.value.where == resolved and "link" in refusal.value.rule
    assert os.listdir(elsewhere) == []


@pytest.mark.root
@pytest.mark.slow
def test_a_sigkilled_verify_leaves_no_staging_directory_after_the_next_run(world, casebox, tmp_path, sandbox_ids):
    """What a SIGKILL leaves in the temporary directory (the bundle copy, the tools) is removed by the next
    verify; that run leaves none of its own; recovery then finds nothing it cannot finish."""
    _, config = world
    bundle, sha256 = packed(tmp_path)
    state = tmp_path / "state"

    def command(attempt: str) -> list[str]:
        return [
            "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256, "--plan",
            str(EXAMPLES / "plan.json"), "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(EXAMPLES / "index"),
            "--attempt", attempt, "--evidence", str(tmp_path / attempt), "--root", "/", "--state-root", str(state),
        ]

    staged = scratch_dirs()
    killed = subprocess.Popen([str(REPO / ".venv" / "bin" / "casebox"), *command("killed-1")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (left := [name for name in scratch_dirs() - staged
                        if os.path.exists(os.path.join(tempfile.gettempdir(), name, "tools"))]):
        assert time.monotonic() < deadline and killed.poll() is None, "the verification never staged its tools"
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert set(left) <= scratch_dirs(), "the killed verification's scratch directory is there to be removed"
    result = casebox(*command("next-1"), timeout=300)
    assert result.returncode == 3, result.stdout.decode() + result.stderr.decode()
    assert scratch_dirs() <= staged - set(left), "a scratch directory outlived its verification"
    recovered = casebox("--config", str(config), "stage", "recover", "--all", "--state-root", str(state))
    assert recovered.returncode == 0, recovered.stdout.decode()
    assert processes_of(*sandbox_ids) == []


@pytest.mark.root
def test_stage_recover_removes_and_lists_what_a_killed_verify_left(world, casebox, tmp_path):
    """The operator's view: `stage recover --all` removes root's scratch directories whose verification was
    killed, one line each."""
    from test_scratch import killed_scratch

    _, config = world
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    path = killed_scratch(scratch)
    (tmp_path / "state").mkdir(mode=0o700)
    result = casebox("--config", str(config), "stage", "recover", "--all", "--state-root", str(tmp_path / "state"),
                     env={**os.environ, "TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert f"ok   scratch {path}: a verification that was killed left it; removed" in result.stdout.decode()
    assert not path.exists()


@pytest.mark.root
@pytest.mark.slow
def test_a_verify_stopped_with_sigterm_leaves_no_staging_and_its_stage_retired_or_recoverable(world, tmp_path, sandbox_ids, casebox):
    """SIGTERM (a CI job cancelled) ends verify as Ctrl-C does (exit 130): its scratch directory is removed,
    and its embedded session is retired as INTERRUPTED on the way out. Where the interrupt lands inside the
    steward's own work (a sandbox starting), that retirement may not complete; the stage then keeps a VALID
    journal (the writer is never left half-advanced) and recovery seals it."""
    _, config = world
    bundle, sha256 = packed(tmp_path)
    state = tmp_path / "state"
    staged = scratch_dirs()
    running = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "casebox"), "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256,
         "--plan", str(EXAMPLES / "plan.json"), "--verifier-tree", str(EXAMPLES / "verifier"), "--index", str(EXAMPLES / "index"),
         "--attempt", "stopped-1", "--evidence", str(tmp_path / "evidence"), "--root", "/", "--state-root", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )

    def journal_records() -> int:
        journals = list((state / "stages").glob("*/journal")) if (state / "stages").is_dir() else []
        return len(read_journal(journals[0].read_bytes()).records) if journals else 0

    deadline = time.monotonic() + 60
    while journal_records() < 3:  # GENESIS, then the session's first records: the session is open
        assert time.monotonic() < deadline and running.poll() is None, "the verification never used its session"
        time.sleep(0.01)
    assert scratch_dirs() - staged, "the verification has its scratch directory"
    running.send_signal(signal.SIGTERM)
    _, stderr = running.communicate(timeout=300)
    assert running.returncode == 130, stderr
    assert scratch_dirs() <= staged, "the scratch directory outlived the interrupted verification"
    left = os.listdir(state / "stages")
    for stage_id in left:
        assert read_journal((state / "stages" / stage_id / "journal").read_bytes()).verdict == "VALID"
    if left:
        recovered = casebox("--config", str(config), "stage", "recover", "--all", "--state-root", str(state))
        assert recovered.returncode == 0, recovered.stdout.decode()
    else:
        (stage_id,) = os.listdir(state / "tombstones")
        note = read_journal((state / "tombstones" / stage_id / "journal").read_bytes()).records[-1].fields["note"]
        assert note == "session=INTERRUPTED diagnostic=INTERRUPTED"
    assert os.listdir(state / "stages") == [] and all(
        (state / "tombstones" / name / "seal.json").exists() for name in os.listdir(state / "tombstones"))
    assert processes_of(*sandbox_ids) == []
