"""``casebox verify``: one verification attempt, end to end (docs/pipeline.md)."""

from __future__ import annotations

import argparse
import os
import sys

from journal.errors import Refused

VERIFY_SCHEMA = "casebox.verify.v1"


def add_output_options(command: argparse.ArgumentParser) -> None:
    """--json, --summary FILE and --quiet: how verify and demo report (docs/pipeline.md, "What a run shows")."""
    command.add_argument("--json", action="store_true", help="print one JSON object (the report, the paths, the notes) "
                         "instead of the table; annotations then go to stderr")
    command.add_argument("--summary", metavar="FILE", help="also write the Markdown job summary to FILE, a new file")
    command.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_python_option(command: argparse.ArgumentParser) -> None:
    """--python PATH: the case runtime, for verify and demo (docs/pipeline.md, "The runtime")."""
    command.add_argument(
        "--python", metavar="PATH",
        help="the interpreter the cases, the resolver and pip run on: CPython 3.9 or later, such as the one "
        "actions/setup-python installed; its installation prefix, when outside /usr, passes F4 and is mounted "
        "read-only at the same path in every sandbox (default: the interpreter under /usr)",
    )


def verified_value(verified) -> dict:
    """``verify --json``: the report and where everything is."""
    from executor import VERSION

    return {
        "schema": VERIFY_SCHEMA,
        "casebox_version": VERSION,
        "report": verified.report.as_dict(),
        "steward": verified.steward,
        "runtime": verified.runtime,
        "evidence": verified.evidence,
        "tombstone": verified.tombstone,
        "stages": [{"evidence": stage.evidence, "tombstone": stage.tombstone} for stage in verified.stages],
        "notes": list(verified.notes),
    }


def show_paths(verified) -> None:
    from executor.cli.frontend import say
    from journal.untrusted import escape

    for note in verified.notes:
        say(f"note: {escape(note)}")
    say(f"python: {verified.runtime}")
    say(f"steward: {verified.steward}")
    say(f"evidence: {verified.evidence}")
    if verified.tombstone is not None:
        say(f"tombstone: {verified.tombstone}")
    else:
        for index, stage in enumerate(verified.stages, 1):
            say(f"stage {index}: evidence {stage.evidence}, tombstone {stage.tombstone}")


def report_ci(verified, args: argparse.Namespace, command: str) -> None:
    """The job summary and the annotations (executor/cli/reporting.py)."""
    from executor.cli.reporting import publish_ci

    publish_ci(
        verified.report, evidence=[stage.evidence for stage in verified.stages], command=command, summary=args.summary,
        annotate_to=sys.stderr if args.json else sys.stdout,
    )


def show(verified, args: argparse.Namespace) -> int:
    """The verdict table, why each case that is not PASS failed, the notes, the evidence and tombstone paths,
    the job summary and annotations; the exit code of the verdict."""
    from executor.cli.commands.evaluate import EXIT_BY_VERDICT, table
    from executor.cli.frontend import say, say_json
    from executor.cli.reporting import detail_lines

    if args.json:
        say_json(verified_value(verified))
    else:
        for line in table(verified.report) + detail_lines(verified.report):
            say(line)
        show_paths(verified)
        say(f"verdict: {verified.report.verdict}")
    report_ci(verified, args, "casebox verify")
    return EXIT_BY_VERDICT[verified.report.verdict]


# verify --jobs by default: the host's cores, at most this many (a hosted GitHub runner has 4).
DEFAULT_MAX_JOBS = 4


def check_jobs(text: str | None, pool: int) -> int:
    """--jobs N: from 1 to the sandbox pool's size (config sandbox_ids), each stage running at once needs a uid
    of its own (S6); without it, the host's cores up to DEFAULT_MAX_JOBS, and at most the pool."""
    if text is None:
        from steward.api import usable_cores

        return max(1, min(usable_cores(), DEFAULT_MAX_JOBS, pool))
    if not text.isdecimal() or not 1 <= int(text) <= pool:
        raise Refused(
            "--jobs", f"must be a whole number from 1 to the {pool} sandbox uids configured (sandbox_ids), not {text!r}"
        )
    return int(text)


def _verify(args: argparse.Namespace) -> int:
    from executor.cli import config as configuration
    from executor.cli.frontend import interrupt_on_sigterm
    from executor.inputs import resolve_inside
    from executor.transport.preflight import check_attempt, check_sha256
    from executor.evidence.receipts import MAX_ATTEMPT_NUMBER
    from executor.cli.reporting import Progress
    from executor.shard import parse_shard
    from executor.attempt import Attempt, run_attempt
    from journal.createonly import check_creatable
    from steward.forwarder import check_index_url

    attempt_id = check_attempt(args.attempt, "--attempt")
    sha256 = check_sha256(args.sha256, "--sha256")
    if not 1 <= args.attempt_number <= MAX_ATTEMPT_NUMBER:
        raise Refused("--attempt-number", f"must be from 1 to {MAX_ATTEMPT_NUMBER}")
    shard = None if args.shard is None else parse_shard(args.shard, "--shard")
    index_url = None
    if args.index is not None and "://" in args.index:
        index_url = check_index_url(args.index, "--index")
    interrupt_on_sigterm()
    root = args.root
    if args.summary is not None:
        check_creatable(args.summary)
    config = configuration.load(args.config).overridden(state_root=args.state_root)
    jobs = check_jobs(args.jobs, config.sandbox_ids)
    request = Attempt(
        bundle=resolve_inside(args.bundle, root, "--bundle"),
        sha256=sha256,
        plan=resolve_inside(args.plan, root, "--plan"),
        verifier_tree=resolve_inside(args.verifier_tree, root, "--verifier-tree"),
        attempt_id=attempt_id,
        evidence=resolve_inside(args.evidence, root, "--evidence"),
        index=None if args.index is None or index_url else resolve_inside(args.index, root, "--index"),
        shard=shard,
        attempt_number=args.attempt_number,
        index_url=index_url,
        installer=None if args.installer is None else resolve_inside(args.installer, root, "--installer"),
        python=args.python,
        jobs=jobs,
    )
    return show(run_attempt(config, request, progress=Progress(quiet=args.quiet), embedded=args.state_root is not None), args)


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "verify",
        help="run a candidate bundle against a plan in sandboxes and evaluate the evidence (root)",
        description="One verification attempt, as root (docs/pipeline.md): preflight the bundle (size and sha256, "
        "data only); extract it in a sandbox as the dedicated UID and seal it; resolve its dependencies from the "
        "index in a sandbox and fetch them with pip; install once; run every case of the plan (or of "
        "the shard) in a sandbox of its own, each with a receipt; clean up, retire the stage into a sealed "
        "tombstone and write the journal, the seal marker and the receipts into --evidence; evaluate them. "
        "With --jobs N the cases are split over stages (case k to stage k mod s + 1), N running at once, each "
        "doing all of the above in its own session; one evaluation folds every stage's evidence. "
        "The session is the steward daemon's when its socket answers (then this runs as any user in client_uids), "
        "else an embedded steward's, which needs root. "
        "Prints progress on stderr (one line per step and per finished case), then the verdict table, why each "
        "case that is not PASS got its reason (failing tests and the last output line, from the published "
        "output), the evidence and tombstone paths; under GITHUB_ACTIONS=true it also appends a Markdown summary "
        "to $GITHUB_STEP_SUMMARY and prints one ::error (FAIL) or ::warning (UNVERIFIED) per case. Exits like "
        "casebox evaluate: 0 PASS, 1 FAIL, 3 UNVERIFIED; 64 for refused input, 77 when an embedded steward "
        "needs root, 70 when the host or a sandbox failed.",
    )
    command.add_argument("--bundle", metavar="FILE", required=True, help="the candidate bundle (casebox pack)")
    command.add_argument("--sha256", metavar="HEX", required=True, help="the bundle's expected sha256")
    command.add_argument("--plan", metavar="PLAN", required=True, help="the case plan (docs/plan.md)")
    command.add_argument(
        "--verifier-tree", metavar="DIR", required=True,
        help="the verifier tree, read-only at the cases' working directory; must pass F4 (no .git inside)",
    )
    command.add_argument("--attempt", metavar="ID", required=True, help="the attempt id every receipt carries")
    command.add_argument(
        "--evidence", metavar="DIR", required=True,
        help="where the journal, seal.json and the receipts are written: an empty or absent directory",
    )
    command.add_argument(
        "--index", metavar="DIR|URL",
        help="where dependencies are resolved from: a local find-links directory (offline; must pass F4), or the "
        "http(s) URL of a simple index (PEP 503/691; no user:pass@, query or fragment), which gives the resolver "
        "and fetch sandboxes, and only those, the index network: the steward's forwarder to that index and its "
        "file hosts (index_file_hosts), nothing else",
    )
    command.add_argument(
        "--installer", metavar="WHEEL",
        help="the pip wheel (pip-X.Y[.Z]-py3-none-any.whl, 22.2 or later) that resolves and fetches in the sandboxes "
        "(the trees are installed by casebox's own copy of PyPA's installer); "
        "default: the one the runtime bundles. A pip wheel in the index never becomes the installer",
    )
    add_python_option(command)
    command.add_argument("--shard", metavar="i/n", help="run only shard i of n of the plan's cases (casebox plan shard)")
    command.add_argument(
        "--jobs", metavar="N",
        help="run the attempt's cases as stages, N at once on this host, each a session of its own with its own "
        "sandbox uid (from the pool, config sandbox_ids), journal, tombstone and evidence; with more than one stage "
        "--evidence holds one directory per stage (stage-1, stage-2, ...) and one evaluation folds them all. A plan "
        "with more applicable cases than one stage's journal holds is split into more stages, at most N at once. "
        "From 1 to sandbox_ids (default: the cores verify may run on, at most 4 and at most sandbox_ids)",
    )
    command.add_argument(
        "--attempt-number", metavar="N", type=int, default=1,
        help="the run attempt of this attempt id, bound into every receipt (default 1)",
    )
    command.add_argument(
        "--root", metavar="DIR", default=os.curdir,
        help="the perimeter: every path above must resolve inside it, symlinks followed (default: the working directory)",
    )
    command.add_argument(
        "--state-root", metavar="DIR",
        help="run the steward embedded in this process (root) on this state root, even when a daemon answers; "
        "without it the daemon at the configured socket is used when it answers, else an embedded steward on the "
        "configured state root",
    )
    add_output_options(command)
    command.set_defaults(handler=_verify)
