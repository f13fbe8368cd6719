"""``casebox doctor``: one PASS or FAIL line per check with what to do; exit 0 only when every required check passes."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from executor import VERSION
from executor.cli import doctor
from executor.cli.main import main
from launcher import syscalls
from steward import cgroups

CHECKS = [
    "root", "open_tree", "mount_setattr", "pidfd_open", "memfd_seals", "renameat2", "namespaces", "dedicated_ids",
    "cgroup_v2", "cgroup_controllers", "clone_into_cgroup", "seccomp_filter", "oom_exemption", "python_prctl", "launcher_runtime",
    "launcher_source",
]


def _config(tmp_path, sandbox_ids) -> str:
    config = tmp_path / "casebox.toml"
    config.write_text(f'sandbox_uid = {sandbox_ids[0]}\nsandbox_gid = {sandbox_ids[1]}\nstate_root = "{tmp_path}/state"\n')
    return str(config)


def _doctor(capsys, config, *arguments):
    code = main(["--config", config, "doctor", *arguments])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


@pytest.mark.root
def test_this_host_passes_every_required_check(capsys, sandbox_ids, tmp_path):
    code, out = _doctor(capsys, _config(tmp_path, sandbox_ids), "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True
    assert report["schema"] == "casebox.doctor.v1"
    assert [check["check"] for check in report["checks"]] == CHECKS
    required = {check["check"]: check for check in report["checks"] if check["required"]}
    hierarchy = cgroups.detect()
    only_on_v2 = set() if hierarchy is not None and hierarchy.version == 2 else {"clone_into_cgroup"}
    assert set(required) == set(CHECKS) - {"cgroup_v2", "oom_exemption", "launcher_source"} - only_on_v2
    assert all(check["status"] == "PASS" for check in required.values()), required
    assert report["configuration"]["sandbox_uid"] == sandbox_ids[0]
    assert report["configuration"]["state_root"] == f"{tmp_path}/state"
    assert len(report["configuration"]["launcher_sha256"]) == 64
    assert not os.path.exists(f"{tmp_path}/state") or os.listdir(f"{tmp_path}/state") == []


@pytest.mark.root
def test_text_output_prints_the_configuration_and_one_sentence_per_check(capsys, sandbox_ids, tmp_path):
    code, out = _doctor(capsys, _config(tmp_path, sandbox_ids), "--state-root", str(tmp_path))
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"casebox doctor: casebox {VERSION}, configuration from ")
    assert f"  state_root = {tmp_path}" in lines
    verdicts = [line for line in lines if line.startswith(("PASS  ", "FAIL  "))]
    assert [line.split()[1].rstrip(":") for line in verdicts] == CHECKS
    assert all(line.endswith(".") for line in verdicts)
    assert lines[-1] == "casebox doctor: this host can sandbox."


@pytest.mark.root
def test_a_failed_required_check_exits_1_with_what_to_do(capsys, sandbox_ids, tmp_path):
    """S6 as a doctor check: a process using the dedicated ids fails the host."""
    squatter = subprocess.Popen(["/usr/bin/sleep", "30"], user=sandbox_ids[0], group=sandbox_ids[1])
    try:
        code, out = _doctor(capsys, _config(tmp_path, sandbox_ids), "--json")
    finally:
        squatter.kill()
        squatter.wait()
    report = json.loads(out)
    check = next(check for check in report["checks"] if check["check"] == "dedicated_ids")
    assert code == 1 and report["ok"] is False
    assert check["status"] == "FAIL" and check["required"] is True
    assert f"{squatter.pid} (sleep)" in check["detail"] and "set another sandbox_uid" in check["detail"]


def test_without_root_the_root_check_says_sudo_with_the_caller_s_config(capsys, monkeypatch):
    """Issue 13: the suggested command is the caller's own command line under sudo, --config and all."""
    from executor.cli import frontend

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(frontend, "_invocation", ["--config", "/srv/my casebox.toml", "doctor"])
    check = doctor.check_root()
    assert (check.status, check.required) == ("FAIL", True)
    assert "run it as root: sudo casebox --config '/srv/my casebox.toml' doctor" in check.detail


def test_launcher_sources_writable_by_others_are_reported(tmp_path, monkeypatch):
    package = tmp_path / "launcher"
    package.mkdir()
    (package / "x.py").write_text("")
    os.chmod(package, 0o755)
    os.chmod(package / "x.py", 0o666)
    monkeypatch.setattr(doctor.launcher, "__file__", str(package / "__init__.py"))
    check = doctor.check_launcher_source()
    assert (check.status, check.required) == ("FAIL", False)
    assert f"{package}/x.py is owned by uid" in check.detail and "mode 0666" in check.detail


def test_cgroup_v2_is_reported_but_not_required():
    check = doctor.check_cgroups()
    assert check.required is False and check.detail


def test_the_memory_controllers_and_the_shipped_filter_are_required(monkeypatch):
    """S12, S14: no memory cap or no shipped filter means no sandbox, and doctor says so with the fix."""
    from launcher import seccomp
    from steward import cgroups

    assert doctor.check_seccomp().required and doctor.check_memory_controller().required
    monkeypatch.setattr(cgroups, "detect", lambda: None)
    check = doctor.check_memory_controller()
    assert (check.status, check.required) == ("FAIL", True) and "enable them" in check.detail
    monkeypatch.setitem(seccomp.SHIPPED_DIGESTS, seccomp.syscalls.MACHINE, frozenset({"0" * 64}))
    check = doctor.check_seccomp()
    assert (check.status, check.required) == ("FAIL", True) and "not the shipped" in check.detail


def test_clone_into_cgroup_is_probed_and_required_on_cgroup_v2(monkeypatch):
    """S10 on cgroup v2: every sandbox's pid 1 is cloned into its cgroup, so a kernel without CLONE_INTO_CGROUP
    (before 5.7) fails the host there, with the version to get; elsewhere it is reported, not required. The
    probe is the real clone3: this kernel knows the flag."""
    real = doctor.check_clone_into_cgroup()
    assert real.passed, real.detail
    monkeypatch.setattr(cgroups, "detect", lambda: cgroups.Hierarchy(2, "/sys/fs/cgroup", "/sys/fs/cgroup"))
    assert doctor.check_clone_into_cgroup() == doctor.Check("clone_into_cgroup", True, True, real.detail.split(" (")[0])

    def old_kernel(flags, cgroup_fd):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(syscalls, "clone_into_cgroup", old_kernel)
    check = doctor.check_clone_into_cgroup()
    assert (check.status, check.required) == ("FAIL", True)
    assert check.detail == "clone3 with CLONE_INTO_CGROUP failed (Invalid argument); casebox needs it on Linux 5.7 or later"
    monkeypatch.setattr(cgroups, "detect", lambda: None)
    assert doctor.check_clone_into_cgroup().required is False


@pytest.mark.root
def test_renameat2_is_probed_on_the_state_roots_filesystem_and_leaves_nothing(tmp_path):
    check = doctor.check_renameat2(str(tmp_path / "not" / "yet"))
    assert check.passed and str(tmp_path) in check.detail
    assert os.listdir(tmp_path) == []


def test_a_state_root_that_is_a_file_is_refused_not_reported_well(capsys, tmp_path, casebox):
    """F1, issue 13: doctor never says all is well for a state root that cannot be one: exit 64 naming it."""
    state = tmp_path / "state"
    state.write_text("not a directory")
    casebox.refused("doctor", "--state-root", str(state), naming=str(state))


@pytest.mark.root
def test_a_process_using_any_pair_of_the_pool_fails_the_host(capsys, sandbox_ids, sandbox_pool_size, tmp_path):
    """S6 with a pool (config sandbox_ids, issue 14): a process on the pool's last pair, not its first, fails
    the host too, since a stage may be bound to any pair."""
    if sandbox_pool_size < 2:
        pytest.skip("needs CASEBOX_TEST_IDS of 2 or more")
    config = _config(tmp_path, sandbox_ids)
    with open(config, "a") as file:
        file.write(f"sandbox_ids = {sandbox_pool_size}\n")
    last = (sandbox_ids[0] + sandbox_pool_size - 1, sandbox_ids[1] + sandbox_pool_size - 1)
    squatter = subprocess.Popen(["/usr/bin/sleep", "30"], user=last[0], group=last[1])
    try:
        code, out = _doctor(capsys, config, "--json")
    finally:
        squatter.kill()
        squatter.wait()
    check = next(check for check in json.loads(out)["checks"] if check["check"] == "dedicated_ids")
    assert code == 1 and check["status"] == "FAIL" and f"{squatter.pid} (sleep)" in check["detail"]
    assert f"uids {sandbox_ids[0]}-{last[0]}" in check["detail"]
