"""The runtime (executor/runtime.py): an interpreter under /usr, the installer wheel, the runtime inventory digest."""

from __future__ import annotations

import hashlib
import os

import pytest

from executor import runtime
from journal.errors import Refused


def test_casebox_s_own_interpreter_is_the_runtime_when_it_lies_under_usr():
    """The sandbox sees only /usr of the host, so the runtime is a real path there."""
    assert runtime.choose_interpreter("/usr/bin/python3") == os.path.realpath("/usr/bin/python3")
    assert runtime.choose_interpreter("/opt/elsewhere/python").startswith("/usr/")


def test_the_stdlib_inventory_covers_files_and_links_and_skips_caches_and_site_packages(tmp_path):
    lib = tmp_path / "lib"
    (lib / "json").mkdir(parents=True)
    (lib / "json" / "__init__.py").write_bytes(b"x = 1\n")
    (lib / "os.py").write_bytes(b"import posix\n")
    (lib / "link.py").symlink_to("os.py")
    first = runtime.stdlib_inventory(str(lib))
    for skipped in ("__pycache__", "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu"):
        (lib / skipped).mkdir()
        (lib / skipped / "anything.py").write_bytes(b"ignored")
    assert runtime.stdlib_inventory(str(lib)) == first
    assert (first["files"], first["bytes"]) == (2, 19)
    (lib / "os.py").write_bytes(b"import posix  \n")
    assert runtime.stdlib_inventory(str(lib))["sha256"] != first["sha256"]


def test_the_newest_pip_wheel_of_the_index_is_the_installer(tmp_path):
    """pip runs from a wheel: the index's newest, read whole and hashed by the trusted side."""
    for version in ("9.0.1", "24.2", "23.3.2", "25.0rc1"):
        (tmp_path / f"pip-{version}-py3-none-any.whl").write_bytes(version.encode())
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        installer = runtime.find_installer(fd, str(tmp_path / "no-stdlib"))
    finally:
        os.close(fd)
    assert (installer.file, installer.source) == ("pip-24.2-py3-none-any.whl", "index")
    assert installer.sha256 == hashlib.sha256(b"24.2").hexdigest()


def test_no_installer_anywhere_is_refused(tmp_path, monkeypatch):
    """Never the network: without a pip wheel in the index or the runtime, verify refuses."""
    monkeypatch.setattr(runtime, "DEBIAN_WHEELS", str(tmp_path / "none"))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match="no pip wheel"):
            runtime.find_installer(fd, str(tmp_path / "no-stdlib"))
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no /usr/bin/python3")
def test_the_runtime_inventory_digest_is_its_canonical_document(repo):
    index = os.open(repo / "examples" / "index", os.O_RDONLY | os.O_DIRECTORY)
    try:
        inspected, again = runtime.inspect(index), runtime.inspect(index)
    finally:
        os.close(index)
    assert inspected.digest == again.digest and inspected.digest.startswith("sha256:")
    assert inspected.document["interpreter"]["path"] == inspected.interpreter
    assert inspected.document["installer"]["sha256"] == hashlib.sha256(inspected.installer.data).hexdigest()


def test_an_installer_wheel_over_its_cap_or_not_a_regular_file_is_refused(tmp_path, monkeypatch):
    """Bounded reads: the index's pip wheel is read through read_evidence, within INSTALLER_MAX_BYTES; a
    larger one is refused, and one turned into a symlink after it was listed is refused, not followed."""
    monkeypatch.setattr(runtime, "INSTALLER_MAX_BYTES", 16)
    (tmp_path / "pip-24.2-py3-none-any.whl").write_bytes(b"x" * 17)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Refused, match="--index pip-24.2-py3-none-any.whl: is larger than the 16-byte cap"):
            runtime.find_installer(fd, str(tmp_path / "no-stdlib"))
        (tmp_path / "pip-24.2-py3-none-any.whl").write_bytes(b"x" * 16)
        assert runtime.find_installer(fd, str(tmp_path / "no-stdlib")).data == b"x" * 16
        (tmp_path / "elsewhere").write_bytes(b"other")
        newest = runtime._newest_installer
        monkeypatch.setattr(runtime, "_newest_installer", lambda directory: _swap_for_link(tmp_path, newest(directory)))
        with pytest.raises(Refused, match="is a symlink"):
            runtime.find_installer(fd, str(tmp_path / "no-stdlib"))
    finally:
        os.close(fd)


def _swap_for_link(directory, name: str) -> str:
    """The race the read must survive: the chosen wheel becomes a symlink between the listing and the read."""
    os.unlink(directory / name)
    os.symlink(directory / "elsewhere", directory / name)
    return name
