"""The case service and the dependency preparer against an in-memory session: E6, E5 plumbing, resolver aborts, C9 roles."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib

import pytest
from pipeline_support import BINDING, RUNTIME, FakeSession, interrupt_while_a_class_is_made, outcome

from executor.transport import pack
from executor.cases.service import (
    RUNNER_BOOT,
    RUNNER_MODULES,
    SITE_MODULES,
    SITE_PATH,
    Blocked,
    CaseService,
    Extraction,
    Trees,
    case_argv,
    case_env,
    check_materializable,
)
from executor.evidence.evaluate import outcome_status
from executor.evidence.junit import MISSING, READ
from executor.cases.ownership import Gate, OwnershipError

from executor.deps.preparer import Dependencies, Preparer, Unresolved
from executor.inside import MODULES_DIRECTORY
from executor.evidence.receipts import STEP_DEPENDENCIES, STEP_INSTALL, STEP_RUNNER, receipt_from_bytes
from executor.cli.reporting import Progress
from executor.deps.protocol import acks_from_bytes, leaf
from executor.scratch import Scratch
from journal.errors import Refused
from plan_support import case as case_doc
from plan_support import plan as make_plan

JUNIT = b'<testsuites><testsuite name="t"><testcase name="a"/><testcase name="b"/></testsuite></testsuites>'
PLAN = make_plan(
    case_doc("c0", "pytest", ("tests/test_x.py",), 1000, True, 0),
    case_doc("c1", "python-module", ("demo_app",), 1000, True, 0),
    case_doc("c2", "console-script", ("demo-app", "--flag"), 1000, True, 0),
    case_doc("c3", "pytest", (), 1000, False, 0),
)
CASES = list(enumerate(PLAN.cases))
REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def scratch():
    place = Scratch()
    yield place
    place.close()


READY = Trees(site="site", runner="runner")


def service_for(session, plan=PLAN) -> CaseService:
    return CaseService(Gate(session), session, runtime=RUNTIME, plan=plan, progress=lambda line: None)


def receipts(session) -> dict:
    found = [receipt_from_bytes(data) for name, data in session.published.items() if name.endswith(".receipt.json")]
    return {receipt.case_id: receipt for receipt in found}


# --- materialization ----------------------------------------------------------------------------


def test_each_op_is_materialized_as_docs_plan_says():
    """S7, E7: the plan's op, exactly, with no shell; -S keeps the host's site-packages out; pytest is the runner's,
    started by the boot that makes it non-dumpable, loading only the plan's plugins, writing its junit report."""
    assert case_argv("/usr/bin/python3.11", PLAN.cases[1], None) == ["/usr/bin/python3.11", "-S", "-m", "demo_app"]
    assert case_argv("/usr/bin/python3.11", PLAN.cases[2], None) == ["/usr/bin/python3.11", "-S", f"{SITE_PATH}/bin/demo-app", "--flag"]
    argv = case_argv("/usr/bin/python3.11", PLAN.cases[0], "/out/junit-0/junit.xml", ("_hypothesis_pytestplugin",))
    assert argv == [
        "/usr/bin/python3.11", "-S", "-c", RUNNER_BOOT, "--junitxml=/out/junit-0/junit.xml",
        "-p", "_hypothesis_pytestplugin", "tests/test_x.py",
    ]
    assert "boot.boot_runner()" in RUNNER_BOOT and "run_module('pytest'" in RUNNER_BOOT


def test_the_search_path_is_the_stdlib_then_the_runner_then_the_candidate():
    """E7: PYTHONPATH starts with the runtime's own standard library, so no tree can shadow it; the runner comes
    before the candidate; plugin autoload is off for every op; no host or git variable passes."""
    env = case_env(RUNTIME, PLAN.cases[0], "/cap/tests", ("demo_app", "a_helper"))
    assert env["PYTHONPATH"].split(":") == [*RUNTIME.stdlib_path, RUNNER_MODULES, SITE_MODULES]
    assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert env["CASEBOX_RUNNER_BOOT"] == f"/cap/tests\n{SITE_PATH}/\na_helper,demo_app"
    module = case_env(RUNTIME, PLAN.cases[1])
    assert module["PYTHONPATH"].split(":") == [*RUNTIME.stdlib_path, SITE_MODULES] and module["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert "CASEBOX_RUNNER_BOOT" not in module
    assert not any(name.startswith(("GIT_", "PIP_")) for name in env)


def test_a_v2_case_gets_its_own_limits_and_allowlisted_environment(tmp_path):
    """Plan v2: per case memory, pids, tmp, output and timeout, and env names from the allowlist, reach the op."""
    from plan_support import plan_v2

    plan = plan_v2(
        {"id": "m", "op": "python-module", "args": ["demo_app"], "applicable": True, "expect_exit": 0, "env": {"TZ": "UTC"},
         "limits": {"memory_mb": 1024, "pids": 300, "tmp_mb": 32, "output_kib": 8, "timeout_ms": 5000}},
    )
    session = FakeSession(tmp_path / "s")
    service_for(session, plan).run_cases(list(enumerate(plan.cases)), BINDING, READY)
    [op] = session.ops
    assert op.env["TZ"] == "UTC" and op.limits.memory_bytes == 1024 << 20 and op.limits.processes == 300
    assert op.limits.tmp_bytes == 32 << 20 and op.caps == (8192, 8192) and op.timeout_ms == 5000


def test_a_verifier_tree_mounted_under_its_name_runs_from_its_parent(tmp_path):
    """Plan v2 verifier.mount: a tree handed in as ``tests`` is /cap/tests, and the cases run in /cap, so it
    imports as ``tests``; v1 keeps the tree itself as the working directory."""
    from plan_support import plan_v2

    plan = plan_v2({"id": "p", "op": "pytest", "args": ["tests"], "applicable": True, "expect_exit": 0}, verifier={"mount": "tests"})
    session = FakeSession(tmp_path / "s")
    service_for(session, plan).run_cases(list(enumerate(plan.cases)), BINDING, READY)
    assert session.ops[0].read == ["site", "tests", "runner"] and session.ops[0].cwd == "/cap"
    session = FakeSession(tmp_path / "v1")
    service_for(session).run_cases(CASES[1:2], BINDING, READY)
    assert session.ops[0].read == ["site", "verifier"] and session.ops[0].cwd == "/cap/verifier"


@pytest.mark.parametrize(
    "case", [case_doc("m", "python-module", (), 1, True, 0), case_doc("s", "console-script", ("../bin/x",), 1, True, 0), case_doc("e", "console-script", (), 1, True, 0)]
)
def test_an_op_that_cannot_be_materialized_is_refused(case):
    """F1: a python-module needs its module, a console-script a plain script name; refused naming the field."""
    with pytest.raises(Refused, match=r"\$\.cases\[0\]\.args"):
        check_materializable(make_plan(case))


# --- E6: no fail-fast ---------------------------------------------------------------------------


def test_every_case_gets_a_receipt_whatever_happened_before_it(tmp_path):
    """E6: a timed-out case, a sandbox that failed to start and a failing exit stop nothing; N/A is not run."""

    def answer(op):
        if RUNNER_BOOT in op.argv:
            return outcome("s1.op-1", limit="TIMEOUT", wait_status=9)
        return outcome("s3.op-1", limit="EXIT_NONZERO", wait_status=1 << 8)

    session = FakeSession(tmp_path / "s", answer, failing_starts={2})
    runs = service_for(session).run_cases(CASES, BINDING, READY)
    found = receipts(session)
    assert [run.case_id for run in runs] == ["c0", "c1", "c2"] and set(found) == {"c0", "c1", "c2"}
    assert found["c0"].outcome.limit == "TIMEOUT" and found["c0"].pytest.report == MISSING
    assert found["c1"].process is None and found["c1"].outcome.not_started.step == "sandbox"
    assert outcome_status(PLAN.cases[1], found["c1"]) == ("UNVERIFIED", "sandbox_failed")
    assert found["c2"].outcome.limit == "EXIT_NONZERO" and found["c2"].process.pid == 4242
    assert session.open is None


def test_a_blocked_attempt_gives_every_case_a_receipt_that_says_why(tmp_path):
    """E6, C1: when the dependencies could not be resolved no case runs, and each says so, with no process."""
    session = FakeSession(tmp_path / "s")
    service_for(session).run_cases(CASES, BINDING, Trees(blocked=Blocked(STEP_DEPENDENCIES, "no wheel of six")))
    found = receipts(session)
    assert set(found) == {"c0", "c1", "c2"} and session.ops == []
    for case in PLAN.cases[:3]:
        receipt = found[case.id]
        assert receipt.process is None and receipt.outcome.wait_status is None
        assert outcome_status(case, receipt) == ("UNVERIFIED", "dependencies_unresolved")
    assert found["c0"].pytest.report == MISSING


def test_a_runner_that_could_not_be_prepared_blocks_only_the_pytest_cases(tmp_path):
    """E6, E7: without the runner no pytest case can run (runner_failed); the other cases still run."""
    session = FakeSession(tmp_path / "s")
    service_for(session).run_cases(CASES, BINDING, Trees(site="site", runner_blocked=Blocked(STEP_RUNNER, "no runner")))
    found = receipts(session)
    assert outcome_status(PLAN.cases[0], found["c0"]) == ("UNVERIFIED", "runner_failed")
    assert found["c1"].process is not None and found["c2"].process is not None and len(session.ops) == 2


def test_a_pytest_case_reads_its_junit_report_from_its_own_sealed_output(tmp_path):
    """E5: the report comes out through the case's own output, sealed before anything else runs."""

    def answer(op):
        (op.outputs["junit-0"] / "junit.xml").write_bytes(JUNIT)
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    service_for(session).run_cases(CASES[:1], BINDING, READY)
    receipt = receipts(session)["c0"]
    assert receipt.pytest.report == READ and receipt.pytest.counts.tests == 2
    assert session.ops[0].write == ["junit-0"] and session.ops[0].read == ["site", "verifier", "runner"]
    assert (tmp_path / "s" / "sealed" / "junit-0" / "junit.xml").exists()


def test_each_case_publishes_its_output_and_junit_report_before_its_receipt(tmp_path):
    """E4, issue 13: the case's stdout, stderr and junit report are stored beside its receipt, which binds each;
    the receipt comes last, so evidence never holds a receipt whose files are not there yet."""

    def answer(op):
        (op.outputs["junit-0"] / "junit.xml").write_bytes(JUNIT)
        return outcome(stdout=b"2 passed\n")

    session = FakeSession(tmp_path / "s", answer)
    service_for(session).run_cases(CASES[:1], BINDING, READY)
    names = list(session.published)
    attempt = BINDING.attempt_id
    assert names == [f"{attempt}.c0.stdout", f"{attempt}.c0.stderr", f"{attempt}.c0.junit.xml", f"{attempt}.c0.receipt.json"]
    assert session.published[f"{attempt}.c0.junit.xml"] == JUNIT
    assert session.published[f"{attempt}.c0.stdout"] == b"2 passed\n"
    published = receipts(session)["c0"].published
    assert published.junit.sha256 == hashlib.sha256(JUNIT).hexdigest() and published.stdout.bytes == 9


def test_each_finished_case_is_told_to_the_progress_as_its_receipt_is_stored(tmp_path):
    """Issue 13: progress hears of every case as it finishes, with its receipt, in plan order."""
    session = FakeSession(tmp_path / "s")
    heard = []
    service = CaseService(Gate(session), session, runtime=RUNTIME, plan=PLAN, progress=lambda line: None,
                          finished=lambda case, receipt: heard.append((case.id, receipt.case_id, receipt.name in session.published)))
    service.run_cases(CASES, BINDING, READY)
    assert heard == [("c0", "c0", True), ("c1", "c1", True), ("c2", "c2", True)]


def test_the_case_service_owns_the_sandbox_right(tmp_path):
    """C9: once the case service holds the sandbox right, nobody else gets it."""
    session = FakeSession(tmp_path / "s")
    gate = Gate(session)
    CaseService(gate, session, runtime=RUNTIME, plan=PLAN, progress=lambda line: None)
    with pytest.raises(OwnershipError):
        CaseService(gate, session, runtime=RUNTIME, plan=PLAN, progress=lambda line: None)


# --- the dependency preparer ----------------------------------------------------------------------


@pytest.fixture
def index(tmp_path):
    directory = tmp_path / "index"
    directory.mkdir()
    (directory / "lib-1.0-py3-none-any.whl").write_bytes(b"lib wheel bytes")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    yield directory, fd
    os.close(fd)


LIB_SHA = hashlib.sha256(b"lib wheel bytes").hexdigest()


def begin(*modules: str) -> bytes:
    return leaf("BEGIN", 0, protocol="casebox.resolver.v2", python="3.11.2", candidate=[{"name": "demo-app", "version": "1.0", "modules": list(modules)}])


def pin(seq: int = 1, tree: str = "candidate", name: str = "lib") -> bytes:
    file = f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    return leaf("PIN", seq, tree=tree, name=name, version="1.0", file=file, sha256=LIB_SHA, url=f"file:///cap/index/{file}")


BEGIN = begin("demo_app")
PIN = pin()
END = leaf("END", 2, pins=1)


def prepare(tmp_path, scratch, index, resolve_stdout: bytes, fetched: dict[str, bytes] | None = None):
    def answer(op):
        if "resolve" in op.argv:
            return outcome(stdout=resolve_stdout)
        for name, data in (fetched or {}).items():
            (op.outputs["deps"] / name).write_bytes(data)
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, scratch=scratch, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, runner=["pytest"], candidate={"demo-app": "1.0"})
    session.release()
    return result, session


def test_accepted_pins_are_fetched_and_sealed(tmp_path, scratch, index):
    """Step 4: the ACKed pins become the fetch op's capability; the sealed output holds exactly them."""
    result, session = prepare(tmp_path, scratch, index, BEGIN + PIN + END, {"lib-1.0-py3-none-any.whl": b"lib wheel bytes"})
    assert isinstance(result, Dependencies) and result.files("candidate") == ("lib-1.0-py3-none-any.whl",)
    assert result.files("runner") == () and result.modules == {"demo-app": ("demo_app",)}
    fetch = session.ops[1]
    assert fetch.read == ["tools", "request", "pins", "index"] and fetch.write == ["deps"]
    assert fetch.argv[6:] == ["fetch", "/cap/pins/pins.json", "/out/deps", "/cap/index", f"/cap/request/{RUNTIME.installer.file}", "-"]
    with open(os.path.join(scratch.path, "pins", "pins.json"), "rb") as acks:
        assert [(found.tree, found.file, found.sha256) for found in acks_from_bytes(acks.read())] == [("candidate", "lib-1.0-py3-none-any.whl", LIB_SHA)]


@pytest.mark.parametrize(
    "answer, code, named",
    [
        (begin("demo_app") + pin(1, "runner", "demo-app") + leaf("END", 2, pins=1),
         "candidate_shadows_runner", "ships demo-app"),
        (begin("demo_app", "argparse") + leaf("END", 1, pins=0), "candidate_shadows_stdlib", "argparse"),
    ],
)
def test_a_candidate_that_stands_in_for_the_runner_or_the_stdlib_is_refused_before_any_fetch(tmp_path, scratch, index, answer, code, named):
    """E7: a candidate project the runner's closure holds, or a candidate module named like a stdlib module,
    ends the attempt UNVERIFIED with the code; nothing is fetched or installed."""
    (index[0] / "demo_app-1.0-py3-none-any.whl").write_bytes(b"lib wheel bytes")
    result, session = prepare(tmp_path, scratch, index, answer)
    assert isinstance(result, Unresolved) and result.code == code and named in result.sentence
    assert len(session.ops) == 1


@pytest.mark.parametrize(
    "stdout, code",
    [
        (BEGIN + b'{"leaf":"HELLO","seq":1}\n' + END, "unknown"),
        (BEGIN + END + PIN, "out_of_order"),
        (BEGIN + PIN + END + leaf("END", 3, pins=1), "extra"),
        (BEGIN + PIN.replace(LIB_SHA.encode(), b"e" * 64) + END, "hash_mismatch"),
    ],
)
def test_a_refused_answer_leaves_the_dependencies_unresolved(tmp_path, scratch, index, stdout, code):
    """Step 4: unknown, out of order, extra, or a wheel whose hash differs: resolution fails, nothing is fetched."""
    result, session = prepare(tmp_path, scratch, index, stdout)
    assert isinstance(result, Unresolved) and result.code == code
    assert result.sealed is not None and len(session.ops) == 1


@pytest.mark.parametrize(
    "fetched", [{}, {"lib-1.0-py3-none-any.whl": b"other bytes"}, {"lib-1.0-py3-none-any.whl": b"lib wheel bytes", "extra.whl": b"x"}]
)
def test_fetched_wheels_must_be_exactly_the_acked_ones(tmp_path, scratch, index, fetched):
    """Step 4: the sealed bundle holds the ACKed wheels with the ACKed hashes, and nothing else."""
    result, _ = prepare(tmp_path, scratch, index, BEGIN + PIN + END, fetched)
    assert isinstance(result, Unresolved) and result.code == "fetched_mismatch"


def test_a_resolver_that_fails_leaves_the_dependencies_unresolved(tmp_path, scratch, index):
    def answer(op):
        return outcome(limit="EXIT_NONZERO", wait_status=1 << 8)

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, scratch=scratch, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, runner=[], candidate={"demo-app": "1.0"})
    session.release()
    assert isinstance(result, Unresolved) and result.code == "resolver_failed"


def test_a_resolver_output_cut_by_its_cap_is_never_accepted(tmp_path, scratch, index):
    """Step 4: an answer cut by the output cap may look complete; it is refused as incomplete."""

    def answer(op):
        whole = outcome(stdout=BEGIN + PIN + END)
        return dataclasses.replace(whole, observation=dataclasses.replace(whole.observation, stdout_truncated=True))

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, scratch=scratch, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, runner=[], candidate={"demo-app": "1.0"})
    session.release()
    assert isinstance(result, Unresolved) and result.code == "incomplete"


def test_a_fetch_that_fails_leaves_the_dependencies_unresolved(tmp_path, scratch, index):
    """Step 4: a fetch op ending nonzero is fetch_failed, named as such, never read as an empty fetch."""

    def answer(op):
        if "resolve" in op.argv:
            return outcome(stdout=BEGIN + PIN + END)
        return outcome(limit="EXIT_NONZERO", wait_status=1 << 8)

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, scratch=scratch, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, runner=[], candidate={"demo-app": "1.0"})
    session.release()
    assert isinstance(result, Unresolved) and result.code == "fetch_failed" and "EXIT_NONZERO" in result.sentence


# --- a shard's evaluation -------------------------------------------------------------------------


def test_a_shard_is_judged_on_its_own_cases(tmp_path):
    """verify --shard evaluates its own stage: the other shards' cases are not missing from it."""
    from evidence_support import ATTEMPT, BUNDLE, DESIGNED_RUNS, DESIGNED_STATUS, build_attempt

    from executor.evidence.evaluate import Expected, evaluate
    from executor.plan import plan_from_bytes
    from executor.shard import cases_for_shard

    plan = plan_from_bytes((REPO / "examples" / "plan.json").read_bytes())
    directories = build_attempt(tmp_path, plan, DESIGNED_RUNS, shards=3)
    shard = frozenset(case.id for case in cases_for_shard(plan, 2, 3))
    report = evaluate(Expected(plan, ATTEMPT, BUNDLE, cases=shard), [str(directories[1])])
    assert {r.case_id: (r.status, r.reason) for r in report.cases} == {case: DESIGNED_STATUS[case] for case in shard}
    whole = evaluate(Expected(plan, ATTEMPT, BUNDLE), [str(directories[1])])
    assert {r.reason for r in whole.cases if r.case_id not in shard} == {"missing"}


# --- a failure mid-attempt ------------------------------------------------------------------------


def demo_attempt(tmp_path):
    """An attempt of the demo plan over a stand-in bundle and an empty verifier tree, for a faked session."""
    from executor.attempt import Attempt

    (tmp_path / "plan.json").write_bytes((REPO / "examples" / "plan.json").read_bytes())
    (tmp_path / "bundle.tar").write_bytes(b"bundle bytes")
    (tmp_path / "verifier").mkdir()
    return Attempt(
        bundle=str(tmp_path / "bundle.tar"), sha256=hashlib.sha256(b"bundle bytes").hexdigest(), plan=str(tmp_path / "plan.json"),
        verifier_tree=str(tmp_path / "verifier"), attempt_id="run-1", evidence=str(tmp_path / "evidence"),
        index=str(REPO / "examples" / "index"),
    )


def test_a_failure_after_the_session_opened_abandons_it_and_leaves_no_evidence(tmp_path, monkeypatch):
    """C5 for the client: a session that cannot go on is still cleaned up and retired (abandoned), never left open."""
    import executor.attempt as verification
    from executor.cli.config import Config
    from executor.cli.frontend import InternalFailure
    from executor.attempt import run_attempt
    from steward.failure import SandboxFailure

    session = FakeSession(tmp_path / "s")
    calls = []

    def create_output(name, **limits):
        raise SandboxFailure("the host refused the output mount")

    session.create_output = create_output
    session.abandon = lambda: calls.append("abandon")
    monkeypatch.setattr(verification.sessions, "open_session", lambda config, attempt_id, embedded=False: session)
    request = demo_attempt(tmp_path)
    with pytest.raises(InternalFailure, match="^the host refused the output mount$"):
        run_attempt(Config(state_root=str(tmp_path / "state")), request, progress=Progress(quiet=True))
    assert calls == ["abandon"] and not (tmp_path / "evidence").exists()
    assert set(session.capabilities) == {"verifier", "index", "bundle", "tools"}
    session.release()


def test_an_interrupt_that_lands_while_a_class_is_made_retires_the_session_as_interrupted(tmp_path, monkeypatch):
    """C5 for the client, with F1: SIGTERM that lands while a module defining a dataclass is first imported
    reaches the attempt as the RuntimeError Python 3.11 raises in its place; the session is still retired as
    interrupted, never abandoned as a failure, and the command sees an interrupt."""
    import executor.attempt as verification
    from executor.cli.config import Config
    from executor.cli.frontend import is_interrupt
    from executor.attempt import run_attempt

    session = FakeSession(tmp_path / "s")
    calls = []

    def create_output(name, **limits):
        interrupt_while_a_class_is_made()

    session.create_output = create_output
    session.abandon = lambda: calls.append("abandon")
    session.interrupt = lambda: calls.append("interrupt")
    monkeypatch.setattr(verification.sessions, "open_session", lambda config, attempt_id, embedded=False: session)
    request = demo_attempt(tmp_path)
    with pytest.raises(BaseException) as raised:
        run_attempt(Config(state_root=str(tmp_path / "state")), request, progress=Progress(quiet=True))
    assert is_interrupt(raised.value) and calls == ["interrupt"] and not (tmp_path / "evidence").exists()
    session.release()


# --- extraction -----------------------------------------------------------------------------------


def test_the_identity_digest_is_recomputed_from_the_sealed_extraction(tmp_path):
    """T3, T5: the trusted side hashes the sealed files as data; the digest is the bundle's own identity."""
    from executor.transport import bundle as bundles
    from executor.transport.ustar import TOP

    bundle = pack.build([("demo_app-1.0-py3-none-any.whl", wheel_bytes())])
    path = tmp_path / "candidate.tar"
    path.write_bytes(bundle)
    fd = os.open(path, os.O_RDONLY)
    try:
        expected = bundles.identity_of(bundles.open_bundle(fd))
    finally:
        os.close(fd)

    def answer(op):
        target = op.outputs["candidate"] / TOP
        target.mkdir()
        fd = os.open(path, os.O_RDONLY)
        try:
            checked = bundles.open_bundle(fd)
            for member in checked.files():
                chunks = bundles.member_chunks(checked, member, memoryview(bytearray(1 << 16)))
                (target / bundles.relative(member)).write_bytes(b"".join(bytes(chunk) for chunk in chunks))
        finally:
            os.close(fd)
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    extraction = service_for(session).extract()
    assert extraction.candidate_digest == expected and extraction.wheels == ("demo_app-1.0-py3-none-any.whl",)
    assert extraction.projects == {"demo-app": "1.0"}
    assert session.ops[0].read == ["bundle", "tools"] and "extract" in session.ops[0].argv


def test_a_refused_bundle_blocks_every_case(tmp_path):
    """T4: the extractor refuses inside the sandbox; no candidate digest exists, so nothing is bound to one."""
    session = FakeSession(tmp_path / "s", lambda op: outcome(limit="EXIT_NONZERO", wait_status=64 << 8))
    blocked = service_for(session).extract()
    assert isinstance(blocked, Blocked) and "EXIT_NONZERO" in blocked.sentence


def test_a_sealed_extraction_holding_a_file_that_is_no_wheel_blocks_every_case(tmp_path):
    """T6: the wheels are named by the sealed files; one that is not a valid wheel file name blocks the
    cases instead of reaching the resolver or an install."""
    from executor.transport.ustar import TOP

    def answer(op):
        (op.outputs["candidate"] / TOP).mkdir()
        (op.outputs["candidate"] / TOP / "not-a-wheel.whl").write_bytes(b"x")
        return outcome()

    blocked = service_for(FakeSession(tmp_path / "s", answer)).extract()
    assert isinstance(blocked, Blocked) and blocked.step == "extraction" and "not-a-wheel.whl" in blocked.sentence


def test_an_install_that_fails_blocks_every_case_and_seals_nothing(tmp_path):
    """E6, step 5: a failed install is a Blocked step that every case's receipt names; the site is never sealed."""
    session = FakeSession(tmp_path / "s", lambda op: outcome(limit="EXIT_NONZERO", wait_status=1 << 8))
    trees = service_for(session).install(EXTRACTION, Dependencies(DEPS_SEALED, ()), runner=False)
    assert trees.blocked.step == STEP_INSTALL and "the install of the candidate and its dependencies failed" in trees.blocked.sentence
    assert not (tmp_path / "s" / "sealed" / "site").exists()


def _installed(outputs: dict[str, dict[str, str]]):
    """An install op's answer: write these files into the modules directory of the output it was given."""

    def answer(op):
        for output, files in outputs.items():
            if output in op.outputs:
                for name, data in files.items():
                    path = op.outputs[output] / MODULES_DIRECTORY / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(data)
        return outcome()

    return answer


def test_the_runner_and_the_candidate_are_installed_and_sealed_apart(tmp_path):
    """E7: two installs, two sealed trees; the runner from its own pins only, the candidate from its wheels and
    its pins; the runner's tree is never writable while the candidate's wheels are installed."""
    from executor.deps.protocol import Pin

    pins = (Pin(1, "runner", "pytest", "8.3.5", "pytest-8.3.5-py3-none-any.whl", LIB_SHA, "u"),
            Pin(2, "candidate", "lib", "1.0", "lib-1.0-py3-none-any.whl", LIB_SHA, "u"))
    answer = _installed({"runner": {"pytest/__init__.py": "", "_pytest/__init__.py": ""}, "site": {"demo_app/__init__.py": ""}})
    session = FakeSession(tmp_path / "s", answer)
    trees = service_for(session).install(EXTRACTION, Dependencies(DEPS_SEALED, pins, {"demo-app": ("demo_app",)}), runner=True)
    assert trees.blocked is None and trees.runner_blocked is None and trees.runner.name == "runner" and trees.site.name == "site"
    runner, site = session.ops
    assert runner.write == ["runner"] and "candidate" not in runner.read and "/cap/deps/pytest-8.3.5-py3-none-any.whl" in runner.argv
    assert site.write == ["site"] and "runner" not in site.read
    assert "/cap/candidate/candidate/demo_app-1.0-py3-none-any.whl" in site.argv and "/cap/deps/lib-1.0-py3-none-any.whl" in site.argv


@pytest.mark.parametrize(
    "runner_files, site_files, code",
    [
        ({"_pytest/__init__.py": ""}, {"demo_app/__init__.py": ""}, "candidate_shadows_runner"),
        ({"pytest/__init__.py": ""}, {"demo_app/__init__.py": "", "json/__init__.py": ""}, "candidate_shadows_stdlib"),
        ({"pytest/__init__.py": ""}, {"demo_app/__init__.py": "", "sitecustomize.py": ""}, "candidate_shadows_stdlib"),
    ],
)
def test_the_sealed_trees_listing_applies_the_shadowing_rule(tmp_path, runner_files, site_files, code):
    """E7: a candidate module named like one the sealed runner holds, or a stdlib module or a startup hook of
    ``site`` found in the sealed candidate tree (whatever the resolver said), blocks every case with its code."""
    modules = {"demo-app": ("demo_app", "_pytest")}
    answer = _installed({"runner": runner_files, "site": site_files})
    session = FakeSession(tmp_path / "s", answer)
    trees = service_for(session).install(EXTRACTION, Dependencies(DEPS_SEALED, (), modules), runner=True)
    assert trees.blocked is not None and trees.blocked.step == code


def test_a_plugin_the_plan_names_loads_from_the_runner_by_its_entry_point_or_module(tmp_path):
    """E7: plugins load by name from the runner: a pytest11 entry point's module, or a runner module; a plugin the
    runner does not hold blocks the pytest cases (runner_failed), never falls through to the candidate."""
    from plan_support import plan_v2

    entry = "[pytest11]\nhypothesispytest = _hypothesis_pytestplugin\n"
    files = {"_hypothesis_pytestplugin.py": "", "hypothesis/__init__.py": "", "hypothesis-6.0.dist-info/entry_points.txt": entry}
    for plugins, expected, blocked in [(["hypothesispytest"], ("_hypothesis_pytestplugin",), False), (["hypothesis"], ("hypothesis",), False),
                                        (["demo_app"], (), True)]:
        plan = plan_v2({"id": "p", "op": "pytest", "args": [], "applicable": True, "expect_exit": 0}, plugins=plugins)
        session = FakeSession(tmp_path / f"s-{plugins[0]}", _installed({"runner": files, "site": {"demo_app/__init__.py": ""}}))
        trees = service_for(session, plan).install(EXTRACTION, Dependencies(DEPS_SEALED, (), {}), runner=True)
        assert trees.plugins == expected and (trees.runner_blocked is not None) == blocked


def test_a_junit_output_that_cannot_be_sealed_is_a_refused_report_and_the_next_cases_still_run(tmp_path):
    """E5, E6: the candidate fills its own junit output; if that cannot be sealed (a symlink, a FIFO), the
    pytest case's report is refused (UNVERIFIED) and every later case still runs and gets its receipt."""
    session = FakeSession(tmp_path / "s")
    sealing = session.seal_output

    def seal_output(name):
        if name.startswith("junit-"):
            raise Refused(f"output {name}/link", "is a symlink; a sealed output holds only regular files and directories")
        return sealing(name)

    session.seal_output = seal_output
    runs = service_for(session).run_cases(CASES, BINDING, READY)
    assert [run.case_id for run in runs] == ["c0", "c1", "c2"]
    assert receipts(session)["c0"].pytest.report == "refused"


def _sealed(name: str):
    from steward.api import Sealed

    return Sealed(name, "sha256:" + "1" * 64, 1, 1, 1)


EXTRACTION = Extraction(_sealed("candidate"), "sha256:" + "2" * 64, ("demo_app-1.0-py3-none-any.whl",))
DEPS_SEALED = _sealed("deps")


def wheel_bytes() -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("demo_app/__init__.py", "")
        archive.writestr("demo_app-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-app\nVersion: 1.0\n")
    return buffer.getvalue()


def test_each_case_sandbox_is_started_ahead_while_the_case_before_it_runs(tmp_path):
    """Issue 14, E2, E6, C9: with one sandbox ahead, the next case's sandbox is started once the case before it
    has its sandbox and before that case's op is sent; each case's op runs in a sandbox of its own with its own
    report output; a start ahead that failed is started again for its case, which still runs and gets its
    receipt; nothing is left open."""
    session = FakeSession(tmp_path / "s", failing_starts={3}, ahead=1)
    runs = service_for(session).run_cases(CASES, BINDING, READY)
    assert session.events == [
        ("start", 1), ("ahead", 2), ("run", 1),
        ("take", 2), ("ahead", 3), ("run", 2),
        ("take", 3), ("start", 4), ("run", 4),
    ]
    assert [run.case_id for run in runs] == ["c0", "c1", "c2"]
    assert all(receipt.process is not None for receipt in receipts(session).values())
    assert [op.write for op in session.ops] == [["junit-0"], [], []]
    assert session.open is None and session.waiting == [] and session.closed_sandboxes == 3
