"""The escape battery: small hostile programs run through the real sandbox, as root.

Each must be contained and reported correctly. After every test no process
of the dedicated UID remains and the host mount table is unchanged (the
``contained`` fixture). Bombs use small caps and short timeouts.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import time

import pytest

from sandbox_support import contained, hostile, processes_of, run, start, start_with_launcher_without, state_root  # noqa: F401
from steward.api import Limits
from steward.starter import OpResult

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("contained")]


# -- network -------------------------------------------------------------------


def test_host_loopback_listeners_are_unreachable(sandbox_ids, state_root):
    """S9: a TCP connect or UDP datagram to the host's 127.0.0.1 never arrives."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.3)
    try:
        _, seen = hostile(sandbox_ids, state_root, """
            import errno, json, socket, sys
            tcp = socket.socket(); tcp.settimeout(2)
            try:
                tcp.connect(('127.0.0.1', int(sys.argv[1]))); outcome = 'connected'
            except OSError as error:
                outcome = errno.errorcode.get(error.errno, str(error))
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.sendto(b'escape', ('127.0.0.1', int(sys.argv[2])))
            print(json.dumps(outcome))
        """, str(tcp.getsockname()[1]), str(udp.getsockname()[1]))
        assert seen == "ECONNREFUSED"
        with pytest.raises(TimeoutError):
            udp.recvfrom(64)
        tcp.setblocking(False)
        with pytest.raises(BlockingIOError):
            tcp.accept()
    finally:
        tcp.close()
        udp.close()


def test_host_abstract_unix_sockets_are_unreachable(sandbox_ids, state_root):
    """S9: the abstract socket namespace belongs to the network namespace."""
    name = f"casebox-escape-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    try:
        _, seen = hostile(sandbox_ids, state_root, """
            import errno, json, socket, sys
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                client.connect('\\0' + sys.argv[1]); print(json.dumps('connected'))
            except OSError as error:
                print(json.dumps(errno.errorcode[error.errno]))
        """, name)
        assert seen == "ECONNREFUSED"
    finally:
        listener.close()


def test_no_interface_but_loopback(sandbox_ids, state_root):
    """S9: loopback only."""
    _, seen = hostile(sandbox_ids, state_root, """
        import json, socket
        print(json.dumps(socket.if_nameindex()))
    """)
    assert seen == [[1, "lo"]]


# -- files ---------------------------------------------------------------------


def test_host_files_are_not_there(sandbox_ids, state_root, tmp_path):
    """S4: only /usr, /cap/NAME, /proc, /dev, /tmp and /work exist; /etc/shadow and every other host path do not."""
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json, sys
        outcomes = {}
        for path in sys.argv[1:]:
            try:
                open(path).read(); outcomes[path] = 'read'
            except OSError as error:
                outcomes[path] = errno.errorcode[error.errno]
        print(json.dumps(outcomes))
    """, "/etc/shadow", "/etc/passwd", "/root/.bashrc", str(secret), "/var/log/syslog", "/proc/1/root/etc/shadow")
    assert "read" not in seen.values(), seen
    assert seen["/etc/shadow"] == "ENOENT" and seen[str(secret)] == "ENOENT"


def test_dot_dot_out_of_a_mount_leads_to_the_new_root_not_the_host(sandbox_ids, state_root):
    """S4: the host's root, which pivot_root leaves stacked over the new one, is detached: '..' out of a mount
    of the sandbox (/work, /tmp, /proc, /dev) lands on the new root, and the host's files stay out of reach."""
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json, os
        outcomes = {point: sorted(os.listdir(point + '/..')) for point in ('/', '/work', '/tmp', '/proc', '/dev')}
        try:
            open('/work/../etc/passwd').read(); outcomes['passwd'] = 'read'
        except OSError as error:
            outcomes['passwd'] = errno.errorcode[error.errno]
        print(json.dumps(outcomes))
    """)
    root = seen["/"]
    assert "work" in root and "etc" not in root, root
    assert seen == {"/": root, "/work": root, "/tmp": root, "/proc": root, "/dev": root, "passwd": "ENOENT"}


def test_writes_land_only_in_work_and_tmp(sandbox_ids, state_root):
    """S4: the root, /usr, /dev and /proc refuse writes; /work and /tmp accept them."""
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json
        outcomes = {}
        for path in ('/escape', '/usr/escape', '/usr/bin/true', '/dev/escape', '/proc/escape', '/cap/escape',
                     '/work/ok', '/tmp/ok'):
            try:
                with open(path, 'w') as file:
                    file.write('x')
                outcomes[path] = 'written'
            except OSError as error:
                outcomes[path] = errno.errorcode[error.errno]
        print(json.dumps(outcomes))
    """)
    assert seen.pop("/work/ok") == seen.pop("/tmp/ok") == "written"
    assert "written" not in seen.values(), seen
    assert seen["/escape"] == "EROFS" and seen["/usr/bin/true"] == "EROFS"


def test_a_setuid_file_gives_nothing(sandbox_ids, state_root):
    """S4/S5: every writable mount is nosuid and NoNewPrivs is set, so a setuid bit never raises privilege."""
    _, seen = hostile(sandbox_ids, state_root, """
        import json, os, shutil, subprocess
        shutil.copy('/usr/bin/id', '/tmp/idcopy')
        os.chmod('/tmp/idcopy', 0o4755)
        mounts = {point: bool(os.statvfs(point).f_flag & os.ST_NOSUID) for point in ('/tmp', '/work', '/usr', '/')}
        own = subprocess.run(['/tmp/idcopy', '-u'], capture_output=True, text=True).stdout.strip()
        setuid_root = [path for path in ('/usr/bin/newgrp', '/usr/bin/passwd', '/usr/bin/su')
                       if os.path.exists(path) and os.stat(path).st_mode & 0o4000]
        print(json.dumps({'nosuid': mounts, 'copy_euid': own, 'root_setuid_present': setuid_root}))
    """)
    assert all(seen["nosuid"].values()), seen["nosuid"]
    assert seen["copy_euid"] == str(sandbox_ids[0])


def test_a_read_only_capability_refuses_writes(sandbox_ids, state_root, tmp_path):
    """S4: a capability is read-only even where the host directory is world-writable."""
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o777)
    (data / "existing").write_text("keep")
    os.chmod(data / "existing", 0o666)
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json, os
        outcomes = {}
        for action, call in (('create', lambda: open('/cap/data/new', 'w')),
                             ('overwrite', lambda: open('/cap/data/existing', 'w')),
                             ('remove', lambda: os.unlink('/cap/data/existing')),
                             ('mkdir', lambda: os.mkdir('/cap/data/dir'))):
            try:
                call(); outcomes[action] = 'done'
            except OSError as error:
                outcomes[action] = errno.errorcode[error.errno]
        outcomes['read'] = open('/cap/data/existing').read()
        print(json.dumps(outcomes))
    """, capabilities=[("data", str(data))])
    assert seen == {"create": "EROFS", "overwrite": "EROFS", "remove": "EROFS", "mkdir": "EROFS", "read": "keep"}
    assert sorted(os.listdir(data)) == ["existing"] and (data / "existing").read_text() == "keep"


# -- processes -------------------------------------------------------------------


def test_host_processes_are_invisible(sandbox_ids, state_root):
    """S4/S8: a fresh /proc for the sandbox's pid namespace; no host pid can be seen or signalled."""
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json, os, sys
        pids = sorted(int(name) for name in os.listdir('/proc') if name.isdigit())
        try:
            os.kill(int(sys.argv[1]), 0); host = 'signalled'
        except OSError as error:
            host = errno.errorcode[error.errno]
        print(json.dumps({'pids': pids, 'me': os.getpid(), 'host': host}))
    """, str(os.getpid()))
    assert seen["pids"] == [seen["me"]], "pid 1 is hidden (hidepid) and nothing else runs"
    assert seen["me"] < 10 and seen["host"] == "ESRCH"


def test_pid_one_can_be_neither_killed_nor_traced(sandbox_ids, state_root):
    """S8: the op's parent is pid 1 of the sandbox's own pid namespace, the launcher (not the host's init,
    which would refuse the same signals and ptrace for reasons of its own); signals and ptrace against it
    fail, and the sandbox keeps serving ops."""
    with start(sandbox_ids, state_root) as sandbox:
        first = sandbox.run(["/usr/bin/python3", "-c", """
import ctypes, errno, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
parent = os.getppid()
for number in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT):
    try:
        os.kill(1, number)
    except OSError:
        pass
traced = libc.ptrace(16, 1, 0, 0)
print(json.dumps({'parent': parent, 'ptrace': traced, 'errno': errno.errorcode.get(ctypes.get_errno())}))
"""], env={}, timeout_ms=10_000, stdout_cap=4096, stderr_cap=4096)
        second = sandbox.run(["/usr/bin/true"], env={}, timeout_ms=5000, stdout_cap=64, stderr_cap=64)
    assert first.limit == "OK", first.stderr
    assert json.loads(first.stdout) == {"parent": 1, "ptrace": -1, "errno": "EPERM"}
    assert second.limit == "OK"


@pytest.mark.root
def test_a_launcher_that_leaves_out_the_pid_namespace_never_gets_ready(tmp_path, sandbox_ids, monkeypatch):
    """S8: the starter checks through the host's /proc that the process stage 1 reports is its own child and
    pid 1 of a pid namespace of its own before it releases it; a launcher built to leave CLONE_NEWPID out
    (provisioned as if shipped) fails the start, and no op runs."""
    failure, _ = start_with_launcher_without(tmp_path, sandbox_ids, monkeypatch, "    | syscalls.CLONE_NEWPID\n")
    assert "is not our child and pid 1 of a new namespace" in failure
    assert processes_of(*sandbox_ids) == []


def test_pid_one_descriptors_and_environment_are_closed_to_ops(sandbox_ids, state_root):
    """S8: /proc/1/fd/* and /proc/1/environ cannot be opened (pid 1 is not dumpable)."""
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json, os
        outcomes = {}
        for path in ('/proc/1/environ', '/proc/1/fd/0', '/proc/1/fd/3', '/proc/1/mem', '/proc/1/cmdline'):
            try:
                open(path, 'rb').read(1); outcomes[path] = 'opened'
            except OSError as error:
                outcomes[path] = errno.errorcode[error.errno]
        try:
            outcomes['listdir'] = os.listdir('/proc/1/fd')
        except OSError as error:
            outcomes['listdir'] = errno.errorcode[error.errno]
        print(json.dumps(outcomes))
    """)
    assert "opened" not in seen.values() and not isinstance(seen["listdir"], list), seen


def test_no_control_descriptor_reaches_an_op(sandbox_ids, state_root):
    """S7: only 0 (the sandbox's own /dev/null), 1 and 2 (capture pipes) are open in an op."""
    _, seen = hostile(sandbox_ids, state_root, """
        import json, os
        fds = {}
        for name in os.listdir('/proc/self/fd'):
            try:
                fds[name] = os.readlink(f'/proc/self/fd/{name}')
            except FileNotFoundError:
                pass  # the descriptor listdir itself used
        fds['stdin_is_the_sandbox_dev_null'] = os.path.samestat(os.fstat(0), os.stat('/dev/null'))
        print(json.dumps(fds))
    """)
    assert seen.pop("stdin_is_the_sandbox_dev_null") is True
    assert sorted(seen) == ["0", "1", "2"], seen
    assert seen["0"] == "/dev/null" and seen["1"].startswith("pipe:") and seen["2"].startswith("pipe:")


def test_no_host_variable_and_no_git_variable_reaches_an_op(sandbox_ids, state_root, monkeypatch):
    """S7: the op's environment is exactly the message's allowlist."""
    for name in ("GIT_DIR", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0", "GITHUB_TOKEN", "HOME", "SECRET"):
        monkeypatch.setenv(name, "host-value")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CASE": "1"}
    result = run(sandbox_ids, state_root, ["/usr/bin/cat", "/proc/self/environ"], env=env)
    assert sorted(result.stdout.split(b"\0")[:-1]) == sorted(f"{k}={v}".encode() for k, v in env.items())


def test_a_double_forked_daemon_is_killed_and_counted(sandbox_ids, state_root):
    """S8: pid 1 kills and reaps what outlives the op, and counts it, instead of waiting for it."""
    started = time.monotonic()
    result, seen = hostile(sandbox_ids, state_root, """
        import json, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        os.wait()
        print(json.dumps('parent done'))
    """)
    assert seen == "parent done" and result.limit == "OK"
    assert result.descendants_reaped == 1
    assert time.monotonic() - started < 60, "the daemon was waited for, not killed"


def test_setsid_and_tiocsti_have_no_terminal_to_inject_into(sandbox_ids, state_root):
    """S7/S8: there is no controlling terminal and no tty device."""
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, fcntl, json, os, termios
        if os.fork():
            os._exit(os.wait()[1])
        os.setsid()
        outcomes = {}
        for fd in (0, 1, 2):
            try:
                fcntl.ioctl(fd, termios.TIOCSTI, b'x'); outcomes[fd] = 'injected'
            except OSError as error:
                outcomes[fd] = errno.errorcode[error.errno]
        try:
            os.open('/dev/tty', os.O_RDWR); outcomes['tty'] = 'opened'
        except OSError as error:
            outcomes['tty'] = errno.errorcode[error.errno]
        print(json.dumps(outcomes))
    """)
    assert "injected" not in seen.values() and seen["tty"] == "ENOENT", seen


def test_root_cannot_be_regained(sandbox_ids, state_root):
    """S5: setuid(0), setresuid and setgid(0) all fail."""
    _, seen = hostile(sandbox_ids, state_root, """
        import errno, json, os
        outcomes = {}
        for name, call in (('setuid', lambda: os.setuid(0)), ('setresuid', lambda: os.setresuid(0, 0, 0)),
                           ('setgid', lambda: os.setgid(0)), ('setgroups', lambda: os.setgroups([0]))):
            try:
                call(); outcomes[name] = 'root'
            except OSError as error:
                outcomes[name] = errno.errorcode[error.errno]
        outcomes['ids'] = [os.getresuid(), os.getresgid()]
        print(json.dumps(outcomes))
    """)
    uid, gid = sandbox_ids
    assert seen == {"setuid": "EPERM", "setresuid": "EPERM", "setgid": "EPERM", "setgroups": "EPERM",
                    "ids": [[uid] * 3, [gid] * 3]}


def test_host_sysv_ipc_and_dev_shm_are_unreachable(sandbox_ids, state_root):
    """S9: the host's SysV shared memory and message queues, and /dev/shm, are not in the sandbox."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x0CA5E000 + os.getpid() % 4096
    shm = libc.shmget(key, 4096, 0o1666)
    msg = libc.msgget(key, 0o1666)
    assert shm >= 0 and msg >= 0
    try:
        _, seen = hostile(sandbox_ids, state_root, """
            import ctypes, json, os, sys
            libc = ctypes.CDLL(None, use_errno=True)
            key = int(sys.argv[1])
            print(json.dumps({'shm': libc.shmget(key, 0, 0o666), 'msg': libc.msgget(key, 0o666),
                              'listed': [open(f'/proc/sysvipc/{kind}').read().count('\\n') for kind in ('shm', 'msg')],
                              'dev_shm': os.path.exists('/dev/shm')}))
        """, str(key))
        assert seen == {"shm": -1, "msg": -1, "listed": [1, 1], "dev_shm": False}
    finally:
        libc.shmctl(shm, 0, None)
        libc.msgctl(msg, 0, None)


def test_kill_minus_one_hurts_nothing_outside(sandbox_ids, other_ids, state_root):
    """S8/S9: kill(-1, SIGKILL) reaches only the sandbox's own processes."""
    sentinels = [subprocess.Popen(["/usr/bin/sleep", "30"]),
                 subprocess.Popen(["/usr/bin/sleep", "30"], user=other_ids[0], group=other_ids[1])]
    try:
        result, seen = hostile(sandbox_ids, state_root, """
            import json, os, signal
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing else runs in the sandbox
            print(json.dumps('survived'))
        """)
        assert seen == "survived" and result.limit == "OK"
        assert all(sentinel.poll() is None for sentinel in sentinels)
    finally:
        for sentinel in sentinels:
            sentinel.kill()
            sentinel.wait()


# -- bombs ---------------------------------------------------------------------


def test_a_fork_bomb_is_capped_and_reported_as_pids(sandbox_ids, state_root):
    """S10, S14: pids.max (and NPROC above it) caps the bomb; the refused forks name the class PIDS."""
    result = run(sandbox_ids, state_root, ["/usr/bin/python3", "-c", """
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.05)
"""], limits=Limits(processes=12), timeout_ms=1500)
    assert isinstance(result, OpResult)
    assert result.limit == "PIDS"
    assert result.descendants_reaped >= 1


def test_a_memory_bomb_is_reported_as_memory(sandbox_ids, state_root):
    """S10, S14: the memory cap ends the bomb; the ops cgroup's OOM counter names the class MEMORY."""
    result = run(sandbox_ids, state_root, ["/usr/bin/python3", "-c", """
chunks = []
while True:
    chunks.append(bytearray(b'x') * (1 << 20))
"""], limits=Limits(memory_bytes=48 << 20), timeout_ms=20_000)
    assert isinstance(result, OpResult)
    assert result.limit == "MEMORY" and result.signal == 9


def test_filling_tmp_is_reported_as_disk(sandbox_ids, state_root):
    """S10: /tmp is a capped tmpfs; filling it names the class DISK."""
    result = run(sandbox_ids, state_root, ["/usr/bin/python3", "-c", """
with open('/tmp/fill', 'wb') as file:
    while True:
        file.write(b'x' * 65536)
"""], limits=Limits(tmp_bytes=4 << 20), timeout_ms=20_000)
    assert isinstance(result, OpResult)
    assert result.limit == "DISK" and result.exit_code != 0


def test_an_infinite_loop_is_reported_as_timeout(sandbox_ids, state_root):
    """S10: the wall-clock deadline kills the op and names the class TIMEOUT."""
    started = time.monotonic()
    result = run(sandbox_ids, state_root, ["/usr/bin/python3", "-c", "while True: pass"], timeout_ms=400)
    assert isinstance(result, OpResult)
    assert (result.limit, result.signal) == ("TIMEOUT", 9)
    assert 400 <= result.wall_ms < 5000 and time.monotonic() - started < 10


def test_an_output_flood_is_capped_and_reported_as_output(sandbox_ids, state_root):
    """S10: output beyond its cap is dropped, flagged, and names the class OUTPUT."""
    result = run(sandbox_ids, state_root, ["/usr/bin/yes", "flood"], output=4096, timeout_ms=20_000)
    assert isinstance(result, OpResult)
    assert result.limit == "OUTPUT" and result.stdout_truncated and not result.stderr_truncated
    assert len(result.stdout) == 4096 and result.stdout.startswith(b"flood\nflood\n")
