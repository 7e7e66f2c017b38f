"""What the observe tests share: the image_chat bundle, a call recorded in process, the
checks every flowrt trace must pass (its JSON schema, one complete event per activation,
consistent nesting per lane, an arrow from each consumed frame's producer to its consumer),
and reading a scrape of /metrics by metric and labels."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import jsonschema

from tests.conftest import REPO

IMAGE_CHAT = REPO / "examples" / "image_chat"
REQUEST = json.loads((IMAGE_CHAT / "request.json").read_text())
TEXT_ONLY = json.loads((IMAGE_CHAT / "tests" / "chat.text_only.input.json").read_text())
BROKEN_IMAGE = {"request": {"segments": [{"type": "image", "height": 3}]}}  # no width: vit and vae raise
SCHEMA = json.loads((Path(__file__).parent / "data" / "trace.schema.json").read_text())
# what each request runs with image_chat's stand-in roles, read off the pipeline (not off a trace):
# (role, interface, outcome) -> activations
RUNS = {
    "request": Counter({("frontend", "parse", "ok"): 1, ("embed", "encode", "ok"): 1, ("vit", "encode", "ok"): 1,
                        ("vae", "encode", "ok"): 1, ("llm", "generate", "ok"): 2, ("dit", "denoise", "ok"): 1,
                        ("vae", "decode", "ok"): 1}),
    "text_only": Counter({("frontend", "parse", "ok"): 1, ("embed", "encode", "ok"): 1, ("llm", "generate", "ok"): 1,
                          ("dit", "denoise", "ok"): 1, ("vae", "decode", "ok"): 1}),
    "broken_image": Counter({("frontend", "parse", "ok"): 1, ("vit", "encode", "error"): 1, ("vae", "encode", "error"): 1}),
}  # fmt: skip


def build_image_chat(directory: Path) -> Path:
    out = directory / "chat_bundle"  # not `image_chat`: that is the impl's package
    result = subprocess.run(
        [sys.executable, "-m", "flowc", "build", str(IMAGE_CHAT / "pipeline.flow"), "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


def activations(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "activation"]


def check_trace(trace: dict, expected: Counter) -> None:
    """Everything a trace of one call promises (docs/observe.md)."""
    jsonschema.validate(trace, SCHEMA)
    runs = activations(trace)
    assert Counter((e["args"]["role"], e["args"]["interface"], e["args"]["outcome"]) for e in runs) == expected
    assert len({e["args"]["aid"] for e in runs}) == len(runs) == trace["otherData"]["activations"]
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    by_lane = defaultdict(list)
    for event in complete:
        by_lane[event["tid"]].append(event)
    for events in by_lane.values():  # on a lane, two events are disjoint or one holds the other
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[float] = []
        for event in events:
            while open_ends and open_ends[-1] <= event["ts"]:
                open_ends.pop()
            assert not open_ends or event["ts"] + event["dur"] <= open_ends[-1], f"{event['name']} overlaps on its lane"
            open_ends.append(event["ts"] + event["dur"])
    call = next(e for e in complete if e["cat"] == "call")
    producers = {e["args"]["aid"]: e for e in runs} | {0: call}
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    finishes = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert starts.keys() == finishes.keys()
    arrows = {(finishes[i]["tid"], finishes[i]["ts"], finishes[i]["args"]["frame"]): starts[i] for i in finishes}
    for run in runs:
        assert run["args"]["inputs"], f"{run['name']} consumed no frame"
        for frame in run["args"]["inputs"]:
            start = arrows.get((run["tid"], run["ts"], frame))
            assert start is not None, f"no arrow brings frame {frame} to {run['name']}"
            producer = producers[int(frame.split(":")[0])]
            assert start["tid"] == producer["tid"]
            # it leaves its producer's bar (times are microseconds to 3 decimals: their sum is exact to 1e-6)
            assert producer["ts"] <= start["ts"] <= producer["ts"] + producer["dur"] + 1e-6


def family(samples: dict, name: str) -> dict[tuple, float]:
    """The samples of one metric name (of a scrape: (name, labels as sorted pairs) -> value): labels -> value."""
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def by(samples: dict, name: str, *keys: str) -> dict[tuple, float]:
    """The samples of `name` keyed by the values of labels `keys`."""
    return {tuple(dict(labels)[k] for k in keys): value for labels, value in family(samples, name).items()}
