"""The steward's composition root (executor/cli/sessions.py): F4's one predicate is what the session applies."""

from __future__ import annotations

import os

import pytest

from executor.cli.sessions import capability_check
from journal.errors import Refused


def check(tmp_path, directory) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        capability_check(str(tmp_path / "state"))(fd, "capability verifier")
    finally:
        os.close(fd)


def test_a_descriptor_holding_git_is_refused_by_the_session_seam(tmp_path):
    """F4: every descriptor handed to a session passes the same walk as a user's path; .git at depth 3 is refused."""
    tree = tmp_path / "tree"
    (tree / "a" / "b" / ".git").mkdir(parents=True)
    (tree / "a" / "b" / ".git" / "config").write_text("[remote]\n")
    with pytest.raises(Refused, match=r"capability verifier/a/b/\.git"):
        check(tmp_path, tree)


def test_a_descriptor_with_a_symlink_out_or_inside_the_state_root_is_refused(tmp_path):
    """F4: a symlink to /etc, and the state root itself, never enter a sandbox through the session."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "etc").symlink_to("/etc")
    with pytest.raises(Refused, match="leaves the directory"):
        check(tmp_path, tree)
    (tmp_path / "state" / "inside").mkdir(parents=True)
    with pytest.raises(Refused, match="state root"):
        check(tmp_path, tmp_path / "state" / "inside")


def test_a_clean_descriptor_is_accepted(tmp_path):
    (tmp_path / "tree" / "tests").mkdir(parents=True)
    (tmp_path / "tree" / "tests" / "test_x.py").write_text("def test(): pass\n")
    check(tmp_path, tmp_path / "tree")
