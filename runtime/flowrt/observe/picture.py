"""One call drawn as a picture: `flowc trace FILE -o call.svg|call.html`.

Reads a Chrome trace (what `flowc run --trace FILE` writes, the `trace` of a `?trace=1` done
event, or that whole NDJSON answer) and draws one swimlane per lane of the trace (the caller,
then each replica: flowrt.observe.trace), a bar per complete event and a line per flow arrow,
on a time axis. The SVG has classes and data attributes that say what each shape is (`lane`,
`bar`, `arrow`), so tests and tools can read the picture back; the HTML page is the SVG with
a table of the activations. The same trace always gives the same bytes.

A file that is not such a trace, or an output that is neither .svg nor .html, raises
`TraceFileError` with a message that names the fix.
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Any

WIDTH, LABELS, LANE, AXIS, PAD = 1000, 150, 26, 28, 8
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac", "#ff9da7")
CALL_COLOUR, ERROR_COLOUR = "#d0d4da", "#e15759"
HOW_TO_RECORD = "record one with `flowc run DIR --once GRAPH --trace call.json` or POST /graphs/GRAPH?trace=1"
FORMATS = (".svg", ".html")


class TraceFileError(Exception):
    """A trace that cannot be read or drawn, or a picture that cannot be written; the message names the fix."""


def load_trace(path: str | Path) -> dict:
    """The Chrome trace in `path`: a trace object, a done event carrying one, or an NDJSON answer ending with it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise TraceFileError(f"cannot read {path}: {error.strerror or error}; {HOW_TO_RECORD}") from None
    except UnicodeDecodeError as error:
        raise TraceFileError(f"{path} is not a JSON trace (not UTF-8 at byte {error.start}); {HOW_TO_RECORD}") from None
    value = _json(text)
    if value is None:  # an NDJSON answer: its last line is the done event
        lines = [line for line in text.splitlines() if line.strip()]
        value = _json(lines[-1]) if lines else None
        if value is None and text.lstrip().startswith("{"):
            raise TraceFileError(f"{path} is not whole JSON (cut short?); {HOW_TO_RECORD}")
    if isinstance(value, dict) and isinstance(value.get("trace"), dict):
        value = value["trace"]
    if not isinstance(value, dict) or not isinstance(value.get("traceEvents"), list):
        raise TraceFileError(f"{path} is not a Chrome trace (no `traceEvents` list); {HOW_TO_RECORD}")
    if not any(_drawable(e) for e in value["traceEvents"]):
        raise TraceFileError(f"{path} holds no complete events (ph X, with a numeric ts and dur) to draw; {HOW_TO_RECORD}")
    return value


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _drawable(event: object) -> bool:
    """A complete event with the times a bar needs."""
    return isinstance(event, dict) and event.get("ph") == "X" and _number(event.get("ts")) and _number(event.get("dur"))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def write_picture(trace_path: str | Path, output: str | Path) -> str:
    """Draw the trace in `trace_path` into `output` (.svg or .html); what was written, in words."""
    suffix = Path(output).suffix.lower()
    if suffix not in FORMATS:
        raise TraceFileError(f"-o {output}: the picture is SVG or HTML; name the output call.svg or call.html")
    trace = load_trace(trace_path)
    text = svg(trace) if suffix == ".svg" else html(trace)
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        raise TraceFileError(f"cannot write {output}: {error.strerror or error}; choose a writable path for -o") from None
    lanes = len(_lanes(trace))
    bars = sum(1 for e in _events(trace) if e["ph"] == "X")
    return f"wrote {output}: {lanes} lanes, {bars} bars"


# ── reading the events ──


def _events(trace: dict) -> list[dict]:
    """The events worth drawing, those with the fields they need, in a stable order."""
    kept = []
    for event in trace["traceEvents"]:
        if (
            _drawable(event)
            or isinstance(event, dict)
            and (event.get("ph") == "M" or event.get("ph") in ("s", "f") and _number(event.get("ts")))
        ):
            kept.append(event)
    return kept


def _lane_key(event: dict) -> tuple:
    return (str(event.get("pid", "")), str(event.get("tid", "")))


def _lanes(trace: dict) -> list[tuple[tuple, str]]:
    """(lane key, name) for every lane with a bar, in the trace's sort order (else its order)."""
    names: dict[tuple, str] = {}
    order: dict[tuple, float] = {}
    used: list[tuple] = []
    for event in _events(trace):
        key = _lane_key(event)
        if event["ph"] == "M" and event.get("name") == "thread_name":
            names[key] = str(event.get("args", {}).get("name", ""))
        elif event["ph"] == "M" and event.get("name") == "thread_sort_index":
            index = event.get("args", {}).get("sort_index", 0)
            order[key] = index if isinstance(index, (int, float)) else 0
        elif event["ph"] == "X" and key not in used:
            used.append(key)
    ranked = sorted(used, key=lambda k: (order.get(k, float("inf")), used.index(k)))
    return [(key, names.get(key) or f"thread {key[1]}") for key in ranked]


# ── drawing ──


def svg(trace: dict) -> str:
    """The call as an SVG picture: lanes, bars, arrows, a time axis."""
    events = _events(trace)
    lanes = _lanes(trace)
    row = {key: index for index, (key, _) in enumerate(lanes)}
    bars = [e for e in events if e["ph"] == "X"]
    start = min(e["ts"] for e in bars)
    span = max(e["ts"] + e["dur"] for e in bars) - start or 1.0
    scale = (WIDTH - LABELS - 2 * PAD) / span
    height = AXIS + LANE * len(lanes) + PAD

    def x(ts: float) -> float:
        return LABELS + PAD + (ts - start) * scale

    def y(key: tuple) -> float:
        return AXIS + LANE * row[key]

    roles = sorted({str(e.get("args", {}).get("role")) for e in bars if e.get("cat") != "call"})
    colours = {role: PALETTE[i % len(PALETTE)] for i, role in enumerate(roles)}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        'font-family="sans-serif" font-size="11">',
        '<defs><marker id="head" viewBox="0 0 6 6" refX="6" refY="3" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#555"/></marker></defs>',
    ]
    out += _axis(span, x, start, height)
    for index, (key, name) in enumerate(lanes):
        top = y(key)
        shade = "#f6f7f9" if index % 2 else "#ffffff"
        out.append(f'<g class="lane" data-lane="{escape(name)}">')
        out.append(f'<rect x="0" y="{top}" width="{WIDTH}" height="{LANE}" fill="{shade}"/>')
        out.append(f'<text x="{PAD}" y="{top + LANE / 2 + 4:.1f}">{escape(name)}</text>')
        for bar in (b for b in bars if _lane_key(b) == key):
            out.append(_bar(bar, x, top, colours))
        out.append("</g>")
    out += _arrows(events, x, lambda key: y(key) + LANE / 2, row)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _bar(bar: dict, x: Any, top: float, colours: dict) -> str:
    args = bar.get("args", {}) if isinstance(bar.get("args"), dict) else {}
    name = str(bar.get("name", ""))
    left, width = x(bar["ts"]), max(bar["dur"] * (x(1.0) - x(0.0)), 1.5)
    fill = CALL_COLOUR if bar.get("cat") == "call" else colours.get(str(args.get("role")), PALETTE[0])
    stroke = f' stroke="{ERROR_COLOUR}" stroke-width="2"' if args.get("outcome") not in (None, "ok") else ""
    details = [f"{name}: {bar['dur'] / 1000:.3f} ms"] + [
        f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in sorted(args.items())
    ]
    label = (
        f'<text x="{left + 3:.1f}" y="{top + LANE / 2 + 4:.1f}" fill="#111">{escape(name)}</text>'
        if width > 7 * len(name)
        else ""
    )
    return (
        f'<g class="bar" data-name="{escape(name)}" data-aid="{escape(str(args.get("aid", "")))}">'
        f'<rect x="{left:.1f}" y="{top + 4}" width="{width:.1f}" height="{LANE - 8}" rx="3" fill="{fill}"{stroke}>'
        f"<title>{escape(chr(10).join(details))}</title></rect>{label}</g>"
    )


def _arrows(events: list[dict], x: Any, middle: Any, row: dict) -> list[str]:
    """A line from each flow start to its finish (matched by id), drawn over the bars."""
    starts = {(e.get("cat"), e.get("id")): e for e in events if e["ph"] == "s"}
    lines = []
    for finish in (e for e in events if e["ph"] == "f"):
        begin = starts.get((finish.get("cat"), finish.get("id")))
        if begin is None or _lane_key(begin) not in row or _lane_key(finish) not in row:
            continue
        frame = escape(str(finish.get("args", {}).get("frame", "")))
        lines.append(
            f'<line class="arrow" data-frame="{frame}" x1="{x(begin["ts"]):.1f}" y1="{middle(_lane_key(begin)):.1f}" '
            f'x2="{x(finish["ts"]):.1f}" y2="{middle(_lane_key(finish)):.1f}" stroke="#555" stroke-width="1" '
            'marker-end="url(#head)" opacity="0.6"/>'
        )
    return lines


def _axis(span: float, x: Any, start: float, height: float) -> list[str]:
    """Ticks at a round step (1, 2 or 5 times a power of ten microseconds), about ten of them."""
    step = 1.0
    while span / step > 10:
        for factor in (2, 2.5, 2):
            step *= factor
            if span / step <= 10:
                break
    out = ['<g class="axis">']
    tick = 0.0
    while tick <= span:
        left = x(start + tick)
        out.append(f'<line x1="{left:.1f}" y1="{AXIS - 6}" x2="{left:.1f}" y2="{height - PAD}" stroke="#e3e5e8"/>')
        out.append(f'<text x="{left:.1f}" y="{AXIS - 10}" text-anchor="middle" fill="#555">{_duration(tick)}</text>')
        tick += step
    out.append("</g>")
    return out


def _duration(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:g} s"
    return f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} µs"


def html(trace: dict) -> str:
    """The picture in a page, with the call's summary and a table of its activations."""
    other = trace.get("otherData", {}) if isinstance(trace.get("otherData"), dict) else {}
    title = f"call {other.get('call_id', '?')} of {other.get('graph', '?')}"
    rows = []
    for bar in sorted((e for e in _events(trace) if e["ph"] == "X" and e.get("cat") != "call"), key=lambda e: e["ts"]):
        args = bar.get("args", {}) if isinstance(bar.get("args"), dict) else {}
        cells = (
            bar.get("name"),
            args.get("replica"),
            f"{bar['ts'] / 1000:.3f}",
            f"{bar['dur'] / 1000:.3f}",
            args.get("frames"),
            ", ".join(map(str, args.get("inputs") or [])),
            args.get("outcome"),
        )
        rows.append("<tr>" + "".join(f"<td>{escape(_visible(c if c is not None else ''))}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>" for h in ("activation", "replica", "start (ms)", "duration (ms)", "frames", "inputs", "outcome")
    )
    summary = ", ".join(f"{k}: {escape(_visible(other[k]))}" for k in ("status", "session", "activations") if k in other)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>'
        + escape(title)
        + "</title><style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}</style></head><body>\n"
        + f"<h1>{escape(title)}</h1><p>{summary}</p>\n"
        + svg(trace)
        + f"<table><tr>{head}</tr>\n"
        + "\n".join(rows)
        + "\n</table></body></html>\n"
    )


def _visible(value: Any) -> str:
    """A value as the page shows it: its text, with control characters (which HTML cannot
    show, NUL among them) written as escapes."""
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
