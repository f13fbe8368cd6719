"""``casebox doctor [--json]``: can this host sandbox, and with which configuration?"""

from __future__ import annotations

import argparse

from executor import VERSION
from executor.cli import config as configuration
from executor.cli.doctor import run_checks
from executor.cli.frontend import EXIT_NOT_OK, EXIT_OK, say, say_json
from steward import provision, stateroot

SCHEMA = "casebox.doctor.v1"


def _doctor(args: argparse.Namespace) -> int:
    config = configuration.load(args.config).overridden(state_root=args.state_root)
    stateroot.exists(config.state_root)
    checks = run_checks(config.state_root, config.sandbox_pool)
    ok = all(check.passed for check in checks if check.required)
    settings = config.as_dict()
    settings["launcher_sha256"] = provision.shipped()[1].hex()
    if args.json:
        document = {
            "schema": SCHEMA,
            "casebox_version": VERSION,
            "ok": ok,
            "configuration": settings,
            "checks": [
                {"check": check.name, "status": check.status, "required": check.required, "detail": check.detail}
                for check in checks
            ],
        }
        say_json(document)
    else:
        say(f"casebox doctor: casebox {VERSION}, configuration from {config.source}")
        for name, value in settings.items():
            if name != "source":
                say(f"  {name} = {value}")
        for check in checks:
            optional = "" if check.required else " (not required)"
            say(f"{check.status}  {check.name}{optional}: {check.detail}.")
        say("casebox doctor: this host can sandbox." if ok else "casebox doctor: this host cannot sandbox; fix each required FAIL above.")
    return EXIT_OK if ok else EXIT_NOT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser(
        "doctor",
        help="check whether this host can sandbox (run with sudo)",
        description="Probe every kernel feature and host condition casebox needs: root, open_tree, mount_setattr, "
        "pidfd_open, memfd seals, renameat2 on the state directory's filesystem, new namespaces, an unused "
        "dedicated UID/GID, python-prctl, a root-only launcher runtime; cgroup v2 and root-only launcher sources are "
        "reported, not required. "
        "Prints the effective configuration and one PASS or FAIL line per check with what to do. Exit 0 only "
        "when every required check passes, 1 otherwise; 64 when the state root is there but not a directory.",
    )
    doctor.add_argument("--json", action="store_true", help=f"print one JSON object ({SCHEMA}): schema, casebox_version, "
                        "ok, configuration, checks")
    doctor.add_argument("--state-root", metavar="DIR", help="state root to check (default: configuration)")
    doctor.set_defaults(handler=_doctor)
