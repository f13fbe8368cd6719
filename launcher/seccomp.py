"""S12: the sandbox's syscall filter: its rules, the program libseccomp builds from them, its install and its proof.

The rules are the table below (docs/launcher.md, "S12: the syscall filter").
The starter builds the BPF program once per process with libseccomp
(``program``), bound through cffi in out-of-line ABI mode like
launcher/syscalls.py: ``_FFI`` is what cffi serializes from ``CDEF``
(tests/test_seccomp.py regenerates it), so no compiler and no pycparser run.
Every number in the table is the machine's own, so libseccomp translates
nothing, and its tables (which lag the kernel) never decide what is denied.

pid 1 loads exactly those bytes with seccomp(2) after the drop (``install``),
so every op inherits the filter, and READY carries what the kernel then
reports (``observe``): ``Seccomp: 2``, the filter count, and the SHA-256 of
the program it loaded. ``check`` is the one rule that judges them, in the
launcher before READY and in the starter before its ACK.

A call from another architecture (the i386 ABI through ``int 0x80``, x32 on
x86_64, arm32 on aarch64) kills the process: libseccomp's bad-architecture
action, and its x32 test on x86_64, in the built program.
"""

import _struct
import errno
import os

import _cffi_backend

from launcher import syscalls
from launcher.digest import sha256
from launcher.vocabulary import SHIPPED_DIGESTS

CDEF = """
struct scmp_version { unsigned int major; unsigned int minor; unsigned int micro; };
struct scmp_arg_cmp { unsigned int arg; int op; uint64_t datum_a; uint64_t datum_b; };
const struct scmp_version *seccomp_version(void);
void *seccomp_init(uint32_t def_action);
void seccomp_release(void *ctx);
int seccomp_attr_set(void *ctx, int attr, uint32_t value);
int seccomp_rule_add_array(void *ctx, uint32_t action, int syscall, unsigned int arg_cnt, const struct scmp_arg_cmp *arg_array);
int seccomp_export_bpf(const void *ctx, int fd);
"""
_FFI_VERSION = 0x2601
_FFI_TYPES = (
    b"\x00\x00\x02\x0D\x00\x00\x1C\x03\x00\x00\x07\x01\x00\x00\x16\x01\x00\x00\x00\x0F\x00\x00\x02\x0D\x00\x00\x01\x11"
    b"\x00\x00\x16\x01\x00\x00\x07\x01\x00\x00\x08\x01\x00\x00\x18\x03\x00\x00\x00\x0F\x00\x00\x02\x0D\x00\x00\x1C\x03"
    b"\x00\x00\x07\x01\x00\x00\x00\x0F\x00\x00\x19\x0D\x00\x00\x00\x0F\x00\x00\x01\x0D\x00\x00\x16\x01\x00\x00\x00\x0F"
    b"\x00\x00\x1C\x0D\x00\x00\x01\x11\x00\x00\x00\x0F\x00\x00\x00\x09\x00\x00\x1A\x03\x00\x00\x01\x09\x00\x00\x18\x01"
    b"\x00\x00\x00\x01"
)
_FFI_GLOBALS = (
    b"\x00\x00\x00\x23seccomp_attr_set", 0, b"\x00\x00\x0C\x23seccomp_export_bpf", 0, b"\x00\x00\x12\x23seccomp_init", 0,
    b"\x00\x00\x15\x23seccomp_release", 0, b"\x00\x00\x05\x23seccomp_rule_add_array", 0,
    b"\x00\x00\x10\x23seccomp_version", 0,
)
_FFI_STRUCT_UNIONS = (
    (b"\x00\x00\x00\x18\x00\x00\x00\x02scmp_arg_cmp", b"\x00\x00\x09\x11arg", b"\x00\x00\x02\x11op",
     b"\x00\x00\x1B\x11datum_a", b"\x00\x00\x1B\x11datum_b"),
    (b"\x00\x00\x00\x1A\x00\x00\x00\x02scmp_version", b"\x00\x00\x09\x11major", b"\x00\x00\x09\x11minor",
     b"\x00\x00\x09\x11micro"),
)
_FFI = _cffi_backend.FFI(
    "launcher.seccomp", _version=_FFI_VERSION, _types=_FFI_TYPES, _globals=_FFI_GLOBALS,
    _struct_unions=_FFI_STRUCT_UNIONS,
)
LIBRARY = "libseccomp.so.2"
INSTALL_HINT = "install libseccomp2 (apt-get install libseccomp2, which scripts/bootstrap does)"

# libseccomp's constants (seccomp.h).
_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_ACT_ERRNO = 0x00050000
_ATTR_ACT_BADARCH = 2
NE, EQ, GE, MASKED_EQ = 1, 4, 5, 7
_LOW_32 = 0xFFFFFFFF

# The number of each filtered call, per machine (the kernel's own tables; x86_64 has no iopl/ioperm twin on
# aarch64). tests/test_seccomp.py compares them with libseccomp's names for every call it knows.
NUMBERS = {
    "x86_64": {
        "ioctl": 16, "ptrace": 101, "syslog": 103, "personality": 135, "setpriority": 141, "sched_setparam": 142,
        "sched_setscheduler": 144, "pivot_root": 155, "adjtimex": 159, "chroot": 161, "acct": 163,
        "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
        "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
        "sched_setaffinity": 203, "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249,
        "keyctl": 250, "ioprio_set": 251, "unshare": 272, "perf_event_open": 298, "prlimit64": 302,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "sched_setattr": 314,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "socket": 41, "socketpair": 53, "clone": 56,
    },
    "aarch64": {
        "ioctl": 29, "ioprio_set": 30, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "quotactl": 60,
        "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106,
        "clock_settime": 112, "syslog": 116, "ptrace": 117, "sched_setparam": 118, "sched_setscheduler": 119,
        "sched_setaffinity": 122, "setpriority": 140, "reboot": 142, "settimeofday": 170, "adjtimex": 171,
        "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220,
        "swapon": 224, "swapoff": 225, "perf_event_open": 241, "prlimit64": 261, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270,
        "process_vm_writev": 271, "finit_module": 273, "sched_setattr": 274, "bpf": 280, "userfaultfd": 282,
        "kexec_file_load": 294,
    },
}
# Numbered alike on both (the unified table from 5.1 on); libseccomp 2.5 knows the last four by number only.
for _table in NUMBERS.values():
    _table.update({
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
        "mount_setattr": 442, "quotactl_fd": 443, "statmount": 457, "listmount": 458, "open_tree_attr": 467,
    })
del _table

# What the filter denies, and with which errno: whole calls, then calls by their arguments. Every rule is one
# libseccomp rule; two conditions of one rule are on two different arguments (libseccomp 2.5 allows no more).
DENIED = {
    errno.EPERM: (
        # kernel objects shared beyond the sandbox
        "keyctl", "add_key", "request_key",
        # reaching into another process
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
        # new kernel surface
        "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd",
        "mount", "umount2", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
        "statmount", "listmount", "open_tree_attr", "pivot_root", "chroot", "setns", "unshare",
        # the machine's own state
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
        "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "name_to_handle_at", "open_by_handle_at",
        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    ),
    # glibc's pthread_create and posix_spawn try clone3 first and fall back to clone on ENOSYS only.
    errno.ENOSYS: ("clone3",),
}
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
ALLOWED_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
# Linux knows families 0 to 45 (AF_MCTP); every number from 46 on, and any value with upper bits, is denied.
FAMILY_LIMIT = 46
NETLINK_ROUTE = 0
PRIO_PROCESS = 0
IOPRIO_WHO_PROCESS = 1
PER_LINUX = 0


def _argument_rules() -> tuple[tuple[str, tuple[tuple[int, int, int, int], ...]], ...]:
    """(call, conditions) denied with EPERM; a condition is libseccomp's (argument, comparison, datum_a, datum_b):
    (value, 0) for a plain comparison, (mask, value) for MASKED_EQ."""
    rules: list[tuple[str, tuple[tuple[int, int, int, int], ...]]] = []
    # clone with any CLONE_NEW* flag: each flag its own rule (the flags are the first argument on both machines).
    rules += [("clone", ((0, MASKED_EQ, flag, flag),)) for flag in CLONE_NEW_FLAGS.values()]
    rules.append(("personality", ((0, NE, PER_LINUX, 0),)))
    # The request is an unsigned int: only its low 32 bits count, so a value with upper bits set is caught too.
    rules += [("ioctl", ((1, MASKED_EQ, _LOW_32, request),)) for request in (TIOCSTI, TIOCLINUX)]
    for call in ("socket", "socketpair"):
        rules += [(call, ((0, EQ, family, 0),)) for family in range(FAMILY_LIMIT) if family not in ALLOWED_FAMILIES]
        rules.append((call, ((0, GE, FAMILY_LIMIT, 0),)))
        rules.append((call, ((0, EQ, AF_NETLINK, 0), (2, NE, NETLINK_ROUTE, 0))))
    # Acting on another pid: only 0 (the caller itself) is allowed.
    rules += [(call, ((0, NE, 0, 0),)) for call in ("prlimit64", "sched_setscheduler", "sched_setparam",
                                                      "sched_setaffinity", "sched_setattr")]
    rules += [("setpriority", ((0, NE, PRIO_PROCESS, 0),)), ("setpriority", ((1, NE, 0, 0),))]
    rules += [("ioprio_set", ((0, NE, IOPRIO_WHO_PROCESS, 0),)), ("ioprio_set", ((1, NE, 0, 0),))]
    return tuple(rules)


ARGUMENT_RULES = _argument_rules()



class FilterError(Exception):
    """No filter can be built, installed or proved on this host; the sentence says why (S11)."""


_LOADED = []


def _library():
    """libseccomp, opened once and kept: a pointer it returns is valid only while the library stays loaded."""
    if _LOADED:
        return _LOADED[0]
    try:
        _LOADED.append(_FFI.dlopen(LIBRARY))
        return _LOADED[0]
    except OSError:
        raise FilterError(f"{LIBRARY} cannot be loaded, and casebox never runs a sandbox without its syscall filter; "
                          f"{INSTALL_HINT}") from None


def library_version() -> str:
    version = _library().seccomp_version()
    return f"{version.major}.{version.minor}.{version.micro}"


def program(machine: str = syscalls.MACHINE) -> bytes:
    """The filter's BPF program for this machine, as libseccomp exports it (``seccomp_export_bpf``)."""
    if machine not in NUMBERS:
        raise FilterError(f"casebox pins the syscall filter to x86_64 or aarch64, not {machine}")
    numbers = NUMBERS[machine]
    library = _library()
    context = library.seccomp_init(_ACT_ALLOW)
    if context == _FFI.NULL:
        raise FilterError("libseccomp could not start a filter (seccomp_init failed)")
    try:
        _check(library.seccomp_attr_set(context, _ATTR_ACT_BADARCH, _ACT_KILL_PROCESS), "the bad-architecture action")
        for code, calls in DENIED.items():
            for call in calls:
                if call in numbers:
                    _check(library.seccomp_rule_add_array(context, _ACT_ERRNO | code, numbers[call], 0, _FFI.NULL), call)
        for call, conditions in ARGUMENT_RULES:
            compared = _FFI.new("struct scmp_arg_cmp[]", list(conditions))
            _check(library.seccomp_rule_add_array(context, _ACT_ERRNO | errno.EPERM, numbers[call], len(conditions), compared), call)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            _check(library.seccomp_export_bpf(context, write_end), "the export")
            os.close(write_end)
            write_end = -1
            data = b""
            while chunk := os.read(read_end, 1 << 16):
                data += chunk
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
    finally:
        library.seccomp_release(context)
    return data


def _check(result: int, what: str) -> None:
    if result != 0:
        raise FilterError(f"libseccomp refused {what} ({os.strerror(-result)})")


def digest(data: bytes) -> str:
    return sha256(data).hexdigest()


def shipped_program(machine: str = syscalls.MACHINE) -> bytes:
    """``program``, refused unless its digest is one this casebox ships for the machine."""
    data = program(machine)
    if not SHIPPED_DIGESTS.get(machine):
        raise FilterError(f"this casebox ships no syscall filter digest for {machine}; "
                          "add the one scripts/seccomp-digest prints there to launcher.vocabulary.SHIPPED_DIGESTS")
    if (reason := unshipped_reason(digest(data), machine)) is not None:
        raise FilterError(
            f"libseccomp {library_version()} builds a syscall filter whose {reason}; casebox runs only a filter "
            f"it ships, scripts/seccomp-digest prints this host's, and docs/launcher.md (S12, \"Verified libseccomp "
            f"versions\") says how a version is added"
        )
    return data


def unshipped_reason(hex_digest: str, machine: str) -> str | None:
    """None when the digest is one this casebox ships for the machine, else how it differs: the one rule
    ``shipped_program`` and ``check`` apply."""
    shipped = SHIPPED_DIGESTS.get(machine, frozenset())
    if hex_digest in shipped:
        return None
    return f"SHA-256 is {hex_digest}, not the shipped {' or '.join(sorted(shipped)) or 'none'}"


_SOCK_FPROG = _struct.Struct("=H6xQ")
_SECCOMP_SET_MODE_FILTER = 1
_BPF_INSTRUCTION = 8


def install(data: bytes) -> None:
    """Load the program with seccomp(2); no_new_privs must already be set (the drop sets it)."""
    if not data or len(data) % _BPF_INSTRUCTION:
        raise FilterError("the syscall filter program is empty or not whole instructions")
    instructions = syscalls.buffer(data)
    fprog = syscalls.buffer(_SOCK_FPROG.pack(len(data) // _BPF_INSTRUCTION, syscalls.address(instructions)))
    syscalls.seccomp(_SECCOMP_SET_MODE_FILTER, 0, fprog)


def observe(data: bytes) -> dict:
    """What the kernel says about this process's filters, and the digest of the program loaded, as READY carries them."""
    status = {}
    with open("/proc/self/status", "rb") as file:
        for line in file.read().decode("ascii", "replace").splitlines():
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return {
        "seccomp": _number(status.get("Seccomp")),
        "seccomp_filters": _number(status.get("Seccomp_filters")),
        "filter_digest": sha256(data).digest(),
    }


def inherited_filters() -> int:
    """How many filters this thread already runs under (a steward under systemd's SystemCallFilter has some)."""
    with open("/proc/thread-self/status", "rb") as file:
        for line in file.read().decode("ascii", "replace").splitlines():
            key, _, value = line.partition(":")
            if key == "Seccomp_filters":
                return _number(value.strip())
    return 0


def _number(text: str | None) -> int:
    # A missing or unreadable line reads as a value the check never accepts.
    return int(text) if text is not None and text.isdigit() else 0xFFFFFFFF


def check(observations: dict, inherited: int, machine: str = syscalls.MACHINE) -> None:
    """Refuse READY unless the shipped filter is loaded on top of ``inherited`` ones: the one rule, used by the
    launcher before READY and by the starter before its ACK."""
    problems = []
    if observations["seccomp"] != 2:
        problems.append(f"Seccomp is {observations['seccomp']}, not 2 (filter mode)")
    if observations["seccomp_filters"] != inherited + 1:
        problems.append(f"Seccomp_filters is {observations['seccomp_filters']}, not {inherited + 1} "
                        f"(the {inherited} inherited and casebox's)")
    if (reason := unshipped_reason(observations["filter_digest"].hex(), machine)) is not None:
        problems.append(f"the loaded filter's {reason}")
    if problems:
        raise FilterError("the syscall filter is not proved: " + "; ".join(problems))
