"""The bundle of a graph with a streaming entry (`placeholder stream`): graphs.py and plan.json
record it (`entry_stream`, the placeholder node's `stream`), flowrt reads it back
(`flowrt.tables.entry_stream`) and runs it in process (`flowc run --once` takes the list of its
frames; served over HTTP, POST takes the list and the WebSocket endpoint the frames one by one).
Under `--deploy local`, with either control, tests/deploy/test_streaming_local.py runs it."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

from flowc.check import check_file
from flowc.codegen import build_bundle
from flowrt.bundle import BundleError, load_bundle, refuse_streaming_entries
from flowrt.control import Runtime
from flowrt.gateway import application
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


def test_flowrt_loads_it_and_knows_which_entries_stream(bundle):
    loaded = load_bundle(OUT)
    assert loaded.plan["graphs"]["talk"]["entry_stream"] == ["audio_in"]
    talk = dict(loaded.plan["graphs"]["talk"], entry_stream=[])
    refuse_streaming_entries(dataclasses.replace(loaded, plan={**loaded.plan, "graphs": {"talk": talk}}), "served over HTTP")


def test_the_http_gateway_serves_it(bundle):
    async def main():
        runtime = await Runtime.open(OUT)
        try:  # POST takes the frames as a list, the WebSocket one by one (tests/gateway/test_websocket.py)
            routes = {(route.method, route.resource.canonical) for route in application(runtime).router.routes()}
            assert {("POST", "/graphs/{graph}"), ("GET", "/graphs/{graph}/ws")} <= routes
        finally:
            await runtime.close()

    asyncio.run(main())


def test_a_malformed_entry_stream_is_a_malformed_graphs_py(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(OUT, copy)
    graphs = copy / "graphs.py"
    graphs.write_text(graphs.read_text().replace('"entry_stream": ["audio_in"]', '"entry_stream": ["nobody"]'))
    with pytest.raises(BundleError, match=r"graphs.py is malformed \(TableError: graph `talk`: `entry_stream`"):
        load_bundle(copy)


def run_flowc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowc", "run", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_flowc_run_once_sends_a_list_as_the_entrys_frames(bundle):
    result = run_flowc(str(OUT), "--once", "talk", "--input", '{"audio_in": ["hello there", "you"], "voice": "v"}')
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["value"] for e in events if e.get("field") == "heard"] == ["hello", "there", "you"]
    returned = {e["field"]: e["value"] for e in events if e["event"] == "return"}
    assert returned == {"first": ["hello there", "you"], "total": 3}
    assert events[-1] == {"event": "done", "status": "ok", "errors": [], "missing": []}


def test_flowc_run_once_under_local_gives_what_it_gives_in_process(bundle):
    given = ("--once", "talk", "--input", '{"audio_in": ["hello there", "you"], "voice": "v"}')
    in_process, local = run_flowc(str(OUT), *given), run_flowc(str(OUT), *given, "--deploy", "local")
    assert local.returncode == 0, local.stderr
    events = [json.loads(line) for line in local.stdout.splitlines()]
    assert [e["value"] for e in events if e.get("field") == "heard"] == ["hello", "there", "you"]
    expected = [json.loads(line) for line in in_process.stdout.splitlines()]

    def by_field(events: list[dict]) -> dict:  # (the order within each field; fields interleave as they come)
        return {field: [e for e in events if e.get("field") == field] for field in {e.get("field") for e in events}}

    assert by_field(events) == by_field(expected) and events[-1] == expected[-1]


def test_flowc_run_refuses_what_it_cannot_run_in_one_line(bundle):
    for target in (str(OUT), str(DUPLEX)):  # (served over HTTP it runs: tests/gateway/test_websocket.py)
        result = run_flowc(target, "--once", "talk", "--input", '{"audio_in": "x", "voice": "v"}')
        assert result.returncode == 2, result.stderr
        said = "entry `audio_in` streams, so a call takes the list of its frames, not str"
        assert said in result.stderr and "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("flowc: ")
