"""S1: the launcher is provisioned create-only and runs only if it is exactly the shipped one."""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import pathlib
import subprocess
import sys

import pytest

from journal.errors import Refused
from steward import interpreter, provision
from steward.failure import SandboxFailure

root = pytest.mark.root
NAME = "launcher-test.pyc"


@pytest.fixture
def staging(tmp_path):
    state = tmp_path / "state"
    fd, _ = provision.open_staging(str(state))
    yield fd, state / "staging"
    os.close(fd)


def _provisioned(staging_fd: int) -> bytes:
    data, digest = provision.shipped()
    provision.provision(staging_fd, NAME, data, shown=NAME)
    return digest


def test_the_launcher_bytes_do_not_depend_on_references_held_elsewhere(monkeypatch):
    """S1: the build gives the same bytes however many references the building process holds to the code's
    constants (a long-running steward or test run holds more than a fresh process); marshal's formats from 3
    on flag an object by its reference count."""
    package = provision.pathlib.Path(provision.launcher.__file__).parent
    plain = provision.build(package)
    held = []
    compile_plainly = provision._compile

    def compile_and_hold(source, name):
        code = compile_plainly(source, name)
        held.extend(code.co_consts)
        return code

    monkeypatch.setattr(provision, "_compile", compile_and_hold)
    assert provision.build(package) == plain and held


def test_the_shipped_launcher_is_deterministic():
    """S1: the same package gives the same bytes, in this process and in a fresh one."""
    data, digest = provision.shipped()
    assert hashlib.sha256(data).digest() == digest
    assert provision.build(provision.pathlib.Path(provision.launcher.__file__).parent) == data
    fresh = subprocess.run(
        [sys.executable, "-c", "from steward import provision; print(provision.shipped()[1].hex())"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    assert fresh == digest.hex()


def test_the_shipped_launcher_is_one_compiled_file_of_every_launcher_module():
    """S1: one .pyc of this interpreter, holding every module of launcher/ compiled, and nothing else."""
    data, _ = provision.shipped()
    assert data[:4] == importlib.util.MAGIC_NUMBER
    code = marshal.loads(data[16:])
    (modules,) = [const for const in code.co_consts if isinstance(const, tuple) and const and isinstance(const[0], tuple)]
    package = pathlib.Path(provision.launcher.__file__).parent
    expected = sorted("launcher" if path.name == "__init__.py" else f"launcher.{path.stem}"
                      for path in package.glob("*.py") if path.name != provision.TOP_LEVEL)
    assert {"launcher", "launcher.drop", "launcher.ops"} <= set(expected), expected
    assert sorted(name for name, _, _ in modules) == expected
    assert all(code.co_filename == f"launcher/{name.rpartition('.')[2] if name != 'launcher' else '__init__'}.py"
               for name, _, code in modules)


def test_the_shipped_launcher_runs_its_own_modules_as_a_script(tmp_path):
    """S1, S3: ``python -I -S FILE`` runs the file itself; its launcher modules come from it, not from disk."""
    data, _ = provision.shipped()
    path = tmp_path / "launcher.pyc"
    path.write_bytes(data)
    interpreter = os.path.realpath(sys.executable)
    shown = subprocess.run([interpreter, "-I", "-S", "-X", "importtime", str(path)], capture_output=True, text=True, env={})
    assert shown.returncode == 2 and "started without its starter" in shown.stderr
    assert "runpy" not in shown.stderr
    assert str(provision.launcher.__file__) not in shown.stderr
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "onefile.py").write_text(
        (pathlib.Path(provision.launcher.__file__).parent / "onefile.py").read_text().replace(
            "    from launcher.__main__ import main\n\n    main()\n",
            "    from launcher import protocol\n\n    print(protocol.__file__)\n",
        )
    )
    for module in pathlib.Path(provision.launcher.__file__).parent.glob("*.py"):
        if module.name != "onefile.py":
            (probe / module.name).write_bytes(module.read_bytes())
    path.write_bytes(provision.build(probe))
    shown = subprocess.run([interpreter, "-I", "-S", str(path)], capture_output=True, text=True, env={}, check=True)
    assert shown.stdout.strip() == f"{path}/launcher/protocol.py"


def test_a_top_level_without_its_modules_placeholder_is_not_built(tmp_path):
    """S1: the build refuses a top level that would run without the launcher's modules."""
    (tmp_path / "onefile.py").write_text("import sys\n")
    (tmp_path / "__init__.py").write_text("")
    with pytest.raises(RuntimeError, match="MODULES placeholder"):
        provision.build(tmp_path)


@root
def test_a_provisioned_launcher_is_root_owned_0500_and_verifies(staging):
    staging_fd, directory = staging
    digest = _provisioned(staging_fd)
    info = os.stat(directory / NAME)
    assert (info.st_uid, info.st_mode & 0o7777) == (0, 0o500)
    assert oct(os.stat(directory).st_mode & 0o777) == oct(0o700)
    fd = provision.open_verified(staging_fd, NAME, digest, shown=NAME)
    os.close(fd)


@root
def test_an_existing_file_is_refused(staging):
    """S1: create-only; a file of that name already present is refused."""
    staging_fd, directory = staging
    (directory / NAME).write_bytes(b"planted")
    with pytest.raises(Refused, match="already exists"):
        _provisioned(staging_fd)
    assert (directory / NAME).read_bytes() == b"planted"


@root
def test_a_symlink_in_its_place_is_refused(staging, tmp_path):
    staging_fd, directory = staging
    os.symlink(tmp_path / "elsewhere", directory / NAME)
    with pytest.raises(Refused, match="already exists"):
        _provisioned(staging_fd)
    assert not (tmp_path / "elsewhere").exists()


@root
def test_a_foreign_owner_is_refused(staging):
    """S1: the launcher must be owned by root."""
    staging_fd, directory = staging
    digest = _provisioned(staging_fd)
    os.chown(directory / NAME, 1234, 0)
    with pytest.raises(Refused, match="owned by uid 1234"):
        provision.open_verified(staging_fd, NAME, digest, shown=NAME)


@root
def test_a_wrong_mode_is_refused(staging):
    """S1: the launcher must be mode 0500."""
    staging_fd, directory = staging
    digest = _provisioned(staging_fd)
    os.chmod(directory / NAME, 0o700)
    with pytest.raises(Refused, match="mode 0700"):
        provision.open_verified(staging_fd, NAME, digest, shown=NAME)


@root
def test_a_wrong_digest_is_refused(staging):
    """S1: the launcher runs only if its SHA-256 is the shipped launcher's."""
    staging_fd, directory = staging
    digest = _provisioned(staging_fd)
    with open(directory / NAME, "r+b") as file:
        file.seek(100)
        file.write(b"X")
    with pytest.raises(Refused, match="does not match the shipped launcher"):
        provision.open_verified(staging_fd, NAME, digest, shown=NAME)


@root
def test_a_second_link_is_refused(staging, tmp_path):
    staging_fd, directory = staging
    digest = _provisioned(staging_fd)
    os.link(directory / NAME, directory / "other")
    with pytest.raises(Refused, match="2 links"):
        provision.open_verified(staging_fd, NAME, digest, shown=NAME)


@root
@pytest.mark.parametrize("mode", [0o770, 0o702, 0o750])
def test_a_staging_directory_open_to_group_or_other_is_refused(tmp_path, mode):
    """S1: the scratch directory is root-owned 0700."""
    state = tmp_path / "state"
    (state / "staging").mkdir(parents=True, mode=0o700)
    os.chmod(state, 0o700)
    os.chmod(state / "staging", mode)
    with pytest.raises(Refused, match="must be 0700"):
        provision.open_staging(str(state))


@root
def test_a_foreign_staging_directory_is_refused(tmp_path):
    state = tmp_path / "state"
    (state / "staging").mkdir(parents=True, mode=0o700)
    os.chmod(state, 0o700)
    os.chown(state / "staging", 1234, 0)
    with pytest.raises(Refused, match="owned by uid 1234"):
        provision.open_staging(str(state))


@root
def test_a_state_root_writable_by_others_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chmod(state, 0o777)
    with pytest.raises(Refused, match="must be 0700"):
        provision.open_staging(str(state))


@root
@pytest.mark.parametrize("change", ["owner", "mode"])
def test_a_module_directory_another_user_can_change_is_refused(tmp_path, monkeypatch, change):
    """S1: root runs the launcher on C modules from a directory only root can change; one an unprivileged user
    owns (a venv of its own) or may write is refused before any launcher starts, even when the modules are root's."""
    venv = tmp_path / "site-packages"
    venv.mkdir(mode=0o755)
    names = [f"{module}.so" for module in interpreter.LAUNCHER_MODULES]
    for name in names:
        (venv / name).write_bytes(b"")
        os.chmod(venv / name, 0o644)
    if change == "owner":
        os.chown(venv, 1234, 1234)
    else:
        os.chmod(venv, 0o777)
    monkeypatch.setattr(interpreter, "_module_directory", lambda: (str(venv), names))
    with pytest.raises(SandboxFailure, match=f"module directory {venv} is owned by uid"):
        interpreter.open_runtime().close()
