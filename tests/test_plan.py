"""Case plans v1 and v2 (docs/plan.md): closed schema, canonical digest, and `casebox plan check`
from outside (D1, D2, F1)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import sys

import pytest
from casebox_cli import run

from executor.plan import MAX_ARG_BYTES, MAX_ARGS, MAX_CASES, MAX_TIMEOUT_MS, PLAN_MAX_BYTES, plan_from_bytes
from journal.strictjson import StrictJSONError

REPO_PLAN = "examples/plan.json"
EXAMPLE_IDS = [
    "pass",
    "assertion-failure",
    "import-core",
    "import-greet",
    "import-extra",
    "console-script",
    "timeout",
    "not-applicable",
    "output-cap",
    "network-denied",
]
DIGEST = re.compile(rb"sha256:[0-9a-f]{64}\n\Z")


def case(case_id: str = "c", **fields) -> dict:
    entry = {"id": case_id, "op": "pytest", "args": ["tests/test_x.py"], "timeout_ms": 1000, "applicable": True, "expect_exit": 0}
    entry.update(fields)
    return entry


def plan(*cases: dict) -> dict:
    return {"schema": "casebox.plan.v1", "cases": list(cases) or [case()]}


def encode(value: object) -> bytes:
    return json.dumps(value).encode()


def independent_digest(value: dict) -> str:
    """docs/plan.md's definition, computed with the stdlib alone (valid for plan v1's ASCII keys,
    integers and strings): SHA-256 of the sorted, whitespace-free UTF-8 JSON."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- the schema, in-process ----------------------------------------------------


def test_example_plan_is_valid_with_its_ten_cases(repo):
    """D1: examples/plan.json is a valid plan v1 with the ten reference case ids."""
    checked = plan_from_bytes((repo / REPO_PLAN).read_bytes())
    assert [entry.id for entry in checked.cases] == EXAMPLE_IDS
    assert {case.id: case.applicable for case in checked.cases}["not-applicable"] is False


def test_every_bound_is_accepted_at_its_edge():
    """D1: the largest and smallest legal values of every field are accepted."""
    edge_cases = [
        case("a", args=[], timeout_ms=1, expect_exit=0),
        case("0" + "z" * 63, args=["x" * MAX_ARG_BYTES], timeout_ms=MAX_TIMEOUT_MS, expect_exit=255),
        case("a_b-c", op="python-module", args=["é" * (MAX_ARG_BYTES // 2)]),
        case("d", op="console-script", args=["a"] * MAX_ARGS, applicable=False),
    ]
    fillers = [case(f"f{index}") for index in range(MAX_CASES - len(edge_cases))]
    checked = plan_from_bytes(encode(plan(*edge_cases, *fillers)))
    assert len(checked.cases) == MAX_CASES
    assert checked.cases[1].args == ("x" * MAX_ARG_BYTES,)
    assert checked.cases[3].applicable is False


def test_digest_is_the_documented_definition(repo):
    """D2: the digest is sha256 of the RFC 8785 bytes of the plan, as docs/plan.md defines it."""
    value = json.loads((repo / REPO_PLAN).read_bytes())
    assert plan_from_bytes((repo / REPO_PLAN).read_bytes()).digest == independent_digest(value)
    odd = plan(case("q", args=['quote " back \\ tab \t nl \n del \x7f é \u2028 \U0001f600']))
    assert plan_from_bytes(encode(odd)).digest == independent_digest(odd)


def test_digest_ignores_layout_but_not_content(repo):
    """D2: whitespace and key order do not change the digest; case order and any value do."""
    value = json.loads((repo / REPO_PLAN).read_bytes())
    digest = plan_from_bytes((repo / REPO_PLAN).read_bytes()).digest
    reordered = {"cases": [dict(reversed(list(entry.items()))) for entry in value["cases"]], "schema": value["schema"]}
    for layout in (json.dumps(value), json.dumps(reordered, indent="\t"), json.dumps(value, indent=7).replace("\n", "\r\n")):
        assert plan_from_bytes(layout.encode()).digest == digest
    swapped = copy.deepcopy(value)
    swapped["cases"][0], swapped["cases"][1] = swapped["cases"][1], swapped["cases"][0]
    changed = copy.deepcopy(value)
    changed["cases"][0]["timeout_ms"] += 1
    assert len({digest, plan_from_bytes(encode(swapped)).digest, plan_from_bytes(encode(changed)).digest}) == 3


def test_canonical_bytes_read_back_to_the_same_plan(repo):
    """D2: the canonical bytes of a plan are themselves a valid plan with the same digest."""
    checked = plan_from_bytes((repo / REPO_PLAN).read_bytes())
    again = plan_from_bytes(checked.canonical_bytes())
    assert again == checked and again.digest == checked.digest


# --- hostile plans, each through the installed CLI ------------------------------


def with_case(**fields) -> bytes:
    return encode(plan(case(**fields)))


def without(field: str) -> bytes:
    entry = case()
    del entry[field]
    return encode(plan(entry))


def plan_text(**replace) -> bytes:
    """A valid plan's text with one field's JSON text replaced verbatim."""
    fields = {"id": '"c"', "op": '"pytest"', "args": '["t"]', "timeout_ms": "1000", "applicable": "true", "expect_exit": "0"}
    fields.update(replace)
    members = ",".join(f'"{name}":{text}' for name, text in fields.items())
    return ('{"schema":"casebox.plan.v1","cases":[{' + members + "}]}").encode()


VALID = encode(plan())


def count_values(value: object) -> int:
    if type(value) is dict:
        return 1 + sum(count_values(member) for member in value.values())
    if type(value) is list:
        return 1 + sum(count_values(item) for item in value)
    return 1


def with_extra(extra: object) -> bytes:
    """The valid plan with one more top-level member, "x"."""
    return encode({**plan(), "x": extra})


def nested_arrays(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def zeros_to_reach(total: int) -> list:
    """An array of zeros that brings with_extra's document to exactly ``total`` values."""
    return [0] * (total - count_values({**plan(), "x": []}))


HOSTILE = {
    # malformed JSON of every kind the reader refuses
    "empty file": (b"", "at $: the document is empty"),
    "whitespace only": (b" \n", "the document is empty"),
    "not json": (b"schema: casebox.plan.v1", "is not JSON"),
    "truncated": (VALID[:-1], "is not JSON"),
    "trailing garbage": (VALID + b"x", "has data after the JSON value"),
    "second document": (VALID + VALID, "has data after the JSON value"),
    "bom": (b"\xef\xbb\xbf" + VALID, "byte order mark"),
    "utf-16 with bom": (VALID.decode().encode("utf-16"), "not valid UTF-8"),
    "utf-16-le no bom": (VALID.decode().encode("utf-16-le"), "is not JSON"),
    "invalid utf-8": (VALID.replace(b'"c"', b'"\xff"'), "not valid UTF-8"),
    "utf-8 surrogate": (VALID.replace(b'"c"', b'"\xed\xa0\x80"'), "not valid UTF-8"),
    "duplicate key": (VALID[:-1] + b',"schema":"casebox.plan.v1"}', "$.schema: is a duplicate key"),
    "depth 33": (with_extra(nested_arrays(32)), "nests deeper than 32 levels"),
    "50,001 nodes": (with_extra(zeros_to_reach(50_001)), "limit of 50000 values"),
    "NaN": (plan_text(timeout_ms="NaN"), "$.cases[0].timeout_ms: is the non-finite number NaN"),
    "Infinity": (plan_text(timeout_ms="Infinity"), "non-finite number Infinity"),
    "-Infinity": (plan_text(expect_exit="-Infinity"), "non-finite number -Infinity"),
    "1e400": (plan_text(timeout_ms="1e400"), "$.cases[0].timeout_ms: is a non-integer number (1e400)"),
    "float": (plan_text(timeout_ms="1000.0"), "floats are refused"),
    "huge integer": (plan_text(timeout_ms="9" * 5000), "outside ±(2^53−1)"),
    "lone surrogate in id": (plan_text(id='"\\ud800"'), "$.cases[0].id: the string holds a lone surrogate"),
    "lone surrogate in arg": (plan_text(args='["\\udc00"]'), "$.cases[0].args[0]: the string holds a lone surrogate"),
    "lone surrogate in key": (VALID[:-1] + b',"\\udfff":1}', "the key holds a lone surrogate"),
    "noncharacter": (plan_text(args='["\\uffff"]'), "noncharacter"),
    # wrong types
    "top-level array": (b"[]", "at $: must be an object, not an array"),
    "top-level string": (b'"plan"', "must be an object, not a string"),
    "schema as integer": (encode({"schema": 1, "cases": [case()]}), "$.schema: must be a string, not an integer"),
    "schema v3": (encode({"schema": "casebox.plan.v3", "cases": [case()]}), "$.schema: must be 'casebox.plan.v1' or 'casebox.plan.v2'"),
    "v2 field in a v1 plan": (encode({**plan(), "runner": ["pytest"]}), "$.runner: is not a known field"),
    "cases as object": (encode({"schema": "casebox.plan.v1", "cases": {}}), "$.cases: must be an array"),
    "case as array": (encode({"schema": "casebox.plan.v1", "cases": [[]]}), "$.cases[0]: must be an object"),
    "id as integer": (with_case(case_id=7), "$.cases[0].id: must be a string, not an integer"),
    "op as array": (with_case(op=["pytest"]), "$.cases[0].op: must be a string, not an array"),
    "args as string": (with_case(args="-k x"), "$.cases[0].args: must be an array, not a string"),
    "arg as integer": (with_case(args=[1]), "$.cases[0].args[0]: must be a string, not an integer"),
    "arg as null": (with_case(args=[None]), "$.cases[0].args[0]: must be a string, not null"),
    "timeout as string": (with_case(timeout_ms="1000"), "$.cases[0].timeout_ms: must be an integer, not a string"),
    "timeout as bool": (with_case(timeout_ms=True), "$.cases[0].timeout_ms: must be an integer, not a bool"),
    "applicable as 1": (with_case(applicable=1), "$.cases[0].applicable: must be a bool, not an integer"),
    "applicable as string": (with_case(applicable="true"), "$.cases[0].applicable: must be a bool, not a string"),
    "expect_exit as bool": (with_case(expect_exit=False), "$.cases[0].expect_exit: must be an integer, not a bool"),
    "expect_exit as null": (with_case(expect_exit=None), "$.cases[0].expect_exit: must be an integer, not null"),
    # unknown and missing fields
    "unknown top-level field": (VALID[:-1] + b',"env":{}}', "$.env: is not a known field"),
    "unknown case field": (with_case(env={"A": "1"}), "$.cases[0].env: is not a known field"),
    "missing schema": (encode({"cases": [case()]}), "$.schema: is missing"),
    "missing cases": (encode({"schema": "casebox.plan.v1"}), "$.cases: is missing"),
    **{f"missing {field}": (without(field), f"$.cases[0].{field}: is missing") for field in case()},
    # values out of range
    "duplicate case ids": (encode(plan(case("same"), case("other"), case("same"))), "$.cases[2].id: repeats the case id 'same'"),
    "0 cases": (encode({"schema": "casebox.plan.v1", "cases": []}), "$.cases: must hold 1 to 64 items, not 0"),
    "65 cases": (encode(plan(*[case(f"c{index}") for index in range(65)])), "$.cases: must hold 1 to 64 items, not 65"),
    "65 args": (with_case(args=["a"] * 65), "$.cases[0].args: must hold 0 to 64 items, not 65"),
    "arg over 4096 bytes": (with_case(args=["x" * 4097]), "$.cases[0].args[0]: must be at most 4096 bytes, not 4097"),
    "arg over 4096 utf-8 bytes": (with_case(args=["é" * 2049]), "must be at most 4096 bytes, not 4098"),
    "arg with NUL": (with_case(args=["a\x00b"]), "$.cases[0].args[0]: must not contain NUL"),
    "id uppercase": (with_case(case_id="Pass"), "$.cases[0].id: must match ^[a-z0-9][a-z0-9_-]{0,63}$"),
    "id leading dash": (with_case(case_id="-x"), "must match"),
    "id with space": (with_case(case_id="a b"), "must match"),
    "id with newline": (with_case(case_id="a\n"), "must match"),
    "id empty": (with_case(case_id=""), "must match"),
    "id 65 chars": (with_case(case_id="a" * 65), "must be at most 64 bytes"),
    "id non-ascii": (with_case(case_id="café"), "must match"),
    "unknown op": (with_case(op="shell"), "$.cases[0].op: must be one of python-module, console-script, pytest"),
    "op case differs": (with_case(op="PyTest"), "must be one of"),
    "timeout 0": (with_case(timeout_ms=0), "$.cases[0].timeout_ms: must be from 1 to 3600000, not 0"),
    "timeout 3,600,001": (with_case(timeout_ms=3_600_001), "must be from 1 to 3600000, not 3600001"),
    "timeout negative": (with_case(timeout_ms=-5), "must be from 1 to 3600000, not -5"),
    "expect_exit 256": (with_case(expect_exit=256), "$.cases[0].expect_exit: must be from 0 to 255, not 256"),
    "expect_exit -1": (with_case(expect_exit=-1), "must be from 0 to 255, not -1"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_plan_is_exit_64_with_one_sentence(casebox, tmp_path, name):
    """D1/F1: each hostile plan exits 64 with one sentence naming the file, the JSON path and the
    rule; nothing on stdout, no traceback."""
    data, naming = HOSTILE[name]
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    sentence = casebox.refused("plan", "check", str(path), naming=naming)
    assert sentence.startswith(f"{path} at $")


def case_v2(case_id: str = "c", **fields) -> dict:
    entry = {"id": case_id, "op": "pytest", "args": ["tests/test_x.py"], "applicable": True, "expect_exit": 0}
    entry.update(fields)
    return entry


def plan_v2(*cases: dict, **settings) -> dict:
    return {"schema": "casebox.plan.v2", **settings, "cases": list(cases) or [case_v2()]}


HOSTILE_V2 = {
    "v1 timeout in a v2 case": (encode(plan_v2(case_v2(timeout_ms=5))), "$.cases[0].timeout_ms: is not a known field"),
    "unknown limit": (encode(plan_v2(case_v2(limits={"cpu": 1}))), "$.cases[0].limits.cpu: is not a known field"),
    "memory 8 MiB": (encode(plan_v2(case_v2(limits={"memory_mb": 8}))), "$.cases[0].limits.memory_mb: must be from 16 to 16384, not 8"),
    "pids 0": (encode(plan_v2(case_v2(limits={"pids": 0}))), "$.cases[0].limits.pids: must be from 1 to 4096, not 0"),
    "output over the cap": (encode(plan_v2(case_v2(limits={"output_kib": 257}))), "$.cases[0].limits.output_kib: must be from 1 to 256"),
    "limit as string": (encode(plan_v2(case_v2(limits={"tmp_mb": "64"}))), "$.cases[0].limits.tmp_mb: must be an integer, not a string"),
    "env GIT_DIR": (encode(plan_v2(case_v2(env={"GIT_DIR": "/x"}))), "$.cases[0].env.GIT_DIR: is not a case environment name"),
    "env token": (encode(plan_v2(case_v2(env={"GITHUB_TOKEN": "x"}))), "$.cases[0].env.GITHUB_TOKEN: is not a case environment name"),
    "env PYTHONPATH": (encode(plan_v2(case_v2(env={"PYTHONPATH": "/x"}))), "$.cases[0].env.PYTHONPATH: is not a case environment name"),
    "env PYTEST_PLUGINS": (encode(plan_v2(case_v2(env={"PYTEST_PLUGINS": "x"}))), "$.cases[0].env.PYTEST_PLUGINS: is not"),
    "env value not a string": (encode(plan_v2(case_v2(env={"TZ": 1}))), "$.cases[0].env.TZ: must be a string"),
    "env value with NUL": (encode(plan_v2(case_v2(env={"TZ": "a\x00"}))), "$.cases[0].env.TZ: must not contain NUL"),
    "runner direct URL": (encode(plan_v2(runner=["pytest @ http://127.0.0.1/pytest.whl"])), "$.runner[0]: names a direct URL"),
    "runner not a requirement": (encode(plan_v2(runner=["-r requirements.txt"])), "$.runner[0]: must be a PEP 508 requirement"),
    "runner empty": (encode(plan_v2(runner=[])), "$.runner: must hold 1 to 32 items, not 0"),
    "plugin twice": (encode(plan_v2(plugins=["a", "a"])), "$.plugins: names a plugin twice"),
    "plugin with a colon": (encode(plan_v2(plugins=["no:cacheprovider"])), "$.plugins[0]: must be a plugin name"),
    "mount reserved": (encode(plan_v2(verifier={"mount": "site"})), "$.verifier.mount: is one of casebox's own capability names"),
    "mount with a slash": (encode(plan_v2(verifier={"mount": "a/b"})), "$.verifier.mount: must be a directory name"),
    "unknown verifier field": (encode(plan_v2(verifier={"mount": "tests", "path": "x"})), "$.verifier.path: is not a known field"),
    "junit over its bound": (encode(plan_v2(junit={"max_bytes": 1 << 30})), "$.junit.max_bytes: must be from 4096 to 67108864"),
    "unknown junit field": (encode(plan_v2(junit={"depth": 9})), "$.junit.depth: is not a known field"),
}


@pytest.mark.parametrize("name", list(HOSTILE_V2))
def test_hostile_v2_plan_is_exit_64_with_one_sentence(casebox, tmp_path, name):
    """D1/F1, E7, S7: every v2 setting is closed and bounded; env names come from the allowlist only."""
    data, naming = HOSTILE_V2[name]
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    casebox.refused("plan", "check", str(path), naming=naming)


def test_a_v2_plan_reads_its_settings_and_fills_the_defaults():
    """Plan v2: the runner, plugins, mount, junit caps, per case limits and env; what is absent is the default."""
    from executor.plan import DEFAULT_JUNIT, LIMIT_BOUNDS

    checked = plan_from_bytes(encode(plan_v2(
        case_v2("a", env={"TZ": "UTC", "PYTHONHASHSEED": "0"}, limits={"memory_mb": 2048, "timeout_ms": 9}), case_v2("b"),
        runner=["pytest>=8", "hypothesis"], plugins=["hypothesis"], verifier={"mount": "tests"}, junit={"max_testcases": 50_000},
    )))
    assert checked.runner == ("pytest>=8", "hypothesis") and checked.plugins == ("hypothesis",) and checked.mount == "tests"
    assert checked.junit == DEFAULT_JUNIT._replace(max_testcases=50_000)
    first, second = checked.cases
    assert first.env == (("PYTHONHASHSEED", "0"), ("TZ", "UTC")) and first.limits.memory_mb == 2048 and first.timeout_ms == 9
    assert second.limits == tuple(default for _, _, default in LIMIT_BOUNDS.values()) and second.env == ()


def test_a_v1_plan_is_a_v2_plan_whose_runner_is_pytest(repo):
    """A v1 plan keeps working unchanged, and its digest stays that of its own document."""
    checked = plan_from_bytes((repo / REPO_PLAN).read_bytes())
    assert checked.runner == ("pytest",) and checked.plugins == () and checked.mount is None
    assert checked.digest == independent_digest(json.loads((repo / REPO_PLAN).read_bytes()))


def test_the_default_limits_are_the_sandbox_s_own():
    """One source of each default: a case without limits gets exactly the sandbox's defaults (steward.api.Limits)."""
    from executor.cases.service import case_limits
    from executor.plan import LIMIT_BOUNDS
    from steward.api import Limits

    from launcher.protocol import MAX_OUTPUT_CAP

    checked = plan_from_bytes(encode(plan_v2()))
    assert case_limits(checked.cases[0]) == Limits()
    assert LIMIT_BOUNDS["output_kib"][2] << 10 == MAX_OUTPUT_CAP


def test_the_reserved_mount_names_are_every_name_the_pipeline_hands_in():
    """The verifier's mount may not take a capability name casebox uses itself (one list, checked here)."""
    from executor.cases import service
    from executor.deps import preparer
    from executor.plan import RESERVED_MOUNTS

    used = {service.CANDIDATE, service.SITE, service.RUNNER, preparer.DEPS, preparer.REQUEST, preparer.PINS}
    assert used | {"bundle", "tools", "index"} == set(RESERVED_MOUNTS)


def test_the_depth_and_node_plans_sit_exactly_on_the_limits():
    """D1: one level or one value fewer than the hostile plans passes the reader and stops at the schema."""
    assert count_values(json.loads(with_extra(zeros_to_reach(50_001)))) == 50_001
    for data in (with_extra(nested_arrays(31)), with_extra(zeros_to_reach(50_000))):
        with pytest.raises(StrictJSONError, match="is not a known field"):
            plan_from_bytes(data)


def test_hostile_plans_cover_the_issue_list():
    """D1: the hostile table keeps every kind the issue names (a guard against trimming it)."""
    required = {"empty file", "trailing garbage", "bom", "utf-16 with bom", "invalid utf-8", "depth 33", "50,001 nodes",
                "NaN", "1e400", "lone surrogate in id", "duplicate case ids", "unknown case field", "missing id",
                "arg with NUL", "arg over 4096 bytes", "65 args", "0 cases", "65 cases", "id uppercase", "unknown op",
                "timeout 0", "timeout 3,600,001", "expect_exit 256", "applicable as 1", "duplicate key"}
    assert required <= set(HOSTILE)


def test_a_10_mb_file_is_refused_without_reading_it_all(casebox, tmp_path):
    """D1/F1: a 10 MB plan is refused by the 1 MiB cap, naming the file."""
    path = tmp_path / "big.json"
    path.write_bytes(VALID[:-1] + b"," + b" " * (10 * 1024 * 1024) + b'"x":1}')
    casebox.refused("plan", "check", str(path), naming=f"{path}: is larger than its 1048576-byte cap")


def test_the_1_mib_cap_is_exact(casebox, tmp_path):
    """D1: a plan of exactly 1 MiB (padded with JSON whitespace) is accepted; one byte more is refused."""
    path = tmp_path / "plan.json"
    path.write_bytes(VALID + b" " * (PLAN_MAX_BYTES - len(VALID)))
    result = casebox("plan", "check", str(path))
    assert result.returncode == 0, result.stderr
    path.write_bytes(VALID + b" " * (PLAN_MAX_BYTES - len(VALID) + 1))
    casebox.refused("plan", "check", str(path), naming="is larger than its 1048576-byte cap")


@pytest.mark.parametrize("target", ["directory", "missing", "dev-null"])
def test_a_plan_path_that_is_not_a_file_is_refused(casebox, tmp_path, target):
    """F1: a directory, a missing path or a device is refused naming the path."""
    path = {"directory": str(tmp_path), "missing": str(tmp_path / "absent.json"), "dev-null": "/dev/null"}[target]
    casebox.refused("plan", "check", path, naming=path)


# --- acceptance from outside ---------------------------------------------------


def test_plan_check_prints_the_digest(casebox, repo):
    """D2: `casebox plan check examples/plan.json` exits 0 and prints only sha256: and 64 hex digits."""
    result = casebox("plan", "check", REPO_PLAN)
    assert result.returncode == 0
    assert result.stderr == b""
    assert DIGEST.match(result.stdout)
    value = json.loads((repo / REPO_PLAN).read_bytes())
    assert result.stdout.decode().strip() == independent_digest(value)


def test_other_layouts_give_the_same_digest_from_outside(casebox, repo, tmp_path):
    """D2: the same plan with other whitespace and another key order prints the same digest."""
    value = json.loads((repo / REPO_PLAN).read_bytes())
    reordered = {"cases": [dict(sorted(entry.items(), reverse=True)) for entry in value["cases"]], "schema": value["schema"]}
    digests = set()
    for index, text in enumerate([(repo / REPO_PLAN).read_text(), json.dumps(value), json.dumps(reordered, indent=3)]):
        path = tmp_path / f"layout{index}.json"
        path.write_text(text)
        result = casebox("plan", "check", str(path))
        assert result.returncode == 0, result.stderr
        digests.add(result.stdout)
    assert len(digests) == 1


def test_every_json_test_suite_refusal_is_one_sentence(corpora, capsys):
    """D1/F1: every n_ and i_ file of JSONTestSuite, checked as a plan, is exit 64 and one sentence."""
    directory = corpora / "JSONTestSuite" / "test_parsing"
    files = sorted(directory.glob("[ni]_*.json"))
    assert len(files) == 188 + 35, "the corpus's 188 n_ and 35 i_ files, every one checked"
    for path in files:
        code, out, err = run(capsys, "plan", "check", str(path))
        assert (code, out) == (64, ""), path.name
        assert err.count("\n") == 1 and err.startswith(f"casebox: {path} at $"), err


def test_refusals_from_the_schema_are_strict_json_errors():
    """D1: schema refusals share the reader's type, so callers catch one type for a whole document."""
    with pytest.raises(StrictJSONError):
        plan_from_bytes(with_case(timeout_ms=0))


def test_the_documented_examples_hold(repo, casebox, tmp_path):
    """docs/plan.md: its minimal plan is valid, its refusal example is what the CLI says, and its
    stdlib recipe computes the digest the CLI prints."""
    text = (repo / "docs" / "plan.md").read_text()
    minimal = re.search(r"```json\n(.*?)```", text, re.DOTALL).group(1)
    path = tmp_path / "plan.json"
    path.write_text(minimal)
    printed = casebox("plan", "check", str(path)).stdout.decode().strip()
    recipe = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    result = subprocess.run([sys.executable, "-I", "-c", recipe], cwd=tmp_path, capture_output=True, check=True)
    assert result.stdout.decode().strip() == printed

    value = json.loads(minimal)
    value["cases"] = [case(f"c{index}") for index in range(3)] + [case("bad", timeout_ms=0)]
    path.write_text(json.dumps(value))
    documented = re.search(r"^casebox: plan\.json at .*$", text, re.MULTILINE).group(0)
    assert casebox("plan", "check", "plan.json", cwd=tmp_path).stderr.decode() == documented + "\n"
