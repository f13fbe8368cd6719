"""F4: the one predicate every directory passes before it is handed into a sandbox (executor/capability.py)."""

from __future__ import annotations

import os
import pathlib

import pytest

from executor import capability
from executor.capability import link_leaves, open_capability, segment_rule
from journal.errors import Refused


@pytest.fixture
def state_root(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "var" / "casebox"
    (root / "stages" / "s-1").mkdir(parents=True)
    return root


def tree(base: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return base


def accepted(path: pathlib.Path, state_root: pathlib.Path) -> os.stat_result:
    fd = open_capability(str(path), state_root=str(state_root))
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def refused(path: pathlib.Path | str, state_root: pathlib.Path, naming: str) -> str:
    with pytest.raises(Refused) as caught:
        open_capability(str(path), state_root=str(state_root))
    assert caught.value.where == naming, caught.value.sentence()
    return caught.value.rule


def verifier(tmp_path: pathlib.Path) -> pathlib.Path:
    return tree(tmp_path / "verifier", {"tests/test_a.py": "def test_a(): pass\n", "tests/data/x.txt": "x", "pytest.ini": ""})


def test_a_plain_tree_with_inner_symlinks_is_accepted_as_the_descriptor_it_checked(tmp_path, state_root):
    """F4 control: a tree with relative symlinks that stay inside is accepted, and the descriptor is that tree."""
    root = verifier(tmp_path)
    (root / "alias.py").symlink_to("tests/test_a.py")
    (root / "tests" / "data" / "up").symlink_to("../test_a.py")
    (root / "tests" / "here").symlink_to(".")
    status = accepted(root, state_root)
    assert os.path.samestat(status, os.stat(root))


def test_git_config_at_depth_three_is_refused_naming_it(tmp_path, state_root):
    """F4: a .git segment at any depth is refused, naming the path."""
    root = verifier(tmp_path)
    tree(root, {"a/b/.git/config": "[remote]\n\textraheader = AUTHORIZATION: basic token\n"})
    rule = refused(root, state_root, f"{root}/a/b/.git")
    assert ".git" in rule


def test_git_in_capitals_is_refused(tmp_path, state_root):
    """F4: .git is compared without regard to case."""
    root = verifier(tmp_path)
    tree(root, {"vendored/.GIT/HEAD": "ref: refs/heads/main\n"})
    refused(root, state_root, f"{root}/vendored/.GIT")


def test_a_git_file_is_refused_too(tmp_path, state_root):
    """F4: a worktree's .git file (gitdir: pointer) is a .git segment like a directory."""
    root = verifier(tmp_path)
    tree(root, {"sub/.Git": "gitdir: /elsewhere\n"})
    refused(root, state_root, f"{root}/sub/.Git")


def test_a_directory_inside_a_git_directory_is_refused(tmp_path, state_root):
    """F4: the segment rule covers the directory's own path, not only what it holds."""
    hooks = tree(tmp_path / "repo" / ".git" / "hooks", {"pre-commit": "#!/bin/sh\n"})
    refused(hooks, state_root, str(hooks))


def test_a_symlink_to_etc_is_refused(tmp_path, state_root):
    """F4: a symlink pointing outside the directory (absolute) is refused, naming it."""
    root = verifier(tmp_path)
    (root / "tests" / "etc").symlink_to("/etc")
    rule = refused(root, state_root, f"{root}/tests/etc")
    assert "/etc" in rule


def test_a_relative_symlink_climbing_out_is_refused(tmp_path, state_root):
    """F4: a relative symlink whose .. segments climb past the root leaves the directory."""
    root = verifier(tmp_path)
    (root / "tests" / "passwd").symlink_to("../../../etc/passwd")
    refused(root, state_root, f"{root}/tests/passwd")


def test_dotdot_after_a_name_is_refused(tmp_path, state_root):
    """F4: `here/..` can climb out wherever a symlinked name led, so .. after a name is refused."""
    root = verifier(tmp_path)
    (root / "here").symlink_to(".")
    (root / "out").symlink_to("here/..")
    refused(root, state_root, f"{root}/out")


def test_the_state_root_itself_is_refused(state_root):
    """F4: the state root is never a capability."""
    rule = refused(state_root, state_root, str(state_root))
    assert rule == "is the casebox state root"


def test_a_path_inside_the_state_root_is_refused(state_root):
    """F4: anything inside the state root is refused, found by climbing parents by identity."""
    stage = state_root / "stages" / "s-1"
    assert refused(stage, state_root, str(stage)) == "lies inside the casebox state root"


def test_a_path_inside_the_state_root_reached_through_a_symlink_is_refused(tmp_path, state_root):
    """F4: a symlink to a stage is resolved first; the identity walk still finds the state root."""
    link = tmp_path / "innocent"
    link.symlink_to(state_root / "stages")
    assert refused(link, state_root, str(link)) == "lies inside the casebox state root"


def test_a_directory_holding_the_state_root_is_refused_by_name(tmp_path, state_root):
    """F4: an entry named like the state directory is refused at any depth."""
    parent = state_root.parent
    rule = refused(parent, state_root, f"{parent}/casebox")
    assert "state directory" in rule


def test_a_directory_holding_the_state_root_under_another_name_is_refused_by_identity(tmp_path):
    """F4: the state root found below by its identity, where its name does not match."""
    real = tmp_path / "outer" / "real-state"
    real.mkdir(parents=True)
    configured = tmp_path / "state-link"
    configured.symlink_to(real)
    rule = refused(tmp_path / "outer", configured, f"{tmp_path / 'outer'}/real-state")
    assert rule == "is the casebox state root"


def test_the_state_name_rule_is_case_insensitive(tmp_path, state_root):
    """F4: the state directory's name is compared without regard to case."""
    root = verifier(tmp_path)
    (root / "old" / "CaseBox").mkdir(parents=True)
    refused(root, state_root, f"{root}/old/CaseBox")


def test_a_checkout_under_a_segment_named_like_the_state_directory_is_accepted(tmp_path, state_root):
    """F4: the directory's own path is judged by identity, not by the state directory's name."""
    root = verifier(tmp_path / "work" / "casebox" / "casebox")
    accepted(root, state_root)


def test_the_walk_is_bounded_in_depth(tmp_path, state_root, monkeypatch):
    """F4: the walk refuses a tree deeper than MAX_DEPTH, naming where it stopped."""
    monkeypatch.setattr(capability, "MAX_DEPTH", 3)
    root = tree(tmp_path / "deep", {"a/b/c/d/e.txt": ""})
    rule = refused(root, state_root, f"{root}/a/b/c/d")
    assert "3 directories deep" in rule


def test_the_walk_is_bounded_in_entries(tmp_path, state_root, monkeypatch):
    """F4: the walk refuses a tree with more than MAX_ENTRIES entries."""
    monkeypatch.setattr(capability, "MAX_ENTRIES", 5)
    root = tree(tmp_path / "wide", {f"f{index}": "" for index in range(6)})
    assert "more than 5 entries" in refused(root, state_root, str(root))


def test_a_file_or_a_missing_path_is_refused(tmp_path, state_root):
    """F1: a capability must be an existing directory; the refusal names it."""
    (tmp_path / "file").write_text("")
    refused(tmp_path / "file", state_root, str(tmp_path / "file"))
    refused(tmp_path / "absent", state_root, str(tmp_path / "absent"))


@pytest.mark.parametrize(
    "target, depth, leaves",
    [
        ("x", 0, False),
        ("./x/./y", 0, False),
        ("..", 0, True),
        ("../x", 1, False),
        ("../../x", 1, True),
        ("x/../y", 3, True),
        ("/etc", 5, True),
        ("", 0, True),
        ("x//y/", 0, False),
    ],
)
def test_link_leaves_is_a_pure_rule_on_the_target_and_depth(target, depth, leaves):
    """F4: the symlink rule, a pure function of the target text and where the link sits."""
    assert link_leaves(target, depth) is leaves


@pytest.mark.parametrize("name", [".git", ".GIT", ".Git", "casebox", "CASEBOX"])
def test_segment_rule_refuses_reserved_names(name):
    """F4: the segment rule, a pure function of the name and the state directory's name."""
    assert segment_rule(name, "casebox") is not None


@pytest.mark.parametrize("name", ["git", ".gitignore", ".github", "casebox2", "tests"])
def test_segment_rule_accepts_other_names(name):
    """F4 control: names that merely resemble the reserved ones pass."""
    assert segment_rule(name, "casebox") is None


def test_a_descriptor_someone_else_opened_gets_the_same_checks(tmp_path, state_root):
    """F4: check_descriptor, what the steward applies to a client's descriptor, refuses what open_capability refuses."""
    clean = verifier(tmp_path)
    fd = os.open(clean, os.O_RDONLY | os.O_DIRECTORY)
    try:
        capability.check_descriptor(fd, "capability tree", state_root=str(state_root))
    finally:
        os.close(fd)
    (clean / "sub" / ".Git").mkdir(parents=True)
    for target, where, rule in [
        (clean, "capability tree/sub/.Git", "is a .git segment"),
        (state_root / "stages", "capability tree", "lies inside the casebox state root"),
        (clean / "pytest.ini", "capability tree", "must be a directory"),
    ]:
        fd = os.open(target, os.O_RDONLY)
        try:
            with pytest.raises(Refused) as caught:
                capability.check_descriptor(fd, "capability tree", state_root=str(state_root))
        finally:
            os.close(fd)
        assert caught.value.where == where and caught.value.rule.startswith(rule), caught.value.sentence()
