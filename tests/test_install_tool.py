"""The install op's tool (executor/inside.py ``install``), run on crafted wheels: no candidate code is imported
or run, only unpacked and compiled (issue 14, "A faster exact install")."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
import os
import pathlib
import zipfile

import pytest

from executor.inside import main

MOUNTED = "/cap/site"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(directory: pathlib.Path, files: dict[str, bytes], *, record: dict[str, str] | None = None) -> str:
    """A wheel of ``files`` with its metadata and a RECORD; ``record`` overrides the hash RECORD states for a name."""
    info = "demo_lib-1.0.dist-info"
    files = {
        **files,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: demo-lib\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\ndemo-lib = demo_lib:main\n",
    }
    stated = record or {}
    lines = [f"{name},{stated.get(name, _digest(data))},{len(data)}" for name, data in files.items()]
    lines.append(f"{info}/RECORD,,")
    path = directory / "demo_lib-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join(lines) + "\n")
    return str(path)


MODULE = {"demo_lib/__init__.py": b"def main():\n    return 0\n"}


def test_a_wheel_is_installed_in_the_target_layout_and_compiled_for_where_cases_mount_it(tmp_path):
    """E7, issue 14: modules in site-packages/ (a venv's layout), scripts in bin/, and every module's
    checked-hash .pyc names the path the cases see the sealed tree at, never the directory it was written in."""
    target = tmp_path / "out"
    target.mkdir()
    assert main(["install", str(target), MOUNTED, wheel(tmp_path, MODULE)]) == 0
    assert sorted(os.listdir(target)) == ["bin", "site-packages"]
    module = target / "site-packages" / "demo_lib" / "__init__.py"
    assert module.is_file() and (target / "bin" / "demo-lib").is_file()
    cached = pathlib.Path(importlib.util.cache_from_source(str(module))).read_bytes()
    assert int.from_bytes(cached[4:8], "little") == 0b11
    assert marshal.loads(cached[16:]).co_filename == f"{MOUNTED}/site-packages/demo_lib/__init__.py"


def test_the_runner_s_tree_gets_the_runner_s_boot_as_its_sitecustomize_and_never_a_wheel_s(tmp_path, capsys):
    """E7: install-runner writes executor/cases/runner_boot.py as the runner tree's sitecustomize, compiled like
    the rest, so every interpreter of a pytest case that starts with site runs the runner's finder (a plugin's
    workers among them); a runner closure that ships a sitecustomize of its own fails the install instead of
    replacing the boot, and a plain install writes none."""
    target = tmp_path / "runner"
    target.mkdir()
    assert main(["install-runner", str(target), "/cap/runner", wheel(tmp_path, MODULE)]) == 0
    boot = target / "site-packages" / "sitecustomize.py"
    assert boot.read_bytes() == (pathlib.Path(__file__).parent.parent / "executor" / "cases" / "runner_boot.py").read_bytes()
    assert pathlib.Path(importlib.util.cache_from_source(str(boot))).is_file()
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["install", str(plain), MOUNTED, wheel(tmp_path, MODULE)]) == 0
    assert not (plain / "site-packages" / "sitecustomize.py").exists()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (tmp_path / "w").mkdir()
    assert main(["install-runner", str(shipped), "/cap/runner", wheel(tmp_path / "w", {**MODULE, "sitecustomize.py": b"pass\n"})]) == 1
    assert "ships a sitecustomize of its own" in capsys.readouterr().err


def test_a_wheels_data_files_land_in_data_and_never_at_the_top_of_the_tree(tmp_path):
    """E7: with a verifier mount the cases run in /cap, and the working directory comes first on the search path
    of every interpreter there, ahead of the standard library: an ``__init__.py`` at the top of the candidate's
    tree would make /cap/site the package ``site`` to any import of it where ``site`` is not frozen (Python
    3.9 and 3.10 runtimes, ``-X frozen_modules=off``). A wheel's ``.data/data`` files go to ``data/``, so
    nothing a wheel holds lands at the top. Red with data at the top."""
    target = tmp_path / "out"
    target.mkdir()
    files = {**MODULE, "demo_lib-1.0.data/data/__init__.py": b"import os\nos._exit(0)\n", "demo_lib-1.0.data/data/share/x.txt": b"x"}
    assert main(["install", str(target), MOUNTED, wheel(tmp_path, files)]) == 0
    assert sorted(os.listdir(target)) == ["bin", "data", "site-packages"]
    assert (target / "data" / "__init__.py").is_file() and (target / "data" / "share" / "x.txt").is_file()


def test_two_installs_of_one_wheel_are_the_same_bytes(tmp_path):
    """Issue 14 (5): the same wheel installed twice, in two directories, gives byte-identical trees, so two
    stages or two shards bind one runner inventory digest."""
    built = wheel(tmp_path, MODULE)
    trees = []
    for name in ("one", "two"):
        target = tmp_path / name
        target.mkdir()
        assert main(["install", str(target), MOUNTED, built]) == 0
        trees.append({str(path.relative_to(target)): path.read_bytes() for path in sorted(target.rglob("*")) if path.is_file()})
    assert trees[0] == trees[1]


def test_a_file_whose_bytes_differ_from_its_record_is_refused_before_anything_is_written(tmp_path, capsys):
    """Issue 14: a hostile wheel whose RECORD states another hash for a module is refused, and nothing of it
    reaches the tree (pip installed it without a word)."""
    target = tmp_path / "out"
    target.mkdir()
    forged = wheel(tmp_path, MODULE, record={"demo_lib/__init__.py": _digest(b"something else")})
    assert main(["install", str(target), MOUNTED, forged]) == 1
    assert [path for path in target.rglob("*") if not path.is_dir()] == []
    assert "demo_lib-1.0-py3-none-any.whl" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../escaped.py", "demo_lib/../../escaped.py"])
def test_a_file_outside_the_tree_is_refused(tmp_path, name):
    """Issue 14, F-style containment: a wheel entry that climbs out of the modules directory is never written
    outside it (not beside it in the tree, not outside the tree)."""
    target = tmp_path / "deep" / "out"
    target.mkdir(parents=True)
    hostile = wheel(tmp_path, {**MODULE, name: b"x = 1\n"})
    assert main(["install", str(target), MOUNTED, hostile]) == 1
    assert [path.name for path in tmp_path.rglob("escaped.py")] == []
