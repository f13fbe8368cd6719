"""P1: `.ci/run` is the host suite, then the platform check on both guests (Debian's bookworm, then Ubuntu's
noble) under one deadline. The real guests take minutes under qemu, so these tests run a copy of `.ci/run`
beside stand-in scripts that record how they were called, and a stand-in `date` that moves the clock."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

from conftest import REPO

STEPS = ("bootstrap", "test", "mutation-check", "platform-check")


def _checkout(tmp_path: pathlib.Path, *, failing: str | None = None, later_seconds: int = 0) -> pathlib.Path:
    """A directory holding `.ci/run` and stand-ins for its steps; each appends its name, arguments and guest
    bound to ``calls``. ``failing`` exits 1; every `date +%s` after the first reads ``later_seconds`` on."""
    root = tmp_path / "checkout"
    (root / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", root / ".ci" / "run")
    (root / "scripts").mkdir()
    for step in STEPS:
        script = root / "scripts" / step
        script.write_text(
            "#!/usr/bin/env bash\n"
            f'echo "{step} $* ${{CASEBOX_PLATFORM_TIMEOUT:-}}" >> "{tmp_path}/calls"\n'
            f"exit {1 if step == failing else 0}\n"
        )
        script.chmod(0o755)
    clock = tmp_path / "bin"
    clock.mkdir()
    date = clock / "date"
    date.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ -e "{tmp_path}/clock" ]; then echo $(( 1000000 + {later_seconds} )); '
        f'else touch "{tmp_path}/clock"; echo 1000000; fi\n'
    )
    date.chmod(0o755)
    return root


def _run(tmp_path: pathlib.Path, root: pathlib.Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(root / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    calls = tmp_path / "calls"
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_ci_runs_the_suite_then_both_guests_each_bounded(tmp_path):
    """P1: bootstrap, the suite, the mutation check of every invariant, then the platform check on bookworm
    and on noble, each guest bounded by at most 23 minutes."""
    result, calls = _run(tmp_path, _checkout(tmp_path))
    assert result.returncode == 0, result.stderr
    assert calls == [
        "bootstrap  ",
        "test  ",
        "mutation-check  ",
        "platform-check --release bookworm 1380",
        "platform-check --release noble 1380",
    ]


def test_a_failing_guest_fails_the_run_and_stops_it(tmp_path):
    """P1: a platform check that fails is the run's failure, and nothing after it runs."""
    result, calls = _run(tmp_path, _checkout(tmp_path, failing="platform-check"))
    assert result.returncode != 0
    assert calls == ["bootstrap  ", "test  ", "mutation-check  ", "platform-check --release bookworm 1380"]


def test_a_guard_whose_removal_leaves_its_test_green_fails_the_run_before_any_guest(tmp_path):
    """P1: a mutation check that finds a red test still green (docs/design.md, "Invariants") is the run's failure,
    and no guest starts."""
    result, calls = _run(tmp_path, _checkout(tmp_path, failing="mutation-check"))
    assert result.returncode != 0
    assert calls == ["bootstrap  ", "test  ", "mutation-check  "]


def test_each_guest_gets_only_what_is_left_of_the_deadline(tmp_path):
    """P1: with 30 minutes gone, a guest is bounded by the 11 left of the first 41, not by 23."""
    result, calls = _run(tmp_path, _checkout(tmp_path, later_seconds=30 * 60))
    assert result.returncode == 0, result.stderr
    assert calls[3:] == ["platform-check --release bookworm 660", "platform-check --release noble 660"]


def test_no_guest_starts_with_under_five_minutes_left(tmp_path):
    """P1: with 37 minutes gone no guest is started, and the run fails saying why, inside CI's 45 minutes."""
    result, calls = _run(tmp_path, _checkout(tmp_path, later_seconds=37 * 60))
    assert result.returncode == 1
    assert calls == ["bootstrap  ", "test  ", "mutation-check  "]
    assert result.stderr.strip() == ".ci/run: 240s are left of the guests' 41-minute deadline, too few to run the bookworm guest"
