"""Golden plans and pictures of every example; the JSON schema; `flowc plan` and `flowc graph`."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from flowc.check import check_file
from flowc.plan import build_plan, pictures
from flowc.plan.text import plan_text
from tests.conftest import EXAMPLES, REPO, display

SCHEMA = json.loads((REPO / "docs/plan.schema.json").read_text())
IDS = [p.parent.name for p in EXAMPLES]


def plan_of(path):
    result = check_file(path, display(path))
    assert result.ok and result.diagnostics == [], [d.message for d in result.diagnostics]
    return build_plan(result.program)


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_plan_text(path, golden):
    assert plan_text(plan_of(path)) == golden


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_plan_json(path, golden):
    assert json.dumps(plan_of(path).as_json(), indent=2, sort_keys=True) + "\n" == golden


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_plan_matches_schema(path):
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(plan_of(path).as_json(), SCHEMA, cls=jsonschema.Draft202012Validator)


def test_schema_rejects_a_broken_plan():
    plan = plan_of(EXAMPLES[0]).as_json()
    graph = next(iter(plan["graphs"].values()))
    node = next(n for n in graph["nodes"].values() if n["groups"])
    node["groups"][0]["routing"] = "teleport"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(plan, SCHEMA, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_mermaid(path, golden):
    plan = plan_of(path)
    texts = [pictures.mermaid(graph) for _, graph in sorted(plan.graphs.items())]  # one picture a graph
    assert "\n".join(texts) == golden
    # every interface of each graph is drawn, inside its role's cluster
    for graph, text in zip((g for _, g in sorted(plan.graphs.items())), texts, strict=True):
        for node_id in graph.nodes:
            if "." in node_id:
                assert f"subgraph role_{node_id.split('.')[0]} " in text


def test_pictures_mark_buckets_joins_sessions_and_back_edges():
    chat = plan_of(REPO / "examples/image_chat/pipeline.flow").graphs["chat"]
    text = pictures.mermaid(chat)
    assert "bucket: vit_emb & vae_lat" in text
    assert "join: hidden 1, vit_emb all, vae_lat all" in text
    assert "class llm_generate" in text and "session (ordered)" in text
    loop = plan_of(REPO / "examples/agent_loop/pipeline.flow").graphs["ask"]
    assert "tools_run -. observation .-> agent_think" in pictures.mermaid(loop)
    assert 'tools_run -> agent_think [label="observation", style=dashed' in pictures.dot(loop)


def flowc(*args, env=None):
    return subprocess.run([sys.executable, "-m", "flowc", *args], capture_output=True, text=True, cwd=REPO, timeout=60, env=env)


def test_graph_svg_renders_with_graphviz_or_says_how_to_install_it():
    import os
    import shutil

    path = "examples/image_chat/pipeline.flow"
    if shutil.which("dot"):
        for example in EXAMPLES:
            plan = plan_of(example)
            for graph in plan.graphs.values():
                text = pictures.svg(graph)
                assert text.lstrip().startswith("<?xml") and "<svg" in text
                assert all(node.split(".")[1] in text for node in graph.nodes if "." in node)
        result = flowc("graph", "--format", "svg", path)
        assert result.returncode == 0, result.stderr
        assert "<svg" in result.stdout
    # Without Graphviz on the PATH the command explains how to get it.
    env = {**os.environ, "PATH": ""}
    missing = subprocess.run(
        [sys.executable, "-m", "flowc", "graph", "--format", "svg", path],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert missing.returncode == 2
    assert (
        "Install the `graphviz` package (Debian/Ubuntu: `apt-get install graphviz`" in missing.stderr
        and "Traceback" not in missing.stderr
    )


def test_graph_command_formats_and_choice(tmp_path):
    out = tmp_path / "chat.dot"
    result = flowc("graph", "--format", "dot", "-o", str(out), "examples/image_chat/pipeline.flow")
    assert result.returncode == 0
    assert out.read_text().startswith('digraph "chat" {')
    assert flowc("graph", "--graph", "nope", "examples/image_chat/pipeline.flow").returncode == 2


def test_plan_command_text_and_json():
    text = flowc("plan", "examples/image_chat/pipeline.flow")
    assert text.returncode == 0
    assert "in 1: bucket root frontend.parse: vit_emb<-vit.encode*, vae_lat<-vae.encode*" in text.stdout
    payload = json.loads(flowc("plan", "--json", "examples/image_chat/pipeline.flow").stdout)
    assert payload["graphs"]["chat"]["nodes"]["llm.generate"]["groups"][1]["root"] == "frontend.parse"
    broken = flowc("plan", "tests/invalid/E140_field_without_producer.flow")
    assert broken.returncode == 1 and "E140" in broken.stderr
