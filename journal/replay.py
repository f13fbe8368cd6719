"""A journal as a reviewer's text timeline: one block per sandbox and per host lane, then cleanup and the verdict.

The lanes come from :mod:`journal.timeline`, in the order their first record
appears. A sandbox's in-namespace mounts are summarised in a few lines; the
HTML rendering (:mod:`journal.replay_html`) draws the same lanes. Only the
valid prefix is ever shown, under the verdict that judged it.
"""

from __future__ import annotations

from journal.reader import Reading, Verdict
from journal.timeline import (
    Labels,
    Mount,
    Process,
    Sandbox,
    Timeline,
    contents,
    duration,
    full_wait,
    mount_groups,
    plural,
    since,
    timeline,
    wall_time,
)

_WHEN = 13
_INDENT = " " * _WHEN


def summary(reading: Reading, shown: str) -> list[str]:
    lines = [f"journal   {shown}: {reading.stated}, {len(reading.records)} records, {reading.valid_bytes} bytes"]
    if reading.verdict is not Verdict.VALID:
        lines.append(f"reason    {reading.reason}")
    lines.append(f"head      {reading.head or '(none)'}")
    return lines


def render_text(reading: Reading, shown: str, labels: Labels | None = None) -> str:
    lines = summary(reading, shown)
    if not reading.records:
        return "\n".join(lines) + "\n"
    line = timeline(reading, labels)
    genesis = line.genesis
    lines += [
        f"stage     {genesis['stage_id']}  attempt {genesis['attempt_id']}  journal {genesis['journal_id']}",
        f"created   {wall_time(genesis['created'])}, the records span {duration(line.start, line.end)}",
        f"holds     {contents(line)}",
    ]
    if line.lanes or line.events:
        lines.append("")
    for lane in line.lanes:
        if isinstance(lane, Sandbox):
            lines += _sandbox(line, lane)
        elif isinstance(lane, Mount):
            lines += _host_mount(line, lane)
        else:
            lines += _host_process(line, lane)
    for event in line.events:
        outcome = f": {event.outcome}" if event.outcome else ""
        lines.append(f"{since(line.start, event.at):<{_WHEN}}{event.label}{outcome}  ({event.detail})")
    lines += ["", f"verdict   {line.conclusion()}"]
    return "\n".join(lines) + "\n"


def _process(line: Timeline, process: Process, name: str) -> str:
    start = line.start
    text = f"{name}  {process.role:<10}  pid {process.pid:<7}  intent {since(start, process.intent_at)}  "
    text += "not released  " if process.released_at is None else f"released {since(start, process.released_at)}  "
    if process.terminal_at is not None:
        text += f"terminal {since(start, process.terminal_at)}  "
    text += full_wait(process)
    if process.terminal_at is not None:
        text += f"  lived {duration(process.intent_at, process.terminal_at)}"
    if process.descendants is not None:
        text += f"  {process.descendants} descendants terminal"
    if process.filter_digest is not None:
        text += f"  ready, filter sha256:{process.filter_digest}"
    return text


def _host_process(line: Timeline, process: Process) -> list[str]:
    return [f"{since(line.start, process.intent_at):<{_WHEN}}process  " + _process(line, process, process.op_id)]


def _mount_steps(line: Timeline, mount: Mount) -> str:
    start = line.start
    steps = []
    if mount.intent_at is not None:
        done = "not done in this journal" if mount.done_at is None else (
            f"done {since(start, mount.done_at)} ({duration(mount.intent_at, mount.done_at)})"
        )
        steps.append(f"mount {since(start, mount.intent_at)}, {done}")
    if mount.unmount_op_id is None:
        steps.append("never unmounted in this journal")
    else:
        done = "not done in this journal" if mount.unmount_done_at is None else (
            f"done {since(start, mount.unmount_done_at)} ({duration(mount.unmount_intent_at, mount.unmount_done_at)})"
        )
        steps.append(f"unmount {mount.unmount_op_id} {since(start, mount.unmount_intent_at)}, {done}")
    if mount.done_at is not None and mount.unmount_done_at is not None:
        steps.append(f"mounted {duration(mount.done_at, mount.unmount_done_at)}")
    return "; ".join(steps)


def _host_mount(line: Timeline, mount: Mount) -> list[str]:
    return [
        f"{since(line.start, mount.first_at):<{_WHEN}}host mount  {mount.op_id or mount.unmount_op_id}  {mount.kind} {mount.target}",
        _INDENT + "  " + _mount_steps(line, mount),
    ]


def _sandbox(line: Timeline, sandbox: Sandbox) -> list[str]:
    lines = [
        f"{since(line.start, sandbox.first_at):<{_WHEN}}{sandbox.title}  "
        f"spans {duration(sandbox.first_at, sandbox.last_at)}" + ("  with the index network" if sandbox.networked else "")
    ]
    width = max((len(sandbox.local(process.op_id)) for process in sandbox.processes), default=0)
    for process in sandbox.processes:
        lines.append(_INDENT + "  " + _process(line, process, f"{sandbox.local(process.op_id):<{width}}"))
    return lines + [_INDENT + "  " + text for text in namespace_mounts(line, sandbox)]


def namespace_mounts(line: Timeline, sandbox: Sandbox) -> list[str]:
    """A sandbox's mounts and unmounts in a few lines, and what the records say about how the rest ended."""
    start = line.start
    done = [mount for mount in sandbox.mounts if mount.done_at is not None]
    pending = [mount for mount in sandbox.mounts if mount.intent_at is not None and mount.done_at is None]
    unmounts = [mount for mount in sandbox.mounts if mount.unmount_op_id is not None]
    lines = []
    if done:
        times = [mount.done_at for mount in done]
        lines.append(
            f"mounts    {plural(len(done), 'mount')} done in the namespace, {since(start, min(times))} .. "
            f"{since(start, max(times))}: " + _grouped(done)
        )
    if pending:
        lines.append(f"mounts    {len(pending)} intended, not done in this journal: " + _grouped(pending))
    for mount in unmounts:
        finished = "not done in this journal" if mount.unmount_done_at is None else f"done {since(start, mount.unmount_done_at)}"
        lines.append(f"unmount   {mount.kind} {mount.target} {since(start, mount.unmount_intent_at)}, {finished}")
    if sandbox.lasting_mounts:
        lines.append("ends      " + namespace_end(line, sandbox))
    return lines


def namespace_end(line: Timeline, sandbox: Sandbox) -> str:
    """How the mounts without an unmount ended, as far as the records of the sandbox's pid 1 tell."""
    mounts = plural(len(sandbox.lasting_mounts), "mount")
    pid1 = sandbox.pid1
    if sandbox.namespace == "unrecorded":
        return f"no pid 1 is recorded for this sandbox: the journal does not say when the namespace of its {mounts} ended"
    if sandbox.namespace == "open":
        return f"pid 1 ({pid1.op_id}) is not reaped in this journal: its namespace and {mounts} may still exist"
    return (
        f"{mounts} with no unmount record ended with the namespace: pid 1 ({pid1.op_id}) "
        f"was reaped at {since(line.start, pid1.terminal_at)}"
    )


def _grouped(mounts: list[Mount]) -> str:
    return "; ".join(f"{kind} " + " ".join(targets) for kind, targets in mount_groups(mounts))
