"""Case plans v1 and v2: a closed list of cases, and the canonical digest of the document (docs/plan.md).

A v2 plan adds what real projects need: the runner (the verifier's test tools,
as PEP 508 requirements, resolved from the index and never from the bundle),
the pytest plugins that load (by name, from the runner), the name the
verifier tree is mounted as, the junit caps, and per case an environment
from a closed allowlist and limits within hard bounds. A v1 plan reads as a
v2 plan whose runner is ``pytest`` and whose other settings are the
defaults; its digest stays the digest of its own v1 document.
"""

from __future__ import annotations

import collections
import hashlib
import re

from journal.closed import ClosedObject, check_str
from journal.strictjson import StrictJSONError, canonical, child_path, loads

SCHEMA_V1 = "casebox.plan.v1"
SCHEMA_V2 = "casebox.plan.v2"
SCHEMAS = (SCHEMA_V1, SCHEMA_V2)
PLAN_MAX_BYTES = 1_048_576
MAX_CASES = 64
MAX_ARGS = 64
MAX_ARG_BYTES = 4_096
MAX_TIMEOUT_MS = 3_600_000
OPS = ("python-module", "console-script", "pytest")
CASE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\Z")
MIB = 1 << 20
KIB = 1 << 10

# The runner of a v1 plan, and of a v2 plan that names none.
DEFAULT_RUNNER = ("pytest",)
MAX_RUNNER = 32
MAX_REQUIREMENT_BYTES = 512
REQUIREMENT_START = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?=[\s\[(<>=!~;]|\Z)")
MAX_PLUGINS = 32
PLUGIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}\Z")
# The names of casebox's own capabilities and outputs in a case sandbox (/cap/NAME): the verifier tree may not be
# mounted as one of them. tests/test_plan.py checks every name the pipeline hands in is here.
RESERVED_MOUNTS = ("bundle", "candidate", "deps", "index", "pins", "request", "runner", "site", "tools")
MOUNT = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}\Z")

# The environment a case may set (v2 "env"): names a test suite reads to choose behaviour, never a way to load
# code (PYTHONPATH, PYTHONSTARTUP, PYTEST_PLUGINS, PYTEST_ADDOPTS), to colour output (which makes pytest import
# optional modules), to reach a host (proxies) or to carry a secret. The launcher's own rule (S7) applies as well.
CASE_ENV_NAMES = (
    "CI",
    "COLUMNS",
    "LANG",
    "LC_ALL",
    "NO_COLOR",
    "PYTHONDEVMODE",
    "PYTHONFAULTHANDLER",
    "PYTHONHASHSEED",
    "PYTHONIOENCODING",
    "PYTHONTRACEMALLOC",
    "PYTHONUTF8",
    "PYTHONWARNINGS",
    "TZ",
)
MAX_ENV_VALUE_BYTES = 4_096


class Limits(collections.namedtuple("Limits", "timeout_ms memory_mb pids tmp_mb output_kib")):
    """One case's limits; each within its hard bound (:data:`LIMIT_BOUNDS`)."""

    __slots__ = ()


# (low, high, default) of each case limit. The defaults are the sandbox's (steward.api.Limits; a test checks).
LIMIT_BOUNDS = {
    "timeout_ms": (1, MAX_TIMEOUT_MS, 60_000),
    "memory_mb": (16, 16_384, 512),
    "pids": (1, 4_096, 512),
    "tmp_mb": (1, 16_384, 64),
    "output_kib": (1, 256, 256),
}


class Junit(collections.namedtuple("Junit", "max_bytes max_testcases")):
    """The caps a pytest case's junit report is read under (executor/evidence/junit.py)."""

    __slots__ = ()


# (low, high, default): the defaults fit a small suite; upstream suites such as packaging's need more.
JUNIT_BOUNDS = {
    "max_bytes": (4 * KIB, 64 * MIB, 1 * MIB),
    "max_testcases": (1, 500_000, 10_000),
}


DEFAULT_JUNIT = Junit(*(default for _, _, default in JUNIT_BOUNDS.values()))


# Immutable records as named tuples: dataclasses would import inspect and ast
# on every `casebox plan check` start, several milliseconds of a ~20 ms command.
class Case(collections.namedtuple("Case", "id op args applicable expect_exit limits env")):
    """One checked case; ``args`` is a tuple of strings, ``env`` a tuple of (name, value) in name order."""

    __slots__ = ()

    @property
    def timeout_ms(self) -> int:
        return self.limits.timeout_ms


class Plan(collections.namedtuple("Plan", "schema cases runner plugins mount junit document")):
    """A checked plan: its cases in plan order, its v2 settings (v1: the defaults), and the document as read.

    ``mount`` is the name the verifier tree is mounted as, or None: then the
    tree is the cases' working directory itself, as in v1."""

    __slots__ = ()

    def canonical_bytes(self) -> bytes:
        return canonical(self.document)

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_bytes()).hexdigest()


def _limits(fields: ClosedObject | None) -> Limits:
    values = {}
    for key, (low, high, default) in LIMIT_BOUNDS.items():
        values[key] = fields.pop_int(key, low=low, high=high) if fields is not None and fields.has(key) else default
    if fields is not None:
        fields.done()
    return Limits(**values)


def _env(fields: ClosedObject) -> tuple[tuple[str, str], ...]:
    found = []
    for name in fields.keys():
        if name not in CASE_ENV_NAMES:
            raise StrictJSONError(child_path(fields.path, name), f"is not a case environment name; allowed: {', '.join(CASE_ENV_NAMES)}")
        found.append((name, fields.pop_str(name, max_bytes=MAX_ENV_VALUE_BYTES)))
    fields.done()
    return tuple(found)


def _case_from(path: str, value: object, schema: str) -> Case:
    fields = ClosedObject(value, path)
    case_id = fields.pop_str("id", max_bytes=64, pattern=CASE_ID, rule=f"must match ^{CASE_ID.pattern[:-2]}$")
    op = fields.pop_str("op", max_bytes=32)
    if op not in OPS:
        raise StrictJSONError(child_path(path, "op"), f"must be one of {', '.join(OPS)}")
    args = tuple(
        check_str(item, item_path, max_bytes=MAX_ARG_BYTES)
        for item_path, item in fields.pop_list("args", min_items=0, max_items=MAX_ARGS)
    )
    if schema == SCHEMA_V1:
        limits = _limits(None)._replace(timeout_ms=fields.pop_int("timeout_ms", low=1, high=MAX_TIMEOUT_MS))
        env: tuple[tuple[str, str], ...] = ()
    else:
        limits = _limits(fields.pop_object("limits") if fields.has("limits") else None)
        env = _env(fields.pop_object("env")) if fields.has("env") else ()
    applicable = fields.pop_bool("applicable")
    expect_exit = fields.pop_int("expect_exit", low=0, high=255)
    fields.done()
    return Case(case_id, op, args, applicable, expect_exit, limits, env)


def _runner(fields: ClosedObject) -> tuple[str, ...]:
    if not fields.has("runner"):
        return DEFAULT_RUNNER
    runner = []
    for item_path, item in fields.pop_list("runner", min_items=1, max_items=MAX_RUNNER):
        requirement = check_str(item, item_path, max_bytes=MAX_REQUIREMENT_BYTES)
        if not REQUIREMENT_START.match(requirement):
            raise StrictJSONError(item_path, "must be a PEP 508 requirement that starts with a project name")
        if "@" in requirement:
            raise StrictJSONError(item_path, "names a direct URL; the runner comes from the configured index only, by name and version")
        runner.append(requirement)
    return tuple(runner)


def _plugins(fields: ClosedObject) -> tuple[str, ...]:
    if not fields.has("plugins"):
        return ()
    plugins = tuple(
        check_str(item, item_path, max_bytes=100, pattern=PLUGIN, rule="must be a plugin name (an entry point or a module)")
        for item_path, item in fields.pop_list("plugins", min_items=0, max_items=MAX_PLUGINS)
    )
    if len(set(plugins)) != len(plugins):
        raise StrictJSONError("$.plugins", "names a plugin twice")
    return plugins


def _mount(fields: ClosedObject) -> str | None:
    if not fields.has("verifier"):
        return None
    verifier = fields.pop_object("verifier")
    mount = verifier.pop_str("mount", max_bytes=40, pattern=MOUNT, rule="must be a directory name: 1 to 40 of a-z 0-9 _ -")
    verifier.done()
    if mount in RESERVED_MOUNTS:
        raise StrictJSONError("$.verifier.mount", f"is one of casebox's own capability names ({', '.join(RESERVED_MOUNTS)})")
    return mount


def _junit(fields: ClosedObject) -> Junit:
    if not fields.has("junit"):
        return DEFAULT_JUNIT
    caps = fields.pop_object("junit")
    values = {key: caps.pop_int(key, low=low, high=high) if caps.has(key) else default for key, (low, high, default) in JUNIT_BOUNDS.items()}
    caps.done()
    return Junit(**values)


def plan_from_value(value: object) -> Plan:
    fields = ClosedObject(value)
    schema = fields.pop_str("schema", max_bytes=32)
    if schema not in SCHEMAS:
        raise StrictJSONError("$.schema", f"must be {' or '.join(repr(name) for name in SCHEMAS)}")
    if schema == SCHEMA_V2:
        runner, plugins, mount, junit = _runner(fields), _plugins(fields), _mount(fields), _junit(fields)
    else:
        runner, plugins, mount, junit = DEFAULT_RUNNER, (), None, DEFAULT_JUNIT
    cases = []
    seen: set[str] = set()
    for path, item in fields.pop_list("cases", min_items=1, max_items=MAX_CASES):
        case = _case_from(path, item, schema)
        if case.id in seen:
            raise StrictJSONError(child_path(path, "id"), f"repeats the case id {case.id!r}; ids must be unique")
        seen.add(case.id)
        cases.append(case)
    fields.done()
    return Plan(schema, tuple(cases), runner, plugins, mount, junit, value)


def plan_from_bytes(data: bytes) -> Plan:
    return plan_from_value(loads(data, max_bytes=PLAN_MAX_BYTES))
