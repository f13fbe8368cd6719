"""F3: the state root is opened once; everything inside is reached *at + O_NOFOLLOW, root-owned, no symlink."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest

from journal.errors import Refused
from steward.stateroot import AREAS, LOCKS, STAGES, StateRoot

pytestmark = pytest.mark.root


def test_the_state_root_and_its_areas_are_root_owned_0700(tmp_path):
    path = str(tmp_path / "state")
    with StateRoot.open(path) as root:
        for area in AREAS:
            info = os.stat(root.path_of(area))
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
        assert (os.stat(path).st_uid, stat.S_IMODE(os.stat(path).st_mode)) == (0, 0o700)


def test_a_state_root_open_to_others_is_refused(tmp_path):
    """F3: the state root is 0700."""
    path = tmp_path / "state"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    with pytest.raises(Refused, match="must be 0700"):
        StateRoot.open(str(path))


def test_a_symlinked_state_root_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(tmp_path / "real")
    with pytest.raises(Refused, match="symlink"):
        StateRoot.open(str(tmp_path / "state"))


def test_a_symlinked_area_is_refused(tmp_path):
    """F3: stages/ is opened with O_NOFOLLOW, so a symlink planted there is refused, not followed."""
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (path / STAGES).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Refused, match="stages: is a symlink"):
        StateRoot.open(str(path))


def test_a_foreign_owner_inside_is_refused(tmp_path):
    """F3: every directory in the state root is root's."""
    path = tmp_path / "state"
    StateRoot.open(str(path)).close()
    os.chown(path / STAGES, 1234, 0)
    with pytest.raises(Refused, match="owned by uid 1234"):
        StateRoot.open(str(path))


def test_an_entry_that_is_a_symlink_or_foreign_is_refused(tmp_path):
    """F3: a stage is opened *at its area with O_NOFOLLOW and must be root's."""
    path = tmp_path / "state"
    with StateRoot.open(str(path)) as root:
        (path / STAGES / "planted").symlink_to(tmp_path)
        with pytest.raises(Refused, match="planted: is a symlink"):
            root.open_entry(STAGES, "planted")
        (path / STAGES / "foreign").mkdir()
        os.chown(path / STAGES / "foreign", 1234, 1234)
        with pytest.raises(Refused, match="owned by uid 1234"):
            root.open_entry(STAGES, "foreign")


def test_the_lease_admits_one_holder_at_a_time(tmp_path):
    """S6, C4: one session at a time holds the dedicated UID; a second waits, then is refused."""
    with StateRoot.open(str(tmp_path / "state")) as root:
        first = root.lease(4242, wait_seconds=0)
        with pytest.raises(Refused, match="sandbox uid 4242.*leased by another session"):
            root.lease(4242, wait_seconds=0.1)
        other = root.lease(4243, wait_seconds=0)
        other.release()
        timer = threading.Timer(0.2, first.release)
        timer.start()
        started = time.monotonic()
        second = root.lease(4242, wait_seconds=5)
        assert time.monotonic() - started >= 0.15
        second.release()
        timer.join()


def test_a_symlinked_lock_is_refused(tmp_path):
    path = tmp_path / "state"
    with StateRoot.open(str(path)) as root:
        (path / LOCKS / "uid-7").symlink_to(tmp_path / "x")
        with pytest.raises(Refused, match="symlink"):
            root.lease(7, wait_seconds=0)


@pytest.mark.parametrize("path", ["state", "/", "/tmp/../var/lib/casebox", "/var/lib/casebox/"])
def test_a_state_root_that_is_not_a_normalized_absolute_path_is_refused(path):
    """F3: the one path lookup the steward makes is of a normalized absolute path other than /."""
    with pytest.raises(Refused, match="must be a normalized absolute path other than /"):
        StateRoot.open(path)


def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path):
    """S6: a lease is an flock on a regular file; a FIFO (or anything else) under the lock's name is refused."""
    with StateRoot.open(str(tmp_path / "state")) as root:
        os.mkfifo(root.path_of(LOCKS, "uid-4242"))
        with pytest.raises(Refused, match="uid-4242: must be a regular file"):
            root.lease(4242, wait_seconds=0)
