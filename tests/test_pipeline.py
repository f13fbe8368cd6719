"""The case service and the dependency preparer against an in-memory session: E6, E5 plumbing, resolver aborts, C9 roles."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib

import pytest
from pipeline_support import BINDING, RUNTIME, FakeSession, outcome

from executor import pack
from executor.caseservice import CASE_ENV, SITE_PATH, Blocked, CaseService, case_argv, check_materializable
from executor.evaluate import outcome_status
from executor.junit import MISSING, READ
from executor.ownership import Gate, OwnershipError
from executor.plan import Case, Plan
from executor.preparer import Dependencies, Preparer, Unresolved
from executor.receipts import STEP_DEPENDENCIES, receipt_from_bytes
from executor.reporting import Progress
from executor.resolverproto import leaf
from executor.staging import Staging
from journal.errors import Refused

JUNIT = b'<testsuites><testsuite name="t"><testcase name="a"/><testcase name="b"/></testsuite></testsuites>'
PLAN = Plan(
    (
        Case("c0", "pytest", ("tests/test_x.py",), 1000, True, 0),
        Case("c1", "python-module", ("demo_app",), 1000, True, 0),
        Case("c2", "console-script", ("demo-app", "--flag"), 1000, True, 0),
        Case("c3", "pytest", (), 1000, False, 0),
    )
)
CASES = list(enumerate(PLAN.cases))
REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def staging():
    place = Staging()
    yield place
    place.close()


def service_for(session) -> CaseService:
    return CaseService(Gate(session), session, runtime=RUNTIME, progress=lambda line: None)


def receipts(session) -> dict:
    found = [receipt_from_bytes(data) for name, data in session.published.items() if name.endswith(".receipt.json")]
    return {receipt.case_id: receipt for receipt in found}


# --- materialization ----------------------------------------------------------------------------


def test_each_op_is_materialized_as_docs_plan_says():
    """S7: the plan's op, exactly, with no shell; -S keeps the host's site-packages out; pytest writes its junit report."""
    assert case_argv("/usr/bin/python3.11", PLAN.cases[1], None) == ["/usr/bin/python3.11", "-S", "-m", "demo_app"]
    assert case_argv("/usr/bin/python3.11", PLAN.cases[2], None) == ["/usr/bin/python3.11", "-S", f"{SITE_PATH}/bin/demo-app", "--flag"]
    assert case_argv("/usr/bin/python3.11", PLAN.cases[0], "/out/junit-0/junit.xml") == [
        "/usr/bin/python3.11", "-S", "-m", "pytest", "--junitxml=/out/junit-0/junit.xml", "tests/test_x.py",
    ]
    assert CASE_ENV["PYTHONPATH"] == SITE_PATH and "GIT_DIR" not in CASE_ENV


@pytest.mark.parametrize(
    "case", [Case("m", "python-module", (), 1, True, 0), Case("s", "console-script", ("../bin/x",), 1, True, 0), Case("e", "console-script", (), 1, True, 0)]
)
def test_an_op_that_cannot_be_materialized_is_refused(case):
    """F1: a python-module needs its module, a console-script a plain script name; refused naming the field."""
    with pytest.raises(Refused, match=r"\$\.cases\[0\]\.args"):
        check_materializable(Plan((case,)))


# --- E6: no fail-fast ---------------------------------------------------------------------------


def test_every_case_gets_a_receipt_whatever_happened_before_it(tmp_path):
    """E6: a timed-out case, a sandbox that failed to start and a failing exit stop nothing; N/A is not run."""

    def answer(op):
        if "pytest" in op.argv:
            return outcome("s1.op-1", limit="TIMEOUT", wait_status=9)
        return outcome("s3.op-1", limit="EXIT_NONZERO", wait_status=1 << 8)

    session = FakeSession(tmp_path / "s", answer, failing_starts={2})
    runs = service_for(session).run_cases(CASES, BINDING, None)
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
    service_for(session).run_cases(CASES, BINDING, Blocked(STEP_DEPENDENCIES, "no wheel of six"))
    found = receipts(session)
    assert set(found) == {"c0", "c1", "c2"} and session.ops == []
    for case in PLAN.cases[:3]:
        receipt = found[case.id]
        assert receipt.process is None and receipt.outcome.wait_status is None
        assert outcome_status(case, receipt) == ("UNVERIFIED", "dependencies_unresolved")
    assert found["c0"].pytest.report == MISSING


def test_a_pytest_case_reads_its_junit_report_from_its_own_sealed_output(tmp_path):
    """E5: the report comes out through the case's own output, sealed before anything else runs."""

    def answer(op):
        (op.outputs["junit-0"] / "junit.xml").write_bytes(JUNIT)
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    service_for(session).run_cases(CASES[:1], BINDING, None)
    receipt = receipts(session)["c0"]
    assert receipt.pytest.report == READ and receipt.pytest.counts.tests == 2
    assert session.ops[0].write == ["junit-0"] and session.ops[0].read == ["site", "verifier"]
    assert (tmp_path / "s" / "sealed" / "junit-0" / "junit.xml").exists()


def test_each_case_publishes_its_output_and_junit_report_before_its_receipt(tmp_path):
    """E4, issue 13: the case's stdout, stderr and junit report are stored beside its receipt, which binds each;
    the receipt comes last, so evidence never holds a receipt whose files are not there yet."""

    def answer(op):
        (op.outputs["junit-0"] / "junit.xml").write_bytes(JUNIT)
        return outcome(stdout=b"2 passed\n")

    session = FakeSession(tmp_path / "s", answer)
    service_for(session).run_cases(CASES[:1], BINDING, None)
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
    service = CaseService(Gate(session), session, runtime=RUNTIME, progress=lambda line: None,
                          finished=lambda case, receipt: heard.append((case.id, receipt.case_id, receipt.name in session.published)))
    service.run_cases(CASES, BINDING, None)
    assert heard == [("c0", "c0", True), ("c1", "c1", True), ("c2", "c2", True)]


def test_the_case_service_owns_the_sandbox_right(tmp_path):
    """C9: once the case service holds the sandbox right, nobody else gets it."""
    session = FakeSession(tmp_path / "s")
    gate = Gate(session)
    CaseService(gate, session, runtime=RUNTIME, progress=lambda line: None)
    with pytest.raises(OwnershipError):
        CaseService(gate, session, runtime=RUNTIME, progress=lambda line: None)


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
BEGIN = leaf("BEGIN", 0, protocol="casebox.resolver.v1", python="3.11.2", candidate=[{"name": "demo-app", "version": "1.0"}])
PIN = leaf("PIN", 1, name="lib", version="1.0", file="lib-1.0-py3-none-any.whl", sha256=LIB_SHA, required_by="demo-app")
END = leaf("END", 2, pins=1)


def prepare(tmp_path, staging, index, resolve_stdout: bytes, fetched: dict[str, bytes] | None = None):
    def answer(op):
        if "resolve" in op.argv:
            return outcome(stdout=resolve_stdout)
        for name, data in (fetched or {}).items():
            (op.outputs["deps"] / name).write_bytes(data)
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, staging=staging, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, requirements=["pytest"], candidate={"demo-app": "1.0"})
    session.release()
    return result, session


def test_accepted_pins_are_fetched_and_sealed(tmp_path, staging, index):
    """Step 4: the ACKed pins become the fetch op's capability; the sealed output holds exactly them."""
    result, session = prepare(tmp_path, staging, index, BEGIN + PIN + END, {"lib-1.0-py3-none-any.whl": b"lib wheel bytes"})
    assert isinstance(result, Dependencies) and result.files == ("lib-1.0-py3-none-any.whl",)
    fetch = session.ops[1]
    assert fetch.read == ["tools", "index", "request", "pins"] and fetch.write == ["deps"]
    assert fetch.argv[6:9] == ["pip", f"/cap/request/{RUNTIME.installer.file}", "download"] and "--require-hashes" in fetch.argv
    assert {"--no-deps", "--only-binary=:all:", "--no-index"} <= set(fetch.argv)
    with open(os.path.join(staging.path, "pins", "requirements.txt")) as requirements:
        assert requirements.read() == f"lib==1.0 --hash=sha256:{LIB_SHA}\n"


@pytest.mark.parametrize(
    "stdout, code",
    [
        (BEGIN + b'{"leaf":"HELLO","seq":1}\n' + END, "unknown"),
        (BEGIN + END + PIN, "out_of_order"),
        (BEGIN + PIN + END + leaf("END", 3, pins=1), "extra"),
        (BEGIN + PIN.replace(LIB_SHA.encode(), b"e" * 64) + END, "hash_mismatch"),
    ],
)
def test_a_refused_answer_leaves_the_dependencies_unresolved(tmp_path, staging, index, stdout, code):
    """Step 4: unknown, out of order, extra, or a wheel whose hash differs: resolution fails, nothing is fetched."""
    result, session = prepare(tmp_path, staging, index, stdout)
    assert isinstance(result, Unresolved) and result.code == code
    assert result.sealed is not None and len(session.ops) == 1


@pytest.mark.parametrize(
    "fetched", [{}, {"lib-1.0-py3-none-any.whl": b"other bytes"}, {"lib-1.0-py3-none-any.whl": b"lib wheel bytes", "extra.whl": b"x"}]
)
def test_fetched_wheels_must_be_exactly_the_acked_ones(tmp_path, staging, index, fetched):
    """Step 4: the sealed bundle holds the ACKed wheels with the ACKed hashes, and nothing else."""
    result, _ = prepare(tmp_path, staging, index, BEGIN + PIN + END, fetched)
    assert isinstance(result, Unresolved) and result.code == "fetched_mismatch"


def test_a_resolver_that_fails_leaves_the_dependencies_unresolved(tmp_path, staging, index):
    def answer(op):
        return outcome(limit="EXIT_NONZERO", wait_status=1 << 8)

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, staging=staging, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, requirements=[], candidate={"demo-app": "1.0"})
    session.release()
    assert isinstance(result, Unresolved) and result.code == "resolver_failed"


def test_a_resolver_output_cut_by_its_cap_is_never_accepted(tmp_path, staging, index):
    """Step 4: an answer cut by the output cap may look complete; it is refused as incomplete."""

    def answer(op):
        whole = outcome(stdout=BEGIN + PIN + END)
        return dataclasses.replace(whole, observation=dataclasses.replace(whole.observation, stdout_truncated=True))

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, staging=staging, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, requirements=[], candidate={"demo-app": "1.0"})
    session.release()
    assert isinstance(result, Unresolved) and result.code == "incomplete"


def test_a_fetch_that_fails_leaves_the_dependencies_unresolved(tmp_path, staging, index):
    """Step 4: pip download ending nonzero is fetch_failed, named as such, never read as an empty fetch."""

    def answer(op):
        if "resolve" in op.argv:
            return outcome(stdout=BEGIN + PIN + END)
        return outcome(limit="EXIT_NONZERO", wait_status=1 << 8)

    session = FakeSession(tmp_path / "s", answer)
    preparer = Preparer(Gate(session), session, staging=staging, runtime=RUNTIME, index_fd=index[1], progress=lambda line: None)
    result = preparer.prepare(plan_digest=BINDING.plan_digest, requirements=[], candidate={"demo-app": "1.0"})
    session.release()
    assert isinstance(result, Unresolved) and result.code == "fetch_failed" and "EXIT_NONZERO" in result.sentence


# --- a shard's evaluation -------------------------------------------------------------------------


def test_a_shard_is_judged_on_its_own_cases(tmp_path):
    """verify --shard evaluates its own stage: the other shards' cases are not missing from it."""
    from evidence_support import ATTEMPT, BUNDLE, DESIGNED_RUNS, DESIGNED_STATUS, build_attempt

    from executor.evaluate import Expected, evaluate
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


def test_a_failure_after_the_session_opened_abandons_it_and_leaves_no_evidence(tmp_path, monkeypatch):
    """C5 for the client: a session that cannot go on is still cleaned up and retired (abandoned), never left open."""
    import executor.verify as verification
    from executor.config import Config
    from executor.verify import Attempt, verify
    from steward.failure import SandboxFailure

    session = FakeSession(tmp_path / "s")
    calls = []

    def create_output(name, **limits):
        raise SandboxFailure("the host refused the output mount")

    session.create_output = create_output
    session.abandon = lambda: calls.append("abandon")
    monkeypatch.setattr(verification.sessions, "open_session", lambda config, attempt_id, embedded=False: session)
    data = (REPO / "examples" / "plan.json").read_bytes()
    (tmp_path / "plan.json").write_bytes(data)
    (tmp_path / "bundle.tar").write_bytes(b"bundle bytes")
    (tmp_path / "verifier").mkdir()
    request = Attempt(
        bundle=str(tmp_path / "bundle.tar"), sha256=hashlib.sha256(b"bundle bytes").hexdigest(), plan=str(tmp_path / "plan.json"),
        verifier_tree=str(tmp_path / "verifier"), attempt_id="run-1", evidence=str(tmp_path / "evidence"),
        index=str(REPO / "examples" / "index"),
    )
    with pytest.raises(SandboxFailure):
        verify(Config(state_root=str(tmp_path / "state")), request, progress=Progress(quiet=True))
    assert calls == ["abandon"] and not (tmp_path / "evidence").exists()
    assert set(session.capabilities) == {"verifier", "index", "bundle", "tools"}
    session.release()


# --- extraction -----------------------------------------------------------------------------------


def test_the_identity_digest_is_recomputed_from_the_sealed_extraction(tmp_path):
    """T3, T5: the trusted side hashes the sealed files as data; the digest is the bundle's own identity."""
    from executor import bundle as bundles
    from executor.ustar import TOP

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
    from executor.ustar import TOP

    def answer(op):
        (op.outputs["candidate"] / TOP).mkdir()
        (op.outputs["candidate"] / TOP / "not-a-wheel.whl").write_bytes(b"x")
        return outcome()

    blocked = service_for(FakeSession(tmp_path / "s", answer)).extract()
    assert isinstance(blocked, Blocked) and blocked.step == "extraction" and "not-a-wheel.whl" in blocked.sentence


def test_an_install_that_fails_blocks_every_case_and_seals_nothing(tmp_path):
    """E6, step 5: a failed install is a Blocked step that every case's receipt names; the site is never sealed."""
    from executor.caseservice import Extraction
    from executor.receipts import STEP_INSTALL
    from steward.api import Sealed

    session = FakeSession(tmp_path / "s", lambda op: outcome(limit="EXIT_NONZERO", wait_status=1 << 8))
    sealed = Sealed("candidate", "sha256:" + "1" * 64, 1, 1, 1)
    extraction = Extraction(sealed, "sha256:" + "2" * 64, ("demo_app-1.0-py3-none-any.whl",))
    blocked = service_for(session).install(extraction, Dependencies(dataclasses.replace(sealed, name="deps"), ()))
    assert isinstance(blocked, Blocked) and blocked.step == STEP_INSTALL and "pip install failed" in blocked.sentence
    assert not (tmp_path / "s" / "sealed" / "site").exists()


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
    runs = service_for(session).run_cases(CASES, BINDING, None)
    assert [run.case_id for run in runs] == ["c0", "c1", "c2"]
    assert receipts(session)["c0"].pytest.report == "refused"


def wheel_bytes() -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("demo_app/__init__.py", "")
        archive.writestr("demo_app-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-app\nVersion: 1.0\n")
    return buffer.getvalue()
