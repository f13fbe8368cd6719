"""S12: the syscall filter: its serialized binding, its rules, its proof, and probes from inside real sandboxes.

The probes call each denied system call by number (ctypes' ``syscall``) from
an op, so no library wrapper stands between the call and the filter; each
asserts the errno docs/launcher.md documents for it. Without the filter most
of them succeed as the dedicated UID, which is what makes each one a test of
the filter and not of the drop.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from ffi_support import serialized
from launcher import seccomp, syscalls
from sandbox_support import contained, hostile, start, state_root  # noqa: F401
from steward.starter import OpResult

root = pytest.mark.root
MACHINE = syscalls.MACHINE


def test_serialized_ffi_matches_the_cdef(tmp_path):
    """S12: the ABI blob in seccomp.py is exactly what cffi serializes from CDEF, so no pycparser runs."""
    positional, keywords = serialized(seccomp.CDEF, "launcher.seccomp", tmp_path)
    assert positional == ("launcher.seccomp",)
    assert keywords == {
        "_version": seccomp._FFI_VERSION, "_types": seccomp._FFI_TYPES, "_globals": seccomp._FFI_GLOBALS,
        "_struct_unions": seccomp._FFI_STRUCT_UNIONS,
    }


@pytest.mark.parametrize("machine, token", [("x86_64", 0xC000003E), ("aarch64", 0xC00000B7)])
def test_every_number_is_the_kernels(machine, token):
    """S12: each filtered call's number, per machine, is the one libseccomp's own tables give for its name. A
    call newer than the host's tables (libseccomp 2.5 knows none of the last three, 2.6 the first two) is
    numbered alike on both machines, and checked as such."""
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef("int seccomp_syscall_resolve_name_arch(uint32_t arch_token, const char *name);")
    library = ffi.dlopen(seccomp.LIBRARY)
    for name, number in seccomp.NUMBERS[machine].items():
        resolved = library.seccomp_syscall_resolve_name_arch(token, name.encode())
        if resolved >= 0:
            assert resolved == number, name
        else:
            assert (name, number) in (("statmount", 457), ("listmount", 458), ("open_tree_attr", 467)), name
    named = {call for calls in seccomp.DENIED.values() for call in calls} | {call for call, _ in seccomp.ARGUMENT_RULES}
    assert named - set(seccomp.NUMBERS[machine]) <= ({"iopl", "ioperm"} if machine == "aarch64" else set())


def test_the_built_program_is_the_shipped_one():
    """S12: libseccomp builds exactly a program whose digest this casebox ships; anything else is refused."""
    data = seccomp.shipped_program()
    assert seccomp.digest(data) in seccomp.SHIPPED_DIGESTS[MACHINE] and len(data) % 8 == 0


def test_the_shipped_digests_are_what_the_script_prints_and_the_docs_list(repo):
    """S12, docs move with code: scripts/seccomp-digest prints this host's digest, which is the one the verified
    versions table of docs/launcher.md lists for this host's libseccomp, and each machine's shipped set is
    exactly the digests that table lists for it: no digest is shipped without a verified version, and none
    documented without being shipped."""
    printed = subprocess.run([str(repo / "scripts" / "seccomp-digest")], capture_output=True, text=True, check=True)
    host = json.loads(printed.stdout)
    assert (host["machine"], host["libseccomp"], host["shipped"]) == (MACHINE, seccomp.library_version(), True)
    assert host["sha256"] == seccomp.digest(seccomp.program())
    documented = _verified_versions(repo)
    assert {digest for machine, versions, digest in documented if machine == MACHINE and host["libseccomp"] in versions} == {host["sha256"]}
    for machine, shipped in seccomp.SHIPPED_DIGESTS.items():
        assert shipped == {digest for documented_machine, _, digest in documented if documented_machine == machine}
    assert {machine for machine, _, _ in documented} <= set(seccomp.SHIPPED_DIGESTS)


def _verified_versions(repo) -> list[tuple[str, tuple[str, ...], str]]:
    """(machine, libseccomp versions, digest) of each row of docs/launcher.md's verified versions table."""
    section = (repo / "docs" / "launcher.md").read_text().split("\n### Verified libseccomp versions\n", 1)[1]
    table = [line for line in section.split("\n#", 1)[0].splitlines() if line.startswith("|")]
    rows = []
    for line in table[2:]:
        machine, versions, _, digest = (cell.strip().strip("`") for cell in line.strip("|").split("|"))
        rows.append((machine, tuple(version.strip() for version in versions.split(",")), digest))
    return rows


def test_every_shipped_digest_is_a_sha256_in_lowercase_hex():
    """S12: a shipped digest is what ``digest`` prints (the receipts' form), so a mistyped one never matches."""
    from executor.evidence.receipts import SHIPPED_FILTER_DIGESTS

    for digest in SHIPPED_FILTER_DIGESTS | {digest for shipped in seccomp.SHIPPED_DIGESTS.values() for digest in shipped}:
        assert re.fullmatch(r"[0-9a-f]{64}", digest), digest


def test_each_digest_of_the_machines_set_is_shipped_and_no_other(monkeypatch):
    """S12: the shipped digests are a set per machine (one per libseccomp build that exports other bytes from
    the rules): the build and the proof accept any digest of the machine's set, never one of another machine."""
    built = seccomp.digest(seccomp.program())
    monkeypatch.setitem(seccomp.SHIPPED_DIGESTS, MACHINE, frozenset({"0" * 64, built}))
    monkeypatch.setitem(seccomp.SHIPPED_DIGESTS, "other-machine", frozenset({"1" * 64}))
    assert seccomp.digest(seccomp.shipped_program()) == built
    for shipped in (built, "0" * 64):
        seccomp.check(_proof(filter_digest=bytes.fromhex(shipped)), 2)
    with pytest.raises(seccomp.FilterError, match=f"SHA-256 is 1{{64}}, not the shipped {min(built, '0' * 64)} or "):
        seccomp.check(_proof(filter_digest=b"\x11" * 32), 2)


def test_a_host_that_builds_other_bytes_gets_a_sentence_not_a_sandbox(monkeypatch):
    """S11, S12: a filter other than the shipped ones (another libseccomp, other rules) is refused by name: the
    sentence names the libseccomp that built it and the script that prints a host's digest."""
    monkeypatch.setitem(seccomp.SHIPPED_DIGESTS, MACHINE, frozenset({"0" * 64}))
    with pytest.raises(seccomp.FilterError, match=(
            rf"libseccomp {re.escape(seccomp.library_version())} builds a syscall filter whose SHA-256 is [0-9a-f]{{64}}, "
            r"not the shipped 0{64}; .*scripts/seccomp-digest prints this host's")):
        seccomp.shipped_program()
    monkeypatch.delitem(seccomp.SHIPPED_DIGESTS, MACHINE)
    with pytest.raises(seccomp.FilterError, match=f"ships no syscall filter digest for {MACHINE}"):
        seccomp.shipped_program()


def test_a_host_without_libseccomp_gets_a_sentence(monkeypatch):
    """S11: no libseccomp, no sandbox, and the sentence says how to fix it."""
    monkeypatch.setattr(seccomp, "LIBRARY", "libseccomp-absent.so.2")
    monkeypatch.setattr(seccomp, "_LOADED", [])
    with pytest.raises(seccomp.FilterError, match=r"cannot be loaded, and casebox never runs a sandbox without its syscall filter; install libseccomp2"):
        seccomp.program()


def _proof(**change) -> dict:
    return {"seccomp": 2, "seccomp_filters": 3, "filter_digest": bytes.fromhex(min(seccomp.SHIPPED_DIGESTS[MACHINE])), **change}


@pytest.mark.parametrize("change, complaint", [
    ({"seccomp": 0}, "Seccomp is 0, not 2"),
    ({"seccomp": 1}, "Seccomp is 1, not 2"),
    ({"seccomp_filters": 2}, "Seccomp_filters is 2, not 3"),
    ({"seccomp_filters": 4}, "Seccomp_filters is 4, not 3"),
    ({"filter_digest": b"\x00" * 32}, "the loaded filter's SHA-256 is 0000"),
    ({"filter_digest": b""}, "the loaded filter's SHA-256 is , not"),
])
def test_the_proof_needs_filter_mode_one_more_filter_and_the_shipped_digest(change, complaint):
    """S12: the one rule the launcher and the starter apply to READY's filter proof."""
    seccomp.check(_proof(), 2)
    with pytest.raises(seccomp.FilterError, match=complaint):
        seccomp.check(_proof(**change), 2)


# -- probes from inside a sandbox ---------------------------------------------------

PROBE = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = json.loads(sys.argv[1])

def call(name, *args):
    result = libc.syscall(ctypes.c_long(NR[name]), *(ctypes.c_long(arg) for arg in args))
    return 'ok' if result >= 0 else errno.errorcode[ctypes.get_errno()]

seen = {}
seen['keyctl'] = call('keyctl', 0, -4, 1)                       # KEYCTL_GET_KEYRING_ID of @u
seen['add_key'] = call('add_key', 0, 0, 0, 0, -3)
child = os.fork()
if child == 0:
    __import__('time').sleep(30)
    os._exit(0)
seen['ptrace_sibling'] = call('ptrace', 0x4206, child, 0, 0)    # PTRACE_SEIZE
seen['process_vm_readv'] = call('process_vm_readv', child, 0, 0, 0, 0, 0)
os.kill(child, 9); os.waitpid(child, 0)
params = ctypes.create_string_buffer(120)
seen['io_uring_setup'] = call('io_uring_setup', 1, ctypes.addressof(params))
seen['bpf'] = call('bpf', 0, 0, 0)
seen['vsock'] = call('socket', 40, 1, 0)
seen['uevent'] = call('socket', 16, 3, 15)                      # NETLINK_KOBJECT_UEVENT
seen['netlink_route'] = call('socket', 16, 3, 0)
seen['packet'] = call('socket', 17, 3, 0)
seen['family_with_upper_bits'] = call('socket', (1 << 32) | 2, 1, 0)
seen['unshare_user'] = call('unshare', 0x10000000)
seen['clone_newuser'] = call('clone', 0x10000000 | 17, 0, 0, 0, 0)
seen['clone3'] = call('clone3', 0, 0)
seen['fsopen'] = call('fsopen', 0, 0)
seen['setns'] = call('setns', 0, 0)
seen['personality_linux32'] = call('personality', 8)
seen['tiocsti_upper_bits'] = call('ioctl', 0, (1 << 32) | 0x5412, 0)
limit = (ctypes.c_ulong * 2)(1, 1)
seen['prlimit_pid_1'] = call('prlimit64', 1, 7, ctypes.addressof(limit), 0)
seen['prlimit_self'] = call('prlimit64', 0, 7, 0, ctypes.addressof(limit))
seen['setpriority_pid_1'] = call('setpriority', 0, 1, 10)
seen['setpriority_user'] = call('setpriority', 2, 0, 10)
seen['sched_setscheduler_pid_1'] = call('sched_setscheduler', 1, 0, ctypes.addressof(limit))
seen['ioprio_set_pid_1'] = call('ioprio_set', 1, 1, 0)
print(json.dumps(seen))
"""

DENIED_AS_DOCUMENTED = {
    "keyctl": "EPERM", "add_key": "EPERM", "ptrace_sibling": "EPERM", "process_vm_readv": "EPERM",
    "io_uring_setup": "EPERM", "bpf": "EPERM", "vsock": "EPERM", "uevent": "EPERM", "packet": "EPERM",
    "family_with_upper_bits": "EPERM", "unshare_user": "EPERM", "clone_newuser": "EPERM", "clone3": "ENOSYS",
    "fsopen": "EPERM", "setns": "EPERM", "personality_linux32": "EPERM", "tiocsti_upper_bits": "EPERM",
    "prlimit_pid_1": "EPERM", "setpriority_pid_1": "EPERM", "setpriority_user": "EPERM",
    "sched_setscheduler_pid_1": "EPERM", "ioprio_set_pid_1": "EPERM",
    # allowed, and the probe's control: the calls still work where the rules let them
    "netlink_route": "ok", "prlimit_self": "ok",
}


@root
@pytest.mark.usefixtures("contained")
def test_each_denied_call_gets_its_documented_errno_inside_a_sandbox(sandbox_ids, state_root):
    """S12: from an op, every denied call of the probe fails with the errno docs/launcher.md gives it, the
    allowed neighbours (a route netlink socket, a prlimit of itself) still work, and pid 1 keeps serving."""
    import json

    result, seen = hostile(sandbox_ids, state_root, PROBE, json.dumps(seccomp.NUMBERS[MACHINE]))
    assert result.limit == "OK", result.stderr
    assert seen == DENIED_AS_DOCUMENTED


@root
@pytest.mark.usefixtures("contained")
@pytest.mark.skipif(MACHINE != "x86_64", reason="the i386 ABI and x32 exist on x86_64 only")
def test_a_call_of_another_abi_kills_the_process(sandbox_ids, state_root, tmp_path):
    """S12: the architecture is pinned: the i386 ABI through int 0x80 and an x32 call (the x32 bit set) each
    kill the calling process with SIGSYS instead of reaching the kernel."""
    probe = tmp_path / "probe"
    probe.mkdir()
    source = tmp_path / "int80.c"
    source.write_text('#include <stdio.h>\nint main(void) { long r; __asm__ volatile ("int $0x80" : "=a"(r) : "a"(20L) : "memory");'
                      ' printf("%ld\\n", r); return 0; }\n')
    subprocess.run(["gcc", "-O1", "-o", str(probe / "int80"), str(source)], check=True)
    with start(sandbox_ids, state_root, capabilities=[("probe", str(probe))]) as sandbox:
        i386 = sandbox.run(["/cap/probe/int80"], env={}, timeout_ms=10_000, stdout_cap=4096, stderr_cap=4096)
        x32 = sandbox.run(["/usr/bin/python3", "-c", "import ctypes; print(ctypes.CDLL(None).syscall(0x40000000 | 39))"],
                          env={}, timeout_ms=10_000, stdout_cap=4096, stderr_cap=4096)
    for result in (i386, x32):
        assert isinstance(result, OpResult)
        assert (result.limit, result.signal, result.stdout) == ("SIGNALLED", signal.SIGSYS, b""), result


@root
@pytest.mark.usefixtures("contained")
def test_a_hundred_threads_run_under_the_default_limits(sandbox_ids, state_root):
    """S14: thread pools of real test suites run (more-itertools starts 100 threads): no address-space rlimit
    and the default process cap leave room for them; glibc's clone3 falls back to clone on ENOSYS."""
    result, seen = hostile(sandbox_ids, state_root, """
        import json, threading
        gate = threading.Barrier(101)
        threads = [threading.Thread(target=gate.wait) for _ in range(100)]
        for thread in threads:
            thread.start()
        gate.wait()
        for thread in threads:
            thread.join()
        print(json.dumps(len(threads)))
    """)
    assert (result.limit, seen) == ("OK", 100), result.stderr


def test_the_starter_refuses_ready_without_the_filter_proved(tmp_path):
    """S12: the starter checks READY's filter proof again, with the launcher's rule, before it ACKs; a pid 1
    that reports no filter (or another one) gets no op and nothing is journalled as ready."""
    import socket

    from launcher import protocol
    from launcher.protocol import Channel, ProtocolError
    from steward.ledger import RecordingLedger
    from steward.starter import Sandbox, Spec
    from test_drop_proof import GID, UID, filtered, proved

    for change in ({"seccomp": 0, "seccomp_filters": seccomp.inherited_filters()}, {"filter_digest": b"\x01" * 32}):
        ledger = RecordingLedger()
        sandbox = Sandbox(Spec(UID, GID), ledger, str(tmp_path))
        near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sandbox.channel = Channel(near, protocol.STARTER)
        Channel(far, protocol.LAUNCHER).send("READY", proc_hidepid=True, **{**proved(), **filtered(), **change})
        with pytest.raises(ProtocolError, match="the syscall filter is not proved"):
            sandbox._bootstrap()
        far.setblocking(False)
        with pytest.raises(BlockingIOError):
            far.recv(64)  # no ACK was sent
        assert ledger.records == []
        near.close()
        far.close()


@root
@pytest.mark.usefixtures("contained")
def test_ready_and_the_journal_carry_the_shipped_filter(sandbox_ids, state_root):
    """S12: a real sandbox's READY proves Seccomp 2, one filter more than the starter's own and the shipped
    digest, and the ledger records that digest for its pid 1 before any op."""
    from steward.ledger import RecordingLedger

    ledger = RecordingLedger()
    with start(sandbox_ids, state_root, ledger=ledger) as sandbox:
        ready = sandbox.ready
    assert (ready["seccomp"], ready["seccomp_filters"]) == (2, seccomp.inherited_filters() + 1)
    built = seccomp.digest(seccomp.shipped_program())
    assert ready["filter_digest"].hex() == built
    readies = [record for record in ledger.records if record[0] == "sandbox_ready"]
    assert readies == [("sandbox_ready", f"{sandbox.id}.init", built)]
    assert ledger.records.index(readies[0]) < min(
        index for index, record in enumerate(ledger.records) if record[0] == "process_terminal" and record[1].endswith(".init"))
