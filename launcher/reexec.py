"""S3: the launcher's authenticated source in a sealed memfd, and the re-exec into new namespaces.

Stage 1 copies the file it runs from (the provisioned, digest-checked
launcher) into a memfd, seals it against every change, and checks the seals
and the digest on the memfd itself. It then clones a child straight into new
mount, pid, net, ipc, uts and cgroup namespaces with CLONE_PARENT, so the
sandbox's pid 1 is the starter's own child (the starter reaps it and records
its raw wait status), and that child execs the real interpreter, by
descriptor, with ``-I -S /proc/self/fd/N``. On re-entry pid 1 checks that the
code it runs came from that descriptor and that the descriptor still carries
the seals and the digest. The memfd has no other use and is closed before the
drop.
"""

import fcntl
import os
import _signal

from launcher import syscalls
from launcher.digest import sha256_of_fd

REQUIRED_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
NAMESPACES = (
    syscalls.CLONE_NEWNS
    | syscalls.CLONE_NEWPID
    | syscalls.CLONE_NEWNET
    | syscalls.CLONE_NEWIPC
    | syscalls.CLONE_NEWUTS
    | syscalls.CLONE_NEWCGROUP
)
_MFD_NOEXEC_SEAL = 0x8
_PR_SET_PDEATHSIG = 1
_CHUNK = 1 << 16


class SealError(Exception):
    """The memfd is not sealed as required, or its bytes are not the authenticated launcher."""


def _memfd() -> int:
    # The memfd is only ever read by the interpreter, never executed, so it
    # asks for MFD_NOEXEC_SEAL where the kernel knows it (6.3+; required when
    # vm.memfd_noexec=2). An older kernel refuses the unknown flag with EINVAL.
    flags = os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC
    try:
        return os.memfd_create("casebox-launcher", flags | _MFD_NOEXEC_SEAL)
    except OSError as error:
        if error.errno != 22:
            raise
        return os.memfd_create("casebox-launcher", flags)


def sealed_copy(source_fd: int, digest: bytes) -> int:
    """A sealed memfd holding exactly the bytes of ``source_fd``, verified against ``digest``."""
    memfd = _memfd()
    try:
        offset = 0
        while True:
            chunk = os.pread(source_fd, _CHUNK, offset)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(memfd, view):]
            offset += len(chunk)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
        verify_sealed(memfd, digest)
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def verify_sealed(fd: int, digest: bytes) -> None:
    """Refuse a descriptor that lacks any required seal or whose bytes differ from ``digest``."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as error:
        raise SealError(f"descriptor {fd} is not a sealable memfd ({error.strerror})") from None
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise SealError(f"descriptor {fd} carries seals {seals:#x}, not all of {REQUIRED_SEALS:#x}")
    if sha256_of_fd(fd) != digest:
        raise SealError(f"descriptor {fd} does not hold the authenticated launcher (digest mismatch)")


def verify_reentry(memfd: int, digest: bytes, argv0: str, module_file: str) -> None:
    """S3 on re-entry: this code was loaded from ``memfd``, which is still sealed and authentic."""
    source = f"/proc/self/fd/{memfd}"
    if argv0 != source or not module_file.startswith(source + "/"):
        raise SealError(f"the launcher runs from {argv0!r}, not from its sealed memfd {source}")
    verify_sealed(memfd, digest)


def clone_into_namespaces(
    interpreter_fd: int, interpreter_path: str, memfd: int, arguments: list[str], keep: list[int],
    cgroup_fd: int | None,
) -> tuple[int, str]:
    """Start the sandbox's pid 1 as a sibling (CLONE_PARENT): its pid and, if its exec failed, why.

    Given ``cgroup_fd`` (cgroup v2), pid 1 is born in that cgroup (CLONE_INTO_CGROUP); on v1 the starter has
    already moved stage 1 into the sandbox's cgroups, so pid 1 inherits them.

    The pid is returned either way, because the starter, its parent, must
    record and reap it. Only the descriptors in ``keep``, the memfd and 0, 1, 2
    cross the exec; the child arms its parent-death signal first, so the
    sandbox dies with the starter.
    """
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    if cgroup_fd is None:
        pid = syscalls.clone(syscalls.CLONE_PARENT | NAMESPACES)
    else:
        pid = syscalls.clone_into_cgroup(syscalls.CLONE_PARENT | NAMESPACES, cgroup_fd)
    if pid == 0:
        try:
            os.close(report_read)
            for fd in keep + [memfd]:
                os.set_inheritable(fd, True)
            syscalls.prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL)
            argv = [interpreter_path, "-I", "-S", f"/proc/self/fd/{memfd}", *arguments]
            syscalls.execveat(interpreter_fd, "", argv, {}, syscalls.AT_EMPTY_PATH)
        except OSError as error:
            os.write(report_write, f"{error.errno}:{error.strerror}".encode())
        finally:
            os._exit(127)
    os.close(report_write)
    try:
        report = os.read(report_read, 512)
    finally:
        os.close(report_read)
    return pid, report.decode(errors="replace")
