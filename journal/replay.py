"""A journal's records as a reviewer's timeline: processes, mounts, helper attempts, cleanup, retirement.

:func:`timeline` folds a :class:`~journal.reader.Reading` into lanes; the two
renderers turn lanes into text or into one self-contained HTML page with an
inline SVG (no scripts, no fonts, no network). Only the valid prefix is ever
shown, under the verdict that judged it.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import signal

from journal.format import Kind
from journal.reader import Reading, Record, Verdict


@dataclasses.dataclass
class ProcessLane:
    op_id: str
    role: str
    pid: int
    pgid: int
    starttime: int
    intent_at: int
    released_at: int | None = None
    terminal_at: int | None = None
    wait_status: int | None = None
    reaper: str | None = None
    descendants: int | None = None


@dataclasses.dataclass
class MountLane:
    target: str
    kind: str
    op_id: str | None = None
    intent_at: int | None = None
    done_at: int | None = None
    unmount_op_id: str | None = None
    unmount_intent_at: int | None = None
    unmount_done_at: int | None = None


@dataclasses.dataclass
class Event:
    at: int
    label: str
    detail: str


@dataclasses.dataclass
class Timeline:
    reading: Reading
    start: int
    end: int
    processes: list[ProcessLane]
    mounts: list[MountLane]
    events: list[Event]
    cleanup: dict | None

    @property
    def genesis(self) -> dict:
        return self.reading.records[0].fields

    def conclusion(self) -> str:
        """The final word: only a VALID journal with cleanup evidence supports a cleanup claim (J4)."""
        verdict = self.reading.verdict
        if verdict is not Verdict.VALID:
            return f"journal {verdict}: no cleanup claim is authorized; the stage is preserved"
        if self.cleanup is None:
            return "journal VALID, but it holds no cleanup evidence"
        return f"cleanup {self.cleanup['outcome']}, journal VALID"


def describe_wait(status: int) -> str:
    """A raw wait status in words; the raw value is always shown beside it."""
    if status & 0x7F == 0:
        return f"exit {status >> 8}"
    number = status & 0x7F
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"killed by {name} ({number})" + (", core dumped" if status & 0x80 else "")


def timeline(reading: Reading) -> Timeline:
    processes: dict[str, ProcessLane] = {}
    mounts: list[MountLane] = []
    mounts_by_op: dict[str, MountLane] = {}
    events: list[Event] = []
    cleanup = None
    for record in reading.records:
        fields, kind = record.fields, record.kind
        at = fields.get("at", fields.get("created"))
        if kind is Kind.PROCESS_INTENT:
            processes[fields["op_id"]] = ProcessLane(
                fields["op_id"], fields["role"], fields["pid"], fields["pgid"], fields["starttime"], at
            )
        elif kind is Kind.PROCESS_RELEASED:
            processes[fields["op_id"]].released_at = at
        elif kind is Kind.PROCESS_TERMINAL:
            lane = processes[fields["op_id"]]
            lane.terminal_at, lane.wait_status, lane.reaper = at, fields["wait_status"], fields["reaper"]
        elif kind is Kind.DESCENDANTS_TERMINAL:
            processes[fields["op_id"]].descendants = fields["count"]
        elif kind is Kind.MOUNT_INTENT:
            lane = MountLane(fields["target"], fields["kind"], fields["op_id"], at)
            mounts.append(lane)
            mounts_by_op[fields["op_id"]] = lane
        elif kind is Kind.MOUNT_DONE:
            mounts_by_op[fields["op_id"]].done_at = at
        elif kind is Kind.UNMOUNT_INTENT:
            lane = _mounted(mounts, fields["target"], fields["kind"])
            if lane is None:
                lane = MountLane(fields["target"], fields["kind"])
                mounts.append(lane)
            lane.unmount_op_id, lane.unmount_intent_at = fields["op_id"], at
            mounts_by_op[fields["op_id"]] = lane
        elif kind is Kind.UNMOUNT_DONE:
            mounts_by_op[fields["op_id"]].unmount_done_at = at
        elif kind is not Kind.GENESIS:
            events.append(_event(record, at))
            if kind is Kind.CLEANUP_EVIDENCE:
                cleanup = fields
    times = [record.fields.get("at", record.fields.get("created")) for record in reading.records]
    return Timeline(reading, min(times), max(times), list(processes.values()), mounts, events, cleanup)


def _mounted(mounts: list[MountLane], target: str, kind: str) -> MountLane | None:
    """The latest mount of ``target`` and ``kind`` that no unmount has claimed yet."""
    for lane in reversed(mounts):
        if lane.target == target and lane.kind == kind and lane.op_id is not None and lane.unmount_op_id is None:
            return lane
    return None


def _event(record: Record, at: int) -> Event:
    fields = record.fields
    if record.kind is Kind.HELPER_ATTEMPT:
        return Event(at, f"helper attempt {fields['attempt']}: {fields['outcome']}", f"response {fields['response_digest']}")
    if record.kind is Kind.CLEANUP_EVIDENCE:
        return Event(
            at,
            f"cleanup evidence: {fields['outcome']}",
            f"journal head {fields['journal_head']}, process inventory {fields['process_inventory_digest']}, "
            f"mount inventory {fields['mount_inventory_digest']}, preceding process {fields['preceding_process_digest']}",
        )
    label = "retirement intent" if record.kind is Kind.RETIREMENT_INTENT else "retired"
    return Event(at, label, fields["note"])


def since(start: int, at: int | None) -> str:
    return "-" if at is None else f"+{(at - start) / 1e6:.6f}s"


def duration(start: int | None, stop: int | None) -> str:
    if start is None or stop is None:
        return "open"
    micros = stop - start
    if abs(micros) >= 1_000_000:
        return f"{micros / 1e6:.3f} s"
    if abs(micros) >= 1_000:
        return f"{micros / 1e3:.3f} ms"
    return f"{micros} µs"


def wall_time(micros: int) -> str:
    moment = datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _summary(reading: Reading, shown: str) -> list[str]:
    lines = [f"journal   {shown}: {reading.verdict}, {len(reading.records)} records, {reading.valid_bytes} bytes"]
    if reading.verdict is not Verdict.VALID:
        lines.append(f"reason    {reading.reason}")
    lines.append(f"head      {reading.head or '(none)'}")
    return lines


def render_text(reading: Reading, shown: str) -> str:
    lines = _summary(reading, shown)
    if not reading.records:
        return "\n".join(lines) + "\n"
    line = timeline(reading)
    start, genesis = line.start, line.genesis
    lines += [
        f"stage     {genesis['stage_id']}  attempt {genesis['attempt_id']}  journal {genesis['journal_id']}",
        f"created   {wall_time(genesis['created'])}",
        "",
        "processes",
    ]
    for lane in line.processes:
        status = "not reaped" if lane.wait_status is None else f"{describe_wait(lane.wait_status)} (raw {lane.wait_status}), reaped by {lane.reaper}"
        lines.append(f"  {lane.op_id}  {lane.role}  pid {lane.pid}  pgid {lane.pgid}  starttime {lane.starttime}")
        lines.append(
            f"      intent {since(start, lane.intent_at)}  released {since(start, lane.released_at)}  "
            f"terminal {since(start, lane.terminal_at)}  {status}  lived {duration(lane.intent_at, lane.terminal_at)}"
            + ("" if lane.descendants is None else f"  {lane.descendants} descendants terminal")
        )
    if not line.processes:
        lines.append("  (none)")
    lines.append("mounts")
    for lane in line.mounts:
        lines.append(f"  {lane.op_id or '(not mounted here)'}  {lane.kind} {lane.target}")
        if lane.op_id is not None:
            lines.append(
                f"      intent {since(start, lane.intent_at)}  done {since(start, lane.done_at)} "
                f"({duration(lane.intent_at, lane.done_at)})"
            )
        if lane.unmount_op_id is not None:
            lines.append(
                f"      unmount {lane.unmount_op_id}  intent {since(start, lane.unmount_intent_at)}  "
                f"done {since(start, lane.unmount_done_at)} ({duration(lane.unmount_intent_at, lane.unmount_done_at)})"
                + (f"  mounted {duration(lane.done_at, lane.unmount_done_at)}" if lane.op_id is not None else "")
            )
        else:
            lines.append("      never unmounted in this journal")
    if not line.mounts:
        lines.append("  (none)")
    lines.append("events")
    for event in line.events:
        lines.append(f"  {since(start, event.at)}  {event.label}" + (f"  ({event.detail})" if event.detail else ""))
    if not line.events:
        lines.append("  (none)")
    lines += ["", f"verdict   {line.conclusion()}"]
    return "\n".join(lines) + "\n"


# HTML: one page, inline CSS and SVG, every journal string escaped.

_COLOURS = {
    Verdict.VALID: "#1a7f37",
    Verdict.TORN: "#b35900",
    Verdict.MISSING: "#6e7781",
}
_LANE = 26
_LABEL = 330
_WIDTH = 1100
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:20px;margin:0 0 4px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600}
code{font:12px ui-monospace,monospace;word-break:break-all}
table{border-collapse:collapse;margin-top:12px}
td,th{border-bottom:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top;font-size:12px}
svg text{font:12px ui-monospace,monospace}
.legend span{display:inline-block;margin-right:16px}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
"""


def _escape(text: object) -> str:
    return html.escape(str(text), quote=True)


class _Svg:
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.span = max(end - start, 1)
        self.parts: list[str] = []
        self.y = 30

    def x(self, at: int) -> float:
        return round(_LABEL + (at - self.start) / self.span * (_WIDTH - _LABEL - 60), 2)

    def bar(self, begin: int, stop: int, fill: str, title: str, *, height: int = 14, dashed: bool = False) -> None:
        left, right = self.x(begin), self.x(stop)
        dash = ' stroke="#57606a" stroke-dasharray="4 3"' if dashed else ""
        self.parts.append(
            f'<rect x="{left}" y="{self.y + (_LANE - height) / 2 - 4}" width="{max(right - left, 2)}" height="{height}" '
            f'rx="3" fill="{fill}"{dash}><title>{_escape(title)}</title></rect>'
        )

    def mark(self, at: int, fill: str, title: str) -> None:
        x, y = self.x(at), self.y + _LANE / 2 - 4
        self.parts.append(
            f'<path d="M{x} {y - 7} L{x + 6} {y} L{x} {y + 7} L{x - 6} {y} Z" fill="{fill}"><title>{_escape(title)}</title></path>'
        )

    def label(self, text: str, colour: str = "#1f2328") -> None:
        self.parts.append(f'<text x="8" y="{self.y + _LANE / 2}" fill="{colour}">{_escape(text[:44])}</text>')

    def next_lane(self) -> None:
        self.parts.append(f'<line x1="0" x2="{_WIDTH}" y1="{self.y + _LANE - 2}" y2="{self.y + _LANE - 2}" stroke="#eaeef2"/>')
        self.y += _LANE

    def axis(self, end: int) -> None:
        for step in range(6):
            at = self.start + (end - self.start) * step // 5
            x = self.x(at)
            self.parts.append(f'<line x1="{x}" x2="{x}" y1="18" y2="{self.y}" stroke="#d0d7de"/>')
            self.parts.append(f'<text x="{x}" y="12" text-anchor="middle" fill="#57606a">+{_escape(duration(self.start, at))}</text>')

    def render(self) -> str:
        return (
            f'<svg role="img" aria-label="journal timeline" width="{_WIDTH}" height="{self.y + 10}" '
            f'viewBox="0 0 {_WIDTH} {self.y + 10}">' + "".join(self.parts) + "</svg>"
        )


def _process_svg(svg: _Svg, lane: ProcessLane, end: int, start: int) -> None:
    svg.label(f"{lane.op_id} {lane.role} pid {lane.pid}")
    stop = lane.terminal_at if lane.terminal_at is not None else end
    fill = "#ffffff" if lane.terminal_at is None else "#0969da" if lane.wait_status == 0 else "#d1242f"
    status = "not reaped" if lane.wait_status is None else describe_wait(lane.wait_status)
    svg.bar(
        lane.intent_at,
        stop,
        fill,
        f"{lane.op_id} {lane.role} pid {lane.pid} pgid {lane.pgid}: intent {since(start, lane.intent_at)}, "
        f"terminal {since(start, lane.terminal_at)}, {status}, lived {duration(lane.intent_at, lane.terminal_at)}",
        dashed=lane.terminal_at is None,
    )
    if lane.released_at is not None:
        svg.mark(lane.released_at, "#8250df", f"released {since(start, lane.released_at)}")
    svg.next_lane()


def _mount_svg(svg: _Svg, lane: MountLane, end: int, start: int) -> None:
    svg.label(f"{lane.kind} {lane.target}")
    begin = lane.intent_at if lane.intent_at is not None else lane.unmount_intent_at
    stop = lane.unmount_done_at if lane.unmount_done_at is not None else end
    svg.bar(
        begin,
        stop,
        "#bf8700" if lane.unmount_done_at is not None else "#ffffff",
        f"{lane.kind} {lane.target}: mounted {since(start, lane.done_at)}, unmounted {since(start, lane.unmount_done_at)}",
        dashed=lane.unmount_done_at is None,
    )
    if lane.done_at is not None:
        svg.mark(lane.done_at, "#6f4e00", f"mount done {since(start, lane.done_at)} ({duration(lane.intent_at, lane.done_at)})")
    if lane.unmount_intent_at is not None:
        svg.mark(lane.unmount_intent_at, "#57606a", f"unmount intent {since(start, lane.unmount_intent_at)}")
    svg.next_lane()


def _event_colour(label: str) -> str:
    """Green for a cleaned outcome and for retirement, amber for MISSING, red for any other outcome."""
    outcome = label.rpartition(": ")[2]
    if outcome in ("CLEANED", "retirement intent", "retired"):
        return "#1a7f37"
    return "#bf8700" if outcome == "MISSING" else "#cf222e"


def render_html(reading: Reading, shown: str) -> str:
    colour = _COLOURS.get(reading.verdict, "#d1242f")
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>casebox journal {_escape(reading.verdict)}: {_escape(shown)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f'<h1>casebox journal <span class="badge" style="background:{colour}">{_escape(reading.verdict)}</span></h1>',
        f"<p><code>{_escape(shown)}</code>: {len(reading.records)} records, {reading.valid_bytes} bytes; "
        f"head <code>{_escape(reading.head or '(none)')}</code></p>",
    ]
    if reading.verdict is not Verdict.VALID:
        head.append(f"<p><strong>{_escape(reading.reason)}</strong></p>")
    if not reading.records:
        return "\n".join(head + ["</body></html>"]) + "\n"
    line = timeline(reading)
    genesis, start = line.genesis, line.start
    head.append(
        f"<p>stage <code>{_escape(genesis['stage_id'])}</code>, attempt <code>{_escape(genesis['attempt_id'])}</code>, "
        f"journal <code>{_escape(genesis['journal_id'])}</code>, created {_escape(wall_time(genesis['created']))}</p>"
    )
    head.append(f"<p><strong>{_escape(line.conclusion())}</strong></p>")
    svg = _Svg(start, line.end)
    for lane in line.processes:
        _process_svg(svg, lane, line.end, start)
    for lane in line.mounts:
        _mount_svg(svg, lane, line.end, start)
    for event in line.events:
        svg.label(event.label, "#8250df" if "helper" in event.label else "#1f2328")
        svg.mark(event.at, _event_colour(event.label), f"{event.label} {since(start, event.at)}: {event.detail}")
        svg.next_lane()
    svg.axis(line.end)
    legend = (
        '<p class="legend"><span><i class="sw" style="background:#0969da"></i>process, intent to exit 0</span>'
        '<span><i class="sw" style="background:#d1242f"></i>process ended otherwise</span>'
        '<span><i class="sw" style="border:1px dashed #57606a"></i>still open at the end of the journal</span>'
        '<span><i class="sw" style="background:#bf8700"></i>mount, intent to unmount</span>'
        '<span><i class="sw" style="background:#8250df"></i>released / helper</span></p>'
    )
    rows = "".join(
        f"<tr><td>{record.offset}</td><td>{_escape(since(start, record.fields.get('at', record.fields.get('created'))))}</td>"
        f"<td>{record.kind.name}</td><td><code>{_escape(record.payload.decode('ascii'))}</code></td></tr>"
        for record in reading.records
    )
    table = f"<h2>Records</h2><table><tr><th>offset</th><th>time</th><th>kind</th><th>payload</th></tr>{rows}</table>"
    return "\n".join(head + ["<h2>Timeline</h2>", svg.render(), legend, table, "</body></html>"]) + "\n"
