"""The trusted side's private scratch directory (executor/scratch.py): removed on every way out, and what a
SIGKILL leaves is removed by the next sweep, never a directory a live verification still uses."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from executor import scratch
from executor.scratch import Scratch, remove_abandoned

REPO = pathlib.Path(__file__).resolve().parent.parent
KILLED = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from executor.scratch import Scratch
    place = Scratch()
    place.directory("tools", {{"executor/x.py": b"pass"}})
    print(place.path, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def killed_scratch(directory: pathlib.Path) -> pathlib.Path:
    """A scratch directory whose maker was SIGKILLed with it full, in ``directory``."""
    result = subprocess.run(
        [sys.executable, "-c", KILLED.format(repo=str(REPO))], capture_output=True, env={**os.environ, "TMPDIR": str(directory)},
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    path = pathlib.Path(result.stdout.decode().strip())
    assert path.parent == directory and (path / "tools" / "executor" / "x.py").exists()
    return path


def test_a_staging_directory_names_its_maker_is_locked_while_it_lives_and_goes_when_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    place = Scratch()
    name = pathlib.Path(place.path).name
    assert name.startswith(f"casebox-scratch-{os.getpid()}-{scratch._start_time(os.getpid())}-")
    assert remove_abandoned(str(tmp_path)) == [] and os.path.isdir(place.path)
    place.close()
    assert os.listdir(tmp_path) == []


def test_what_a_killed_verification_left_is_removed_by_the_next_sweep(tmp_path):
    """A SIGKILL is the one way out that skips close(): the maker's identity is gone and its lock with it, so
    the next sweep removes the directory, copies and tools included, and says which."""
    path = killed_scratch(tmp_path)
    assert remove_abandoned(str(tmp_path)) == [str(path)]
    assert not path.exists()


def test_a_directory_of_a_live_maker_is_kept_even_before_it_is_locked(tmp_path):
    """The name is made before the lock is taken: a sweep in that moment sees a live maker and keeps it."""
    live = tmp_path / f"casebox-scratch-{os.getpid()}-{scratch._start_time(os.getpid())}-abcd1234"
    live.mkdir()
    assert remove_abandoned(str(tmp_path)) == [] and live.is_dir()


def test_a_directory_whose_lock_is_held_is_kept_whoever_its_name_says_made_it(tmp_path):
    """The lock speaks for a maker the name cannot (another pid namespace sharing the directory)."""
    import fcntl

    held = tmp_path / "casebox-scratch-1-1-abcd1234"
    held.mkdir()
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_abandoned(str(tmp_path)) == [] and held.is_dir()
    finally:
        os.close(fd)
    assert remove_abandoned(str(tmp_path)) == [str(held)]


def test_only_real_directories_of_this_user_are_removed(tmp_path):
    """F3: a link named like a scratch directory is never followed, and an unrelated name is never touched."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / "casebox-scratch-1-1-link0000").symlink_to(target)
    (tmp_path / "casebox-scratch-else").mkdir()
    assert remove_abandoned(str(tmp_path)) == []
    assert (target / "keep").exists() and (tmp_path / "casebox-scratch-else").is_dir()


@pytest.mark.root
def test_another_users_staging_directory_is_left_to_that_user(tmp_path):
    """Root's sweep (stage recover) removes root's own leftovers only; another user's are for its next verify."""
    path = killed_scratch(tmp_path)
    os.chown(path, 65534, 65534)
    assert remove_abandoned(str(tmp_path)) == [] and path.exists()
    os.chown(path, 0, 0)
    assert remove_abandoned(str(tmp_path)) == [str(path)]
