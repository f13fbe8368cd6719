"""Plans built in the tests from their documents, so every plan has the digest its document gives."""

from __future__ import annotations

from executor.plan import SCHEMA_V1, SCHEMA_V2, Plan, plan_from_value


def case(case_id: str, op: str, args=(), timeout_ms: int = 1000, applicable: bool = True, expect_exit: int = 0) -> dict:
    """One v1 case document."""
    return {
        "id": case_id, "op": op, "args": list(args), "timeout_ms": timeout_ms,
        "applicable": applicable, "expect_exit": expect_exit,
    }


def plan(*cases: dict) -> Plan:
    """A v1 plan of these case documents."""
    return plan_from_value({"schema": SCHEMA_V1, "cases": list(cases)})


def plan_v2(*cases: dict, **settings) -> Plan:
    """A v2 plan of these case documents (v2 cases: ``limits`` instead of ``timeout_ms``) and top-level settings."""
    return plan_from_value({"schema": SCHEMA_V2, **settings, "cases": list(cases)})
