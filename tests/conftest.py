"""Shared fixtures: paths into the repository and the `golden` snapshot fixture.

Golden files live under golden/<test module>/, one plain-text file per snapshot, so a change
shows up as a readable diff. `make golden` rewrites them; a snapshot no test uses fails the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import settings
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

# CI (which sets CI=true) replays a fixed, derandomized set of examples so a run is
# reproducible; local runs draw new examples each time and keep finding new cases.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Network tests stay on loopback: Ray's clusters (its nodes, GCS and workers, read when Ray is
# imported and inherited by every process it starts) and flowrt's tcp endpoints
# (flowrt.transport.sockets.host_address) use 127.0.0.1, not this machine's outward address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("FLOWRT_HOST", "127.0.0.1")

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden"
EXAMPLES = sorted(REPO.glob("examples/*/pipeline.flow"))
# examples on flowstd's model modules need the `models` extra (torch, tokenizers, and the media
# extra's Pillow and soundfile), which the Python 3.12 pass (`.[dev]` only) does not install
MODEL_MODULES = re.compile(r"^import\s+(llm|multimodal|tokenizer|voice|duplex)\b", re.MULTILINE)
HAVE_MODELS = all(importlib.util.find_spec(name) is not None for name in ("torch", "tokenizers", "PIL", "soundfile"))
NO_MODELS = (
    "needs the models extra (pip install 'flowc[models]': torch, tokenizers, Pillow, soundfile); this Python has not got it"
)


def needs_models(pipeline: Path) -> bool:
    """Whether an example's pipeline imports a flowstd module that runs models."""
    return MODEL_MODULES.search(pipeline.read_text()) is not None


INVALID = sorted((REPO / "tests" / "invalid").glob("*.flow"))


class GoldenText(SingleFileSnapshotExtension):
    _write_mode = WriteMode.TEXT
    file_extension = "txt"

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(GOLDEN / test_location.basename)


@pytest.fixture
def golden(snapshot):
    return snapshot.use_extension(GoldenText)


def display(path: Path) -> str:
    """How diagnostics name a repository file: relative to the repository root."""
    return path.relative_to(REPO).as_posix()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    failed = terminalreporter.stats.get("failed", [])
    if any("snapshot" in getattr(report, "longreprtext", "") for report in failed):
        terminalreporter.write_line(
            "golden files differ: if the change is intended, run `make golden` and review `git diff golden/`",
            yellow=True,
            bold=True,
        )


def by_field(lines: list[str], ordered: set[str]) -> dict:
    """A call's printed events as the language defines them: an ordered stream's frames in
    order, any other stream's as a multiset, the returned values, and the `done` line last."""
    events = [json.loads(line) for line in lines]
    fields: dict = {}
    for event in events[:-1]:
        fields.setdefault((event["event"], event["field"]), []).append(json.dumps(event["value"], sort_keys=True))
    for (kind, name), values in fields.items():
        if kind == "stream" and name not in ordered:
            values.sort()
    return {"fields": fields, "done": events[-1], "last": events[-1]["event"]}
