"""E7, E8: hostile candidates against the verdict, each a real `casebox verify` run as root.

Every attack here once turned an honestly failing case into PASS. The
candidate is ``calc``: ``python -m calc 2 2`` prints the sum, but this one
adds wrong (it prints 5). The verifier's test checks it only through a
subprocess, so the runner never imports candidate code; the honest verdict
is FAIL. Each hostile candidate adds one attack on top (built here with
zipfile, tests/wheelforge.py) and each test says which guard stops it: with
the guard removed, the attack gets its PASS and the test goes red.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import subprocess

import pytest
from test_verify import EXAMPLES, value
from wheelforge import wheel

from executor.transport import pack
from executor.cases.service import RUNNER_MODULES, SITE_MODULES, search_path
from executor.inside import MODULES_DIRECTORY
from executor.cases.runtime import choose_interpreter, inspect
from plan_support import case as case_doc

pytestmark = pytest.mark.root

CALC_MAIN = "import sys\nprint(int(sys.argv[1]) + int(sys.argv[2]) + 1)\n"
VERIFIER_TEST = '''"""The verifier's test: the candidate only through a subprocess."""
import subprocess
import sys


def test_two_and_two():
    out = subprocess.run([sys.executable, "-m", "calc", "2", "2"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "4", out.stdout + out.stderr
'''
PLAN = {"schema": "casebox.plan.v1", "cases": [case_doc("sum", "pytest", ["tests/test_calc.py"], 120_000)]}


def v2_plan(**settings) -> dict:
    """A v2 plan of the one ``sum`` pytest case, with these top-level settings (runner, plugins, verifier)."""
    case = {"id": "sum", "op": "pytest", "args": ["tests/test_calc.py", "-p", "no:cacheprovider"], "applicable": True, "expect_exit": 0,
            "limits": {"timeout_ms": 180_000, "pids": 128}, "env": {"PYTHONHASHSEED": "0"}}
    return {"schema": "casebox.plan.v2", **settings, "cases": [case]}


def calc(directory: pathlib.Path, *requires: str, files: dict | None = None, **options) -> pathlib.Path:
    """The calc candidate's wheel: the wrong sum, plus whatever the attack adds."""
    return wheel(directory, "calc", "1.0", *requires, files={"calc/__init__.py": "", "calc/__main__.py": CALC_MAIN, **(files or {})}, **options)


@pytest.fixture(scope="module")
def world(tmp_path_factory, sandbox_ids):
    base = tmp_path_factory.mktemp("hostile")
    uid, gid = sandbox_ids
    config = base / "casebox.toml"
    config.write_text(f'state_root = "{base}/state"\nsandbox_uid = {uid}\nsandbox_gid = {gid}\nsocket = "{base}/no.sock"\n')
    return base, config


def verify(
    world, casebox, tmp_path, wheels, *, tests=None, plan=None, index=None, extra=(), hand_tests_dir=False,
) -> tuple[subprocess.CompletedProcess, str]:
    """`casebox verify` of these wheels against the verifier's tests (in ``tests/`` of the verifier tree, or the
    ``tests`` directory itself handed in); (result, stdout + stderr)."""
    _, config = world
    data = pack.build(pack.read_wheels(sorted(str(path) for path in wheels)))
    bundle = tmp_path / "candidate.tar"
    bundle.write_bytes(data)
    verifier = tmp_path / "verifier"
    (verifier / "tests").mkdir(parents=True)
    for name, text in (tests or {"test_calc.py": VERIFIER_TEST}).items():
        (verifier / "tests" / name).write_text(text)
    (tmp_path / "plan.json").write_text(json.dumps(plan or PLAN))
    result = casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", hashlib.sha256(data).hexdigest(),
        "--plan", str(tmp_path / "plan.json"), "--verifier-tree", str(verifier / "tests" if hand_tests_dir else verifier),
        "--index", str(index or EXAMPLES / "index"), "--attempt", f"hostile-{tmp_path.name[-20:].strip('_') or 'x'}", "--evidence", str(tmp_path / "evidence"),
        "--root", "/", *extra, timeout=300,
    )
    return result, result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")


def status(output: str, case_id: str = "sum") -> tuple[str, str]:
    row = re.search(rf"^{case_id}\s+(\S+)\s+(\S+)", output, re.M)
    assert row, output
    return row.group(1), row.group(2)


def test_the_honest_candidate_fails(world, casebox, tmp_path):
    """The baseline every attack starts from: 2 + 2 printed as 5 is FAIL, exit 1."""
    result, output = verify(world, casebox, tmp_path, [calc(tmp_path / "w")])
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


FORGED_PYTEST = {
    "pytest/__init__.py": "",
    "pytest/__main__.py": (
        "import sys\n"
        "report = next(a for a in sys.argv if a.startswith('--junitxml=')).split('=', 1)[1]\n"
        "open(report, 'w').write('<testsuites><testsuite name=\"x\"><testcase name=\"t\"/></testsuite></testsuites>')\n"
        "sys.exit(0)\n"
    ),
}


@pytest.mark.parametrize("project", ["pytest", "pluggy"])
def test_a_candidate_project_named_like_a_runner_distribution_is_refused(world, casebox, tmp_path, project):
    """E7: a bundle project whose name is in the runner's closure (pytest itself, or pluggy, a dependency of
    pytest) is refused before anything is installed: UNVERIFIED, candidate_shadows_runner, naming the project.
    Without the guard the candidate's project is never the runner's (resolved from the index alone, and the
    runner comes first on the search path), so this test checks the refusal itself."""
    files = FORGED_PYTEST if project == "pytest" else {"pluggy/__init__.py": "raise SystemExit(0)\n"}
    shadow = wheel(tmp_path / "w", project, "99.0", files=files)
    result, output = verify(world, casebox, tmp_path, [calc(tmp_path / "w"), shadow])
    assert status(output) == ("UNVERIFIED", "candidate_shadows_runner"), output
    assert f"ships {project}, a distribution of the runner" in output and result.returncode == 3


FORGE_PLUGIN = '''"""A pytest11 plugin: every failed report becomes passed, and the session exits 0."""
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
        report.longrepr = None


def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
'''


def test_a_pytest11_entry_point_in_the_candidate_never_loads(world, casebox, tmp_path):
    """E7: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 on every op; a candidate's pytest11 entry point that rewrites failed
    reports as passed never loads, so the honest FAIL stands. Without the guard it is PASS."""
    hostile = calc(tmp_path / "w", files={"calc_forge.py": FORGE_PLUGIN}, entry_points="[pytest11]\nforge = calc_forge\n")
    result, output = verify(world, casebox, tmp_path, [hostile])
    assert status(output) == ("FAIL", "exit_mismatch"), output


ARGPARSE_SHIM = '''"""A top-level argparse: loads the real one, then forges the report and the exit at interpreter exit."""
import atexit, glob, os, sys
here = sys.path.index(os.path.dirname(os.path.abspath(__file__)))
del sys.modules["argparse"]
sys.path.pop(here)
import argparse as real
sys.modules["argparse"] = real
globals().update(vars(real))


def forge():
    for report in glob.glob("/out/junit-*/junit.xml"):
        open(report, "w").write('<testsuites><testsuite name="x"><testcase name="t"/></testsuite></testsuites>')
    os._exit(0)


atexit.register(forge)
'''


def test_a_candidate_module_named_like_a_stdlib_module_is_refused(world, casebox, tmp_path):
    """E7: a candidate wheel installing a top-level argparse (or json, or any stdlib name) is refused before
    any case runs: UNVERIFIED, candidate_shadows_stdlib, naming the module."""
    hostile = calc(tmp_path / "w", files={"argparse.py": ARGPARSE_SHIM})
    result, output = verify(world, casebox, tmp_path, [hostile])
    assert status(output) == ("UNVERIFIED", "candidate_shadows_stdlib"), output
    assert "installs the top-level module argparse" in output


def test_a_candidate_module_named_like_a_runner_module_is_refused(world, casebox, tmp_path):
    """E7: a candidate wheel installing a top-level _pytest (a module of the sealed runner tree) is refused."""
    hostile = calc(tmp_path / "w", files={"_pytest/__init__.py": "raise SystemExit(0)\n"})
    result, output = verify(world, casebox, tmp_path, [hostile])
    assert status(output) == ("UNVERIFIED", "candidate_shadows_runner"), output
    assert "installs the top-level module _pytest" in output


SHADOW_PROBE = "import sys\nprint('SHADOWED', __name__)\nsys.stdout.flush()\n"


def test_the_search_path_is_stdlib_then_runner_then_candidate_in_a_real_sandbox(casebox, tmp_path, sandbox_ids):
    """E7: with argparse.py, json/ and _pytest/ in the candidate tree and a _pytest in the runner tree, a case
    imports the standard library's argparse and json and the runner's _pytest: none of the candidate's three is
    ever imported, whatever the refusal above says. The search path is the one the case service gives a pytest
    case (caseservice.search_path). Without the stdlib first, the candidate's argparse and json are imported."""
    site, runner = tmp_path / "site", tmp_path / "runner"
    for name in ("argparse.py", "json/__init__.py", "_pytest/__init__.py"):
        (site / MODULES_DIRECTORY / name).parent.mkdir(parents=True, exist_ok=True)
        (site / MODULES_DIRECTORY / name).write_text(SHADOW_PROBE)
    (runner / MODULES_DIRECTORY / "_pytest").mkdir(parents=True)
    (runner / MODULES_DIRECTORY / "_pytest" / "__init__.py").write_text("print('RUNNER _pytest')\n")
    runtime = inspect()
    pytest_case = type("Case", (), {"op": "pytest"})()
    uid, gid = sandbox_ids
    probe = "import argparse, json, _pytest; print(argparse.__file__); print(json.__file__)"
    result = casebox(
        "sandbox", "run", "--uid", str(uid), "--gid", str(gid), "--state-root", str(tmp_path / "state"),
        "--ro", f"site={site}", "--ro", f"runner={runner}", "--env", f"PYTHONPATH={search_path(runtime, pytest_case)}",
        "--", runtime.interpreter, "-S", "-c", probe, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    stdout = json.loads(result.stdout)["stdout"]
    assert "SHADOWED" not in stdout and "RUNNER _pytest" in stdout
    assert f"{runtime.stdlib_path[1]}/argparse.py" in stdout and f"{runtime.stdlib_path[1]}/json/__init__.py" in stdout
    assert search_path(runtime, pytest_case).split(":")[-2:] == [RUNNER_MODULES, SITE_MODULES]


PTRACE_FORGE = r'''"""calc, and behind it a daemon that ptraces the runner (its parent, pytest): at exit_group it rewrites the
junit report to a pass and the exit status to 0."""
import ctypes, glob, os, sys

parent = os.getppid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        libc.ptrace.restype = ctypes.c_long
        regs = (ctypes.c_ulonglong * 27)()
        if libc.ptrace(0x4206, parent, None, ctypes.c_void_p(1)) != 0:  # PTRACE_SEIZE, PTRACE_O_TRACESYSGOOD
            open("/tmp/ptrace-denied", "w").write(os.strerror(ctypes.get_errno()))
            os._exit(0)
        libc.ptrace(0x4207, parent, None, None)  # PTRACE_INTERRUPT
        status = ctypes.c_int()
        while libc.waitpid(parent, ctypes.byref(status), 0x40000000) == parent:  # __WALL
            if (status.value & 0x7f) != 0x7f:
                break
            libc.ptrace(12, parent, None, regs)  # PTRACE_GETREGS
            if regs[15] == 231:  # orig_rax: exit_group, at its entry
                for report in glob.glob("/out/junit-*/junit.xml"):
                    open(report, "w").write('<testsuites><testsuite name="x"><testcase name="t"/></testsuite></testsuites>')
                regs[14] = 0  # rdi: the exit status
                libc.ptrace(13, parent, None, regs)  # PTRACE_SETREGS
                libc.ptrace(17, parent, None, None)  # PTRACE_DETACH
                break
            libc.ptrace(24, parent, None, None)  # PTRACE_SYSCALL
        os._exit(0)
    os._exit(0)
os.wait()
print(int(sys.argv[1]) + int(sys.argv[2]) + 1)
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the forge's register layout is x86_64's")
def test_the_candidate_cannot_ptrace_the_runner_to_forge_its_exit(world, casebox, tmp_path):
    """E7: the runner makes itself non-dumpable before any test runs, so the candidate's subprocess cannot
    seize it and rewrite its exit status at exit_group. Without it, the execute-only interpreter copy and the
    syscall filter all three, the forge would turn the honest FAIL into PASS."""
    hostile = calc(tmp_path / "w", files={"calc/__main__.py": PTRACE_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile])
    assert status(output) == ("FAIL", "exit_mismatch"), output


RUNNER_PROBE = '''"""The verifier's probe of its own runner process."""
import ctypes, os, subprocess, sys


def test_the_runner_is_not_dumpable():
    assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 0


def test_a_child_cannot_open_the_runner_s_memory():
    probe = "import os, sys\\ntry:\\n    open(f'/proc/{os.getppid()}/mem', 'r+b')\\nexcept OSError as e:\\n    print(e.errno)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() in ("1", "2", "13"), out.stdout + out.stderr
'''


def test_the_runner_process_is_not_dumpable_and_its_memory_is_closed_to_the_candidate(world, casebox, tmp_path):
    """E7: the guard itself, seen from the runner's process: PR_GET_DUMPABLE is 0, and a same-UID child cannot
    open /proc/<runner>/mem (which no syscall filter would stop). In a sandbox the execute-only copy of the
    interpreter makes every process of it non-dumpable as well, so this and the test above stay green without
    the runner's own PR_SET_DUMPABLE; tests/test_runner_boot.py proves that one alone, on a readable interpreter."""
    plan = {"schema": "casebox.plan.v1", "cases": [case_doc("sum", "pytest", ["tests/test_probe.py"], 120_000)]}
    result, output = verify(world, casebox, tmp_path, [calc(tmp_path / "w")], tests={"test_probe.py": RUNNER_PROBE}, plan=plan)
    assert status(output) == ("PASS", "passed"), output


ATEXIT_FORGE = '''import atexit, glob, os, sys


def forge():
    if os.fork() == 0:
        os.setsid()
        import time
        for _ in range(200):
            time.sleep(0.05)
            for report in glob.glob("/out/junit-*/junit.xml"):
                open(report, "w").write('<testsuites><testsuite name="x"><testcase name="t"/></testsuite></testsuites>')
        os._exit(0)
    os._exit(0)


atexit.register(forge)
print(int(sys.argv[1]) + int(sys.argv[2]) + 1)
'''


def test_an_atexit_forge_in_a_candidate_used_only_through_a_subprocess_is_not_a_pass(world, casebox, tmp_path):
    """E5, E7: the candidate's own process can exit 0 and can rewrite the junit report (it runs as the same UID),
    but it cannot decide the runner's exit: the report that claims a pass beside pytest's exit 1 contradicts it."""
    hostile = calc(tmp_path / "w", files={"calc/__main__.py": ATEXIT_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile])
    assert status(output)[0] in ("FAIL", "UNVERIFIED") and result.returncode in (1, 3), output


# The verifier's test judging the candidate's output with a check of its own, in a second interpreter: a process
# of the runner's side, which imports nothing of the candidate's by design.
CHECKED_VERIFIER_TEST = '''"""The verifier's test: the candidate through a subprocess, its output judged by the verifier's own checker."""
import subprocess
import sys

CHECK = "import sys; sys.exit(0 if sys.argv[1:] == ['4'] else 1)"


def test_two_and_two():
    out = subprocess.run([sys.executable, "-m", "calc", "2", "2"], capture_output=True, text=True, timeout=60)
    check = subprocess.run([sys.executable, "-c", CHECK, *out.stdout.split()], timeout=60)
    assert check.returncode == 0, out.stdout + out.stderr
'''
STARTUP_FORGE = "import os\nos._exit(0)\n"


def test_the_honest_candidate_fails_the_verifiers_own_checker(world, casebox, tmp_path):
    """The baseline of the two startup-hook attacks below: the checker process sees 5 and the case is FAIL."""
    result, output = verify(world, casebox, tmp_path, [calc(tmp_path / "w")], tests={"test_calc.py": CHECKED_VERIFIER_TEST})
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


RUNNER_FORGE = '''import atexit, os, sys


def forge():
    report = next(arg for arg in sys.argv if arg.startswith("--junitxml=")).split("=", 1)[1]
    with open(report, "w") as junit:
        junit.write('<testsuites><testsuite name="x" tests="1"><testcase name="t"/></testsuite></testsuites>')
    os._exit(0)


atexit.register(forge)
'''


@pytest.mark.parametrize(
    "module, path, forge",
    [("usercustomize", "usercustomize.py", STARTUP_FORGE), ("sitecustomize", "sitecustomize.py", STARTUP_FORGE),
     ("org", "org/__init__.py", RUNNER_FORGE + "raise ImportError('no Jython here')\n")],
)
def test_a_candidate_module_the_standard_library_imports_when_present_is_refused(world, casebox, tmp_path, module, path, forge):
    """E7: the standard library imports some modules it does not ship whenever it finds one on the search path,
    and the candidate's tree is on that path: ``site`` its startup hooks ``sitecustomize`` and ``usercustomize``
    in every interpreter started without -S, ``copy`` and ``pickle`` Jython's ``org`` as the runner loads. A
    candidate's copy would run inside the verifier's own processes, which import nothing of the candidate's:
    the checker (exit 0), or the runner itself (a forged junit report and exit 0). So those names are refused
    like a stdlib module's: UNVERIFIED, candidate_shadows_stdlib, naming the module. Without the refusal,
    sitecustomize and org get their PASS (the sandbox's Debian stdlib has only a link into the host's /etc,
    which the sandbox lacks) and usercustomize a FAIL, since PYTHONNOUSERSITE (below) also stops it."""
    hostile = calc(tmp_path / "w", files={path: forge})
    result, output = verify(world, casebox, tmp_path, [hostile], tests={"test_calc.py": CHECKED_VERIFIER_TEST})
    assert status(output) == ("UNVERIFIED", "candidate_shadows_stdlib"), output
    assert f"installs the top-level module {module}, which the standard library imports when it finds one" in output


PLANT_USER_SITE = '''import os, site, sys
directory = site.getusersitepackages()
os.makedirs(directory, exist_ok=True)
with open(os.path.join(directory, "forge.pth"), "w") as pth:
    pth.write("import os; os._exit(0)\\n")
print(int(sys.argv[1]) + int(sys.argv[2]) + 1)
'''


def test_a_user_site_the_candidate_plants_in_home_never_loads_into_the_verifiers_checker(world, casebox, tmp_path):
    """E7: HOME is the case's writable /work, so the candidate's process can write a ``.pth`` into the user site
    directory there, which ``site`` executes in every later interpreter of the case, the verifier's checker
    among them. The case environment sets PYTHONNOUSERSITE, so no interpreter of a case reads the user site:
    FAIL, as the honest candidate; PASS without the guard."""
    hostile = calc(tmp_path / "w", files={"calc/__main__.py": PLANT_USER_SITE})
    result, output = verify(world, casebox, tmp_path, [hostile], tests={"test_calc.py": CHECKED_VERIFIER_TEST})
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output




def test_a_hypothesis_entry_point_in_the_candidate_never_runs_in_the_runner(world, casebox, tmp_path):
    """E7: importing hypothesis runs every function any distribution on the search path registers under the
    "hypothesis" entry point group, and the runner's hypothesis plugin imports hypothesis (at the session's end
    at the latest), so a candidate registering one would run its code inside the runner, forging its report and
    exit, though the verifier's test imports nothing of the candidate's. Every case runs with
    HYPOTHESIS_NO_PLUGINS set, and here the runner boot's finder stops it too (the entry point names a module of
    the candidate's, which hypothesis's loader may not find): FAIL, as the honest candidate. The variable alone
    is proved by the next test, where the verifier's test has imported the candidate first."""
    hostile = calc(tmp_path / "w", files={"calc/forge.py": RUNNER_FORGE + "\n\ndef hook():\n    pass\n"}, entry_points="[hypothesis]\nforge = calc.forge:hook\n")
    result, output = verify(world, casebox, tmp_path, [hostile], plan=HYPOTHESIS_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


IMPORTING_VERIFIER_TEST = '''"""The verifier's test: it imports the candidate, as most do, and checks it through a subprocess."""
import subprocess
import sys

import calc


def test_two_and_two():
    out = subprocess.run([sys.executable, "-m", "calc", "2", "2"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "4", out.stdout + out.stderr
'''


def test_a_hypothesis_entry_point_in_a_candidate_the_verifier_imports_never_runs_in_the_runner(world, casebox, tmp_path):
    """E7: the runner's boot refuses the candidate's ``calc`` to hypothesis's entry point loader only until the
    verifier's test has imported it; from then on ``calc.forge`` is a submodule of a package already loaded,
    never asked for by its top-level name, so a function the candidate registers under the "hypothesis" group
    would run inside the runner when its hypothesis plugin imports hypothesis at the session's end, forging its
    report and exit. HYPOTHESIS_NO_PLUGINS alone stops it here: FAIL, as the honest candidate; PASS without it.
    (The test above stays FAIL without it: its verifier imports nothing of the candidate's, so the boot stops
    the import as well.)"""
    hostile = calc(tmp_path / "w", files={"calc/forge.py": RUNNER_FORGE + "\n\ndef hook():\n    pass\n"}, entry_points="[hypothesis]\nforge = calc.forge:hook\n")
    result, output = verify(world, casebox, tmp_path, [hostile], tests={"test_calc.py": IMPORTING_VERIFIER_TEST}, plan=HYPOTHESIS_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


HYPOTHESIS_PLAN = v2_plan(runner=["pytest>=8", "hypothesis"], plugins=["hypothesispytest"])


def test_a_module_the_runner_imports_when_it_finds_one_is_never_the_candidates(world, casebox, tmp_path):
    """E7: the runner's hypothesis plugin imports hypothesis at the session's end, and hypothesis imports
    typing_extensions whenever it finds one; neither the runner's tree nor the standard library holds one, the
    candidate's wheel does. The runner's boot finds a module of the candidate's own projects only for an import
    made by the verifier's tests or the candidate's own code, so the candidate's typing_extensions, forging the
    junit report and exit 0 inside the runner, never loads: FAIL, as the honest candidate; PASS without the
    guard."""
    hostile = calc(tmp_path / "w", files={"typing_extensions.py": RUNNER_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=HYPOTHESIS_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


@pytest.mark.parametrize("scheme", ["purelib", "platlib"])
def test_a_module_a_wheel_installs_through_its_data_directory_is_listed_and_never_the_runners(world, casebox, tmp_path, scheme):
    """E7: a wheel's ``NAME-VERSION.data/purelib/`` and ``platlib/`` hold files the installer writes at the top
    of the installed tree, beside the wheel's own modules, so ``calc-1.0.data/purelib/typing_extensions.py`` is a
    top-level module of the candidate like ``typing_extensions.py`` itself. The resolver's listing of a wheel's
    modules counts them (``executor.deps.shadowing.modules``), so the runner's boot refuses it to hypothesis's
    late import: FAIL, as the honest candidate; PASS without the guard, a listing that skips every ``.data``
    member."""
    hostile = calc(tmp_path / "w", files={f"calc-1.0.data/{scheme}/typing_extensions.py": RUNNER_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=HYPOTHESIS_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


def test_a_sourceless_module_the_runner_imports_when_it_finds_one_is_listed_and_never_the_runners(world, casebox, tmp_path):
    """E7: a top-level ``typing_extensions.pyc`` with no source beside it is a module too (the import system's
    sourceless loader runs it), so the forging typing_extensions can ship as bytecode alone. The listing of a
    wheel's modules counts ``.pyc`` files (``executor.deps.shadowing.modules``), so the runner's boot refuses it
    to hypothesis's late import: FAIL, as the honest candidate; PASS without the guard, a listing that counts
    ``.py`` files alone. The case runtime compiles it, so its bytecode is what that runtime loads."""
    compiled = subprocess.run(
        [choose_interpreter(), "-c", "import importlib.util, marshal, sys; sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER"
                                     " + bytes(12) + marshal.dumps(compile(sys.stdin.read(), 'typing_extensions.py', 'exec')))"],
        input=RUNNER_FORGE.encode(), capture_output=True, check=True, timeout=60,
    )
    hostile = calc(tmp_path / "w", files={"typing_extensions.pyc": compiled.stdout})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=HYPOTHESIS_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


EXTENSION_FORGE = """#include <Python.h>

static struct PyModuleDef forge = {PyModuleDef_HEAD_INIT, "typing_extensions", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_typing_extensions(void)
{
    if (PyRun_SimpleString(%s) != 0)
        return NULL;
    return PyModule_Create(&forge);
}
"""


def test_an_extension_module_the_runner_imports_when_it_finds_one_is_listed_and_never_the_runners(world, casebox, tmp_path):
    """E7: a C extension is a module too: ``typing_extensions.cpython-311-x86_64-linux-gnu.so`` (the runtime's
    own suffix), whose init function runs the forge. The listing of a wheel's modules counts extension modules
    by every suffix (``executor.deps.shadowing.modules``), so the runner's boot refuses it to hypothesis's late
    import: FAIL, as the honest candidate; PASS without the guard, a listing that counts Python files alone.
    Built here with the C compiler and headers scripts/bootstrap installs, for the case runtime."""
    runtime = choose_interpreter()
    where = json.loads(subprocess.run(
        [runtime, "-c", "import importlib.machinery, json, sysconfig; "
                        "print(json.dumps([sysconfig.get_paths()['include'], importlib.machinery.EXTENSION_SUFFIXES[0]]))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout)
    include, suffix = where
    source = tmp_path / "forge.c"
    source.write_text(EXTENSION_FORGE % json.dumps(RUNNER_FORGE))
    built = tmp_path / f"typing_extensions{suffix}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-I{include}", str(source), "-o", str(built)], check=True, timeout=120)
    hostile = calc(tmp_path / "w", files={built.name: built.read_bytes()})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=HYPOTHESIS_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


# The verifier's checker reading the candidate's output on its stdin: alive, and still starting, while the
# candidate's own processes may still run.
STDIN_CHECKED_VERIFIER_TEST = '''"""The verifier's test: the candidate's output piped into the verifier's own checker."""
import subprocess
import sys

CHECK = "import sys; sys.exit(0 if sys.stdin.read().split() == ['4'] else 1)"


def test_two_and_two():
    out = subprocess.run([sys.executable, "-m", "calc", "2", "2"], capture_output=True, text=True, timeout=60)
    check = subprocess.run([sys.executable, "-c", CHECK], input=out.stdout, text=True, timeout=60)
    assert check.returncode == 0, out.stdout + out.stderr
'''
# calc, and behind it a daemon of the same UID that waits for the checker, takes the wrong sum out of its stdin
# pipe through /proc/PID/fd/0 before the checker has started reading, and puts the right one in its place.
PIPE_FORGE = r'''import os, sys, time


def swap_the_checkers_input():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            try:
                found = name.isdigit() and b"sys.stdin.read()" in open(f"/proc/{name}/cmdline", "rb").read()
            except OSError:
                continue
            if not found:
                continue
            try:
                drain = os.open(f"/proc/{name}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
                fill = os.open(f"/proc/{name}/fd/0", os.O_WRONLY)
            except OSError:
                return
            taken = b""
            while not taken.endswith(b"\n") and time.monotonic() < deadline:
                try:
                    taken += os.read(drain, 64)
                except BlockingIOError:
                    time.sleep(0.0005)
            os.write(fill, b"4\n")
            return


if os.fork() == 0:
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    swap_the_checkers_input()
    os._exit(0)
print(int(sys.argv[1]) + int(sys.argv[2]) + 1)
'''


def test_the_candidate_cannot_reach_into_the_verifiers_checker_through_proc(world, casebox, tmp_path):
    """E7: the syscall filter denies ptrace, process_vm_* and pidfd_getfd, but /proc/PID/fd and /proc/PID/mem of
    a process of the same UID open for any process the kernel finds may ptrace it, which with no Yama policy
    (or ptrace_scope 0) is every one that is dumpable. The verifier's checker is dumpable after its exec: a
    daemon the candidate leaves behind swaps the wrong sum in its stdin pipe for the right one. Every sandbox
    runs the case interpreter from an execute-only copy mounted over its path (Session.set_interpreter), so
    every process that execs it is non-dumpable and the daemon's opens are refused: FAIL, as the honest
    candidate; PASS without the guard (on a host with Yama's ptrace_scope 1 the attack fails without it too)."""
    hostile = calc(tmp_path / "w", files={"calc/__main__.py": PIPE_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile], tests={"test_calc.py": STDIN_CHECKED_VERIFIER_TEST})
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


def test_a_module_a_member_name_climbs_to_the_top_of_the_tree_is_refused(world, casebox, tmp_path):
    """E7: the runner's boot and the shadowing rule know the candidate's modules by the resolver's listing of its
    wheels' member names, but the installer writes ``calc/../typing_extensions.py`` at the top of the tree, where
    a listing of ``calc/`` never names it: there the forging typing_extensions of the test above loads into the
    runner after all. A member name that is not a clean relative path refuses the wheel (resolution ``layout``):
    UNVERIFIED; PASS without the guard."""
    hostile = calc(tmp_path / "w", files={"calc/../typing_extensions.py": RUNNER_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=HYPOTHESIS_PLAN)
    assert status(output)[0] == "UNVERIFIED" and result.returncode == 3, output
    assert "dependencies unresolved (layout)" in output and "has a '..' segment" in output, output


def test_a_candidate_with_more_top_level_modules_than_begin_lists_is_refused_whole(world, casebox, tmp_path):
    """E7: the resolver's listing of a wheel's modules is bounded (256, what BEGIN may carry). It was cut at the
    bound, and so was the trusted side's listing of the installed tree: 256 empty modules sorting first hid an
    ``org`` behind them from both, and Jython's ``org``, which ``copy`` imports as the runner loads, forged the
    junit report and exit 0 inside the runner. A wheel over the bound is refused whole (resolution ``layout``)
    and no listing is ever cut: UNVERIFIED; PASS with both listings cut."""
    padding = {f"aa{number:03d}.py": "" for number in range(256)}
    org = RUNNER_FORGE + "raise ImportError('no Jython here')\n"
    hostile = calc(tmp_path / "w", files={"org/__init__.py": org, **padding})
    result, output = verify(world, casebox, tmp_path, [hostile], tests={"test_calc.py": CHECKED_VERIFIER_TEST})
    assert status(output)[0] == "UNVERIFIED" and result.returncode == 3, output
    assert "dependencies unresolved (layout)" in output and "installs 258 top-level modules" in output, output


XDIST_PLAN = v2_plan(runner=["pytest>=8", "pytest-xdist"], plugins=["xdist"])
XDIST_PLAN["cases"][0]["args"] += ["-n", "2"]
# A top-level setproctitle: pytest-xdist's worker imports one whenever it finds one, at its start. This one turns
# every test report the worker makes into a pass, and still names the process as xdist asks.
WORKER_FORGE = '''import _pytest.reports

_made = _pytest.reports.TestReport.from_item_and_call.__func__


def _passed(cls, item, call):
    report = _made(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_passed)


def setproctitle(title):
    pass
'''


def test_a_module_a_runner_worker_imports_when_it_finds_one_is_never_the_candidates(world, casebox, tmp_path):
    """E7: a plugin that starts runner processes of its own starts them without the runner's -S boot: each
    pytest-xdist worker starts with site, and imports setproctitle whenever it finds one before it loads any
    plugin. The runner's finder reaches every interpreter of a pytest case through the sitecustomize of the
    runner's tree, so the candidate's setproctitle, forging every report the worker sends, never loads there:
    FAIL, as the honest candidate; PASS without the guard."""
    hostile = calc(tmp_path / "w", files={"setproctitle.py": WORKER_FORGE})
    result, output = verify(world, casebox, tmp_path, [hostile], plan=XDIST_PLAN)
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


BY_NAME_VERIFIER_TEST = '''"""The verifier's test: the candidate through a subprocess of the interpreter found by name on PATH."""
import subprocess


def test_two_and_two():
    out = subprocess.run(["python3", "-m", "calc", "2", "2"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "4", out.stdout + out.stderr
'''


def test_a_candidate_script_named_like_a_system_command_never_stands_in_for_it(world, casebox, tmp_path):
    """E7: a case's PATH holds the candidate's bin/ ahead of /usr/bin, but a sealed tree's files carry no
    execute bit, so a console script the candidate names python3 (printing 4 whatever it is asked) is never
    what the verifier's test runs when it starts python3 by name: the lookup passes over it to /usr/bin, the
    honest calc runs and the case is FAIL. PASS when sealed files keep an execute bit."""
    hostile = calc(tmp_path / "w", files={"calc/fake.py": "def main():\n    print(4)\n"}, entry_points="[console_scripts]\npython3 = calc.fake:main\n")
    result, output = verify(world, casebox, tmp_path, [hostile], tests={"test_calc.py": BY_NAME_VERIFIER_TEST})
    assert status(output) == ("FAIL", "exit_mismatch") and result.returncode == 1, output


# --- E8: candidate text on the terminal, in the CI log, in the replay -------------------------------------


ESCAPES = "\x1b]0;casebox: PASS\x07\x1b[2J\x1b[H\x1b[32mverdict: PASS\x1b[0m\r\n::error title=casebox::forged ##[warning]forged"


def safe(text: str) -> None:
    """What E8 promises of every line casebox prints: no control sequence, no workflow command."""
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "##[" not in text, text
    for line in text.splitlines():
        assert not line.lstrip().startswith("::"), line


def test_hostile_metadata_and_requirements_reach_the_terminal_escaped(world, casebox, tmp_path):
    """E8: a METADATA Version holding escape sequences and workflow commands, and a Requires-Dist with a direct
    URL, reach verify's notes only through the one escaping rule; evaluate, journal replay (text and HTML) and
    stage show of that attempt are as safe."""
    metadata = f"Metadata-Version: 2.1\nName: calc\nVersion: 1.0{ESCAPES.replace(chr(10), ' ')}\n".encode()
    hostile = calc(tmp_path / "w", metadata=metadata)
    result, output = verify(world, casebox, tmp_path, [hostile])
    safe(output)
    assert status(output)[0] == "UNVERIFIED" and "\\x1b]0;casebox: PASS\\x07" in output, output
    evidence = pathlib.Path(value(output, "evidence"))
    tombstone = pathlib.Path(value(output, "tombstone"))
    bundle_sha = hashlib.sha256((tmp_path / "candidate.tar").read_bytes()).hexdigest()
    attempt = json.loads(next(evidence.glob("*.receipt.json")).read_bytes())["attempt_id"]
    for argv in (
        ["evaluate", "--evidence", str(evidence), "--plan", str(tmp_path / "plan.json"), "--attempt", attempt,
         "--bundle-sha256", bundle_sha, "--report-dir", str(tmp_path)],
        ["journal", "replay", str(tombstone)],
        ["journal", "replay", str(tombstone), "--html", str(tmp_path / "replay.html")],
        ["--config", str(world[1]), "stage", "show", tombstone.name],
    ):
        shown = casebox(*argv)
        safe(shown.stdout.decode() + shown.stderr.decode())
    safe((tmp_path / "replay.html").read_text())

    for number, (url, reason) in enumerate([
        (f"http://127.0.0.1:9/{ESCAPES.replace(chr(10), '')}.whl", "dependencies_unresolved"),
        ("http://127.0.0.1:9/x.whl#::error,title=casebox::forged,##[warning]forged", "direct_url"),
    ]):
        other = tmp_path / f"direct-{number}"
        other.mkdir()
        result, output = verify(world, casebox, other, [calc(other / "w", f"x @ {url}")])
        safe(output)
        assert status(output) == ("UNVERIFIED", reason), output


def test_a_dist_info_named_like_a_workflow_command_reaches_the_log_neutralized(world, casebox, tmp_path):
    """E8: pip's own messages name files of the wheel; one named ##[warning]... reaches verify's notes escaped."""
    files = {"calc/__init__.py": "", "##[warning]forged.dist-info/METADATA": "broken"}
    hostile = wheel(tmp_path / "w", "calc", "1.0", files=files)
    result, output = verify(world, casebox, tmp_path, [hostile])
    safe(output)
    assert status(output)[0] == "UNVERIFIED", output


def test_a_hostile_member_name_in_the_extractors_refusal_is_escaped(world, casebox, tmp_path):
    """E8: the extractor refuses a member whose name holds an escape sequence; the refusal reaches the note
    escaped (T4 refuses the name; E8 keeps the sentence from acting on the terminal)."""
    from tarforge import archive, directory, member

    data = archive(directory("candidate/"), member(f"candidate/{ESCAPES[:40]}", b"x"))
    bundle = tmp_path / "candidate.tar"
    bundle.write_bytes(data)
    _, config = world
    verifier = tmp_path / "verifier"
    (verifier / "tests").mkdir(parents=True)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    result = casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", hashlib.sha256(data).hexdigest(),
        "--plan", str(tmp_path / "plan.json"), "--verifier-tree", str(verifier), "--index", str(EXAMPLES / "index"),
        "--attempt", "hostile-member", "--evidence", str(tmp_path / "evidence"), "--root", "/", timeout=300,
    )
    output = result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")
    safe(output)
    assert "\\x1b]0;casebox" in output and result.returncode == 3, output


def test_the_corpus_covers_every_attack_of_the_issue():
    """A guard against trimming the corpus: each attack the issue lists has its test here."""
    names = {name for name in globals() if name.startswith("test_")}
    assert {
        "test_a_candidate_project_named_like_a_runner_distribution_is_refused",
        "test_a_pytest11_entry_point_in_the_candidate_never_loads",
        "test_a_candidate_module_named_like_a_stdlib_module_is_refused",
        "test_the_search_path_is_stdlib_then_runner_then_candidate_in_a_real_sandbox",
        "test_the_candidate_cannot_ptrace_the_runner_to_forge_its_exit",
        "test_an_atexit_forge_in_a_candidate_used_only_through_a_subprocess_is_not_a_pass",
        "test_a_candidate_module_the_standard_library_imports_when_present_is_refused",
        "test_a_user_site_the_candidate_plants_in_home_never_loads_into_the_verifiers_checker",
        "test_a_hypothesis_entry_point_in_the_candidate_never_runs_in_the_runner",
        "test_a_hypothesis_entry_point_in_a_candidate_the_verifier_imports_never_runs_in_the_runner",
        "test_a_module_the_runner_imports_when_it_finds_one_is_never_the_candidates",
        "test_a_candidate_script_named_like_a_system_command_never_stands_in_for_it",
        "test_hostile_metadata_and_requirements_reach_the_terminal_escaped",
        "test_a_module_a_member_name_climbs_to_the_top_of_the_tree_is_refused",
        "test_a_candidate_with_more_top_level_modules_than_begin_lists_is_refused_whole",
        "test_the_candidate_cannot_reach_into_the_verifiers_checker_through_proc",
        "test_a_module_a_runner_worker_imports_when_it_finds_one_is_never_the_candidates",
        "test_a_module_a_wheel_installs_through_its_data_directory_is_listed_and_never_the_runners",
        "test_a_sourceless_module_the_runner_imports_when_it_finds_one_is_listed_and_never_the_runners",
        "test_an_extension_module_the_runner_imports_when_it_finds_one_is_listed_and_never_the_runners",
    } <= names

