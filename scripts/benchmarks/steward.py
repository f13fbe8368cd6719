"""What a steward session costs on top of the bare sandbox it runs (run as root).

- session_true_ms: one whole in-process session: stage and journal, a
  sandbox, one `true` op, cleanup proof (one REMOVE_AND_PROVE helper,
  inventories), retirement and seal. Anchor: the bare starter doing the same
  sandbox and op with an in-memory ledger (sandbox_cold's path), measured in
  this run; the ratio is the price of the evidence.
- helper_attempt_ms: one REMOVE_AND_PROVE attempt with nothing to remove
  (start, release, response, reap, four journal records). Anchor: starting the
  same interpreter with `-I -c pass`.
- recover_sealed_ms: `Recovery.recover` of a sealed tombstone (it appends
  nothing). Anchor: reading and verifying that tombstone's journal alone.

The dedicated ids come from CASEBOX_TEST_UID/CASEBOX_TEST_GID when set, else
the configured defaults.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from timing import median_seconds, run_quietly

from executor.cli import config as configuration
from journal.files import load_for_review
from journal.reader import read_journal
from journal.writer import JournalWriter
from steward import helperattempts, provision, recovery
from steward.helper import Request
from steward.ledger import RecordingLedger
from steward.session import Settings, Steward
from steward.starter import Sandbox, Spec

TRUE = ["/usr/bin/true"]


def _ids() -> tuple[int, int]:
    defaults = configuration.load()
    uid = int(os.environ.get("CASEBOX_TEST_UID", defaults.sandbox_uid))
    gid = int(os.environ.get("CASEBOX_TEST_GID", os.environ.get("CASEBOX_TEST_UID", defaults.sandbox_gid)))
    return uid, gid


def _steward(state_root: str) -> Steward:
    uid, gid = _ids()
    return Steward(Settings(state_root=state_root, uid=uid, gid=gid), capability_check=lambda fd, name: None)


def _session(steward: Steward):
    session = steward.open_session("bench")
    session.start_sandbox()
    session.run(TRUE, env={}, timeout_ms=10_000, stdout_cap=1024, stderr_cap=1024)
    session.close_sandbox()
    return session.close()


def session_true_ms() -> dict:
    provision.shipped()
    uid, gid = _ids()
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as directory:
        with _steward(os.path.join(directory, "state")) as steward:
            value = median_seconds(lambda: _session(steward), repeat=15, warmup=2) * 1000

        def bare() -> None:
            with Sandbox.start(Spec(uid, gid), ledger=RecordingLedger(), state_root=os.path.join(directory, "bare")) as sandbox:
                sandbox.run(TRUE, env={}, timeout_ms=10_000, stdout_cap=1024, stderr_cap=1024)

        anchor = median_seconds(bare, repeat=15, warmup=2) * 1000
    return {"metric": "session_true_ms", "value": round(value, 2), "unit": "ms",
            "anchor": "the bare starter: sandbox, true, teardown, in-memory ledger", "anchor_value": round(anchor, 2)}


def helper_attempt_ms() -> dict:
    uid, gid = _ids()
    samples = []
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as directory:
        for index in range(11):
            stage = os.path.join(directory, "stages", f"s{index}")
            os.makedirs(os.path.join(stage, "documents"))
            stage_fd = os.open(stage, os.O_RDONLY | os.O_DIRECTORY)
            documents_fd = os.open(os.path.join(stage, "documents"), os.O_RDONLY | os.O_DIRECTORY)
            try:
                with JournalWriter.create(stage_fd, "journal", journal_id="j", stage_id=f"s{index}", attempt_id="bench") as writer:
                    runner = helperattempts.HelperRunner(writer, documents_fd=documents_fd, shown="documents", reaper="steward")
                    request = Request(f"s{index}", directory, "stages", uid, gid, (), (), 5_000)
                    start = time.perf_counter()
                    (attempt,) = runner.run(request)
                    samples.append(time.perf_counter() - start)
                    if attempt.outcome != "CLEANED":
                        raise SystemExit(f"steward benchmark: the helper answered {attempt.outcome}")
            finally:
                os.close(documents_fd)
                os.close(stage_fd)
    value = statistics.median(samples[1:]) * 1000
    anchor = median_seconds(lambda: run_quietly([sys.executable, "-I", "-c", "pass"]), repeat=10, warmup=1) * 1000
    return {"metric": "helper_attempt_ms", "value": round(value, 2), "unit": "ms",
            "anchor": "python -I -c pass", "anchor_value": round(anchor, 2)}


def recover_sealed_ms() -> dict:
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as directory:
        with _steward(os.path.join(directory, "state")) as steward:
            closed = _session(steward)
            work = recovery.Recovery(steward.root, steward.settings)
            value = median_seconds(lambda: work.recover(closed.stage_id), repeat=30, warmup=2) * 1000

            def verify() -> None:
                read_journal(load_for_review(closed.tombstone)[1], expect_stage_id=closed.stage_id, expect_head=closed.head)

            anchor = median_seconds(verify, repeat=30, warmup=2) * 1000
    return {"metric": "recover_sealed_ms", "value": round(value, 3), "unit": "ms",
            "anchor": "reading and verifying the tombstone's journal alone", "anchor_value": round(anchor, 3)}


METRICS = {"session_true_ms": session_true_ms, "helper_attempt_ms": helper_attempt_ms, "recover_sealed_ms": recover_sealed_ms}
