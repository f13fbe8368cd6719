"""E7: the runner's boot as it runs in every interpreter of a pytest case, here on the host with stand-in trees.

``executor/cases/runner_boot.py`` is the runner tree's ``sitecustomize``:
interpreters that start with site (a plugin's worker, the verifier's
checker, the candidate's own processes) install its finder at their start,
and the runner (``-S``) loads it by path. A module of the candidate's own
projects is found for the verifier's code and the candidate's, and for the
program an interpreter was started to run, never for other code on the path
(the runner's); the runner's own ``-c`` program gets no such leave.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from executor.cases.runner_boot import SETTINGS

BOOT = pathlib.Path(__file__).resolve().parent.parent / "executor" / "cases" / "runner_boot.py"
REFUSED = "casebox: calc is a module of the candidate"


@pytest.fixture
def trees(tmp_path):
    """A runner tree holding the boot as sitecustomize and a plugin that imports calc, a candidate tree with
    calc, and a verifier tree whose check imports it."""
    runner, candidate, verifier = tmp_path / "runner", tmp_path / "candidate", tmp_path / "verifier"
    for directory in (runner, candidate / "calc", verifier):
        directory.mkdir(parents=True)
    shutil.copy(BOOT, runner / "sitecustomize.py")
    (runner / "plugin.py").write_text("import calc\n")
    (candidate / "calc" / "__init__.py").write_text("VALUE = 4\n")
    (candidate / "calc" / "__main__.py").write_text("import calc\nprint(calc.VALUE)\n")
    (verifier / "check.py").write_text("import calc\nprint(calc.VALUE)\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": f"{runner}:{candidate}", "PYTHONNOUSERSITE": "1",
        SETTINGS: f"{verifier}\n{candidate}/\ncalc",
    }
    return runner, candidate, verifier, env


def _run(argv: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def _runner_boot(runner: pathlib.Path) -> str:
    """The start of the runner's ``-c`` program: the boot loaded by path, as RUNNER_BOOT loads it."""
    return (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('casebox_runner_boot', {str(runner / 'sitecustomize.py')!r})\n"
        "boot = importlib.util.module_from_spec(spec); spec.loader.exec_module(boot); boot.boot_runner()\n"
    )


def test_an_interpreter_started_with_site_finds_the_candidate_for_its_program_and_the_verifier_only(trees, tmp_path):
    """E7: with site, the boot's finder is installed at the start: ``-m calc``, ``-c "import calc"`` and the
    verifier's own script find calc; other code on the path (the runner's plugin) does not, and is told why;
    nor does code the program ``exec``s with another namespace, or a thread's, as a worker's remote code."""
    runner, candidate, verifier, env = trees
    for argv in (["-m", "calc"], ["-c", "import calc; print(calc.VALUE)"], [str(verifier / "check.py")]):
        found = _run(argv, env, tmp_path)
        assert (found.returncode, found.stdout) == (0, "4\n"), (argv, found.stderr)
    for argv in (["-c", "import plugin"], ["-c", "exec(compile('import calc', '<remote exec>', 'exec'), {})"],
                 ["-c", "import _thread, time\n_thread.start_new_thread(exec, (compile('import calc', '<t>', 'exec'), {}))\ntime.sleep(1)"],
                 ["-c", "import threading, importlib\nt = threading.Thread(target=importlib.import_module, args=('calc',)); t.start(); t.join()"]):
        refused = _run(argv, env, tmp_path)
        assert REFUSED in refused.stderr, (argv, refused.stderr)
    without = _run(["-c", "import plugin"], {**env, SETTINGS: ""}, tmp_path)
    assert "Error in sitecustomize" in without.stderr, "the settings are required: none is no finder, and says so"


def test_the_runner_gets_the_strict_finder_and_refuses_to_start_beside_another_sitecustomize(trees, tmp_path):
    """E7: the runner (``-S``) loads the boot by path: its own ``-c`` program gets no leave to import calc, nor
    does a plugin; and it refuses to start (so the case exits 3) where an interpreter started with site would
    load another sitecustomize first, whose workers would then run without the finder."""
    runner, candidate, verifier, env = trees
    load = _runner_boot(runner)
    for then in ("import calc", "import plugin"):
        refused = _run(["-S", "-c", load + then], env, tmp_path)
        assert refused.returncode == 1 and REFUSED in refused.stderr, (then, refused.stderr)
    (tmp_path / "sitecustomize.py").write_text("pass\n")
    shadowed = _run(["-S", "-c", load], env, tmp_path)
    assert shadowed.returncode == 1 and "would load" in shadowed.stderr and "as sitecustomize" in shadowed.stderr, shadowed.stderr


def test_the_runner_makes_itself_non_dumpable_whatever_binary_runs_it(trees, tmp_path):
    """E7: the runner's boot makes its own process non-dumpable (PR_SET_DUMPABLE 0) before pytest runs, so no
    process of the same UID can ptrace it or open its /proc/PID/mem to rewrite its report or its exit status.
    Here its interpreter is a readable binary, which leaves a process dumpable (in a sandbox the execute-only
    copy makes it non-dumpable anyway, so the real runs there cannot tell the boot's own guard from that one):
    dumpable without the boot, not dumpable after it. Red without the boot's prctl."""
    runner, candidate, verifier, env = trees
    probe = "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"  # PR_GET_DUMPABLE
    plain = _run(["-S", "-c", probe], env, tmp_path)
    assert (plain.returncode, plain.stdout) == (0, "1\n"), "the precondition: this interpreter leaves its process dumpable"
    booted = _run(["-S", "-c", _runner_boot(runner) + probe], env, tmp_path)
    assert (booted.returncode, booted.stdout) == (0, "0\n"), booted.stderr


def test_an_interpreter_started_with_site_searches_no_site_packages_of_its_runtime(trees, tmp_path):
    """E7: what ``site`` adds to the search path is dropped wherever the boot runs, so a worker or a checker
    searches what the runner (``-S``) does. The runtime here is a venv whose site-packages holds a module, and
    a ``.pth`` listing a directory with another (a setup-python Python where the CI job installed packages, or
    Debian's dist-packages): with the boot, neither is found and the path is PYTHONPATH's and the standard
    library's; without its settings, both are. A site-packages directory PYTHONPATH itself names is kept, with
    what its ``.pth`` files list.
    Red without ``drop_site_packages``."""
    runner, candidate, verifier, env = trees
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site_packages = pathlib.Path(subprocess.run(
        [python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True,
    ).stdout.strip())
    (site_packages / "hostonly.py").write_text("")
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "pthonly.py").write_text("")
    (site_packages / "extra.pth").write_text(f"{listed}\n")
    probe = ["-c", "import importlib.util, sys; print([importlib.util.find_spec(n) is not None for n in ('hostonly', 'pthonly')])\n"
                   "print('\\n'.join(sys.path[1:]))"]

    def searched(environment: dict) -> tuple[str, list[str]]:
        done = subprocess.run([python, *probe], env=environment, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        found, *path = done.stdout.splitlines()
        return found, path

    found, path = searched(env)
    assert found == "[False, False]", path
    assert path[:2] == [str(runner), str(candidate)] and not {str(site_packages), str(listed)} & set(path), path
    assert all(entry.startswith(sys.base_prefix) for entry in path[2:]), "after PYTHONPATH, the standard library alone"
    assert searched({**env, SETTINGS: ""})[0] == "[True, True]", "the precondition: site adds both without the boot"
    named = searched({**env, "PYTHONPATH": f"{env['PYTHONPATH']}:{site_packages}"})
    assert named[0] == "[True, True]" and str(site_packages) in named[1], named
