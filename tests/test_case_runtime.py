"""The runtime is a capability (issue 18): verify --python PATH, mounted at its own path, across versions.

The pyenv CPythons of this machine (/root/.pyenv/versions/) stand in for a
CI job's actions/setup-python interpreter under /opt/hostedtoolcache: real
interpreters outside /usr whose prefix is compiled in.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pathlib
import subprocess

import pytest
from journal.reader import read_journal
from test_hostile_candidates import calc, status, verify
from test_verify import EXAMPLES, value

from executor.cases import runtime
from executor.cli.commands.demo import DESIGNED, DESIGNED_VERDICT
from journal.errors import Refused

PYENV = "/root/.pyenv/versions"
CASEBOX = pathlib.Path(__file__).resolve().parent.parent / ".venv" / "bin" / "casebox"


def pyenv(minor: str) -> str | None:
    """The newest pyenv CPython X.Y's interpreter here, or None."""
    found = sorted(glob.glob(f"{PYENV}/{minor}.*/bin/python{minor}"))
    return found[-1] if found else None


def needs(minor: str) -> str:
    path = pyenv(minor)
    if path is None:
        pytest.skip(f"no CPython {minor} is installed under {PYENV}")
    return path


# --- the runtime, on the trusted side -------------------------------------------------------------


@pytest.mark.parametrize("minor", ["3.10", "3.12", "3.13"])
def test_a_runtime_outside_usr_is_its_prefix_mounted_at_its_own_path(minor):
    """--python PATH: the real interpreter, its prefix a capability mounted at the same path, its inventory
    covering the prefix (the interpreter, the stdlib, libpython) and naming the implementation and version."""
    path = needs(minor)
    chosen = runtime.inspect(python=path)
    prefix = str(pathlib.Path(path).resolve().parent.parent)
    assert chosen.interpreter == os.path.realpath(path) and chosen.prefix == prefix and chosen.capabilities == ("runtime",)
    assert chosen.version.startswith(minor + ".") and chosen.label == f"cpython {chosen.version} at {chosen.interpreter}"
    assert all(entry.startswith(prefix + "/") for entry in chosen.stdlib_path) and "argparse" in chosen.stdlib_modules
    document = chosen.document
    assert document["interpreter"]["implementation"] == "cpython" and document["interpreter"]["version"] == chosen.version
    assert document["tree"]["path"] == prefix and document["tree"]["mounted"] is True and document["tree"]["files"] > 500
    assert chosen.tools_interpreter.startswith("/usr/") and chosen.installer.source == "runtime"
    assert chosen.changed() is None


def test_the_default_runtime_stays_the_usr_interpreter():
    chosen = runtime.inspect()
    assert chosen.interpreter.startswith("/usr/") and chosen.prefix is None and chosen.capabilities == ()
    assert chosen.document["tree"]["mounted"] is False and chosen.tools_interpreter == chosen.interpreter


def _fake(tmp_path, answer: dict) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("implementation, version", [("pypy", "3.10.14"), ("cpython", "3.8.18")])
def test_only_cpython_3_9_or_later_is_a_case_runtime(tmp_path, implementation, version):
    """One sentence, exit 64, for another interpreter or an older CPython."""
    fake = _fake(tmp_path, {"implementation": implementation, "version": version})
    with pytest.raises(Refused, match=rf"--python: .* is {implementation} {version}; casebox runs cases on CPython 3\.9 or later"):
        runtime.case_interpreter(fake)


def test_a_python_that_is_not_an_interpreter_is_refused(tmp_path):
    (tmp_path / "python").write_text("not executable")
    with pytest.raises(Refused, match="--python: .* is not an executable file"):
        runtime.case_interpreter(str(tmp_path / "python"))
    with pytest.raises(Refused, match="could not say what it is"):
        runtime.case_interpreter("/bin/true")


def test_the_tree_snapshot_sees_a_file_added_removed_or_touched(tmp_path):
    """The end-of-attempt check: names and stat of every entry, the change time included."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "os.py").write_text("x")
    inventory = runtime.Inventory({}, str(tmp_path), mounted=True)
    assert inventory.changed() is None
    (tmp_path / "lib" / "new.py").write_text("y")
    assert "changed during the attempt (first at lib" in inventory.changed()
    (tmp_path / "lib" / "new.py").unlink()
    os.utime(tmp_path / "lib", None)
    assert inventory.changed() is not None


@pytest.fixture(scope="module")
def world(sandbox_ids):
    """A state root and copies of runtimes outside /tmp and /work, which a sandbox's own tree takes (a runtime
    is mounted at its own path), and named so that no runtime holds an entry of that name (F4)."""
    uid, gid = sandbox_ids
    base = pathlib.Path(f"/var/tmp/casebox-runtime-tests-{uid}")
    subprocess.run(["rm", "-rf", str(base)], check=True)
    base.mkdir(mode=0o700, parents=True)
    config = base / "casebox.toml"
    config.write_text(f'state_root = "{base}/casebox-state"\nsandbox_uid = {uid}\nsandbox_gid = {gid}\nsocket = "{base}/no.sock"\n')
    yield base, config
    subprocess.run(["rm", "-rf", str(base)], check=True)


def copied_runtime(minor: str, where: pathlib.Path) -> str:
    """A copy of a pyenv CPython at ``where``; its interpreter. A real copy, never hard links: a link changes the
    link count and ctime of every file of the shared runtime, which the runtime check (issue 18) of another
    suite running on that runtime at the same moment rightly reads as its runtime changing under it."""
    source = pathlib.Path(needs(minor)).resolve().parent.parent
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(source), str(where)], check=True)
    return str(where / "bin" / f"python{minor}")


@pytest.mark.root
@pytest.mark.parametrize("place", ["git", "state"])
def test_a_runtime_inside_a_git_directory_or_the_state_root_is_refused(world, casebox, tmp_path, place):
    """F4: the runtime's prefix is a capability like any other: no .git segment in its path, nothing of the
    state root. Exit 64 with one sentence naming it, before any sandbox starts."""
    base, _ = world
    (base / "casebox-state").mkdir(mode=0o700, exist_ok=True)
    where = base / "repo" / ".git" / "python" if place == "git" else base / "casebox-state" / "python"
    interpreter = copied_runtime("3.12", where)
    try:
        result, output = verify(world, casebox, tmp_path, [calc(tmp_path / "w")], extra=("--python", interpreter))
    finally:
        subprocess.run(["rm", "-rf", str(where)], check=True)
    assert result.returncode == 64 and output.count("\n") == 1 and output.startswith("casebox: "), output
    assert (".git" if place == "git" else "state root") in output and not (tmp_path / "evidence").exists()


@pytest.mark.root
@pytest.mark.parametrize("minor", ["3.10", "3.11", "3.12", "3.13"])
def test_the_demo_gets_every_designed_status_on_each_installed_cpython(world, casebox, minor):
    """Issue 18: the demo plan on each CPython: every case its designed status, and every receipt names that
    runtime (its version) and the digest of its inventory. 3.11 is the /usr one here: this machine's pyenv 3.11
    is the development interpreter, whose site-packages holds more entries than the F4 walk's bound, so it is
    refused (exit 64) as any such runtime would be."""
    path = runtime.choose_interpreter() if minor == "3.11" else needs(minor)
    _, config = world
    result = casebox("--config", str(config), "demo", "--python", path, "--quiet", timeout=600)
    if minor == "3.11":
        assert runtime.inspect(python=path).prefix is None
    stdout = result.stdout.decode()
    assert result.returncode == 0, stdout + result.stderr.decode()
    version = runtime.inspect(python=path).version
    assert f"python: cpython {version} at {os.path.realpath(path)}" in stdout
    assert f"verdict: {DESIGNED_VERDICT} (designed: {DESIGNED_VERDICT})" in stdout and len(DESIGNED) == 10
    receipts = [json.loads(item.read_bytes()) for item in pathlib.Path(value(stdout, "evidence")).glob("*.receipt.json")]
    assert len(receipts) == 9 and {receipt["runtime_version"] for receipt in receipts} == {f"cpython {version}"}
    assert len({receipt["runtime_inventory_digest"] for receipt in receipts}) == 1


NEEDS_312 = "import sys\nprint(int(sys.argv[1]) + int(sys.argv[2]))\n"


@pytest.mark.root
def test_a_wheel_that_needs_3_12_passes_on_3_12_and_is_a_conflict_on_3_11(world, casebox, tmp_path):
    """Resolution targets the case runtime: Requires-Python >=3.12 is PASS on 3.12, UNVERIFIED conflict on 3.11."""
    needs("3.12")
    honest = calc(tmp_path / "w", files={"calc/__main__.py": NEEDS_312}, requires_python=">=3.12")
    newer = tmp_path / "on-3.12"
    newer.mkdir()
    result, output = verify(world, casebox, newer, [honest], extra=("--python", needs("3.12")))
    assert status(output) == ("PASS", "passed") and "python: cpython 3.12." in output, output
    older = tmp_path / "on-3.11"
    older.mkdir()
    result, output = verify(world, casebox, older, [honest])
    assert status(output) == ("UNVERIFIED", "conflict") and "requires Python >=3.12" in output, output


SLOW_MAIN = "import sys, time\ntime.sleep(3)\nprint(int(sys.argv[1]) + int(sys.argv[2]))\n"


@pytest.mark.root
def test_a_runtime_changed_during_the_attempt_makes_it_unverified(world, casebox, tmp_path):
    """Issue 18: the runtime's tree is listed again before the stage retires; a file added to its lib while the
    case runs makes the attempt UNVERIFIED (its receipts are not exported), whatever the case did. Without the
    check the honest case is PASS. C7: the stage's diagnostic is RUNTIME_CHANGED."""
    from executor.transport import pack

    base, config = world
    interpreter = copied_runtime("3.12", base / "changed" / "python")
    lib = next((base / "changed" / "python" / "lib").glob("python3.*"))
    data = pack.build(pack.read_wheels([str(calc(tmp_path / "w", files={"calc/__main__.py": SLOW_MAIN}))]))
    (tmp_path / "candidate.tar").write_bytes(data)
    (tmp_path / "verifier").mkdir()
    (tmp_path / "plan.json").write_text(json.dumps({"schema": "casebox.plan.v1", "cases": [
        {"id": "sum", "op": "python-module", "args": ["calc", "2", "2"], "timeout_ms": 60_000, "applicable": True, "expect_exit": 0},
    ]}))
    command = [
        str(CASEBOX), "--config", str(config), "verify", "--bundle", str(tmp_path / "candidate.tar"),
        "--sha256", hashlib.sha256(data).hexdigest(), "--plan", str(tmp_path / "plan.json"),
        "--verifier-tree", str(tmp_path / "verifier"), "--index", str(EXAMPLES / "index"), "--attempt", "changed-1",
        "--evidence", str(tmp_path / "evidence"), "--root", "/", "--python", interpreter,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = []
    for line in process.stderr:
        progress.append(line)
        if "applicable cases" in line:
            (lib / "added_while_the_case_ran.py").write_text("")
    stdout = process.stdout.read()
    assert process.wait(timeout=300) == 3, stdout + "".join(progress)
    assert "changed during the attempt (first at lib/" in stdout and status(stdout) == ("UNVERIFIED", "missing"), stdout
    assert list((tmp_path / "evidence").iterdir()) == []
    # The tombstone says why nothing was exported, not that the client went away.
    (tombstone,) = [line.removeprefix("tombstone: ") for line in stdout.splitlines() if line.startswith("tombstone: ")]
    retired = read_journal(pathlib.Path(tombstone, "journal").read_bytes()).records[-1]
    assert retired.fields["note"] == "session=RUNTIME_CHANGED diagnostic=RUNTIME_CHANGED"


@pytest.mark.parametrize("path, mountable", [
    ("/opt/hostedtoolcache/Python/3.12.3/x64", True),
    ("/root/.pyenv/versions/3.12.1", True),
    ("/home/runner/python", True),
    ("/usr/local/python", False),
    ("/tmp/python", False),
    ("/work/python", False),
    ("/cap/runtime", False),
    ("/proc/1/root", False),
    ("/etc/python", False),
    ("/lib64/python", False),
    ("/", False),
    ("relative/python", False),
    ("/opt/../usr", False),
    ("/opt//python", False),
    ("/opt/python/", False),
    ("/opt/my python", False),
    ("/opt/py\"thon", False),
    ("/opt/pyth\u00f6n", False),
    ("/.hidden/python", False),
    ("/" + "/".join(["a"] * 17), False),
])
def test_a_capability_mounts_at_its_own_path_only_outside_the_sandbox_s_own_tree(path, mountable):
    """The one rule (launcher.rendezvous.is_mount_target) the launcher, the session and verify --python apply:
    a runtime's prefix never lands on /usr, /cap, /out, /proc, /dev, /tmp, /work, /etc or the /usr links."""
    from launcher.rendezvous import is_capability_target, is_mount_target
    from steward import api

    assert is_mount_target(path) is mountable and (is_capability_target(path) or not mountable)
    if mountable:
        assert api.check_mount(path, "mount") == path
    else:
        with pytest.raises(Refused, match="mount: must be an absolute, normalized path"):
            api.check_mount(path, "mount")


@pytest.mark.parametrize("path, trees, allowed", [
    ("/usr/bin/python3.11", ["/usr"], True),
    ("/opt/hostedtoolcache/Python/3.12.3/x64/bin/python3.12", ["/usr", "/opt/hostedtoolcache/Python/3.12.3/x64"], True),
    ("/opt/hostedtoolcache/Python/3.12.3/x64/bin/python3.12", ["/usr"], False),
    ("/usr", ["/usr"], False),
    ("/opt/python", ["/opt/python"], False),
    ("/cap/runner/bin/python", ["/usr", "/cap/runner"], False),
    ("/usr/bin/../bin/python3", ["/usr"], False),
    ("/usr//bin/python3", ["/usr"], False),
    ("/usr/bin/python 3", ["/usr"], False),
    ("/usrx/python3", ["/usr"], False),
    ("usr/bin/python3", ["/usr"], False),
])
def test_an_executable_goes_only_over_a_file_inside_usr_or_a_runtime_s_own_mount(path, trees, allowed):
    """E7: the one rule (launcher.rendezvous.is_executable_target) the launcher and the session apply to the
    interpreter's execute-only copy: strictly inside /usr or a mount of a path of its own that a capability
    already holds, normalized, never a tree's top, never under /cap."""
    from launcher.rendezvous import is_executable_target

    assert is_executable_target(path, trees) is allowed
