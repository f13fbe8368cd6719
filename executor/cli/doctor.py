"""Can this host sandbox? Each probe exercises the real kernel feature casebox uses (S11).

A probe that changes namespaces runs in a forked child, so the doctor itself
leaves nothing behind. Every result is a sentence: what was found, or what
to do about it.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import secrets
import shutil
import tempfile
from typing import Callable

import launcher
from executor.cli.frontend import as_root_command
from launcher import reexec
from launcher import syscalls as sc
from steward import cgroups, dedicated
from steward.failure import SandboxFailure
from steward.interpreter import launcher_source_problem, open_runtime


def _sudo() -> str:
    return f"run it as root: {as_root_command()}"



@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    required: bool
    passed: bool
    detail: str

    @property
    def status(self) -> str:
        return "PASS" if self.passed else "FAIL"


def _in_child(probe: Callable[[], None]) -> None:
    """Run ``probe`` in a forked child; its OSError comes back with the same errno and message."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            probe()
            os._exit(0)
        except OSError as error:
            os.write(write_end, f"{error.errno}:{error.strerror}".encode())
        finally:
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read().decode(errors="replace")
    status = os.waitpid(pid, 0)[1]
    if status != 0:
        number, _, text = report.partition(":")
        raise OSError(int(number) if number.isdigit() else errno.EIO, text or f"probe ended with wait status {status:#x}")


def _errno_hint(error: OSError, feature: str, kernel: str) -> str:
    if error.errno == errno.EPERM:
        return f"{feature} was refused ({error.strerror}); {_sudo()}"
    if error.errno == errno.ENOSYS:
        return f"this kernel lacks {feature} ({error.strerror}); casebox needs Linux {kernel} or later"
    return f"{feature} failed ({error.strerror}); casebox needs it on Linux {kernel} or later"


def check_root() -> Check:
    if os.geteuid() == 0:
        return Check("root", True, True, "running as root")
    return Check("root", True, False, f"casebox builds sandboxes as root; {_sudo()}")


def _probe(name: str, feature: str, kernel: str, probe: Callable[[], None], found: str) -> Check:
    try:
        _in_child(probe)
    except OSError as error:
        return Check(name, True, False, _errno_hint(error, feature, kernel))
    return Check(name, True, True, found)


def _detached_tree() -> int:
    return sc.open_tree(sc.AT_FDCWD, "/", sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC)


def check_open_tree() -> Check:
    return _probe("open_tree", "open_tree(OPEN_TREE_CLONE)", "5.2", lambda: os.close(_detached_tree()), "open_tree clones a mount tree")


def check_mount_setattr() -> Check:
    def probe() -> None:
        tree = _detached_tree()
        sc.mount_setattr(tree, "", sc.AT_EMPTY_PATH, sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV)
        os.close(tree)

    return _probe("mount_setattr", "mount_setattr", "5.12", probe, "mount_setattr makes a detached tree read-only")


def check_pidfd() -> Check:
    return _probe("pidfd_open", "pidfd_open", "5.3", lambda: os.close(os.pidfd_open(os.getpid())), "pidfd_open works")


def check_memfd_seals() -> Check:
    def probe() -> None:
        fd = os.memfd_create("casebox-doctor", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        os.write(fd, b"casebox")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, reexec.REQUIRED_SEALS)
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & reexec.REQUIRED_SEALS != reexec.REQUIRED_SEALS:
            raise OSError(errno.EINVAL, "the seals did not stick")
        os.close(fd)

    return _probe("memfd_seals", "memfd SEAL|SHRINK|GROW|WRITE seals", "3.17", probe, "memfd seals SEAL|SHRINK|GROW|WRITE hold")


def check_renameat2(state_root: str) -> Check:
    """RENAME_NOREPLACE on the filesystem of the state root (or its nearest existing parent)."""
    where = state_root
    while not os.path.isdir(where):
        where = os.path.dirname(where)
    try:
        scratch = tempfile.mkdtemp(prefix=".casebox-doctor-", dir=where)
    except OSError as error:
        return Check("renameat2", True, False, f"cannot make a scratch directory in {where} ({error.strerror}); {_sudo()}")
    try:
        directory = os.open(scratch, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in ("a", "b"):
                os.close(os.open(name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=directory))
            try:
                sc.renameat2(directory, "a", directory, "b", sc.RENAME_NOREPLACE)
                return Check("renameat2", True, False, f"renameat2 replaced an existing name on {where}; RENAME_NOREPLACE is not honoured")
            except FileExistsError:
                sc.renameat2(directory, "a", directory, f"c-{secrets.token_hex(4)}", sc.RENAME_NOREPLACE)
        finally:
            os.close(directory)
    except OSError as error:
        return Check(
            "renameat2", True, False,
            f"renameat2(RENAME_NOREPLACE) failed on the filesystem of {where} ({error.strerror}); put the state root on ext4, xfs, btrfs or tmpfs",
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Check("renameat2", True, True, f"renameat2(RENAME_NOREPLACE) works on the filesystem of {where}")


def check_namespaces() -> Check:
    return _probe(
        "namespaces",
        "creating mount, pid, net, ipc, uts and cgroup namespaces",
        "4.6",
        lambda: sc.unshare(reexec.NAMESPACES),
        "new mount, pid, net, ipc, uts and cgroup namespaces can be created",
    )


def check_dedicated(pool: tuple[tuple[int, int], ...]) -> Check:
    """S6 for every pair of the sandbox pool (config sandbox_ids): no live process owns any of them."""
    (uid, gid), (last_uid, last_gid) = pool[0], pool[-1]
    ids = f"uid {uid} / gid {gid}" if len(pool) == 1 else f"uids {uid}-{last_uid} / gids {gid}-{last_gid}"
    users = dedicated.processes_using_any(pool)
    if not users:
        return Check("dedicated_ids", True, True, f"no process uses the sandbox {ids}")
    listed = ", ".join(f"{pid} ({name})" for pid, name in users[:5])
    return Check(
        "dedicated_ids", True, False,
        f"processes {listed} use the sandbox {ids}; stop them or set another sandbox_uid/sandbox_gid",
    )


def check_cgroups() -> Check:
    hierarchy = cgroups.detect()
    if hierarchy is not None and hierarchy.version == 2:
        return Check("cgroup_v2", False, True, f"found {hierarchy.describe()}; MEMORY and PIDS are observed there")
    if hierarchy is not None:
        return Check("cgroup_v2", False, False, f"no cgroup v2 memory and pids controllers: casebox uses {hierarchy.describe()} to observe MEMORY and PIDS")
    return Check(
        "cgroup_v2", False, False,
        "no cgroup memory and pids controllers: rlimits still contain every op, but the MEMORY and PIDS classes cannot be observed",
    )


def check_memory_controller() -> Check:
    """S14: memory is the cgroup's, so a host without the memory and pids controllers gets no sandbox."""
    hierarchy = cgroups.detect()
    if hierarchy is None:
        return Check(
            "cgroup_controllers", True, False,
            "no cgroup memory and pids controllers: casebox caps an op's memory and processes only there; enable them "
            "(cgroup v2 with memory and pids, or the v1 memory and pids hierarchies)",
        )
    return Check("cgroup_controllers", True, True, f"{hierarchy.describe()} caps each sandbox's ops in a cgroup of their own")


def check_clone_into_cgroup() -> Check:
    """S10 on cgroup v2: stage 1 clones each sandbox's pid 1 straight into its cgroup (clone3 with
    CLONE_INTO_CGROUP), so there it is required; a kernel before 5.7 refuses every sandbox."""
    hierarchy = cgroups.detect()
    required = hierarchy is not None and hierarchy.version == 2

    def probe() -> None:
        # A descriptor that is no cgroup directory: a kernel that knows the flag refuses it (EBADF) before any
        # child exists; one that does not refuses the flag (EINVAL), or clone3 itself (ENOSYS).
        not_a_cgroup = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        try:
            child = sc.clone_into_cgroup(0, not_a_cgroup)
        except OSError as error:
            if error.errno != errno.EBADF:
                raise
            return
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        raise OSError(errno.EINVAL, "clone3 took a descriptor that is no cgroup directory")

    check = _probe("clone_into_cgroup", "clone3 with CLONE_INTO_CGROUP", "5.7", probe, "clone3 can start a process inside a cgroup")
    if required:
        return check
    return dataclasses.replace(check, required=False, detail=f"{check.detail} (not used: this host has no cgroup v2 controllers)")


def check_seccomp() -> Check:
    """S12: libseccomp builds the shipped filter here, and the kernel reports filters."""
    from launcher import seccomp

    try:
        data = seccomp.shipped_program()
    except seccomp.FilterError as error:
        return Check("seccomp_filter", True, False, str(error))
    with open("/proc/self/status") as status:
        if not any(line.startswith("Seccomp_filters:") for line in status):
            return Check("seccomp_filter", True, False, "the kernel reports no Seccomp_filters, so READY cannot prove the filter; casebox needs Linux 5.9 or later")
    return Check(
        "seccomp_filter", True, True,
        f"libseccomp {seccomp.library_version()} builds the shipped syscall filter ({len(data) // 8} instructions, sha256 {seccomp.digest(data)})",
    )


def check_oom_exemption() -> Check:
    """S14: pid 1 exempts itself from the OOM killer where the host grants CAP_SYS_RESOURCE (not required)."""
    with open("/proc/self/status") as status:
        bounding = int(next(line for line in status if line.startswith("CapBnd:")).split()[1], 16)
    if bounding & (1 << 24):
        return Check("oom_exemption", False, True, "pid 1 of each sandbox sets its oom_score_adj to -1000")
    return Check(
        "oom_exemption", False, False,
        "this host withholds CAP_SYS_RESOURCE, so pid 1 keeps its OOM score; the ops cgroup still keeps the memory "
        "cap's OOM killer off pid 1, and every op is the OOM killer's first choice (oom_score_adj 1000)",
    )


def check_prctl() -> Check:
    try:
        import prctl

        prctl.get_no_new_privs()
    except (ImportError, OSError) as error:
        return Check("python_prctl", True, False, f"python-prctl does not import ({error}); run scripts/bootstrap (it needs libcap-dev)")
    return Check("python_prctl", True, True, "python-prctl imports")


def check_runtime() -> Check:
    try:
        runtime = open_runtime()
    except (SandboxFailure, OSError) as error:
        return Check("launcher_runtime", True, False, str(error))
    runtime.close()
    return Check("launcher_runtime", True, True, f"the interpreter {runtime.interpreter} and the modules in {runtime.import_dir} are root-only")


def check_launcher_source() -> Check:
    package = os.path.dirname(os.path.realpath(launcher.__file__))
    problem = launcher_source_problem(package)
    if problem is None:
        return Check("launcher_source", False, True, f"the launcher sources in {package} are root-only")
    return Check(
        "launcher_source", False, False,
        f"{problem}, so a non-root user can change what root runs; for production install casebox as root from a root-owned copy",
    )


def run_checks(state_root: str, pool: tuple[tuple[int, int], ...]) -> list[Check]:
    return [
        check_root(),
        check_open_tree(),
        check_mount_setattr(),
        check_pidfd(),
        check_memfd_seals(),
        check_renameat2(state_root),
        check_namespaces(),
        check_dedicated(pool),
        check_cgroups(),
        check_memory_controller(),
        check_clone_into_cgroup(),
        check_seccomp(),
        check_oom_exemption(),
        check_prctl(),
        check_runtime(),
        check_launcher_source(),
    ]
