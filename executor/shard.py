"""Sharding a plan's cases across the runners of a CI matrix (DESIGN "Scale-out").

Shards are numbered 1 to n and written ``i/n``. Case k of the plan (counting
from 0, in plan order) belongs to shard ``k mod n + 1``: the rule depends on
the plan and n alone, so every runner, and the evaluator, computes the same
split, and every case lies in exactly one shard. Non-applicable cases are
dealt like the others; their shard reports them N/A without running them.
"""

from __future__ import annotations

import re

from executor.plan import Case, Plan
from journal.errors import Refused

SHARD = re.compile(r"([1-9][0-9]{0,2})/([1-9][0-9]{0,2})\Z")


def check_count(plan: Plan, count: int, where: str) -> int:
    """``count`` runners can share ``plan``: from 1 to its number of cases, so no shard is empty."""
    if not 1 <= count <= len(plan.cases):
        raise Refused(where, f"must be from 1 to the plan's {len(plan.cases)} cases, not {count}")
    return count


def parse_shard(text: str, where: str) -> tuple[int, int]:
    """``i/n`` as (i, n), with 1 ≤ i ≤ n."""
    match = SHARD.match(text)
    if match is None:
        raise Refused(where, f"must be i/n with 1 ≤ i ≤ n (for example 2/3), not {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if index > count:
        raise Refused(where, f"must be i/n with 1 ≤ i ≤ n, not {text!r}")
    return index, count


def cases_for_shard(plan: Plan, index: int, count: int) -> tuple[Case, ...]:
    """The cases shard ``index`` of ``count`` runs, in plan order."""
    check_count(plan, count, "the shard count")
    if not 1 <= index <= count:
        raise Refused("the shard", f"must be from 1 to {count}, not {index}")
    return plan.cases[index - 1 :: count]


def labels(count: int) -> list[str]:
    """The ``i/n`` label of every shard, for a CI matrix."""
    return [f"{index}/{count}" for index in range(1, count + 1)]
