"""The resolver (executor/deps/resolver.py): pip's own resolver, run on the runtime, answering casebox.resolver.v2.

These tests run the resolver tool as its sandbox runs it (``-I -S -B``, the
tools directory alone on the path, the installer wheel unpacked on TMPDIR),
on wheels built here with zipfile, then check its leaves with the preparer's
:class:`~executor.deps.protocol.Acceptor`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import zipfile

import pytest
from wheelforge import wheel

from executor import inside
from executor.deps.preparer import hash_regular
from executor.deps.resolver import explain
from executor.deps.protocol import Acceptor, accept, request_bytes
from executor.cases.runtime import choose_interpreter

REPO = pathlib.Path(__file__).resolve().parent.parent
RUNTIME = choose_interpreter()
EXAMPLES_INDEX = REPO / "examples" / "index"
PIP_WHEEL = sorted(EXAMPLES_INDEX.glob("pip-*.whl"))[-1]


def _tools_boot(tmp_path: pathlib.Path) -> str:
    """inside.BOOT over a copy of exactly inside.modules()."""
    tools = tmp_path / "tools"
    if not tools.exists():
        for relative in inside.modules():
            (tools / relative).parent.mkdir(parents=True, exist_ok=True)
            (tools / relative).write_bytes((REPO / relative).read_bytes())
    return inside.BOOT.replace(repr(inside.TOOLS), repr(str(tools)))


@pytest.fixture
def dirs(tmp_path):
    candidate, index = tmp_path / "candidate", tmp_path / "index"
    candidate.mkdir()
    index.mkdir()
    return candidate, index


def run_resolver(tmp_path, candidate, index, runner=(), proxy="-") -> subprocess.CompletedProcess:
    """The resolver tool as its sandbox runs it; ``proxy`` is its forwarder (``-``: none, straight to the index)."""
    request = tmp_path / "request"
    request.mkdir(exist_ok=True)
    (request / PIP_WHEEL.name).write_bytes(PIP_WHEEL.read_bytes())
    (request / "request.json").write_bytes(
        request_bytes("sha256:" + "0" * 64, list(runner), {"file": PIP_WHEEL.name, "sha256": "0" * 64, "source": "chosen"})
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return subprocess.run(
        [RUNTIME, "-I", "-S", "-B", "-c", _tools_boot(tmp_path), "resolve", str(request), str(candidate), str(index), proxy],
        capture_output=True, env={"TMPDIR": str(scratch), "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INPUT": "1"}, timeout=180,
    )


def leaves(tmp_path, candidate, index, runner=(), proxy="-") -> list[dict]:
    answer = run_resolver(tmp_path, candidate, index, runner, proxy)
    assert answer.returncode == 0, answer.stderr.decode()
    return [json.loads(line) for line in answer.stdout.splitlines()]


def pins(found: list[dict], tree: str | None = None) -> list[tuple[str, str]]:
    return sorted((leaf["name"], leaf["version"]) for leaf in found if leaf["leaf"] == "PIN" and tree in (None, leaf["tree"]))


def failure(found: list[dict]) -> tuple[str, str]:
    assert found[-1]["leaf"] == "FAIL", found
    return found[-1]["reason"], found[-1]["requirement"]


def test_it_pins_the_highest_compatible_version_and_follows_its_requirements(tmp_path, dirs):
    """Step 4: pip's resolver over the index: the highest version allowed, then that wheel's own requirements."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib>=1,<3")
    for version in ("1.0", "2.0", "3.0"):
        wheel(index, "lib", version, "sub")
    wheel(index, "sub", "1.0")
    assert pins(leaves(tmp_path, candidate, index), "candidate") == [("lib", "2.0"), ("sub", "1.0")]


def test_a_graph_that_needs_backtracking_resolves(tmp_path, dirs):
    """pip's resolver backtracks: aa 2.0 needs cc<2 while bb needs cc>=2, so aa falls back to 1.0."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "aa", "bb")
    wheel(index, "aa", "2.0", "cc<2")
    wheel(index, "aa", "1.0")
    wheel(index, "bb", "2.0", "cc>=2")
    wheel(index, "cc", "1.0")
    wheel(index, "cc", "2.0")
    assert pins(leaves(tmp_path, candidate, index)) == [("aa", "1.0"), ("bb", "2.0"), ("cc", "2.0")]


def test_a_true_conflict_names_both_requirements(tmp_path, dirs):
    """A conflict no backtracking can solve is a FAIL ``conflict`` naming the requirements pip gives as its cause."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "xx", "yy")
    wheel(index, "xx", "1.0", "cc==1.0")
    wheel(index, "yy", "1.0", "cc==2.0")
    wheel(index, "cc", "1.0")
    wheel(index, "cc", "2.0")
    reason, detail = failure(leaves(tmp_path, candidate, index))
    assert reason == "conflict"
    assert "xx 1.0 depends on cc==1.0" in detail and "yy 1.0 depends on cc==2.0" in detail


def test_a_requirement_that_excludes_the_candidates_own_version_is_a_candidate_conflict(tmp_path, dirs):
    candidate, index = dirs
    wheel(candidate, "demo-core", "1.0")
    wheel(candidate, "demo-extra", "1.0", "demo-core>=2")
    wheel(index, "demo-core", "2.0")
    reason, detail = failure(leaves(tmp_path, candidate, index))
    assert reason == "candidate_conflict" and "demo-core" in detail


def test_the_candidates_own_projects_are_never_pinned_from_the_index(tmp_path, dirs):
    """The bundle's wheel satisfies its sibling's requirement, even when the index holds a newer version."""
    candidate, index = dirs
    wheel(candidate, "demo-core", "1.0")
    wheel(candidate, "demo-extra", "1.0", "demo-core")
    wheel(index, "demo-core", "9.0")
    found = leaves(tmp_path, candidate, index)
    assert pins(found) == [] and found[-1] == {"leaf": "END", "pins": 0, "seq": 1}


def test_markers_extras_and_requires_python_are_evaluated_for_the_runtime(tmp_path, dirs):
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib[fast]", 'never; python_version < "3"', 'later; extra == "dev"')
    wheel(index, "lib", "2.0", "old", requires_python=">=99")
    wheel(index, "lib", "1.0", 'speedup; extra == "fast"', extras=("fast",))
    wheel(index, "speedup", "1.0")
    assert pins(leaves(tmp_path, candidate, index)) == [("lib", "1.0"), ("speedup", "1.0")]


def test_a_missing_project_is_no_match(tmp_path, dirs):
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "nowhere>=1")
    assert failure(leaves(tmp_path, candidate, index))[0] == "no_match"


def test_the_runner_is_resolved_from_the_index_never_from_the_bundle(tmp_path, dirs):
    """E7: the candidate ships its own pytest; the runner's pytest is the index's, pinned in the runner tree."""
    candidate, _ = dirs
    wheel(candidate, "pytest", "99.0", files={"pytest/__init__.py": "raise SystemExit('forged')\n"})
    found = leaves(tmp_path, candidate, EXAMPLES_INDEX, runner=["pytest"])
    runner = pins(found, "runner")
    assert ("pytest", "8.3.5") in runner and ("pluggy", "1.5.0") in runner
    assert not any(leaf.get("file", "").startswith("pytest-99") for leaf in found)
    assert found[0]["candidate"] == [{"modules": ["pytest"], "name": "pytest", "version": "99.0"}]


def test_each_candidate_wheel_lists_the_modules_it_installs(tmp_path, dirs):
    """E7: top-level packages, modules, extension modules and .data/purelib entries, for the shadowing rule."""
    candidate, index = dirs
    files = {
        "argparse.py": "", "json/__init__.py": "", "_pytest/__init__.py": "", "fast.cpython-311-x86_64-linux-gnu.so": "",
        "demo_app-1.0.data/purelib/hidden/__init__.py": "", "demo_app-1.0.data/scripts/tool": "", "README": "",
    }
    wheel(candidate, "demo-app", "1.0", files=files)
    [begin, end] = leaves(tmp_path, candidate, index)
    assert begin["candidate"][0]["modules"] == ["_pytest", "argparse", "fast", "hidden", "json"]
    assert end["leaf"] == "END"


@pytest.mark.parametrize(
    "member", ["calc/../typing_extensions.py", "./org.py", "calc//sitecustomize.py", "/abs.py", "calc/./x.py", "calc\\x.py"],
)
def test_a_member_name_that_is_not_a_clean_relative_path_refuses_the_wheel(tmp_path, dirs, member):
    """E7: the installer writes ``calc/../typing_extensions.py`` at the top of the tree, where the listing of
    ``calc/`` never names it, so the shadowing rule and the runner's boot would not know the module. A member
    name must pass the bundle's own rule for a relative path (one predicate, executor.transport.ustar): the
    wheel is refused whole (``layout``), and BEGIN lists none of its modules."""
    candidate, index = dirs
    wheel(candidate, "calc", "1.0", files={"calc/__init__.py": "", member: ""})
    found = leaves(tmp_path, candidate, index)
    reason, detail = failure(found)
    assert reason == "layout" and detail.startswith(f"calc-1.0-py3-none-any.whl holds the member {member!r}: "), detail
    assert found[0]["candidate"][0]["modules"] == []


def test_a_wheel_with_more_modules_than_begin_lists_is_refused_never_listed_in_part(tmp_path, dirs):
    """E7: BEGIN carries at most MAX_MODULES modules a wheel; a listing cut at the bound would hide every module
    past it from the shadowing rule and the runner's boot, so the wheel is refused (``layout``) instead."""
    from executor.deps.protocol import MAX_MODULES

    candidate, index = dirs
    wheel(candidate, "calc", "1.0", files={f"m{number:03d}.py": "" for number in range(MAX_MODULES)})
    [begin, end] = leaves(tmp_path, candidate, index)
    assert len(begin["candidate"][0]["modules"]) == MAX_MODULES and end["leaf"] == "END"
    over = tmp_path / "over"
    wheel(over, "calc", "1.0", files={f"m{number:03d}.py": "" for number in range(MAX_MODULES + 1)})
    assert failure(leaves(tmp_path, over, index)) == ("layout", f"calc-1.0-py3-none-any.whl installs {MAX_MODULES + 1} top-level modules, more than the {MAX_MODULES} BEGIN may list")


def test_a_direct_url_requirement_is_refused_before_any_resolver_runs(tmp_path, dirs):
    """Issue 16, 1: only names and versions resolved through the index are fetched: `x @ URL` is direct_url, and
    pip never sees it (the sandbox is offline, so pip would fail otherwise, with another reason); nor one behind
    a marker that excludes it, and the runner's resolution (pytest is not in this index, so it would fail with
    no_match) never starts."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "x @ http://127.0.0.1:9/x-1.0-py3-none-any.whl")
    assert failure(leaves(tmp_path, candidate, index)) == ("direct_url", "demo-app requires x from a direct URL")
    other = tmp_path / "other"
    wheel(other, "demo-app", "1.0", "y @ http://127.0.0.1:9/y-1.0-py3-none-any.whl ; python_version < '3'")
    assert failure(leaves(tmp_path, other, index, runner=["pytest"])) == ("direct_url", "demo-app requires y from a direct URL")


def test_an_invalid_requirement_or_a_metadata_of_another_project_is_a_metadata_failure(tmp_path, dirs):
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "not a requirement ==")
    assert failure(leaves(tmp_path, candidate, index))[0] == "metadata"
    other = tmp_path / "other"
    wheel(other, "demo-app", "1.0", metadata=b"Metadata-Version: 2.1\nName: something-else\nVersion: 1.0\n")
    reason, detail = failure(leaves(tmp_path, other, index))
    assert reason == "metadata" and "declares something-else 1.0" in detail


def test_the_leaves_pass_the_preparers_acceptor(tmp_path, dirs):
    """The resolver's answer is exactly what the preparer accepts: canonical leaves, hashes of the index files."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib")
    wheel(index, "lib", "1.0")
    answer = run_resolver(tmp_path, candidate, index)
    fd = os.open(index, os.O_RDONLY | os.O_DIRECTORY)
    try:
        acceptor = Acceptor(
            python=subprocess.run([RUNTIME, "-I", "-S", "-c", "import platform; print(platform.python_version())"],
                                  capture_output=True, text=True).stdout.strip(),
            candidate={"demo-app": "1.0"}, index_sha256=lambda file: hash_regular(fd, file), local_index=str(index),
        )
        found = accept(answer.stdout, acceptor)
    finally:
        os.close(fd)
    assert [(pin.tree, pin.name) for pin in found] == [("candidate", "lib")]
    assert acceptor.modules == {"demo-app": ("demo_app",)}


def test_resolution_never_imports_candidate_code(tmp_path, dirs):
    """DESIGN step 4: METADATA is read as data; a candidate or index module that would act on import never runs."""
    candidate, index = dirs
    mark = tmp_path / "imported"
    code = f"open({str(mark)!r}, 'w').write('ran')\n"
    wheel(candidate, "demo-app", "1.0", "lib", files={"demo_app/__init__.py": code})
    wheel(index, "lib", "1.0", files={"lib/__init__.py": code})
    assert pins(leaves(tmp_path, candidate, index)) == [("lib", "1.0")]
    assert not mark.exists()


def test_pip_s_own_words_are_read_for_the_reason():
    """The classification of pip's failure output (its messages since pip 20.3)."""
    conflict = "x\nThe conflict is caused by:\n    a 1 depends on c==1\n    b 1 depends on c==2\n\nTo fix this\n"
    assert (explain(conflict, set()).reason, explain(conflict, set()).requirement) == ("conflict", "a 1 depends on c==1; b 1 depends on c==2")
    assert explain(conflict, {"c"}).reason == "candidate_conflict"
    assert explain("ERROR: No matching distribution found for zz>=1\n", set()).requirement == "zz>=1"
    assert explain("WARNING: Retrying ... Failed to establish a new connection\n", set()).reason == "index"
    assert explain("ERROR: something else\n", set()).reason == "resolver"
    other = "ERROR: Package 'calc' requires a different Python: 3.11.2 not in '>=3.12'\n"
    assert (explain(other, set()).reason, explain(other, set()).requirement) == ("conflict", "calc requires Python >=3.12; the runtime is 3.11.2")


def _zip(path: pathlib.Path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return str(path)


def test_a_wheel_must_hold_exactly_one_top_level_metadata(tmp_path):
    """Step 4: METADATA is read from the one top-level *.dist-info/METADATA; none or two leave the wheel unusable."""
    from executor.deps.resolver import Failure, metadata

    meta = b"Metadata-Version: 2.1\nName: lib\nVersion: 1.0\n"
    two = _zip(tmp_path / "two.whl", {"a-1.0.dist-info/METADATA": meta, "b-1.0.dist-info/METADATA": meta})
    none = _zip(tmp_path / "none.whl", {"lib/__init__.py": b"", "x/a-1.0.dist-info/METADATA": meta})
    for path in (two, none):
        with pytest.raises(Failure, match="top-level METADATA files, not one"):
            metadata(path)
    assert metadata(_zip(tmp_path / "one.whl", {"a-1.0.dist-info/METADATA": meta}))["Name"] == "lib"


def test_a_metadata_over_its_cap_is_refused_unread(tmp_path):
    """Step 4, bounded reads: a METADATA past METADATA_MAX_BYTES is refused (at most the cap plus one byte is read)."""
    from executor.deps.resolver import METADATA_MAX_BYTES, Failure, metadata

    big = b"Metadata-Version: 2.1\nName: lib\nVersion: 1.0\nSummary: " + b"x" * METADATA_MAX_BYTES + b"\n"
    with pytest.raises(Failure, match=f"METADATA over {METADATA_MAX_BYTES} bytes"):
        metadata(_zip(tmp_path / "big.whl", {"lib-1.0.dist-info/METADATA": big}))


def test_hash_regular_hashes_only_a_regular_file(tmp_path):
    """Step 4: the trusted side hashes an index or sealed file only if it is a regular file: a directory,
    a FIFO or a symlink under a wheel's name has no digest, so it can never match an ACKed hash."""
    (tmp_path / "dir.whl").mkdir()
    os.mkfifo(tmp_path / "fifo.whl")
    (tmp_path / "real.whl").write_bytes(b"wheel")
    os.symlink(tmp_path / "real.whl", tmp_path / "link.whl")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert [hash_regular(fd, name) for name in ("dir.whl", "fifo.whl", "link.whl", "missing.whl")] == [None] * 4
        assert hash_regular(fd, "real.whl") == hashlib.sha256(b"wheel").hexdigest()
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.access(RUNTIME, os.X_OK), reason="no /usr/bin/python3")
def test_pip_runs_from_its_package_unpacked_out_of_the_installer_wheel(tmp_path):
    """The resolve op's pip (inside.load_pip): the installer wheel's own pip, imported from a private copy of
    its package unpacked into TMPDIR (not from the zip)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    tools = _tools_boot(tmp_path).split("sys.path[:0] = [", 1)[1].split("]", 1)[0]
    code = (
        f"import sys; sys.path[:0] = [{tools}]; from executor.inside import load_pip; load_pip(sys.argv[1]); "
        "import pip; print(pip.__version__, pip.__file__)"
    )
    shown = subprocess.run([RUNTIME, "-I", "-S", "-B", "-c", code, str(PIP_WHEEL)], capture_output=True,
                           env={"TMPDIR": str(scratch)}, timeout=120)
    assert shown.returncode == 0, shown.stderr
    version = PIP_WHEEL.name.split("-")[1]
    line = shown.stdout.decode().strip()
    assert line.startswith(f"{version} {scratch}/pip-") and line.endswith("/pip/__init__.py"), line
    assert [path.name for path in scratch.iterdir() for path in path.iterdir()] == ["pip"]


def test_a_candidate_that_only_states_requires_python_never_imports_pips_resolver(tmp_path, dirs):
    """issue 14: with no runner and no Requires-Dist, Requires-Python is checked with pip's vendored packaging
    alone: only that much of pip is unpacked, and its resolver and the guard that wraps it (most of a second
    to import) are never loaded, nor its requirement parser."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", requires_python=">=3.8")
    request = tmp_path / "request"
    run_resolver(tmp_path, candidate, index)  # writes the request and the tools
    boot = _tools_boot(tmp_path)
    scratch = tmp_path / "own-scratch"
    scratch.mkdir()
    report = "import atexit, json, sys; atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr)); "
    answer = subprocess.run(
        [RUNTIME, "-I", "-S", "-B", "-c", report + boot, "resolve", str(request), str(candidate), str(index), "-"],
        capture_output=True, env={"TMPDIR": str(scratch), "PIP_CONFIG_FILE": "/dev/null"}, timeout=180,
    )
    assert answer.returncode == 0, answer.stderr.decode()
    found = [json.loads(line) for line in answer.stdout.splitlines()]
    assert found[-1] == {**found[-1], "leaf": "END", "pins": 0}
    loaded = json.loads(answer.stderr.decode().strip().splitlines()[-1])
    assert "pip._vendor.packaging.specifiers" in loaded
    assert not [module for module in loaded if module.startswith("pip._internal")], loaded
    # Nor the requirement parser, some forty regular expressions compiled for no Requires-Dist at all.
    assert "pip._vendor.packaging.requirements" not in loaded, loaded
    [home] = scratch.glob("pip-*")
    assert sorted(path.name for path in (home / "pip").iterdir()) == ["__init__.py", "_vendor"]
    assert sorted(path.name for path in (home / "pip" / "_vendor").iterdir()) == ["__init__.py", "packaging"]


def test_the_tools_entry_point_imports_no_tool_it_does_not_run(tmp_path):
    """issue 14: importing executor.inside, as every tool op does first, loads neither the resolver nor the
    extractor (about 0.1 s of imports, the email parser among them), so an install or fetch op pays only for its own."""
    tools = _tools_boot(tmp_path).split("sys.path[:0] = [", 1)[1].split("]", 1)[0]
    code = f"import json, sys; sys.path[:0] = [{tools}]; import executor.inside; print(json.dumps(sorted(sys.modules)))"
    shown = subprocess.run([RUNTIME, "-I", "-S", "-B", "-c", code], capture_output=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    loaded = set(json.loads(shown.stdout))
    assert "executor.inside" in loaded
    assert not loaded & {"executor.deps.resolver", "executor.deps.protocol", "executor.transport.extract", "email.parser"}
