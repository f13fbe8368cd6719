"""The runtime (executor/cases/runtime.py): an interpreter under /usr, the installer wheel, the runtime inventory digest."""

from __future__ import annotations

import hashlib
import os

import pytest

from executor.cases import runtime
from journal.errors import Refused


def test_casebox_s_own_interpreter_is_the_runtime_when_it_lies_under_usr():
    """The sandbox sees only /usr of the host, so the runtime is a real path there."""
    assert runtime.choose_interpreter("/usr/bin/python3") == os.path.realpath("/usr/bin/python3")
    assert runtime.choose_interpreter("/opt/elsewhere/python").startswith("/usr/")


def test_the_tree_inventory_covers_files_and_links_and_skips_caches_and_site_packages(tmp_path):
    lib = tmp_path / "lib"
    (lib / "json").mkdir(parents=True)
    (lib / "json" / "__init__.py").write_bytes(b"x = 1\n")
    (lib / "os.py").write_bytes(b"import posix\n")
    (lib / "link.py").symlink_to("os.py")
    first = runtime.tree_inventory(str(lib))
    for skipped in ("__pycache__", "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu"):
        (lib / skipped).mkdir()
        (lib / skipped / "anything.py").write_bytes(b"ignored")
    assert runtime.tree_inventory(str(lib)) == first
    assert (first["files"], first["bytes"]) == (2, 19)
    (lib / "os.py").write_bytes(b"import posix  \n")
    assert runtime.tree_inventory(str(lib))["sha256"] != first["sha256"]


def _bundled(tmp_path, *versions: str):
    """A fake runtime stdlib whose ensurepip bundles these pip versions."""
    bundled = tmp_path / "stdlib" / "ensurepip" / "_bundled"
    bundled.mkdir(parents=True)
    for version in versions:
        (bundled / f"pip-{version}-py3-none-any.whl").write_bytes(version.encode())
    return str(tmp_path / "stdlib")


def test_the_runtime_s_newest_bundled_pip_wheel_is_the_installer(tmp_path, monkeypatch):
    """pip runs from a wheel: by default the one the runtime bundles, its newest, read whole and hashed by the trusted side."""
    monkeypatch.setattr(runtime, "DEBIAN_WHEELS", str(tmp_path / "none"))
    installer = runtime.bundled_installer(_bundled(tmp_path, "22.2", "24.2", "23.3.2", "25.0rc1"))
    assert (installer.file, installer.source) == ("pip-24.2-py3-none-any.whl", "runtime")
    assert installer.sha256 == hashlib.sha256(b"24.2").hexdigest() and installer.data == b"24.2"


def test_a_pip_wheel_in_the_index_never_becomes_the_installer(repo):
    """E7: the installer is chosen deliberately; examples/index holds pip 24.2, the runtime's own is used."""
    assert (repo / "examples" / "index" / "pip-24.2-py3-none-any.whl").is_file()
    assert runtime.inspect().installer.source == "runtime"


def test_the_installer_named_on_the_command_line_is_used(repo):
    """verify --installer WHEEL: that wheel, read whole and hashed."""
    path = repo / "examples" / "index" / "pip-24.2-py3-none-any.whl"
    installer = runtime.chosen_installer(str(path))
    assert (installer.file, installer.source) == (path.name, "chosen")
    assert installer.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name, rule", [("pip-21.3.1-py3-none-any.whl", "older than pip 22.2"), ("pipx-1.0-py3-none-any.whl", "is not named")])
def test_an_installer_that_cannot_resolve_or_is_not_pip_is_refused(tmp_path, name, rule):
    """pip's resolver needs install --dry-run --report (22.2); anything not named like a pip wheel is refused."""
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(Refused, match=rule):
        runtime.chosen_installer(str(tmp_path / name))


def test_no_installer_anywhere_is_refused(tmp_path, monkeypatch):
    """Never the network: without a bundled pip wheel and no --installer, verify refuses."""
    monkeypatch.setattr(runtime, "DEBIAN_WHEELS", str(tmp_path / "none"))
    with pytest.raises(Refused, match="bundles no pip wheel"):
        runtime.bundled_installer(str(tmp_path / "no-stdlib"))


def test_the_runtime_inventory_digest_is_its_canonical_document():
    inspected, again = runtime.inspect(), runtime.inspect()
    assert inspected.digest == again.digest
    assert inspected.digest == "sha256:" + hashlib.sha256(runtime.canonical(inspected.document)).hexdigest()
    assert inspected.document["installer"] == inspected.installer.as_dict()


def test_the_runtime_reports_its_stdlib_search_path_and_module_names():
    """E7: what a case's search path starts with, and the names no candidate module may take."""
    inspected = runtime.inspect()
    assert inspected.stdlib_path and all(entry.startswith("/usr/") for entry in inspected.stdlib_path)
    assert {"argparse", "json", "os", "sys"} <= inspected.stdlib_modules and "pytest" not in inspected.stdlib_modules


def test_an_installer_wheel_over_its_cap_or_not_a_regular_file_is_refused(tmp_path, monkeypatch):
    """Bounded reads: the pip wheel is read through read_evidence, within INSTALLER_MAX_BYTES; a
    larger one is refused, and one turned into a symlink after it was listed is refused, not followed."""
    monkeypatch.setattr(runtime, "INSTALLER_MAX_BYTES", 16)
    monkeypatch.setattr(runtime, "DEBIAN_WHEELS", str(tmp_path / "none"))
    stdlib = _bundled(tmp_path, "24.2")
    bundled = tmp_path / "stdlib" / "ensurepip" / "_bundled"
    (bundled / "pip-24.2-py3-none-any.whl").write_bytes(b"x" * 17)
    with pytest.raises(Refused, match="cap of an installer wheel"):
        runtime.bundled_installer(stdlib)
    (bundled / "pip-24.2-py3-none-any.whl").write_bytes(b"x" * 16)
    assert runtime.bundled_installer(stdlib).data == b"x" * 16
    (bundled / "elsewhere").write_bytes(b"other")
    newest = runtime._newest_installer
    monkeypatch.setattr(runtime, "_newest_installer", lambda directory: _swap_for_link(bundled, newest(directory)))
    with pytest.raises(Refused):
        runtime.bundled_installer(stdlib)


def _swap_for_link(directory, name: str) -> str:
    """The race the read must survive: the chosen wheel becomes a symlink between the listing and the read."""
    os.unlink(directory / name)
    os.symlink(directory / "elsewhere", directory / name)
    return name
