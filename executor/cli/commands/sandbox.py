"""``casebox sandbox run``: one op in a fresh sandbox, for tests and debugging (docs/launcher.md)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import sys

from executor.cli import config as configuration
from executor.capability import open_capability
from executor.environ import SANDBOX_ENV, forbidden_variable
from executor.cli.frontend import EXIT_OK, InternalFailure, require_root, say_json
from journal.errors import Refused
from journal.strictjson import decode_lossy
from launcher.protocol import MAX_OUTPUT_CAP
from launcher.rendezvous import is_capability_target
from steward.api import DEFAULT_PROCESSES, MIB, Limits
from steward.failure import SandboxFailure
from steward.ledger import RecordingLedger
from steward.starter import OpNotStarted, Sandbox, Spec

DEFAULT_TIMEOUT_MS = 60_000
DEFAULT_OUTPUT_KIB = 64


def _bounded(low: int, high: int):
    def parse(text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,10}", text) or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}")
        return int(text)

    return parse


def _capability(text: str) -> tuple[str, str]:
    name, separator, directory = text.partition("=")
    if not separator or not is_capability_target(f"/cap/{name}"):
        raise argparse.ArgumentTypeError(
            f"{text!r} must be NAME=DIR, NAME 1 to 64 of a-z 0-9 _ -, starting with a letter or digit"
        )
    if not directory.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: DIR must be an absolute path")
    return name, directory


def _variable(text: str) -> tuple[str, str]:
    name, separator, value = text.partition("=")
    if not separator or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name) or "\x00" in value:
        raise argparse.ArgumentTypeError(f"{text!r} must be NAME=VALUE with a shell-style NAME")
    return name, value


def sandbox_env(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """The op's whole environment: the fixed sandbox defaults, then each allowed --env (S7)."""
    env = dict(SANDBOX_ENV)
    for name, value in pairs:
        if forbidden_variable(name):
            raise Refused(f"--env {name}", "GIT_* variables and credentials never enter a sandbox")
        env[name] = value
    return env


def _checked_capabilities(pairs: list[tuple[str, str]], state_root: str) -> list[tuple[str, int]]:
    """F4: each --ro directory passes the capability boundary; the caller closes the descriptors."""
    names = [name for name, _ in pairs]
    for name in names:
        if names.count(name) > 1:
            raise Refused(f"--ro {name}", "names a capability twice")
    checked: list[tuple[str, int]] = []
    try:
        for name, directory in pairs:
            try:
                checked.append((name, open_capability(directory, state_root=state_root)))
            except Refused as refusal:
                flag = f"--ro {name}={directory}"
                raise (Refused(flag, refusal.rule) if refusal.where == directory else refusal.under(flag)) from None
    except BaseException:
        for _, fd in checked:
            os.close(fd)
        raise
    return checked


def _spec(args: argparse.Namespace, config: configuration.Config, capabilities: list[tuple[str, int]]) -> Spec:
    return Spec(
        uid=config.sandbox_uid,
        gid=config.sandbox_gid,
        capabilities=tuple(capabilities),
        limits=Limits(
            tmp_bytes=args.tmp_mb * MIB,
            work_bytes=args.work_mb * MIB,
            memory_bytes=args.memory_mb * MIB,
            processes=args.pids,
        ),
    )


@dataclasses.dataclass(frozen=True)
class LostOp:
    """An op whose pid 1 died under a limit the kernel counted (S14): its class, and no status nobody read."""

    limit: str
    wait_status: None = None
    exit_code: None = None
    signal: None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    descendants_reaped: None = None
    wall_ms: None = None
    cpu_ms: None = None
    max_rss_kib: None = None
    memory_peak_bytes: None = None


def report(result, uid: int, gid: int) -> dict:
    return {
        "class": result.limit,
        "wait_status": result.wait_status,
        "exit_code": result.exit_code,
        "signal": result.signal,
        "uid": uid,
        "gid": gid,
        "stdout": decode_lossy(result.stdout),
        "stderr": decode_lossy(result.stderr),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "descendants_reaped": result.descendants_reaped,
        "wall_ms": result.wall_ms,
        "cpu_ms": result.cpu_ms,
        "max_rss_kib": result.max_rss_kib,
        "memory_peak_bytes": result.memory_peak_bytes,
    }


def _run(args: argparse.Namespace) -> int:
    if args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    if not args.argv:
        raise Refused("ARGV", "is missing; give the program and its arguments after --")
    config = configuration.load(args.config).overridden(
        sandbox_uid=args.uid, sandbox_gid=args.gid, state_root=args.state_root
    )
    env = sandbox_env(args.env)
    capabilities = _checked_capabilities(args.ro, config.state_root)
    try:
        spec = _spec(args, config, capabilities)
        require_root("casebox sandbox run creates namespaces and mounts")
        cap = args.output_kib * 1024
        try:
            with Sandbox.start(spec, ledger=RecordingLedger(), state_root=config.state_root) as sandbox:
                result = sandbox.run(
                    args.argv, env=env, cwd="/work", timeout_ms=args.timeout_ms, stdout_cap=cap, stderr_cap=cap
                )
        except SandboxFailure as failure:
            if failure.limit is None:
                raise InternalFailure(f"the sandbox failed: {failure}.") from None
            result = LostOp(failure.limit)
    finally:
        for _, fd in capabilities:
            os.close(fd)
    if isinstance(result, OpNotStarted):
        reason = os.strerror(result.errno) if result.errno else "unknown error"
        raise Refused(
            f"ARGV[0] {args.argv[0]}",
            f"cannot be started in the sandbox ({result.step} failed: {errno.errorcode.get(result.errno, '?')} {reason}); "
            "only /usr, /cap/NAME, /tmp and /work exist there",
        )
    say_json(report(result, spec.uid, spec.gid))
    sys.stdout.flush()
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "sandbox", help="run one op in a fresh sandbox (root)", description="Sandbox tools (docs/launcher.md)."
    )
    commands = group.add_subparsers(dest="sandbox_command", metavar="COMMAND")
    commands.required = True
    run = commands.add_parser(
        "run",
        help="run ARGV once in a fresh sandbox and print one JSON object",
        description="As root: provision a launcher, build a sandbox (new namespaces, the host /usr read-only, "
        "each --ro NAME=DIR read-only at /cap/NAME, size-capped tmpfs /tmp and /work, loopback only), drop to "
        "the dedicated UID/GID, run ARGV once with cwd /work and no shell, tear everything down, and print one "
        "JSON object: class, wait_status, exit_code, signal, uid, gid, stdout, stderr, stdout_truncated, "
        "stderr_truncated, descendants_reaped, wall_ms, cpu_ms, max_rss_kib, memory_peak_bytes (the op's cgroup "
        "memory high-water mark, null where the kernel keeps none). Exit 0 if the op ran (whatever "
        "its status; an op whose pid 1 died while its cgroup counted an OOM kill is class MEMORY with null "
        "status fields), 64 for refused input (including an ARGV[0] that cannot be started), 70 if the sandbox failed.",
    )
    run.add_argument("--uid", type=_bounded(1, configuration.MAX_ID), help="dedicated sandbox uid (default: configuration)")
    run.add_argument("--gid", type=_bounded(1, configuration.MAX_ID), help="dedicated sandbox gid (default: configuration)")
    run.add_argument(
        "--ro", type=_capability, action="append", default=[], metavar="NAME=DIR",
        help="bind DIR read-only at /cap/NAME (repeatable); DIR must pass the capability boundary: no .git or "
        "state directory inside, no symlink leaving it, not the state root (docs/receipts.md)",
    )
    run.add_argument("--tmp-mb", type=_bounded(1, 65536), default=64, metavar="N", help="size of /tmp (default 64)")
    run.add_argument("--work-mb", type=_bounded(1, 65536), default=256, metavar="N", help="size of /work (default 256)")
    run.add_argument("--memory-mb", type=_bounded(16, 65536), default=512, metavar="N", help="memory cap (default 512)")
    run.add_argument(
        "--pids", type=_bounded(1, 4096), default=DEFAULT_PROCESSES, metavar="N",
        help=f"cap on the op's processes and threads (default {DEFAULT_PROCESSES})",
    )
    run.add_argument(
        "--timeout-ms", type=_bounded(1, 3_600_000), default=DEFAULT_TIMEOUT_MS, metavar="N",
        help=f"wall-clock limit (default {DEFAULT_TIMEOUT_MS})",
    )
    run.add_argument(
        "--output-kib", type=_bounded(1, MAX_OUTPUT_CAP // 1024), default=DEFAULT_OUTPUT_KIB, metavar="N",
        help=f"cap on each of stdout and stderr (default {DEFAULT_OUTPUT_KIB})",
    )
    run.add_argument(
        "--env", type=_variable, action="append", default=[], metavar="K=V",
        help="add one environment variable to the op's PATH, HOME=/work, TMPDIR=/tmp and LANG=C.UTF-8; "
        "GIT_* and credentials are refused",
    )
    run.add_argument("--state-root", metavar="DIR", help="state root for the staging directory (default: configuration)")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- ARGV", help="the program and its arguments")
    run.set_defaults(handler=_run)
