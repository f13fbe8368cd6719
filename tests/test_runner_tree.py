"""Plan v2 and pip's resolver, end to end as root: a runner that needs hypothesis, backtracking, a true conflict."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from test_hostile_candidates import CALC_MAIN, VERIFIER_TEST, calc, status, v2_plan, verify, world  # noqa: F401
from test_verify import EXAMPLES
from wheelforge import wheel

from executor.cases.runtime import choose_interpreter

pytestmark = pytest.mark.root

PROPERTY_TEST = '''"""A verifier test that needs the runner's hypothesis plugin, and the candidate only through a subprocess."""
import subprocess
import sys

from hypothesis import given, settings, strategies as st


@settings(max_examples=5, deadline=None, database=None)
@given(st.integers(0, 9), st.integers(0, 9))
def test_sums(a, b):
    out = subprocess.run([sys.executable, "-m", "calc", str(a), str(b)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(a + b)


def test_the_plugin_is_the_runner_s(request):
    import _hypothesis_pytestplugin
    assert request.config.pluginmanager.is_registered(_hypothesis_pytestplugin)
    assert _hypothesis_pytestplugin.__file__.startswith("/cap/runner/")


def test_both_trees_are_installed_code_to_hypothesis():
    # Issue 14: hypothesis parses the source of every module it takes for the project's own, once per
    # process (0.5-0.8 s a case for the runner's and the candidate's); a venv's layout makes them installed.
    import _pytest, calc
    from hypothesis.internal.constants_ast import is_local_module_file
    assert not is_local_module_file(_pytest.__file__) and not is_local_module_file(calc.__file__)
'''
HONEST_MAIN = "import sys\nprint(int(sys.argv[1]) + int(sys.argv[2]))\n"


def test_a_runner_that_needs_hypothesis_is_installed_into_the_runner_tree_alone(world, casebox, tmp_path):
    """Plan v2, E7: the runner's hypothesis comes from the index into the runner tree, with no extra wheel in the
    bundle; the plan's plugin loads by its entry point name, from the runner; the honest candidate PASSes."""
    honest = calc(tmp_path / "w", files={"calc/__main__.py": HONEST_MAIN})
    plan = v2_plan(runner=["pytest>=8", "hypothesis"], plugins=["hypothesispytest"])
    result, output = verify(world, casebox, tmp_path, [honest], tests={"test_calc.py": PROPERTY_TEST}, plan=plan)
    assert status(output) == ("PASS", "passed") and result.returncode == 0, output


def test_without_the_plugin_named_the_runner_s_hypothesis_plugin_does_not_load(world, casebox, tmp_path):
    """E7: autoload is off, so a runner plugin loads only when the plan names it: the plugin test fails (FAIL)."""
    honest = calc(tmp_path / "w", files={"calc/__main__.py": HONEST_MAIN})
    plan = v2_plan(runner=["pytest>=8", "hypothesis"])
    result, output = verify(world, casebox, tmp_path, [honest], tests={"test_calc.py": PROPERTY_TEST}, plan=plan)
    assert status(output) == ("FAIL", "exit_mismatch"), output


def test_a_plugin_the_runner_does_not_hold_is_runner_failed(world, casebox, tmp_path):
    """E7: a plugin name found neither among the runner's pytest11 entry points nor its modules never falls
    through to the candidate (which ships a module of that name): runner_failed."""
    hostile = calc(tmp_path / "w", files={"calc/__main__.py": HONEST_MAIN, "forge_plugin.py": "raise SystemExit(0)\n"})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=v2_plan(plugins=["forge_plugin"]))
    assert status(output) == ("UNVERIFIED", "runner_failed") and "forge_plugin" in output, output


IMPORTING_TESTS = {
    "conftest.py": "import calc  # noqa: F401\n",
    "test_calc.py": '''"""The verifier's ways of importing the candidate: directly, or through the standard library."""
import importlib
import pickle
import sys
import threading
from unittest import mock

import pytest


def test_the_verifier_s_own_imports_find_the_candidate():
    assert sys.modules["calc"].__file__.startswith("/cap/site/")  # the conftest's import
    del sys.modules["calc"]
    assert importlib.import_module("calc").VALUE == 4
    del sys.modules["calc"]
    with mock.patch("calc.VALUE", 5):
        assert sys.modules["calc"].VALUE == 5
    data = pickle.dumps(sys.modules["calc"].Thing)
    del sys.modules["calc"]
    assert pickle.loads(data).__name__ == "Thing"
    del sys.modules["calc"]
    found = []
    thread = threading.Thread(target=lambda: found.append(importlib.import_module("calc")))
    thread.start()
    thread.join()
    assert found and found[0].VALUE == 4


def test_an_import_the_runner_s_own_code_makes_does_not_find_the_candidate():
    del sys.modules["calc"]
    with pytest.raises(pytest.skip.Exception, match="a module of the candidate"):
        pytest.importorskip("calc")
''',
}


def test_the_verifier_s_tests_import_the_candidate_and_the_runner_s_own_code_does_not(world, casebox, tmp_path):
    """E7: the runner's boot finds a module of the candidate's own projects only for an import made by the
    verifier's tree (its conftest, its tests, and through the standard library for them: importlib, mock,
    pickle, a thread) or by the candidate's own code; an import the runner's own code makes (pytest's
    importorskip) does not find it, with a sentence saying why. PASS; FAIL without the guard, when
    importorskip finds the candidate, or with a guard that refuses one of the verifier's own ways."""
    honest = calc(tmp_path / "w", files={"calc/__init__.py": "VALUE = 4\n\n\nclass Thing:\n    pass\n", "calc/__main__.py": HONEST_MAIN})
    result, output = verify(world, casebox, tmp_path, [honest], tests=IMPORTING_TESTS)
    assert status(output) == ("PASS", "passed") and result.returncode == 0, output


def test_a_stray_tests_package_in_the_candidate_leaves_the_verifier_s_own_tests_package_to_pytest(world, casebox, tmp_path):
    """E7: many wheels ship a top-level ``tests`` package by mistake. The verifier's tree holds its own, which
    pytest imports itself (``tests.test_calc``, its rootdir first on the path); the runner's boot refuses a
    candidate module to pytest only where the search would find it in the candidate's tree, so the verifier's
    package still loads: PASS; FAIL (an import error at collection) with a boot that refuses by name alone."""
    honest = calc(tmp_path / "w", files={"calc/__main__.py": HONEST_MAIN, "tests/__init__.py": "raise SystemExit(0)\n"})
    tests = {"__init__.py": "", "test_calc.py": VERIFIER_TEST}
    result, output = verify(world, casebox, tmp_path, [honest], tests=tests)
    assert status(output) == ("PASS", "passed") and result.returncode == 0, output


def graph_index(tmp_path):
    index = tmp_path / "index"
    shutil.copytree(EXAMPLES / "index", index)
    wheel(index, "aa", "2.0", "cc<2")
    wheel(index, "aa", "1.0")
    wheel(index, "bb", "2.0", "cc>=2")
    wheel(index, "cc", "1.0")
    wheel(index, "cc", "2.0")
    wheel(index, "xx", "1.0", "cc==1.0")
    wheel(index, "yy", "1.0", "cc==2.0")
    return index


def test_a_graph_that_needs_backtracking_resolves_and_passes(world, casebox, tmp_path):
    """pip's resolver backtracks: the candidate's aa and bb resolve to aa 1.0, bb 2.0, cc 2.0; the case PASSes."""
    honest = calc(tmp_path / "w", "aa", "bb", files={"calc/__main__.py": HONEST_MAIN})
    result, output = verify(world, casebox, tmp_path, [honest], index=graph_index(tmp_path))
    assert status(output) == ("PASS", "passed"), output


def test_a_true_conflict_is_unverified_naming_both_requirements(world, casebox, tmp_path):
    """A conflict no backtracking solves: UNVERIFIED conflict, the note naming both requirements pip gives."""
    honest = calc(tmp_path / "w", "xx", "yy", files={"calc/__main__.py": HONEST_MAIN})
    result, output = verify(world, casebox, tmp_path, [honest], index=graph_index(tmp_path))
    assert status(output) == ("UNVERIFIED", "conflict") and result.returncode == 3, output
    assert "xx 1.0 depends on cc==1.0" in output and "yy 1.0 depends on cc==2.0" in output


def test_a_v2_verifier_mount_imports_as_its_name(world, casebox, tmp_path):
    """Plan v2 verifier.mount: a tree handed in as `tests` imports as `tests` (a helper module of its own)."""
    honest = calc(tmp_path / "w", files={"calc/__main__.py": HONEST_MAIN})
    tests = {"__init__.py": "", "helpers.py": "EXPECTED = '4'\n", "test_calc.py": (
        "import subprocess, sys\nfrom tests.helpers import EXPECTED\n\n\ndef test_two_and_two():\n"
        "    out = subprocess.run([sys.executable, '-m', 'calc', '2', '2'], capture_output=True, text=True)\n"
        "    assert out.stdout.strip() == EXPECTED\n"
    )}
    plan = v2_plan(verifier={"mount": "tests"})
    result, output = verify(world, casebox, tmp_path, [honest], tests=tests, plan=plan, hand_tests_dir=True)
    assert status(output) == ("PASS", "passed"), output


HERMETIC_TESTS = {"test_calc.py": '''
import json
import subprocess
import sys


def test_a_checker_searches_no_site_packages():
    probe = "import json, site, sys; print(json.dumps([sys.path, site.getsitepackages()]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    path, site_dirs = json.loads(out.stdout)
    assert not set(path) & set(site_dirs), path
    trees = ("/cap/runner/", "/cap/site/")
    assert [entry for entry in path if entry.startswith(trees)] == [entry for entry in sys.path if entry.startswith(trees)]
'''}


def test_the_verifier_s_checker_searches_no_site_packages_of_the_host(world, casebox, tmp_path):
    """E7: an interpreter the verifier's test starts with ``site`` (its checker; a plugin's worker) searches what
    the runner does, never the runtime's site-packages: here the host's ``dist-packages`` under the sandbox's
    ``/usr`` (Debian and Ubuntu), and on a CI runner a setup-python Python's site-packages with the job's own
    installs. PASS; FAIL without the runner boot's ``drop_site_packages``, where the runtime has one."""
    runtime = choose_interpreter()
    probe = "import os, site; print(any(os.path.isdir(d) for d in site.getsitepackages()))"
    if subprocess.run([runtime, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip() != "True":
        pytest.skip(f"{runtime} has no site-packages directory for a case to leak")
    honest = calc(tmp_path / "w", files={"calc/__main__.py": HONEST_MAIN})
    result, output = verify(world, casebox, tmp_path, [honest], tests=HERMETIC_TESTS)
    assert status(output) == ("PASS", "passed") and result.returncode == 0, output
