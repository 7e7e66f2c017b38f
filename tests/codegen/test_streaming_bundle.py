"""The bundle of a graph with a streaming entry (`placeholder stream`): graphs.py and plan.json
record it (`entry_stream`, the placeholder node's `stream`), flowrt reads it back
(`flowrt.tables.entry_stream`), and, until a call can take an entry's frames, refuses to load
the bundle rather than run it with the caller's value as the only frame."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys

import pytest

from flowc.check import check_file
from flowc.codegen import build_bundle
from flowrt.bundle import BundleError, load_bundle
from flowrt.tables import TableError, entry_stream
from tests.conftest import REPO

DUPLEX = REPO / "tests" / "data" / "streaming" / "duplex.flow"
OUT = REPO / "build" / "test-bundles" / "streaming_duplex"
PINNED = ("graphs.py", "plan.json", "bundle.json")


@pytest.fixture(scope="module")
def bundle():
    result = check_file(DUPLEX)
    assert result.ok, [d.message for d in result.diagnostics]
    built = build_bundle(result.program, DUPLEX, OUT)
    if OUT.exists():
        shutil.rmtree(OUT)
    built.write(OUT)
    return built


@pytest.mark.parametrize("relative", PINNED)
def test_golden_streaming_bundle_file(bundle, relative, golden):
    assert bundle.files[relative] == golden


def test_graphs_py_and_plan_json_record_the_streaming_entry_alike(bundle):
    plan = json.loads(bundle.files["plan.json"])["graphs"]["talk"]
    graphs = ast.literal_eval(bundle.files["graphs.py"].split("GRAPHS = ", 1)[1])
    talk = graphs["talk"]
    assert talk["entry_stream"] == plan["entry_stream"] == ["audio_in"]
    assert talk["nodes"]["$audio_in"] == plan["nodes"]["$audio_in"] and talk["nodes"]["$audio_in"]["stream"] is True
    assert talk["nodes"]["$voice"]["stream"] is False
    assert entry_stream("talk", talk) == entry_stream("talk", plan) == ("audio_in",)
    assert "#  $audio_in  [stream]" in bundle.files["graphs.py"]


def test_the_runtime_reads_which_entries_stream():
    assert entry_stream("g", {"entry": ["a", "b"], "entry_stream": ["b"]}) == ("b",)
    assert entry_stream("g", {"entry": ["a"]}) == ()  # a bundle from a flowc before streaming entries
    for bad in (["c"], ["a", "a"], "a", [1]):
        with pytest.raises(TableError, match="graph `g`: `entry_stream` must list some of its entries"):
            entry_stream("g", {"entry": ["a", "b"], "entry_stream": bad})


def test_flowrt_refuses_to_load_it_and_says_why(bundle):
    with pytest.raises(BundleError) as refused:
        load_bundle(OUT)
    message = str(refused.value)
    assert "graph `talk` streams `audio_in`" in message
    assert "`call = runtime.start(...)` and `await call.send(...)`, which this flowrt does not have yet" in message
    assert "declare the placeholder without `stream`" in message


def test_a_malformed_entry_stream_is_a_malformed_graphs_py(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(OUT, copy)
    graphs = copy / "graphs.py"
    graphs.write_text(graphs.read_text().replace('"entry_stream": ["audio_in"]', '"entry_stream": ["nobody"]'))
    with pytest.raises(BundleError, match=r"graphs.py is malformed \(TableError: graph `talk`: `entry_stream`"):
        load_bundle(copy)


def test_flowc_run_refuses_it_in_one_line(bundle):
    for target in (str(OUT), str(DUPLEX)):
        result = subprocess.run(
            [sys.executable, "-m", "flowc", "run", target, "--once", "talk", "--input", '{"audio_in": "x", "voice": "v"}'],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert "graph `talk` streams `audio_in`" in result.stderr and "Traceback" not in result.stderr
