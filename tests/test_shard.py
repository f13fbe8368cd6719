"""Sharding a plan across a CI matrix (executor/shard.py) and `casebox plan shard`."""

from __future__ import annotations

import json

import pytest
from casebox_cli import run
from hypothesis import given
from hypothesis import strategies as st


from executor.plan import Plan
from executor.shard import cases_for_shard, check_count, labels, parse_shard
from journal.errors import Refused
from plan_support import case as case_doc
from plan_support import plan as plan_of


def make_plan(size: int) -> Plan:
    return plan_of(*(case_doc(f"c{index}", "pytest", (), 1000, index % 3 != 0, 0) for index in range(size)))


@given(size=st.integers(min_value=1, max_value=64), data=st.data())
def test_every_case_is_in_exactly_one_shard_in_plan_order(size, data):
    """E2 across shards: the shards partition the plan, each in plan order, none empty."""
    plan = make_plan(size)
    count = data.draw(st.integers(min_value=1, max_value=size))
    shards = [cases_for_shard(plan, index, count) for index in range(1, count + 1)]
    ids = [case.id for shard in shards for case in shard]
    assert sorted(ids) == sorted(case.id for case in plan.cases)
    assert len(ids) == len(set(ids))
    order = {case.id: position for position, case in enumerate(plan.cases)}
    for shard in shards:
        assert shard, "no shard is empty"
        assert [order[case.id] for case in shard] == sorted(order[case.id] for case in shard)


def test_the_split_is_fixed_by_the_plan_and_the_count(repo):
    """Every runner computes the same split: case k goes to shard k mod n + 1."""
    plan = make_plan(10)
    assert [case.id for case in cases_for_shard(plan, 1, 3)] == ["c0", "c3", "c6", "c9"]
    assert [case.id for case in cases_for_shard(plan, 3, 3)] == ["c2", "c5", "c8"]
    assert cases_for_shard(plan, 2, 3) == cases_for_shard(make_plan(10), 2, 3)


@pytest.mark.parametrize("count", [0, 11, -1])
def test_a_count_outside_one_to_the_cases_is_refused(count):
    """F1: no shard may be empty, and there is at least one."""
    with pytest.raises(Refused, match="must be from 1 to the plan's 10 cases"):
        check_count(make_plan(10), count, "--count")
    with pytest.raises(Refused):
        cases_for_shard(make_plan(10), 1, count)


@pytest.mark.parametrize("index", [0, 4])
def test_a_shard_index_outside_the_count_is_refused(index):
    """F1: a shard index is from 1 to n."""
    with pytest.raises(Refused):
        cases_for_shard(make_plan(10), index, 3)


@pytest.mark.parametrize("text, expected", [("1/1", (1, 1)), ("2/3", (2, 3)), ("64/64", (64, 64))])
def test_parse_shard_reads_i_of_n(text, expected):
    assert parse_shard(text, "--shard") == expected


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "1", "1/3/4", " 1/3", "01/3", "1/3\n", "a/b", "-1/3", "١/٣"])
def test_parse_shard_refuses_anything_else(text):
    """F1: --shard is exactly i/n in ASCII digits with 1 ≤ i ≤ n."""
    with pytest.raises(Refused) as caught:
        parse_shard(text, "--shard")
    assert caught.value.where == "--shard"


def test_labels_name_every_shard():
    assert labels(3) == ["1/3", "2/3", "3/3"]


def test_plan_shard_prints_each_shard_and_its_cases(capsys, repo):
    code, out, err = run(capsys, "plan", "shard", str(repo / "examples/plan.json"), "--count", "3")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["1/3", "2/3", "3/3"]
    listed = [case for line in lines for case in line.split()[1:]]
    assert len(listed) == 10 and len(set(listed)) == 10


def test_plan_shard_json_is_the_actions_matrix(capsys, repo):
    code, out, _ = run(capsys, "plan", "shard", str(repo / "examples/plan.json"), "--count", "2", "--json")
    assert code == 0
    assert out == '{"shard":["1/2","2/2"]}\n'
    assert json.loads(out) == {"shard": ["1/2", "2/2"]}


def test_plan_shard_refuses_a_count_past_the_cases(casebox, repo):
    """F1: exit 64, one sentence naming --count, nothing on stdout."""
    casebox.refused("plan", "shard", str(repo / "examples/plan.json"), "--count", "11", naming="--count")
