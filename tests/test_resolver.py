"""The resolver (executor/resolver.py): METADATA only, markers for the runtime, highest compatible pin, no backtracking."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from executor import inside, wheelbuild
from executor.preparer import hash_regular
from executor.resolver import LocalIndex, Resolution, vendored_packaging
from executor.resolverproto import Acceptor, accept, request_bytes

REPO = pathlib.Path(__file__).resolve().parent.parent
RUNTIME = "/usr/bin/python3"
packaging = vendored_packaging()


def wheel(directory: pathlib.Path, name: str, version: str, *requires: str, python: str | None = None, code: str = "") -> str:
    """A minimal wheel: METADATA (and a module whose import would leave a mark)."""
    file = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Python: {python}"] if python else []
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(directory / file, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}/__init__.py", code)
        archive.writestr(f"{dist}/METADATA", "\n".join(lines) + "\n")
        archive.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return file


@pytest.fixture
def dirs(tmp_path):
    candidate, index = tmp_path / "candidate", tmp_path / "index"
    candidate.mkdir()
    index.mkdir()
    return candidate, index


def resolve(candidate, index, *requirements: str) -> list[dict]:
    resolution = Resolution(packaging, candidate_dir=str(candidate), index=LocalIndex(str(index)), requirements=requirements)
    return [json.loads(line) for line in resolution.leaves()]


def pins(leaves: list[dict]) -> list[tuple[str, str]]:
    return [(leaf["name"], leaf["version"]) for leaf in leaves if leaf["leaf"] == "PIN"]


def test_it_pins_the_highest_compatible_version_and_follows_its_requirements(dirs):
    """Step 4: the highest version allowed, then that wheel's own Requires-Dist, breadth first."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib>=1,<3")
    for version in ("1.0", "2.0", "3.0"):
        wheel(index, "lib", version, "base")
    wheel(index, "base", "1.0")
    leaves = resolve(candidate, index)
    assert pins(leaves) == [("lib", "2.0"), ("base", "1.0")]
    assert leaves[-1] == {"leaf": "END", "pins": 2, "seq": 3}


def test_markers_are_evaluated_for_the_runtime(dirs):
    """Requires-Dist markers for another Python or platform are left out; extras only when asked for."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", 'old ; python_version < "3.0"', 'win ; sys_platform == "win32"', "tool[cli]", 'doc ; extra == "docs"')
    wheel(index, "tool", "1.0", 'click ; extra == "cli"')
    wheel(index, "click", "8.0")
    for name in ("old", "win", "doc"):
        wheel(index, name, "1.0")
    assert pins(resolve(candidate, index)) == [("tool", "1.0"), ("click", "8.0")]


def test_requires_python_rules_a_version_out(dirs):
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib")
    wheel(index, "lib", "2.0", python=">=4")
    wheel(index, "lib", "1.0", python=">=3")
    assert pins(resolve(candidate, index)) == [("lib", "1.0")]


def test_the_plans_requirements_are_resolved_too(dirs):
    """A shard with a pytest case needs pytest, whatever the candidate declares."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0")
    wheel(index, "pytest", "8.0")
    leaves = resolve(candidate, index, "pytest")
    assert pins(leaves) == [("pytest", "8.0")] and leaves[1]["required_by"] == "plan"


def test_the_candidates_own_projects_are_never_pinned(dirs):
    candidate, index = dirs
    wheel(candidate, "demo-core", "1.0")
    wheel(candidate, "demo-greet", "1.0", "demo-core==1.0")
    wheel(index, "demo-core", "9.0")
    assert pins(resolve(candidate, index)) == []


@pytest.mark.parametrize(
    "requires, index_wheels, reason",
    [
        (("missing",), [], "no_match"),
        (("lib>=5",), [("lib", "1.0")], "no_match"),
        (("lib", "other"), [("lib", "2.0"), ("other", "1.0", "lib<2")], "conflict"),
        (("demo-app>=2",), [], "candidate_conflict"),
    ],
)
def test_a_resolution_that_fails_says_why(dirs, requires, index_wheels, reason):
    """No backtracking: a requirement the pins cannot meet is a FAIL leaf with a reason from the closed set."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", *requires)
    for name, version, *more in index_wheels:
        wheel(index, name, version, *more)
    assert resolve(candidate, index)[-1]["leaf"] == "FAIL"
    assert resolve(candidate, index)[-1]["reason"] == reason


def test_a_wheel_whose_metadata_names_another_project_fails(dirs):
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib")
    file = wheel(index, "lib", "1.0")
    os.rename(index / file, index / "lib-2.0-py3-none-any.whl")
    assert resolve(candidate, index)[-1]["reason"] == "metadata"


def test_the_leaves_pass_the_preparers_acceptor(dirs):
    """What the resolver writes is what the preparer accepts, with the trusted side's own hashes."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib")
    wheel(index, "lib", "1.0")
    resolution = Resolution(packaging, candidate_dir=str(candidate), index=LocalIndex(str(index)), requirements=())
    fd = os.open(index, os.O_RDONLY | os.O_DIRECTORY)
    try:
        acceptor = Acceptor(python=resolution.python, candidate={"demo-app": "1.0"}, index_sha256=lambda f: hash_regular(fd, f))
        answer = accept(b"".join(resolution.leaves()), acceptor)
    finally:
        os.close(fd)
    assert [pin.name for pin in answer] == ["lib"]


def test_resolution_never_imports_candidate_code(dirs, tmp_path):
    """DESIGN step 4: METADATA is read as data; a candidate module that would act on import never runs."""
    candidate, index = dirs
    mark = tmp_path / "imported"
    code = f"open({str(mark)!r}, 'w').write('ran')\n"
    wheel(candidate, "demo-app", "1.0", "lib", code=code)
    wheel(index, "lib", "1.0", code=code)
    before = set(sys.modules)
    resolve(candidate, index)
    assert not mark.exists()
    assert not {name for name in set(sys.modules) - before if name.startswith(("demo_app", "lib"))}


PIP_WHEEL = sorted((REPO / "examples" / "index").glob("pip-*.whl"))[-1]


def _tools_boot(tmp_path: pathlib.Path) -> str:
    """inside.BOOT over a copy of exactly inside.MODULES."""
    tools = tmp_path / "tools"
    for relative in inside.MODULES:
        (tools / relative).parent.mkdir(parents=True, exist_ok=True)
        (tools / relative).write_bytes((REPO / relative).read_bytes())
    return inside.BOOT.replace(repr(inside.TOOLS), repr(str(tools)))


@pytest.mark.skipif(not os.access(RUNTIME, os.X_OK), reason="no /usr/bin/python3")
def test_the_tools_run_from_their_module_list_alone(dirs, tmp_path):
    """The tools capability holds exactly inside.MODULES; with only those, -I -S, the resolver answers."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib")
    wheel(index, "lib", "1.0")
    request = tmp_path / "request"
    request.mkdir()
    (request / PIP_WHEEL.name).write_bytes(PIP_WHEEL.read_bytes())
    (request / "request.json").write_bytes(request_bytes("sha256:" + "0" * 64, [], {"file": PIP_WHEEL.name, "sha256": "0" * 64, "source": "index"}))
    boot = _tools_boot(tmp_path)
    answer = subprocess.run(
        [RUNTIME, "-I", "-S", "-B", "-c", boot, "resolve", str(request), str(candidate), str(index)],
        capture_output=True, env={}, timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    assert [json.loads(line)["leaf"] for line in answer.stdout.splitlines()] == ["BEGIN", "PIN", "END"]


def _zip(path: pathlib.Path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return str(path)


def test_a_wheel_must_hold_exactly_one_top_level_metadata(tmp_path):
    """Step 4: METADATA is read from the one top-level *.dist-info/METADATA; none or two leave the wheel unusable."""
    from executor.resolver import MetadataError, metadata

    meta = b"Metadata-Version: 2.1\nName: lib\nVersion: 1.0\n"
    two = _zip(tmp_path / "two.whl", {"a-1.0.dist-info/METADATA": meta, "b-1.0.dist-info/METADATA": meta})
    none = _zip(tmp_path / "none.whl", {"lib/__init__.py": b"", "x/a-1.0.dist-info/METADATA": meta})
    for path in (two, none):
        with pytest.raises(MetadataError, match="top-level METADATA files, not one"):
            metadata(path)
    assert metadata(_zip(tmp_path / "one.whl", {"a-1.0.dist-info/METADATA": meta}))["Name"] == "lib"


def test_a_metadata_over_its_cap_is_refused_unread(tmp_path):
    """Step 4, bounded reads: a METADATA past METADATA_MAX_BYTES is refused (at most the cap plus one byte is read)."""
    from executor.resolver import METADATA_MAX_BYTES, MetadataError, metadata

    big = b"Metadata-Version: 2.1\nName: lib\nVersion: 1.0\nSummary: " + b"x" * METADATA_MAX_BYTES + b"\n"
    with pytest.raises(MetadataError, match=f"METADATA over {METADATA_MAX_BYTES} bytes"):
        metadata(_zip(tmp_path / "big.whl", {"lib-1.0.dist-info/METADATA": big}))


def test_only_regular_wheel_files_of_a_supported_tag_are_candidates(dirs):
    """Step 4: a symlink named like a wheel, or a wheel for another platform's tags, is never pinned."""
    candidate, index = dirs
    wheel(candidate, "demo-app", "1.0", "lib")
    real = wheel(index, "lib", "1.0")
    os.symlink(index / real, index / "lib-9.0-py3-none-any.whl")
    os.rename(index / real, index / "lib-1.0-py3-none-win_amd64.whl")
    assert resolve(candidate, index)[-1] == {"leaf": "FAIL", "reason": "no_match", "requirement": "lib", "seq": 1}


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
    """The fetch and install ops' pip (inside.py): the installer wheel's own pip, imported from a private copy of
    its package unpacked into TMPDIR (not from the zip), installing with no index and no dependencies."""
    source = tmp_path / "demo-app"
    (source / "demo_app").mkdir(parents=True)
    (source / "demo_app" / "__init__.py").write_text("MARK = 1\n")
    (source / "pyproject.toml").write_text('[project]\nname = "demo-app"\nversion = "1.0"\n')
    name, data = wheelbuild.build_wheel(str(source))
    (tmp_path / name).write_bytes(data)
    scratch, target = tmp_path / "tmp", tmp_path / "site"
    scratch.mkdir()
    boot = _tools_boot(tmp_path)

    def pip(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [RUNTIME, "-I", "-S", "-B", "-c", boot, "pip", str(PIP_WHEEL), *arguments, "--disable-pip-version-check"],
            capture_output=True, env={"TMPDIR": str(scratch), "PIP_CONFIG_FILE": "/dev/null"}, timeout=120,
        )

    shown = pip("--version")
    assert shown.returncode == 0, shown.stderr
    version = PIP_WHEEL.name.split("-")[1]
    assert shown.stdout.decode().startswith(f"pip {version} from {scratch}/pip-"), shown.stdout
    assert [path.name for path in scratch.iterdir() for path in path.iterdir()] == ["pip"]
    installed = pip("install", "--no-index", "--no-deps", "--target", str(target), str(tmp_path / name))
    assert installed.returncode == 0, installed.stderr
    assert (target / "demo_app" / "__init__.py").read_text() == "MARK = 1\n"
