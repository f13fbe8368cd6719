"""S7, S8, S10: one classified op after READY, run by pid 1 as the dedicated UID.

The only kind for now is ``exec`` of a materialized argv. The child first
joins the ops cgroup (S14: the memory cap and its OOM killer are there, pid 1
is not) and makes itself the OOM killer's first choice, then waits blocked:
pid 1 reports it (OP_CHILD) and writes the release byte only after the
starter's ACK, which comes once the child's identity is durable (J1). The
child then gets /dev/null as stdin, two capture pipes as stdout and stderr,
the op's environment and nothing else (close_range marks every other
descriptor close-on-exec), its cwd and a CPU rlimit, and execs with no shell.
A step that fails before exec is reported on a close-on-exec pipe; such an
op never started and gets no exit code.

pid 1 waits on a pidfd, the two pipes and the report pipe, under the op's
deadline. When the op's process ends it is reaped at once if it can be; a
zombie that a tracer holds cannot be, and then the deadline decides. At the
end, the deadline or an overflowed output cap, pid 1 kills every other
process in the namespace (kill(-1) spares pid 1 alone, and the op's cgroup
holds nothing else) before any wait that blocks, so no op can stall it
(S14), and reaps each of its children by pid, counting them. It never calls
waitpid(-1), and it reports raw wait statuses only.
"""

import _signal
import errno
import os
import select
import time

from launcher import limits, syscalls
from launcher.protocol import MAX_OUTPUT_CAP

_READ = 1 << 16
_RELEASE = b"R"
_DRAIN_MS = 2000
SCRATCH_MOUNTS = ("/tmp", "/work")
DEFAULT_PATH = "/usr/bin:/bin"


class OpError(Exception):
    """The op message is not one pid 1 can run; the sandbox ends."""


def check_op(fields: dict) -> None:
    if not fields["argv"] or not fields["argv"][0]:
        raise OpError("argv must name a program")
    if not fields["cwd"].startswith("/"):
        raise OpError("cwd must be absolute")
    if fields["timeout_ms"] < 1:
        raise OpError("timeout_ms must be positive")
    for cap in ("stdout_cap", "stderr_cap"):
        if fields[cap] > MAX_OUTPUT_CAP:
            raise OpError(f"{cap} is over the {MAX_OUTPUT_CAP}-byte output cap")
    for name, _ in fields["env"]:
        if not name or "=" in name:
            raise OpError(f"environment name {name!r} is not valid")


class _Capture:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> bool:
        """Keep what fits under the cap; True once anything had to be dropped."""
        room = self.cap - len(self.data)
        self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True
        return self.truncated


def _execute(argv: list[str], env: dict[str, str]) -> None:
    """execve, searching the op's PATH when argv[0] has no slash (inside the sandbox only)."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    failure = None
    for directory in env.get("PATH", DEFAULT_PATH).split(":"):
        try:
            os.execve(os.path.join(directory or ".", argv[0]), argv, env)
        except OSError as error:
            if failure is None or error.errno not in (errno.ENOENT, errno.ENOTDIR):
                failure = error
    raise failure or FileNotFoundError(errno.ENOENT, "no PATH to search")


def _child(fields: dict, release: int, stdout: int, stderr: int, report: int, op_cgroup: int) -> None:
    step = "cgroup"
    try:
        os.setpgid(0, 0)
        # "0" moves the writer: v1 moves this thread alone, without the global lock a process move waits on.
        os.write(op_cgroup, b"0")
        step = "release"
        if os.read(release, 1) != _RELEASE:
            os._exit(126)
        step = "stdin"
        os.dup2(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), 0)
        step = "stdout"
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        step = "rlimit"
        limits.apply_op_cpu_limit(fields["timeout_ms"])
        step = "chdir"
        os.chdir(fields["cwd"])
        step = "close_range"
        syscalls.close_range(3, syscalls.CLOSE_RANGE_ALL, syscalls.CLOSE_RANGE_CLOEXEC)
        step = "execve"
        _execute(fields["argv"], dict(fields["env"]))
    except OSError as error:
        os.write(report, f"{step}:{error.errno}".encode())
    finally:
        os._exit(127)


def kill_everything() -> None:
    """SIGKILL every process in this pid namespace but pid 1 itself."""
    try:
        os.kill(-1, _signal.SIGKILL)
    except ProcessLookupError:
        pass


def _children() -> list[int]:
    with open(f"/proc/self/task/{os.getpid()}/children", "rb") as file:
        return [int(pid) for pid in file.read().split()]


def reap_all() -> list:
    """Kill and reap, by pid, every remaining child until none is left; their rusages."""
    usages = []
    while True:
        kill_everything()
        pids = _children()
        if not pids:
            return usages
        for pid in pids:
            usages.append(os.wait4(pid, 0)[2])


def _scratch_full() -> bool:
    for path in SCRATCH_MOUNTS:
        usage = os.statvfs(path)
        if usage.f_bavail == 0 or usage.f_favail == 0:
            return True
    return False


def classify(status: int, *, timed_out: bool, overflowed: bool, scratch_full: bool) -> str:
    """The launcher's limit class from what it observed (MEMORY and PIDS are the starter's)."""
    observed = set()
    if overflowed:
        observed.add("OUTPUT")
    if timed_out:
        observed.add("TIMEOUT")
    if scratch_full:
        observed.add("DISK")
    if os.WIFSIGNALED(status):
        observed.add("SIGNALLED")
        signal_number = os.WTERMSIG(status)
        if signal_number == _signal.SIGXCPU:
            observed.add("TIMEOUT")
        elif signal_number == _signal.SIGXFSZ:
            observed.add("DISK")
    elif os.WEXITSTATUS(status) != 0:
        observed.add("EXIT_NONZERO")
    return limits.worst(observed)


def _reap_now(pid: int):
    """``wait4(pid)`` without blocking: (pid, status, usage), or None while the zombie is a tracer's to reap."""
    found = os.wait4(pid, os.WNOHANG)
    return found if found[0] == pid else None


def run(channel, fields: dict, op_cgroup: int) -> None:
    """Run one exec op to the end and report it; every process it started is gone afterwards."""
    check_op(fields)
    release_read, release_write = os.pipe2(os.O_CLOEXEC)
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    stdout_read, stdout_write = os.pipe2(os.O_CLOEXEC)
    stderr_read, stderr_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        _child(fields, release_read, stdout_write, stderr_write, report_write, op_cgroup)
    for fd in (release_read, report_write, stdout_write, stderr_write):
        os.close(fd)
    os.setpgid(pid, pid)
    try:
        channel.leaf("OP_CHILD", pid=pid)
    except BaseException:
        reap_all()
        raise
    try:
        os.write(release_write, _RELEASE)
    except BrokenPipeError:
        pass  # the op was killed before its release (the steward stopping): its end is observed below as any other
    os.close(release_write)
    released = time.monotonic()
    deadline = released + fields["timeout_ms"] / 1000
    pidfd = os.pidfd_open(pid)
    captures = {stdout_read: _Capture(fields["stdout_cap"]), stderr_read: _Capture(fields["stderr_cap"])}
    report = bytearray()
    poller = select.poll()
    for fd in (pidfd, stdout_read, stderr_read, report_read):
        poller.register(fd, select.POLLIN)
    open_fds = {stdout_read, stderr_read, report_read}

    def take(fd: int) -> bool:
        """Read one ready pipe; True when a capture has now overflowed its cap."""
        chunk = os.read(fd, _READ)
        if not chunk:
            poller.unregister(fd)
            open_fds.discard(fd)
            return False
        if fd == report_read:
            report.extend(chunk)
            return False
        return captures[fd].add(chunk)

    timed_out = overflowed = False
    watching = True
    reaped = None
    while reaped is None and not (timed_out or overflowed):
        events = poller.poll(max(0, int((deadline - time.monotonic()) * 1000) + 1))
        if not events:
            timed_out = True
        for fd, _ in events:
            if fd == pidfd:
                reaped = _reap_now(pid)
                if reaped is None:
                    poller.unregister(pidfd)
                    watching = False
            elif take(fd):
                overflowed = True
    # Kill before any wait that blocks: a zombie that a tracer held is released when its tracer dies.
    kill_everything()
    _, status, usage = reaped or os.wait4(pid, 0)
    ended = time.monotonic()
    os.close(pidfd)
    if watching:
        poller.unregister(pidfd)
    while open_fds:
        events = poller.poll(_DRAIN_MS)
        if not events:
            break
        for fd, _ in events:
            take(fd)
    for fd in (stdout_read, stderr_read, report_read):
        os.close(fd)
    others = reap_all()
    if report:
        step, _, number = bytes(report).decode("ascii", "replace").partition(":")
        channel.leaf(
            "OP_NOT_STARTED",
            step=step,
            errno=int(number) if number.isdigit() else 0,
            wait_status=status,
            descendants_reaped=len(others),
        )
        return
    usages = [usage, *others]
    stdout, stderr = captures[stdout_read], captures[stderr_read]
    channel.leaf(
        "OP_RESULT",
        wait_status=status,
        descendants_reaped=len(others),
        wall_ms=int((ended - released) * 1000),
        cpu_ms=int(sum(item.ru_utime + item.ru_stime for item in usages) * 1000),
        max_rss_kib=max(item.ru_maxrss for item in usages),
        limit=classify(status, timed_out=timed_out, overflowed=overflowed, scratch_full=_scratch_full()),
        stdout=bytes(stdout.data),
        stderr=bytes(stderr.data),
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
    )
