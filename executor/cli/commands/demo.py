"""``casebox demo``: the ten-case demo, end to end, checked against the status each case was designed to get."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time

from executor.cli.frontend import EXIT_NOT_OK, EXIT_OK, say
from journal.errors import Refused

# What each case of examples/plan.json is designed to get (examples/README.md says why), and the verdict
# that follows from the fold: a deliberate failure and two limited cases make it UNVERIFIED.
DESIGNED = {
    "pass": "PASS",
    "assertion-failure": "FAIL",
    "import-core": "PASS",
    "import-greet": "PASS",
    "import-extra": "PASS",
    "console-script": "PASS",
    "timeout": "UNVERIFIED",
    "not-applicable": "N/A",
    "output-cap": "UNVERIFIED",
    "network-denied": "PASS",
}
DESIGNED_VERDICT = "UNVERIFIED"
# The installer the demo names (verify --installer): the pip wheel examples/index ships, chosen here on purpose
# (a pip wheel in an index never becomes the installer by itself).
DEMO_INSTALLER = "pip-24.2-py3-none-any.whl"
DEMO_SCHEMA = "casebox.demo.v1"


def examples_directory() -> str:
    """examples/ of the checkout casebox runs from: the demo reads its candidate, plan, verifier tree and index."""
    import executor

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(executor.__file__))), "examples")
    if not os.path.isdir(os.path.join(path, "candidate")):
        raise Refused(path, "is missing: casebox demo runs from a checkout of casebox (scripts/bootstrap installs it there)")
    return path


def fresh_attempt_id() -> str:
    return f"demo-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def _demo(args: argparse.Namespace) -> int:
    from executor.cli import config as configuration
    from executor.transport import pack, wheelbuild
    from executor.cli.commands.evaluate import table
    from executor.cli.commands.verify import report_ci, show_paths, verified_value
    from executor.cli.frontend import interrupt_on_sigterm, require_root, say_json
    from executor.cli.reporting import Progress, detail_lines
    from executor.attempt import Attempt, run_attempt
    from journal.createonly import check_creatable, open_directory, publish_once

    interrupt_on_sigterm()
    if args.summary is not None:
        check_creatable(args.summary)
    config = configuration.load(args.config).overridden(state_root=args.state_root)
    examples = examples_directory()
    require_root("casebox demo runs sandboxes")
    progress = Progress(quiet=args.quiet)
    work = tempfile.mkdtemp(prefix="casebox-demo-")
    os.chmod(work, 0o755)
    progress(f"building the demo candidate in {work}")
    wheels = wheelbuild.build_demo(os.path.join(examples, "candidate"), os.path.join(work, "wheels"))
    bundle = pack.build(pack.read_wheels(sorted(wheels)))
    work_fd = open_directory(work)
    try:
        publish_once(work_fd, "candidate.tar", bundle, mode=0o444, shown=os.path.join(work, "candidate.tar"))
    finally:
        os.close(work_fd)
    request = Attempt(
        bundle=os.path.join(work, "candidate.tar"),
        sha256=pack.coordinate(bundle).sha256,
        plan=os.path.join(examples, "plan.json"),
        verifier_tree=os.path.join(examples, "verifier"),
        attempt_id=fresh_attempt_id(),
        evidence=os.path.join(work, "evidence"),
        index=os.path.join(examples, "index"),
        installer=os.path.join(examples, "index", DEMO_INSTALLER),
        python=args.python,
    )
    verified = run_attempt(config, request, progress=progress, embedded=args.state_root is not None)
    report = verified.report
    got = {result.case_id: result.status for result in report.cases}
    as_designed = got == DESIGNED and report.verdict == DESIGNED_VERDICT
    differing = sorted(case for case in DESIGNED if got.get(case) != DESIGNED[case])
    if args.json:
        say_json({
            **verified_value(verified), "schema": DEMO_SCHEMA, "attempt": request.attempt_id, "bundle": request.bundle,
            "sha256": request.sha256, "designed": DESIGNED, "designed_verdict": DESIGNED_VERDICT, "as_designed": as_designed,
        })
    else:
        say(f"attempt: {request.attempt_id}")
        say(f"bundle: {request.bundle}")
        say(f"sha256: {request.sha256}")
        for line in table(report, DESIGNED) + detail_lines(report):
            say(line)
        show_paths(verified)
        say(f"verdict: {report.verdict} (designed: {DESIGNED_VERDICT})")
        if as_designed:
            say("demo: every case got the status it was designed to get")
    report_ci(verified, args, "casebox demo")
    if as_designed:
        return EXIT_OK
    say(f"demo: not as designed: {', '.join(differing) or 'the verdict'}", file=sys.stderr)
    return EXIT_NOT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "demo",
        help="run the ten-case demo end to end and check every case got its designed status (root)",
        description="As root, from a checkout: build the demo candidate (examples/candidate) into a fresh "
        "directory under /tmp, pack it, and run casebox verify on examples/plan.json with the verifier tree and "
        "offline index of examples/ and a fresh attempt id. When a steward daemon answers on the configured socket "
        "the session is the daemon's (its state root, its tombstone), else an embedded steward's; --state-root "
        "always runs it embedded on that state root. Prints each case's designed and actual status, which steward "
        "served it, the evidence and tombstone paths and the verdict, with progress, the job summary and the "
        "annotations of casebox verify. Exit 0 only when every case got the status it was designed "
        "to get and the verdict is the designed UNVERIFIED (examples/README.md says why); 1 otherwise; 64 for "
        "refused input, 77 when run without root, 70 when the host or a sandbox failed.",
    )
    command.add_argument(
        "--state-root", metavar="DIR",
        help="run the steward embedded on this state root, even when a daemon answers (default: the daemon if it "
        "answers, else embedded on the configured state root)",
    )
    from executor.cli.commands.verify import add_output_options, add_python_option

    add_python_option(command)

    add_output_options(command)
    command.set_defaults(handler=_demo)
