"""Case plan v1: a closed list of cases, and its canonical digest (docs/plan.md)."""

from __future__ import annotations

import collections
import hashlib
import re

from journal.closed import ClosedObject, check_str
from journal.strictjson import StrictJSONError, canonical, child_path, loads

SCHEMA = "casebox.plan.v1"
PLAN_MAX_BYTES = 1_048_576
MAX_CASES = 64
MAX_ARGS = 64
MAX_ARG_BYTES = 4_096
MAX_TIMEOUT_MS = 3_600_000
OPS = ("python-module", "console-script", "pytest")
CASE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\Z")


# Immutable records as named tuples: dataclasses would import inspect and ast
# on every `casebox plan check` start, several milliseconds of a ~20 ms command.
class Case(collections.namedtuple("Case", "id op args timeout_ms applicable expect_exit")):
    """One checked case; ``args`` is a tuple of strings."""

    __slots__ = ()

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "op": self.op,
            "args": list(self.args),
            "timeout_ms": self.timeout_ms,
            "applicable": self.applicable,
            "expect_exit": self.expect_exit,
        }


class Plan(collections.namedtuple("Plan", "cases")):
    """A checked plan: its cases in plan order."""

    __slots__ = ()

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "cases": [case.as_dict() for case in self.cases]}

    def canonical_bytes(self) -> bytes:
        return canonical(self.as_dict())

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_bytes()).hexdigest()


def _case_from(path: str, value: object) -> Case:
    fields = ClosedObject(value, path)
    case_id = fields.pop_str("id", max_bytes=64, pattern=CASE_ID, rule=f"must match ^{CASE_ID.pattern[:-2]}$")
    op = fields.pop_str("op", max_bytes=32)
    if op not in OPS:
        raise StrictJSONError(child_path(path, "op"), f"must be one of {', '.join(OPS)}")
    args = tuple(
        check_str(item, item_path, max_bytes=MAX_ARG_BYTES)
        for item_path, item in fields.pop_list("args", min_items=0, max_items=MAX_ARGS)
    )
    timeout_ms = fields.pop_int("timeout_ms", low=1, high=MAX_TIMEOUT_MS)
    applicable = fields.pop_bool("applicable")
    expect_exit = fields.pop_int("expect_exit", low=0, high=255)
    fields.done()
    return Case(case_id, op, args, timeout_ms, applicable, expect_exit)


def plan_from_value(value: object) -> Plan:
    fields = ClosedObject(value)
    fields.pop_const("schema", SCHEMA)
    cases = []
    seen: set[str] = set()
    for path, item in fields.pop_list("cases", min_items=1, max_items=MAX_CASES):
        case = _case_from(path, item)
        if case.id in seen:
            raise StrictJSONError(child_path(path, "id"), f"repeats the case id {case.id!r}; ids must be unique")
        seen.add(case.id)
        cases.append(case)
    fields.done()
    return Plan(tuple(cases))


def plan_from_bytes(data: bytes) -> Plan:
    return plan_from_value(loads(data, max_bytes=PLAN_MAX_BYTES))
