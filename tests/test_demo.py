"""The demo (examples/): reproducible wheels, an offline-complete index, a valid plan, capabilities F4 accepts, the CI example."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from casebox_cli import run as run_cli
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from executor.transport import pack, wheelbuild
from executor.capability import open_capability
from executor.plan import plan_from_bytes
from executor.transport.wheelbuild import build_demo, build_wheel
from journal.errors import Refused

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CANDIDATE = EXAMPLES / "candidate"
INDEX = EXAMPLES / "index"
# The reproducibility contract: these sources give these bytes on any machine, with any Python 3.11+.
# A change to a demo source changes its digest here, on purpose.
WHEEL_DIGESTS = {
    "demo_core-1.0.0-py3-none-any.whl": "caff9a10d364c80d187a0400e51ef6ef943a938c8429429b128c9459e3d1a323",
    "demo_extra-1.0.0-py3-none-any.whl": "cc0b9cca4452badd809c5f166aa8b8eb32478dc9564915d8b1a3c7aa9d808e8d",
    "demo_greet-1.0.0-py3-none-any.whl": "bbf1cc1c80ad5ef178120a3b0453d0cf44610ceaae12d65582008d6e5a117118",
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("demo")
    return {pathlib.Path(path).name: pathlib.Path(path).read_bytes() for path in build_demo(str(CANDIDATE), str(out))}


# --- the wheels ---------------------------------------------------------------------


def test_the_demo_wheels_have_their_pinned_digests(wheels):
    """T1 for the demo: the same sources give the same bytes on any machine."""
    assert {name: hashlib.sha256(data).hexdigest() for name, data in wheels.items()} == WHEEL_DIGESTS


def test_the_bytes_do_not_depend_on_times_modes_umask_or_location(tmp_path, wheels):
    """T1: file times, file modes, the umask and the checkout's path never reach a wheel."""
    copy = tmp_path / "elsewhere" / "candidate"
    shutil.copytree(CANDIDATE, copy)
    for index, path in enumerate(sorted(copy.rglob("*"))):
        if path.is_file():
            os.chmod(path, 0o600 if index % 2 else 0o755)
        os.utime(path, (1_000_000_000 + index * 7919, 1_700_000_000 + index * 104729))
    (copy / "demo-core" / "demo_core" / "__pycache__").mkdir()
    (copy / "demo-core" / "demo_core" / "__pycache__" / "lock").write_bytes(b"a bytecode cache is skipped whole")
    (copy / "demo-core" / "demo_core" / "legacy.pyc").write_bytes(b"a stray .pyc is skipped too")
    old = os.umask(0o077)
    try:
        rebuilt = {pathlib.Path(p).name: pathlib.Path(p).read_bytes() for p in build_demo(str(copy), str(tmp_path / "out"))}
    finally:
        os.umask(old)
    assert rebuilt == wheels


def test_every_entry_is_stored_sorted_dated_1980_and_mode_0644(wheels):
    """T1: fixed timestamps, sorted entries with .dist-info last and RECORD at the end, fixed permissions."""
    for name, data in wheels.items():
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
        names = [info.filename for info in infos]
        package = [n for n in names if ".dist-info/" not in n]
        info = [n for n in names if ".dist-info/" in n]
        assert names == package + info, name
        assert package == sorted(package) and info[:-1] == sorted(info[:-1]) and info[-1].endswith("/RECORD")
        for entry in infos:
            assert entry.date_time == (1980, 1, 1, 0, 0, 0)
            assert entry.external_attr >> 16 == 0o100644
            assert entry.compress_type == zipfile.ZIP_STORED
            assert "__pycache__" not in entry.filename and not entry.filename.endswith(".pyc")


def test_record_lists_every_file_with_its_hash_and_size(wheels):
    """The wheel spec: RECORD hashes every other file (urlsafe base64 SHA-256, no padding) and lists itself bare."""
    for name, data in wheels.items():
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            record_name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            rows = [line.split(",") for line in archive.read(record_name).decode().splitlines()]
            assert sorted(row[0] for row in rows) == sorted(archive.namelist())
            for path, digest, size in rows:
                if path == record_name:
                    assert (digest, size) == ("", "")
                    continue
                content = archive.read(path)
                expected = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
                assert (digest, int(size)) == (f"sha256={expected}", len(content))


def _metadata(data: bytes, name: str) -> dict[str, list[str]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        text = archive.read(f"{name}/METADATA").decode()
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    return fields


def test_metadata_wheel_and_entry_points_say_what_each_wheel_needs_and_gives(wheels):
    """One wheel depends on another, one on a third-party wheel, one has a console script."""
    greet = wheels["demo_greet-1.0.0-py3-none-any.whl"]
    assert _metadata(greet, "demo_greet-1.0.0.dist-info")["Requires-Dist"] == ["demo-core==1.0.0"]
    assert _metadata(wheels["demo_extra-1.0.0-py3-none-any.whl"], "demo_extra-1.0.0.dist-info")["Requires-Dist"] == ["six>=1.16"]
    assert "Requires-Dist" not in _metadata(wheels["demo_core-1.0.0-py3-none-any.whl"], "demo_core-1.0.0.dist-info")
    with zipfile.ZipFile(io.BytesIO(greet)) as archive:
        assert archive.read("demo_greet-1.0.0.dist-info/entry_points.txt") == b"[console_scripts]\ndemo-greet = demo_greet.cli:main\n"
        wheel = archive.read("demo_greet-1.0.0.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: true\n" in wheel and "Tag: py3-none-any\n" in wheel


def test_casebox_pack_accepts_the_demo_wheels(tmp_path, wheels, casebox):
    """T1/T5: the demo wheels pack into a bundle; from outside, the console script does it too."""
    assert pack.build(sorted(wheels.items()))
    paths = []
    for name, data in wheels.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    result = casebox("pack", *paths, "--out", str(tmp_path / "candidate.tar"))
    assert result.returncode == 0, result.stderr
    coordinate = json.loads(result.stdout)
    assert coordinate["sha256"] == hashlib.sha256((tmp_path / "candidate.tar").read_bytes()).hexdigest()


def test_build_demo_never_replaces_a_different_wheel(tmp_path):
    """E4 for the build: a wheel already there with other bytes is refused and kept."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "demo_core-1.0.0-py3-none-any.whl").write_bytes(b"not the wheel")
    with pytest.raises(Refused, match="different bytes"):
        build_demo(str(CANDIDATE), str(out))
    assert (out / "demo_core-1.0.0-py3-none-any.whl").read_bytes() == b"not the wheel"


def test_scripts_build_demo_builds_the_pinned_wheels(tmp_path):
    result = subprocess.run([str(REPO / "scripts" / "build-demo"), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    printed = {pathlib.Path(path).name: digest for digest, path in (line.split() for line in result.stdout.splitlines())}
    assert printed == WHEEL_DIGESTS


def _project(tmp_path: pathlib.Path, toml: str) -> pathlib.Path:
    source = tmp_path / "p"
    (source / "p").mkdir(parents=True)
    (source / "p" / "__init__.py").write_text("")
    (source / "pyproject.toml").write_text(toml)
    return source


@pytest.mark.parametrize(
    "toml, naming",
    [
        ('[project]\nname = "p"\nversion = "1"\nlicense = "MIT"\n', "project.license"),
        ('[project]\nname = "p"\nversion = "1"\n[tool.x]\n', "tool"),
        ('[project]\nname = "p"\nversion = "1.0rc1"\n', "project"),
        ('[project]\nname = "p"\nversion = "1"\ndependencies = "six"\n', "project.dependencies"),
        ('[project]\nname = "p"\nversion = "1"\n[project.scripts]\nx = "not an entry point"\n', "project.scripts.x"),
        ('[project]\nname = "p"\nversion = "1"\ndescription = "two\\nlines"\n', "project.description"),
    ],
)
def test_the_builder_reads_only_the_closed_subset_it_knows(tmp_path, toml, naming):
    """D1 for the builder's input: an unknown key or a wrong value is refused, naming it."""
    with pytest.raises(Refused) as caught:
        build_wheel(str(_project(tmp_path, toml)))
    assert naming in caught.value.where


def test_the_builder_refuses_a_symlink_in_the_package(tmp_path):
    """The builder never follows a symlink out of the sources into a wheel."""
    source = _project(tmp_path, '[project]\nname = "p"\nversion = "1"\n')
    (source / "p" / "secret.py").symlink_to("/etc/hostname")
    with pytest.raises(Refused, match="symlink"):
        build_wheel(str(source))


def test_the_builder_bounds_the_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelbuild, "MAX_SOURCE_FILES", 1)
    source = _project(tmp_path, '[project]\nname = "p"\nversion = "1"\n')
    (source / "p" / "more.py").write_text("")
    with pytest.raises(Refused, match="more than 1 files"):
        build_wheel(str(source))


# --- the index ------------------------------------------------------------------------


def _index() -> dict[str, tuple[Version, dict[str, list[str]]]]:
    found = {}
    for path in sorted(INDEX.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        dist_info = f"{name}-{version}.dist-info"
        found[canonicalize_name(name)] = (Version(version), _metadata(path.read_bytes(), dist_info))
    return found


def test_the_index_readme_lists_exactly_the_wheels_with_their_digests_and_licenses():
    """Every third-party wheel in the repository is listed with its sha256 and license."""
    text = (INDEX / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+\.whl)` \| `([0-9a-f]{64})` \| [^|]*\w[^|]* \|", text, re.M))
    on_disk = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in INDEX.glob("*.whl")}
    assert on_disk, f"{INDEX} holds no wheel"
    assert rows == on_disk


def test_the_index_holds_only_pure_python_wheels():
    """The index works on any runner: every wheel is for any platform and ABI."""
    found = sorted(INDEX.glob("*.whl"))
    assert found, f"{INDEX} holds no wheel"
    for path in found:
        assert re.search(r"-(py3|py2\.py3)-none-any\.whl\Z", path.name), path.name


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13"])
def test_the_index_and_the_demo_wheels_resolve_offline(python, wheels):
    """Resolution is real and offline: every Requires-Dist of the candidate and of pytest, markers evaluated
    for this Python, is met by exactly one wheel of the index or the candidate."""
    available = _index()
    for name, data in wheels.items():
        project, version = name.split("-")[:2]
        available[canonicalize_name(project)] = (Version(version), _metadata(data, f"{project}-{version}.dist-info"))
    environment = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "implementation_name": "cpython", "os_name": "posix", "extra": ""}
    pending = ["demo-core", "demo-greet", "demo-extra", "pytest"]
    seen = set()
    while pending:
        project = canonicalize_name(pending.pop())
        if project in seen:
            continue
        seen.add(project)
        version, metadata = available[project]
        requires_python = metadata.get("Requires-Python", [""])[0]
        if requires_python:
            assert Version(f"{python}.0") in Requirement(f"x{requires_python}").specifier, (project, python)
        for line in metadata.get("Requires-Dist", []):
            requirement = Requirement(line)
            if requirement.marker is not None and not Marker(str(requirement.marker)).evaluate(environment):
                continue
            dependency = canonicalize_name(requirement.name)
            assert dependency in available, f"{project} needs {line}, which the index lacks"
            assert available[dependency][0] in requirement.specifier, f"{project} needs {line}"
            pending.append(dependency)
    expected = {"demo-core", "demo-greet", "demo-extra", "six", "pytest", "pluggy", "iniconfig", "packaging"}
    if python == "3.10":
        expected |= {"exceptiongroup", "tomli"}
    assert seen == expected


def test_pip_installs_the_candidate_and_pytest_from_the_index_alone(tmp_path, wheels):
    """The wheels are real wheels: pip, with no index and no network, resolves and installs them (no code runs)."""
    dist = tmp_path / "dist"
    dist.mkdir()
    for name, data in wheels.items():
        (dist / name).write_bytes(data)
    target = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-compile", "--disable-pip-version-check",
         "--find-links", str(INDEX), "--find-links", str(dist), "--target", str(target),
         "demo-greet", "demo-extra", "pytest"],
        capture_output=True, text=True, timeout=120, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert (target / "demo_core" / "__init__.py").is_file()
    assert (target / "six.py").is_file()
    assert (target / "bin" / "demo-greet").is_file()


# --- the plan, the verifier tree and the capabilities -------------------------------------


def test_the_plan_is_valid_and_every_case_s_designed_status_is_documented(capsys):
    """The plan passes `casebox plan check`, and examples/README.md gives each case's designed status."""
    code, out, _ = run_cli(capsys, "plan", "check", str(EXAMPLES / "plan.json"))
    assert code == 0 and out.startswith("sha256:")
    plan = plan_from_bytes((EXAMPLES / "plan.json").read_bytes())
    from evidence_support import DESIGNED_STATUS

    assert set(DESIGNED_STATUS) == {case.id for case in plan.cases}
    text = (EXAMPLES / "README.md").read_text()
    for case_id, (status, reason) in DESIGNED_STATUS.items():
        assert re.search(rf"^\| `{case_id}` \|.*\| {re.escape(status)} \(`{reason}`\) \|", text, re.M), case_id


def test_the_plan_s_pytest_cases_name_tests_in_the_verifier_tree():
    """Every pytest case's node id names a test function that exists in examples/verifier."""
    plan = plan_from_bytes((EXAMPLES / "plan.json").read_bytes())
    for case in plan.cases:
        if case.op != "pytest":
            continue
        node = next(arg for arg in case.args if "::" in arg)
        path, function = node.split("::")
        assert re.search(rf"^def {function}\(", (EXAMPLES / "verifier" / path).read_text(), re.M), node


@pytest.mark.parametrize("directory", ["verifier", "index"])
def test_the_demo_capabilities_pass_the_f4_boundary(directory, tmp_path):
    """F4: the verifier tree and the index are accepted as capabilities; the repository root is not."""
    fd = open_capability(str(EXAMPLES / directory), state_root=str(tmp_path / "casebox"))
    os.close(fd)


def test_the_repository_root_is_refused_as_a_capability(tmp_path):
    """F4: the checkout holds .git, so it never enters a sandbox."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    with pytest.raises(Refused, match=r"\.git"):
        open_capability(str(REPO), state_root=str(tmp_path / "casebox"))


# --- the CI example -------------------------------------------------------------------------


WORKFLOW = EXAMPLES / "github-actions" / "verify.yml"


def _command(text: str, program: str) -> list[str]:
    """The folded `run: >` command of ``program`` in the workflow, as argv, with expressions and variables stood in."""
    block = re.search(rf"run: >\n((?:\s+.*\n)*?\s+{re.escape(program)}\n(?:\s+--.*\n)+)", text).group(1)
    line = " ".join(line.strip() for line in block.splitlines())
    line = line.replace("${{ needs.prepare.outputs.sha256 }}", "a" * 64).replace("${{ matrix.shard }}", "1/3")
    line = line.replace('"$PLAN"', str(EXAMPLES / "plan.json")).replace('"$ATTEMPT-py${{ matrix.python-version }}"', "run-1-1-py3.12")
    line = line.replace('"${{ steps.python.outputs.python-path }}"', "/opt/hostedtoolcache/Python/3.12.3/x64/bin/python3.12")
    replaced = line.split()
    return replaced[replaced.index(program.split()[-1]) + 1 :]


def test_the_workflow_shards_with_plan_shard_and_its_matrix_is_what_plan_shard_prints(capsys):
    """Scale-out: the matrix comes from `casebox plan shard --json`, one verify job per shard."""
    text = WORKFLOW.read_text()
    assert 'casebox plan shard "$PLAN" --count "$SHARDS" --json' in text
    assert "shard: ${{ fromJSON(needs.prepare.outputs.matrix).shard }}" in text
    shards = re.search(r'SHARDS: "(\d+)"', text).group(1)
    code, out, _ = run_cli(capsys, "plan", "shard", str(EXAMPLES / "plan.json"), "--count", shards, "--json")
    assert code == 0 and json.loads(out) == {"shard": [f"{i}/{shards}" for i in range(1, int(shards) + 1)]}


def test_the_workflow_runs_verify_per_shard_with_sudo_and_uploads_the_evidence():
    text = WORKFLOW.read_text()
    verify = _command(text, "sudo --preserve-env=GITHUB_ACTIONS,GITHUB_STEP_SUMMARY .venv/bin/casebox verify")
    assert verify[verify.index("--shard") + 1] == "1/3"
    for flag in ("--bundle", "--sha256", "--plan", "--verifier-tree", "--attempt", "--evidence", "--python"):
        assert flag in verify
    assert "path: evidence/" in text and "uses: actions/upload-artifact@v4" in text
    assert "persist-credentials: false" in text


def test_the_workflow_crosses_python_versions_with_the_shards_one_attempt_and_one_verdict_per_version():
    """Issue 18: actions/setup-python per version, after the root bootstrap (so casebox's own venv stays the
    distribution's); each version an attempt of its own, folded by an evaluate job of its own."""
    text = WORKFLOW.read_text()
    versions = re.findall(r'python-version: \["([^]]+)"\]', text)
    assert versions == ['3.11", "3.12", "3.13'] * 2
    assert text.index("sudo scripts/bootstrap") < text.index("uses: actions/setup-python@v5")
    verify = _command(text, "sudo --preserve-env=GITHUB_ACTIONS,GITHUB_STEP_SUMMARY .venv/bin/casebox verify")
    assert verify[verify.index("--attempt") + 1] == "run-1-1-py3.12"
    assert "pattern: evidence-py${{ matrix.python-version }}-*" in text


def test_the_workflow_uploads_each_case_s_output_under_the_names_casebox_publishes():
    """Issue 13: the output artifact's globs match the published output files (executor.evidence.receipts.OUTPUTS), and
    verify under sudo keeps the variables the job summary and the annotations need."""
    from executor.evidence.receipts import OUTPUTS

    text = WORKFLOW.read_text()
    block = text[text.index("name: output-${{ steps.name.outputs.artifact }}"):]
    globs = re.findall(r"^\s+(evidence/\*\S+)$", block, re.M)[:3]
    assert sorted(globs) == sorted(f"evidence/*{suffix}" for suffix in OUTPUTS.values())
    assert "--preserve-env=GITHUB_ACTIONS,GITHUB_STEP_SUMMARY" in text


def test_the_workflow_s_evaluate_command_is_one_casebox_accepts(tmp_path, capsys, monkeypatch):
    """The evaluation job's command line parses, and folds a downloaded set of shard directories."""
    from evidence_support import DESIGNED_RUNS, build_attempt

    text = WORKFLOW.read_text()
    args = _command(text, ".venv/bin/casebox evaluate")
    plan = plan_from_bytes((EXAMPLES / "plan.json").read_bytes())
    downloaded = tmp_path / "evidence"
    directories = build_attempt(downloaded, plan, DESIGNED_RUNS, shards=3, attempt="run-1-1-py3.12")
    index = args.index("--evidence")
    args[index + 1 : index + 2] = [str(d) + "/" for d in directories]
    args[args.index("--bundle-sha256") + 1] = "b" * 64
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "evaluate", *args)
    assert (code, err) == (3, "")
    assert (tmp_path / "report-run-1-1-py3.12.json").is_file()
