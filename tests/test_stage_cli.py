"""`casebox stage list|show|recover` from outside, as an operator runs them (docs/operations.md)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from sandbox_support import contained  # noqa: F401
from steward.session import AFTER_CLEANUP_EVIDENCE, Steward
from steward.stateroot import STAGES, TOMBSTONES
from steward_support import accept_all, one_session, settings

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]


class Stop(Exception):
    pass


@pytest.fixture
def layout(tmp_path, sandbox_ids):
    """A state root with one sealed tombstone and one ACTIVE stage stopped after its cleanup evidence."""
    state = str(tmp_path / "state")

    def hook(point: str) -> None:
        if point == AFTER_CLEANUP_EVIDENCE and hook.armed:
            raise Stop(point)

    hook.armed = False
    with Steward(settings(state, sandbox_ids), capability_check=accept_all, hook=hook) as steward:
        sealed = one_session(steward, "attempt-1")[2].stage_id
        hook.armed = True
        with pytest.raises(Stop):
            one_session(steward, "attempt-2")
    (active,) = os.listdir(pathlib.Path(state) / STAGES)
    config = tmp_path / "casebox.toml"
    config.write_text(f"sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\n")
    return state, str(config), sealed, active


def _run(casebox, layout, *args):
    state, config, *_ = layout
    return casebox("--config", config, "stage", *args, "--state-root", state)


def test_list_shows_each_stage_with_its_state_and_verdict(casebox, layout):
    _, _, sealed, active = layout
    result = _run(casebox, layout, "list", "--json")
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert (document["schema"], document["state_root"]) == ("casebox.stage-list.v1", layout[0])
    rows = {row["stage_id"]: row for row in document["stages"]}
    assert (rows[sealed]["state"], rows[sealed]["journal"], rows[sealed]["diagnostic"]) == ("SEALED", "VALID", "VERIFIED")
    assert (rows[active]["state"], rows[active]["location"], rows[active]["cleanup"]) == ("ACTIVE", "stage", "CLEANED")
    text = _run(casebox, layout, "list").stdout.decode()
    assert sealed in text and "SEALED" in text and active in text and "ACTIVE" in text


def test_show_says_what_state_a_stage_is_in(casebox, layout):
    _, _, sealed, _ = layout
    result = _run(casebox, layout, "show", sealed)
    assert result.returncode == 0
    text = result.stdout.decode()
    assert f"stage {sealed}: SEALED (tombstone)" in text and "cleanup evidence: CLEANED" in text and "diagnostic: VERIFIED" in text


def test_recover_seals_what_it_can_and_running_it_twice_is_safe(casebox, layout):
    """C5: the ACTIVE stage is retired and sealed; the second run changes nothing and still exits 0."""
    state, _, sealed, active = layout
    first = _run(casebox, layout, "recover", "--all")
    assert first.returncode == 0, first.stdout
    assert f"ok   {active}: ACTIVE -> SEALED (SESSION_RECOVERED): sealed" in first.stdout.decode()
    journal = (pathlib.Path(state) / TOMBSTONES / active / "journal").read_bytes()
    second = _run(casebox, layout, "recover", "--all", "--json")
    assert second.returncode == 0
    document = json.loads(second.stdout)
    assert document["schema"] == "casebox.stage-recover.v1"
    reports = {report["stage_id"]: report for report in document["reports"]}
    assert {report["after"] for report in reports.values()} == {"SEALED"}
    assert reports[active]["before"] == "SEALED"
    assert (pathlib.Path(state) / TOMBSTONES / active / "journal").read_bytes() == journal


def test_recover_exits_1_when_a_stage_needs_an_operator(casebox, layout):
    """A stage and a tombstone both present is neither sealed nor deliberately preserved."""
    state, _, sealed, _ = layout
    shutil.copytree(pathlib.Path(state) / TOMBSTONES / sealed, pathlib.Path(state) / STAGES / sealed)
    result = _run(casebox, layout, "recover", sealed)
    assert result.returncode == 1
    assert f"FAIL {sealed}: PRESERVED -> PRESERVED" in result.stdout.decode()


def test_recover_needs_one_id_or_all(casebox, layout):
    state, config, *_ = layout
    casebox.refused("--config", config, "stage", "recover", "--state-root", state, naming="stage recover")
    casebox.refused("--config", config, "stage", "show", "../x", "--state-root", state, naming="ID")


@pytest.mark.parametrize("command", [("show", "nosuch"), ("recover", "nosuch")])
def test_an_unknown_stage_id_is_refused_naming_it(casebox, layout, command):
    """F1, issue 13: an id that is neither a stage nor a tombstone is refused input (exit 64), not PRESERVED."""
    state, config, *_ = layout
    sentence = casebox.refused("--config", config, "stage", *command, "--state-root", state, naming="nosuch")
    assert sentence == f"nosuch: is no stage or tombstone of the state root {state}; casebox stage list shows them."


def test_show_json_names_its_schema(casebox, layout):
    _, _, sealed, _ = layout
    document = json.loads(_run(casebox, layout, "show", sealed, "--json").stdout)
    assert (document["schema"], document["stage_id"], document["state"]) == ("casebox.stage.v1", sealed, "SEALED")
