"""journal_replay_html and journal_replay_text: `casebox journal replay` on a full journal, against reading it.

The journal is a steward session's shape (docs/launcher.md), repeated until
the reserve: per case an output tmpfs on the host, a sandbox (launcher, nine
mounts, pid 1, the old root unmounted, one op, the statuses) and the output's
unmount; journal.py's ``full_journal`` pads it to the reserve and adds both
retirement records: exactly 262,144 bytes. Each metric is the milliseconds to
read the bytes and render them (what the command does once the file is
loaded), against read_journal alone over the same bytes (what `casebox journal
verify` does) in the same run. No goal is set; the ratio is the rendering's
cost in units of verifying.
"""

from __future__ import annotations

import importlib.util
import pathlib

from journal.format import CAP
from journal.reader import read_journal
from journal.replay import render_text
from journal.replay_html import render_html
from journal.writer import JournalWriter
from timing import median_seconds

TREES = ("/usr", "/cap/site", "/cap/verifier", "/out/junit")
LATE = (("/proc", "proc"), ("/dev", "tmpfs"), ("/tmp", "tmpfs"), ("/work", "tmpfs"))


def _case(writer: JournalWriter, number: int) -> None:
    """One case in the order the steward writes it (cf. a demo tombstone's journal)."""
    sandbox, output = f"bench-{number}", f"/var/lib/casebox/stages/bench/live/junit-{number}"
    writer.mount_intent(f"output-{number}-mount", output, "tmpfs")
    writer.mount_done(f"output-{number}-mount", output, "tmpfs")
    writer.process_intent(f"{sandbox}.launcher", "launcher", 1000 + number, 7_000_000 + number, 1000 + number)
    writer.process_released(f"{sandbox}.launcher")
    for index, target in enumerate(TREES, 1):
        writer.mount_intent(f"{sandbox}.mount-{index}", target, "tree")
    writer.process_intent(f"{sandbox}.init", "namespace", 2000 + number, 7_000_001 + number, 1000 + number)
    writer.process_terminal(f"{sandbox}.launcher", 0, "steward")
    writer.process_released(f"{sandbox}.init")
    root = f"{sandbox}.mount-{len(TREES) + 1}"
    writer.mount_intent(root, "/", "tmpfs")
    writer.mount_done(root, "/", "tmpfs")
    for index, target in enumerate(TREES, 1):
        writer.mount_done(f"{sandbox}.mount-{index}", target, "tree")
    for index, (target, kind) in enumerate(LATE, len(TREES) + 2):
        writer.mount_intent(f"{sandbox}.mount-{index}", target, kind)
        writer.mount_done(f"{sandbox}.mount-{index}", target, kind)
    old_root = f"{sandbox}.mount-{len(TREES) + 2 + len(LATE)}"
    writer.unmount_intent(old_root, "/.old-root", "tree")
    writer.unmount_done(old_root, "/.old-root", "tree")
    writer.process_intent(f"{sandbox}.op-1", "descendant", 3000 + number, 7_000_002 + number, 3000 + number)
    writer.process_released(f"{sandbox}.op-1")
    writer.process_terminal(f"{sandbox}.op-1", 256 if number % 5 == 0 else 0, "launcher")
    writer.descendants_terminal(f"{sandbox}.op-1", 0)
    writer.process_terminal(f"{sandbox}.init", 0, "steward")
    writer.unmount_intent(f"output-{number}-unmount", output, "tmpfs")
    writer.unmount_done(f"output-{number}-unmount", output, "tmpfs")


def _full_journal() -> bytes:
    """journal.py's full journal (its file, beside this one: the package ``journal`` takes the plain name)."""
    path = pathlib.Path(__file__).with_name("journal.py")
    spec = importlib.util.spec_from_file_location("benchmarks_journal_fill", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.full_journal(_case)


def _measure(metric: str, render) -> dict:
    data = _full_journal()
    reading = read_journal(data)
    assert len(data) == CAP and reading.verdict == "VALID"
    value = median_seconds(lambda: render(read_journal(data), "journal"), repeat=15)
    anchor = median_seconds(lambda: read_journal(data), repeat=15)
    return {
        "metric": metric,
        "value": round(value * 1000, 2),
        "unit": "ms",
        "anchor": f"read_journal of the same {len(data)}-byte journal ({len(reading.records)} records)",
        "anchor_value": round(anchor * 1000, 2),
    }


def journal_replay_html() -> dict:
    return _measure("journal_replay_html", render_html)


def journal_replay_text() -> dict:
    return _measure("journal_replay_text", render_text)


METRICS = {"journal_replay_html": journal_replay_html, "journal_replay_text": journal_replay_text}
