"""A journal as one self-contained HTML page: a header, an SVG timeline of its lanes, and its records.

No scripts, no fonts, no URLs: inline CSS and ``<title>`` elements for hover
details. Every string from the journal is escaped element content. The output
is a function of the reading alone (same journal, same bytes), and its size is
bounded: at most :data:`MAX_ROWS` rows are drawn, the first and the last ones,
and the rest are named by count (the text replay lists every one); a hover
title shortens long targets and lists at most :data:`TITLE_MOUNTS` mounts, and
the records table below the timeline holds every record whole.
"""

from __future__ import annotations

import math

from journal import untrusted
from journal.format import Kind
from journal.reader import Reading, Verdict
from journal.replay import namespace_end
from journal.timeline import (
    Event,
    Labels,
    Mount,
    Process,
    Sandbox,
    Timeline,
    at_of,
    contents,
    duration,
    full_wait,
    plural,
    short_wait,
    since,
    timeline,
    wall_time,
)

MAX_ROWS = 120
TAIL_ROWS = 30
TITLE_MOUNTS = 30
TITLE_TARGET = 160

WIDTH = 1280
X0 = 300
X1 = WIDTH - 24
CHAR = 7.3
SMALL_CHAR = 6.7

GREEN = "#1a7f37"
RED = "#cf222e"
ORANGE = "#d4600a"
AMBER = "#9a6700"
TEAL = "#0e7c86"
BLUE = "#0969da"
GREY = "#57606a"
LINE = "#d0d7de"
TINTS = {GREEN: "#d6f5dd", RED: "#ffdcd7", ORANGE: "#ffe2cc", GREY: "#ffffff"}
VERDICT_COLOURS = {Verdict.VALID: GREEN, Verdict.TORN: AMBER, Verdict.MISSING: GREY}

_STYLE = (
    "text{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono','Liberation Mono',monospace;"
    "font-size:12px;fill:#1f2328}"
    ".s{font-size:11px;fill:#57606a}.b{font-weight:700}.h{font-size:18px;font-weight:700}"
    ".w{fill:#fff;font-weight:700}.halo{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}"
)
_PAGE_STYLE = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:16px;color:#1f2328;background:#fff}"
    "svg{display:block;max-width:100%;height:auto}"
    "summary{cursor:pointer;margin:12px 0}code{font:12px ui-monospace,monospace;word-break:break-all}"
    "table{border-collapse:collapse}td,th{border-bottom:1px solid #d0d7de;padding:2px 8px;text-align:left;"
    "vertical-align:top;font-size:12px}"
)


def _tooltip(text: str) -> str:
    """A hover text of several lines: each line through the untrusted-text rule (E8), the breaks kept.

    The lines are casebox's own, built from journal fields, which the reader
    only accepts as printable ASCII: a field never holds a line break."""
    return "\n".join(untrusted.html(line) for line in text.split("\n"))


def fit(text: str, chars: int) -> str:
    """``text`` in at most ``chars`` characters, keeping its end (a path's or a sandbox's distinguishing part)."""
    return text if len(text) <= chars else "…" + text[len(text) - chars + 1:]


def fit_path(target: str, chars: int) -> str:
    """A path in at most ``chars`` characters: its last segments after an ellipsis, or its end when one is too long."""
    if len(target) <= chars:
        return target
    kept = ""
    for segment in reversed(target.split("/")[1:]):
        if len(kept) + 1 + len(segment) + 1 > chars:
            break
        kept = "/" + segment + kept
    return "…" + kept if kept else fit(target, chars)


def outcome_colour(process: Process) -> str:
    if process.wait_status is None:
        return GREY
    if process.wait_status & 0x7F:
        return ORANGE
    return GREEN if process.wait_status == 0 else RED


def nice_step(span: int) -> int:
    """A tick step of 1, 2 or 5 times a power of ten microseconds, giving at most ten ticks over ``span``."""
    step = 10 ** max(0, math.floor(math.log10(max(span, 1) / 5)))
    return next(step * factor for factor in (1, 2, 5, 10) if span / (step * factor) <= 10)


def tick_label(value: int, step: int) -> str:
    """A tick's time in the unit of its step, with just the decimals the step needs."""
    if value == 0:
        return "0"
    unit, size = ("s", 1_000_000) if step >= 100_000 else ("ms", 1_000) if step >= 100 else ("µs", 1)
    decimals = max(0, math.ceil(-math.log10(step / size)))
    return f"{value / size:.{decimals}f} {unit}"


class Canvas:
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.span = max(end - start, 1)
        self.end = start + self.span
        self.backgrounds: list[str] = []
        self.grid: list[str] = []
        self.parts: list[str] = []
        self.y = 0.0

    def x(self, at: int) -> float:
        return X0 + (min(max(at, self.start), self.end) - self.start) / self.span * (X1 - X0)

    def add(self, element: str) -> None:
        self.parts.append(element)

    def text(self, x: float, y: float, text: str, *, cls: str = "", anchor: str = "start", fill: str = "") -> None:
        attributes = (f' class="{cls}"' if cls else "") + (f' text-anchor="{anchor}"' if anchor != "start" else "")
        attributes += f' style="fill:{fill}"' if fill else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}"{attributes}>{untrusted.html(text)}</text>')

    def bar(self, begin: int, stop: int | None, top: float, height: float, fill: str, title: str, *,
            stroke: str = "", open_end: bool = False) -> tuple[float, float]:
        """A bar from ``begin`` to ``stop``; an open bar (no recorded end) runs dashed to the journal's end."""
        left = self.x(begin)
        right = max(self.x(self.end if stop is None else stop), left + 2)
        if open_end:
            style = f'fill="#fff" stroke="{stroke or GREY}" stroke-dasharray="4 3"'
        else:
            style = f'fill="{fill}"' + (f' stroke="{stroke}"' if stroke else "")
        self.add(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{height:.1f}" rx="2" {style}>'
            f"<title>{_tooltip(title)}</title></rect>"
        )
        return left, right

    def diamond(self, at: int, middle: float, fill: str, title: str) -> float:
        x = self.x(at)
        self.add(
            f'<path d="M{x:.1f} {middle - 7:.1f}L{x + 7:.1f} {middle:.1f}L{x:.1f} {middle + 7:.1f}L{x - 7:.1f} {middle:.1f}Z" '
            f'fill="{fill}" stroke="#fff"><title>{_tooltip(title)}</title></path>'
        )
        return x

    def beside(self, left: float, right: float, baseline: float, text: str) -> None:
        """A label right of a bar, else left of it, else over its right end with a white halo."""
        width = len(text) * CHAR
        if right + 6 + width <= X1:
            self.text(right + 6, baseline, text)
        elif left - 6 - width >= X0:
            self.text(left - 6, baseline, text, anchor="end")
        else:
            self.text(X1, baseline, text, anchor="end", cls="halo")


# Rows. Each takes the canvas with ``y`` at its top and returns its height.


def _sandbox_row(canvas: Canvas, line: Timeline, sandbox: Sandbox) -> float:
    height = 48.0
    top = canvas.y
    canvas.backgrounds.append(f'<rect x="0" y="{top:.1f}" width="{WIDTH}" height="{height:.1f}" fill="#f6f8fa"/>')
    unmounted = sum(1 for mount in sandbox.mounts if mount.unmounted)
    remaining = sandbox.lasting_mounts
    pid1 = sandbox.pid1
    canvas.add(f"<g><title>{_tooltip(_sandbox_title(line, sandbox))}</title>")
    canvas.text(12, top + 19, fit(sandbox.title, 38), cls="b")
    note = []
    if remaining:
        mounts = plural(len(remaining), "mount")
        note.append({"unrecorded": f"{mounts}, no pid 1 recorded", "open": f"{mounts}, pid 1 not reaped",
                     "ended": f"{mounts} end{'s' if len(remaining) == 1 else ''} with pid 1"}[sandbox.namespace])
    if unmounted:
        note.append(plural(unmounted, "unmount"))
    canvas.text(12, top + 36, fit(" · ".join(note) or "no mounts", 42), cls="s")

    lefts, rights = [], []
    for process in sandbox.processes:
        colour = outcome_colour(process)
        title = _process_title(line, process)
        if process.role == "launcher":
            box = canvas.bar(process.intent_at, process.terminal_at, top + 6, 5, colour, title, open_end=process.terminal_at is None)
        elif process is pid1:
            box = canvas.bar(process.intent_at, process.terminal_at, top + 13, 20, TINTS[colour], title,
                             stroke=colour, open_end=process.terminal_at is None)
        else:
            box = canvas.bar(process.intent_at, process.terminal_at, top + 16, 14, colour, title, open_end=process.terminal_at is None)
        lefts.append(box[0])
        rights.append(box[1])
    if remaining:
        begin = min(mount.first_at for mount in remaining)
        end = sandbox.namespace_end
        title = _namespace_title(line, sandbox, remaining)
        box = canvas.bar(begin, end, top + 37, 4, TEAL, title, stroke=TEAL, open_end=end is None)
        lefts.append(box[0])
        rights.append(box[1])
    for mount in sandbox.mounts:
        if mount.unmount_done_at is not None:
            x = canvas.x(mount.unmount_done_at)
            canvas.add(
                f'<rect x="{x - 1:.1f}" y="{top + 34:.1f}" width="2" height="10" fill="{TEAL}">'
                f"<title>{_tooltip(_unmount_title(line, mount))}</title></rect>"
            )
    if lefts:
        canvas.beside(min(lefts), max(rights), top + 27, _sandbox_outcome(sandbox))
    canvas.add("</g>")
    return height


def _sandbox_title(line: Timeline, sandbox: Sandbox) -> str:
    counts: dict[str, int] = {}
    for process in sandbox.processes:
        counts[process.role] = counts.get(process.role, 0) + 1
    roles = ", ".join(f"{count} {role}" for role, count in counts.items()) or "no process"
    return (
        f"{sandbox.title}: from {since(line.start, sandbox.first_at)} to {since(line.start, sandbox.last_at)} "
        f"({duration(sandbox.first_at, sandbox.last_at)})\n{roles}; {plural(len(sandbox.mounts), 'mount record')}"
        + ("\nit had the index network (its name ends -net)" if sandbox.networked else "")
    )


def _sandbox_outcome(sandbox: Sandbox) -> str:
    ops = sandbox.ops
    if len(ops) <= 3:
        words = [f"{sandbox.local(op.op_id)} {short_wait(op)}" + (
            f" ({duration(op.intent_at, op.terminal_at)})" if op.terminal_at is not None else "") for op in ops]
    else:
        counts: dict[str, int] = {}
        for op in ops:
            counts[short_wait(op)] = counts.get(short_wait(op), 0) + 1
        words = [f"{len(ops)} ops: " + ", ".join(f"{count} {word}" for word, count in counts.items())]
    if not ops:
        words.append("no op")
    for process in sandbox.processes:
        if process not in ops and process.wait_status != 0:
            name = "pid 1" if process is sandbox.pid1 else sandbox.local(process.op_id)
            words.append(f"{name} {short_wait(process)}")
    return ", ".join(words) + (" · had the index network" if sandbox.networked else "")


def _process_title(line: Timeline, process: Process) -> str:
    start = line.start
    text = (
        f"{process.op_id} ({process.role}) pid {process.pid} pgid {process.pgid} starttime {process.starttime}\n"
        f"intent {since(start, process.intent_at)}, released {since(start, process.released_at)}, "
        f"terminal {since(start, process.terminal_at)}\n{full_wait(process)}"
    )
    if process.terminal_at is not None:
        text += f", lived {duration(process.intent_at, process.terminal_at)}"
    if process.descendants is not None:
        text += f"\n{process.descendants} descendants terminal"
    if process.filter_digest is not None:
        text += f"\nready, filter sha256:{process.filter_digest}"
    return text


def _namespace_title(line: Timeline, sandbox: Sandbox, remaining: list[Mount]) -> str:
    start = line.start
    rows = [f"{namespace_end(line, sandbox)}."]
    for mount in remaining[:TITLE_MOUNTS]:
        done = "not done in this journal" if mount.done_at is None else f"done {since(start, mount.done_at)}"
        rows.append(f"{mount.kind} {_titled(mount.target)} ({sandbox.local(mount.op_id)}): intent {since(start, mount.intent_at)}, {done}")
    if len(remaining) > TITLE_MOUNTS:
        rows.append(f"… and {len(remaining) - TITLE_MOUNTS} more (the records below list every one)")
    return "\n".join(rows)


def _titled(target: str) -> str:
    """A target in a hover title: whole up to a length a reader can use; the records table holds it whole."""
    return fit_path(target, TITLE_TARGET)


def _unmount_title(line: Timeline, mount: Mount) -> str:
    return (
        f"unmount {mount.kind} {_titled(mount.target)} ({mount.unmount_op_id}): intent {since(line.start, mount.unmount_intent_at)}, "
        f"done {since(line.start, mount.unmount_done_at)}"
    )


def _host_mount_row(canvas: Canvas, line: Timeline, mount: Mount) -> float:
    height = 38.0
    top = canvas.y
    start = line.start
    canvas.text(12, top + 16, f"{mount.kind} " + fit_path(mount.target, 27), fill=AMBER, cls="b")
    canvas.text(12, top + 31, fit(f"host mount {mount.op_id or mount.unmount_op_id}", 42), cls="s")
    title = f"host mount {mount.kind} {_titled(mount.target)}\n"
    if mount.op_id is not None:
        title += f"{mount.op_id}: intent {since(start, mount.intent_at)}, done {since(start, mount.done_at)}\n"
    if mount.unmount_op_id is not None:
        title += f"{mount.unmount_op_id}: intent {since(start, mount.unmount_intent_at)}, done {since(start, mount.unmount_done_at)}"
    else:
        title += "never unmounted in this journal"
    left, right = canvas.bar(mount.first_at, mount.unmount_done_at, top + 12, 14, "#f5d77a", title.rstrip(),
                             stroke=AMBER, open_end=mount.unmount_done_at is None)
    if mount.unmount_done_at is None:
        label = "never unmounted in this journal" if mount.unmount_op_id is None else "unmount not done in this journal"
    elif mount.done_at is None:
        label = f"unmounted at {since(start, mount.unmount_done_at)}, no mount recorded"
    else:
        label = f"unmounted after {duration(mount.done_at, mount.unmount_done_at)}"
    canvas.beside(left, right, top + 23, label)
    return height


def _host_process_row(canvas: Canvas, line: Timeline, process: Process) -> float:
    height = 30.0
    top = canvas.y
    canvas.text(12, top + 19, fit(f"{process.op_id} ({process.role})", 39))
    colour = outcome_colour(process)
    left, right = canvas.bar(process.intent_at, process.terminal_at, top + 8, 14, colour, _process_title(line, process),
                             open_end=process.terminal_at is None)
    label = short_wait(process)
    if process.terminal_at is not None:
        label += f" ({duration(process.intent_at, process.terminal_at)})"
    canvas.beside(left, right, top + 20, label)
    return height


def _event_row(canvas: Canvas, line: Timeline, event: Event) -> float:
    height = 26.0
    top = canvas.y
    canvas.text(12, top + 17, event.label)
    if event.kind in (Kind.RETIREMENT_INTENT, Kind.RETIRED):
        colour = BLUE
    else:
        colour = GREEN if event.outcome == "CLEANED" else AMBER if event.outcome == "MISSING" else RED
    title = f"{event.label}{': ' + event.outcome if event.outcome else ''} at {since(line.start, event.at)}\n{event.detail}"
    x = canvas.diamond(event.at, top + 13, colour, title)
    canvas.beside(x - 8, x + 8, top + 17, " ".join(filter(None, (event.outcome, since(line.start, event.at)))))
    return height


def _elision_row(canvas: Canvas, hidden: int) -> float:
    canvas.backgrounds.append(f'<rect x="0" y="{canvas.y:.1f}" width="{WIDTH}" height="30" fill="#fff8c5"/>')
    canvas.text(WIDTH / 2, canvas.y + 19, f"… {plural(hidden, 'row')} not drawn (a page draws at most {MAX_ROWS}); "
                "casebox journal replay prints every one …", anchor="middle", cls="s")
    return 30.0


_ROWS = {Sandbox: _sandbox_row, Mount: _host_mount_row, Process: _host_process_row, Event: _event_row}


def _rows(line: Timeline) -> tuple[list, int]:
    rows: list = [*line.lanes, *line.events]
    if len(rows) <= MAX_ROWS:
        return rows, 0
    hidden = len(rows) - MAX_ROWS + 1
    return rows[: MAX_ROWS - 1 - TAIL_ROWS] + [hidden] + rows[-TAIL_ROWS:], hidden


def _header(canvas: Canvas, reading: Reading, shown: str, line: Timeline) -> None:
    colour = VERDICT_COLOURS.get(reading.verdict, RED)
    conclusion = line.conclusion()
    good = reading.verdict is Verdict.VALID and line.cleanup is not None and line.cleanup["outcome"] == "CLEANED"
    canvas.text(12, 30, "casebox journal replay", cls="h")
    badge = len(str(reading.verdict)) * CHAR + 20
    canvas.add(f'<rect x="270" y="12" width="{badge:.1f}" height="24" rx="12" fill="{colour}"/>')
    canvas.text(280, 29, str(reading.verdict), cls="w")
    canvas.text(280 + badge, 29, conclusion, cls="b", fill=GREEN if good else RED if reading.verdict is not Verdict.VALID else AMBER)
    genesis = line.genesis
    rows = [
        fit(shown, 150),
        f"stage {genesis['stage_id']} · attempt {genesis['attempt_id']} · journal {genesis['journal_id']}",
        f"created {wall_time(genesis['created'])} · {len(reading.records)} records, {reading.valid_bytes} bytes, "
        f"spanning {duration(line.start, line.end)}",
        f"head {reading.head} · {reading.stated}",
        f"holds {contents(line)}",
    ]
    if reading.verdict is not Verdict.VALID:
        rows.append(f"reason: {reading.reason}")
    y = 56.0
    for number, row in enumerate(rows):
        canvas.text(12, y, fit(row, 170), fill=RED if row.startswith("reason: ") else GREY if number == 0 else "")
        y += 17
    canvas.y = y + 4
    _legend(canvas)


_LEGEND = (
    ("bar", GREEN, "exit 0"),
    ("bar", RED, "exit ≠ 0"),
    ("bar", ORANGE, "killed by a signal"),
    ("open", GREY, "not reaped / not unmounted in this journal"),
    ("band", GREEN, "pid 1 (its namespace)"),
    ("strip", TEAL, "namespace mounts, until pid 1 is reaped"),
    ("host", AMBER, "host mount"),
    ("diamond", GREEN, "helper, cleanup, retirement"),
)


def _legend(canvas: Canvas) -> None:
    x, y = 12.0, canvas.y
    for shape, colour, words in _LEGEND:
        width = 14 + 6 + len(words) * SMALL_CHAR + 18
        if x + width > WIDTH:
            x, y = 12.0, y + 18
        if shape == "bar":
            canvas.add(f'<rect x="{x:.1f}" y="{y + 1:.1f}" width="14" height="10" rx="2" fill="{colour}"/>')
        elif shape == "open":
            canvas.add(f'<rect x="{x:.1f}" y="{y + 1:.1f}" width="14" height="10" rx="2" fill="#fff" stroke="{colour}" stroke-dasharray="3 2"/>')
        elif shape == "band":
            canvas.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="14" height="12" rx="2" fill="{TINTS[colour]}" stroke="{colour}"/>')
        elif shape == "strip":
            canvas.add(f'<rect x="{x:.1f}" y="{y + 4:.1f}" width="14" height="4" fill="{colour}"/>')
        elif shape == "host":
            canvas.add(f'<rect x="{x:.1f}" y="{y + 1:.1f}" width="14" height="10" rx="2" fill="#f5d77a" stroke="{colour}"/>')
        else:
            canvas.add(f'<path d="M{x + 7:.1f} {y:.1f}L{x + 13:.1f} {y + 6:.1f}L{x + 7:.1f} {y + 12:.1f}L{x + 1:.1f} {y + 6:.1f}Z" fill="{colour}"/>')
        canvas.text(x + 20, y + 10, words, cls="s")
        x += width
    canvas.y = y + 26


def _axis(canvas: Canvas, top: float, bottom: float) -> None:
    step = nice_step(canvas.span)
    labels = bottom - top > 600
    value = 0
    while value <= canvas.span:
        x = canvas.x(canvas.start + value)
        canvas.grid.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top:.1f}" y2="{bottom:.1f}" stroke="#eaeef2"/>')
        canvas.text(x, top - 6, tick_label(value, step), cls="s", anchor="middle")
        if labels:
            canvas.text(x, bottom + 14, tick_label(value, step), cls="s", anchor="middle")
        value += step
    canvas.add(f'<line x1="{X0}" x2="{X1}" y1="{top:.1f}" y2="{top:.1f}" stroke="{LINE}"/>')


def render_svg(reading: Reading, shown: str, line: Timeline) -> str:
    canvas = Canvas(line.start, line.end)
    _header(canvas, reading, shown, line)
    top = canvas.y + 16
    canvas.y = top
    rows, _ = _rows(line)
    for row in rows:
        height = _elision_row(canvas, row) if isinstance(row, int) else _ROWS[type(row)](canvas, line, row)
        canvas.y += height
        canvas.grid.append(f'<line x1="0" x2="{WIDTH}" y1="{canvas.y:.1f}" y2="{canvas.y:.1f}" stroke="#eaeef2"/>')
    _axis(canvas, top, canvas.y)
    height = canvas.y + 28
    return (
        f'<svg role="img" aria-label="journal timeline" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}"><style>{_STYLE}</style>'
        f'<rect width="{WIDTH}" height="{height:.0f}" fill="#fff"/>'
        + "".join(canvas.backgrounds + canvas.grid + canvas.parts)
        + "</svg>"
    )


def render_html(reading: Reading, shown: str, labels: Labels | None = None) -> str:
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>casebox journal {untrusted.html(reading.verdict)}: {untrusted.html(shown)}</title>",
        f"<style>{_PAGE_STYLE}</style></head><body>",
    ]
    if not reading.records:
        head += [f"<h1>casebox journal {untrusted.html(reading.verdict)}</h1>",
                 f"<p><code>{untrusted.html(shown)}</code>: {untrusted.html(reading.reason)}</p>"]
        return "\n".join(head + ["</body></html>"]) + "\n"
    line = timeline(reading, labels)
    rows = "".join(
        f"<tr><td>{record.offset}</td><td>{untrusted.html(since(line.start, at_of(record)))}</td>"
        f"<td>{record.kind.name}</td><td><code>{untrusted.html(record.payload.decode('ascii'), limit=len(record.payload))}</code></td></tr>"
        for record in reading.records
    )
    table = (
        f"<details><summary>The {len(reading.records)} records of the valid prefix</summary>"
        f"<table><tr><th>offset</th><th>time</th><th>kind</th><th>payload</th></tr>{rows}</table></details>"
    )
    return "\n".join(head + [render_svg(reading, shown, line), table, "</body></html>"]) + "\n"
