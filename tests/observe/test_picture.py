"""`flowc trace FILE -o call.svg|html`: the picture of a real image_chat call, checked by a
golden file of its structure (its lanes and the bars on each, which timing cannot change)
and for determinism; and the clear errors for what cannot be drawn."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from flowrt.control import Runtime
from flowrt.observe import CallTrace
from tests.observe.helpers import REQUEST, build_image_chat

GOLDEN = Path(__file__).parent / "data" / "image_chat_picture.json"
SVG = "{http://www.w3.org/2000/svg}"


async def record(bundle: Path) -> dict:
    """The trace of the first call of a fresh runtime (so frontend's round robin picks replica 0)."""
    runtime = await Runtime.open(bundle)
    try:
        trace = CallTrace()
        events = [event async for event in runtime.call("chat", REQUEST, observer=trace)]
        assert events[-1]["status"] == "ok"
        return trace.chrome_trace()
    finally:
        await runtime.close()


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("picture")
    path = directory / "call.json"
    path.write_text(json.dumps(asyncio.run(record(build_image_chat(directory)))))
    return path


def flowc_trace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", "trace", *args], capture_output=True, text=True, timeout=60)


def structure(svg_text: str) -> dict:
    """The picture's lanes, top to bottom, each with its bars left to right, and its arrows."""
    root = ElementTree.fromstring(svg_text)
    lanes = []
    for lane in root.iter(f"{SVG}g"):
        if lane.get("class") == "lane":
            bars = [g for g in lane.iter(f"{SVG}g") if g.get("class") == "bar"]
            bars.sort(key=lambda g: float(g.find(f"{SVG}rect").get("x")))
            lanes.append([lane.get("data-lane"), [g.get("data-name") for g in bars]])
    arrows = sorted(line.get("data-frame") for line in root.iter(f"{SVG}line") if line.get("class") == "arrow")
    return {"lanes": lanes, "arrows": arrows}


def test_the_picture_of_a_call_has_a_lane_per_replica_and_a_bar_per_activation(trace_file, tmp_path):
    result = flowc_trace(str(trace_file), "-o", str(tmp_path / "call.svg"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {tmp_path / 'call.svg'}: 7 lanes, 9 bars")
    assert structure((tmp_path / "call.svg").read_text()) == json.loads(GOLDEN.read_text())


def test_the_picture_is_deterministic_and_the_page_holds_it(trace_file, tmp_path):
    for name in ("a.svg", "b.svg", "a.html", "b.html"):
        assert flowc_trace(str(trace_file), "-o", str(tmp_path / name)).returncode == 0
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()
    page = (tmp_path / "a.html").read_text()
    assert (tmp_path / "a.svg").read_text() in page and page.count("<tr>") == 1 + 8  # a header and 8 activations


def test_a_done_event_or_a_whole_answer_draws_the_same(trace_file, tmp_path):
    trace = json.loads(trace_file.read_text())
    answer = tmp_path / "answer.ndjson"
    answer.write_text(
        '{"event": "stream", "field": "token", "value": "saw"}\n' + json.dumps({"event": "done", "trace": trace}) + "\n"
    )
    assert flowc_trace(str(answer), "-o", str(tmp_path / "answer.svg")).returncode == 0
    assert flowc_trace(str(trace_file), "-o", str(tmp_path / "file.svg")).returncode == 0
    assert (tmp_path / "answer.svg").read_bytes() == (tmp_path / "file.svg").read_bytes()


@pytest.mark.parametrize(
    ("content", "output", "words"),
    [
        (None, "call.svg", "cannot read"),
        ("{not json", "call.svg", "is not whole JSON"),
        ('{"traceEvents": [{"ph": "X", "name": "cut"', "call.svg", "is not whole JSON"),
        ("[1, 2]", "call.svg", "is not a Chrome trace"),
        ('{"traceEvents": []}', "call.svg", "no complete events"),
        ('{"traceEvents": [{"ph": "X"}, {"ph": "X", "ts": "0", "dur": 1}]}', "call.svg", "no complete events"),
        (b"\xff\xfe", "call.svg", "not UTF-8"),
        ("TRACE", "call.png", "name the output call.svg or call.html"),
        ("TRACE", "missing/call.svg", "cannot write"),
    ],
)
def test_what_cannot_be_drawn_gets_a_clear_error(trace_file, tmp_path, content, output, words):
    source = tmp_path / "input.json"
    if content == "TRACE":
        source = trace_file
    elif isinstance(content, bytes):
        source.write_bytes(content)
    elif content is not None:
        source.write_text(content)
    result = flowc_trace(str(source), "-o", str(tmp_path / output))
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr


def test_a_session_shows_as_its_text_with_control_characters_escaped(trace_file):
    from flowrt.observe.picture import html, svg

    trace = json.loads(trace_file.read_text())
    odd = "🐱 日\x00\x1f"
    trace["otherData"]["session"] = odd
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            event["args"]["session"] = odd
    page, picture = html(trace), svg(trace)
    assert "session: 🐱 日\\x00\\x1f" in page and "\x00" not in page and "\x1f" not in page
    ElementTree.fromstring(picture)  # still XML
    assert "session: &quot;🐱 日\\u0000\\u001f&quot;" in picture and "\\ud83d" not in picture
