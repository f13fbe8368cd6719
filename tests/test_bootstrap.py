"""scripts/bootstrap as root with no sudo installed, through sudo, and as a user without sudo (issue 13)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "scripts" / "bootstrap"


def fake(directory: pathlib.Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def tools():
    """A directory of stand-ins, first on PATH: dpkg-query says every package is missing, apt-get and sudo only
    note how they were called (in calls.log) so no package is ever installed. Outside pytest's 0700 base, so
    the unprivileged test user reaches it."""
    base = pathlib.Path(tempfile.mkdtemp())
    os.chmod(base, 0o777)
    directory = base / "bin"
    directory.mkdir(mode=0o755)
    log = base / "calls.log"
    fake(directory, "dpkg-query", "exit 1\n")
    fake(directory, "apt-get", f'echo "apt-get uid=$(id -u) $*" >> {log}\n')
    fake(directory, "sudo", f'echo "sudo $*" >> {log}\nexit 1\n')
    yield directory, log
    shutil.rmtree(base)


@pytest.mark.root
def test_a_second_bootstrap_of_the_checkout_waits_for_the_first(tools):
    """Two bootstraps of one checkout never install into its .venv at once: while the checkout's lock is held
    (as a running bootstrap holds it), a second one does nothing, not even apt; it goes on once released."""
    import fcntl

    directory, log = tools
    env = {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}
    held = os.open(REPO, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = subprocess.Popen([str(BOOTSTRAP)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)
        assert not log.exists() or log.read_text() == ""
    finally:
        os.close(held)
    stdout, stderr = waiting.communicate(timeout=600)
    assert waiting.returncode == 0, stderr
    assert "bootstrap: ready" in stdout and log.read_text()


@pytest.mark.root
@pytest.mark.slow
def test_as_root_it_runs_apt_itself_and_never_asks_sudo(tools):
    """A root host needs no sudo: apt runs as root directly, then .venv is kept and casebox installed."""
    directory, log = tools
    env = {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}
    result = subprocess.run([str(BOOTSTRAP)], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "bootstrap: ready" in result.stdout
    calls = log.read_text().splitlines()
    assert calls and all(call.startswith("apt-get uid=0 ") for call in calls), calls


@pytest.mark.root
def test_as_another_user_apt_goes_through_sudo(tools, sandbox_ids):
    """Through sudo: a user who is not root gets apt-get only by way of sudo (here a stand-in that refuses)."""
    directory, log = tools
    uid, gid = sandbox_ids
    env = {"PATH": f"{directory}:/usr/local/bin:/usr/bin:/bin", "HOME": "/"}
    result = subprocess.run([str(BOOTSTRAP)], capture_output=True, text=True, env=env, user=uid, group=gid,
                            extra_groups=[], cwd="/", timeout=120)
    assert result.returncode != 0
    calls = log.read_text().splitlines()
    assert calls[0].startswith("sudo -- env DEBIAN_FRONTEND=noninteractive apt-get update"), calls
    assert not any(call.startswith("apt-get") for call in calls)


@pytest.mark.root
def test_as_another_user_without_sudo_it_says_to_run_as_root(tools, sandbox_ids):
    """No sudo and not root: one sentence saying to run it as root, before anything is installed or made."""
    directory, log = tools
    (directory / "sudo").unlink()
    for name in ("bash", "env", "dirname", "flock", "id", "grep"):
        (directory / name).symlink_to(shutil.which(name))
    (directory / "python3").symlink_to(os.path.realpath(sys.executable))
    uid, gid = sandbox_ids
    result = subprocess.run(["bash", str(BOOTSTRAP)], capture_output=True, text=True, env={"PATH": str(directory), "HOME": "/"},
                            user=uid, group=gid, extra_groups=[], cwd="/", timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "bootstrap: installing system packages needs root, and this host has no sudo: run scripts/bootstrap as root")
    assert not log.exists()


def test_the_distributions_python_comes_before_another_first_on_path(tmp_path):
    """.venv is made from the distribution's interpreter (libpython linked in, PGO and LTO: the launcher's two
    stages cost a third less CPU on it) even when PATH names another 3.11+ first, as pyenv or setup-python do
    (here a stand-in that answers as a real 3.11+ interpreter would, with its own path)."""
    newer = "import sys; sys.exit(sys.version_info < (3, 11))"
    candidates = ("/usr/bin/python3", "/usr/bin/python3.13", "/usr/bin/python3.12", "/usr/bin/python3.11")
    found = [path for path in candidates if os.path.exists(path) and subprocess.run([path, "-I", "-S", "-c", newer]).returncode == 0]
    if not found:
        pytest.skip("this host has no distribution Python 3.11 or later under /usr/bin")
    for name in ("python3.13", "python3.12", "python3.11", "python3"):
        fake(tmp_path, name, f"echo {tmp_path / name}\n")
    chosen = subprocess.run(["bash", "-c", 'source <(sed -n "/^real_python()/,/^}/p" "$0"); real_python', str(BOOTSTRAP)],
                            capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=60)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == os.path.realpath(found[0])
