"""GET /metrics of examples/chat (a real tiny model on the KV pool) under `inproc` and `local`:
the KV pages of the process that runs the llm role, by tier and state; its prefix-reuse tokens,
which add up to what each call's `generation` says it reused and computed; and the frames of
each edge, a stream of tokens and one last frame of counts going different ways. Servers run
torch on one thread and are stopped by PID (tests.runtime.test_serve.serving)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tokenizers", reason="flowstd's tokenizer needs `tokenizers`: pip install 'flowc[models]'")
pytest.importorskip("torch", reason="the llm role runs flowrt's reference engine: pip install 'flowc[torch]'")

from flowrt.params.layout import KVLayout  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVError, KVSession  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.observe.helpers import by  # noqa: E402
from tests.observe.test_metrics import scrape  # noqa: E402
from tests.runtime.test_serve import flowc, lines, serving  # noqa: E402

EXAMPLE = REPO / "examples" / "chat"
REQUEST = json.loads((EXAMPLE / "request.json").read_text())
LLM_PROCESS = {"inproc": "server", "local": "llm/0"}  # the `process` label of the process running the llm role


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("chat_metrics") / "bundle"
    result = flowc("build", str(EXAMPLE / "pipeline.flow"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # the servers inherit it
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_kv_pages_and_prefix_tokens_of_the_llm_process(bundle, one_thread, deploy):
    command = [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", "--deploy", deploy]
    generations, deltas = [], 0
    with serving(bundle, command) as server:
        _, before = scrape(server)
        for _ in range(2):  # the same prompt twice in one session: turn 2 finds turn 1's full pages
            events = lines(server.post("/graphs/chat", json.dumps(REQUEST).encode(), {"X-Flow-Session": "alice"}))
            assert events[-1]["status"] == "ok", events
            generations += [e["value"] for e in events if e["event"] == "return" and e["field"] == "generation"]
            deltas += len([e for e in events if e["event"] == "stream"])
        _, samples = scrape(server)
    assert not by(before, "flowrt_kv_pages", "process", "tier", "state")  # pools are made on first use
    assert generations[1]["reused_tokens"] > 0  # (what the prefix counts below must add up to)

    prefix = by(samples, "flowrt_prefix_tokens_total", "role", "kind")
    assert prefix == {
        ("llm", "hit"): sum(g["reused_tokens"] for g in generations),
        ("llm", "computed"): sum(g["computed_tokens"] for g in generations),
        ("llm", "recomputed"): 0,
    }

    pages = by(samples, "flowrt_kv_pages", "process", "tier", "state")
    process = LLM_PROCESS[deploy]
    assert {p for p, _, _ in pages} == {process}
    capacity, used = pages[(process, "L1", "capacity")], pages[(process, "L1", "used")]
    assert capacity > 0 and used > 0  # committed pages stay, for the next turn
    assert used + pages[(process, "L1", "free")] == capacity
    assert pages[(process, "L1", "held")] == 0  # no call holds a page any more

    frames = by(samples, "flowrt_edge_frames_total", "producer", "consumer")
    generated = sum(g["generated_tokens"] for g in generations)
    # llm streams one token a frame to the detokenizer, then one frame of counts to the caller
    assert frames[("llm.generate", "stream_detokenizer.detokenize")] == generated
    assert frames[("llm.generate", "caller")] == 2
    assert frames[("stream_detokenizer.detokenize", "caller")] == deltas


def test_count_prefix_sums_per_role_in_the_pools_statistics_and_refuses_what_is_not_a_count():
    layout = KVLayout("kv", ("0",), ("k", "v"), page_tokens=4, heads=1, head_dim=2, dtype="float32")
    pool = KVPool(layout, device_pages=4, store=EmbeddedStore("t"), deployment="t", node="n")
    try:
        KVSession(pool, "s", "s/1/llm.generate#0", role="llm").count_prefix(hit=8, computed=5)
        KVSession(pool, "s", "s/2/llm.generate#0", role="llm").count_prefix(hit=4, computed=3, recomputed=2)
        KVSession(pool, "t", "t/3/dit.denoise#0", role="dit").count_prefix(computed=7)
        assert pool.statistics()["prefix_tokens"] == {
            "dit": {"hit": 0, "computed": 7, "recomputed": 0},
            "llm": {"hit": 12, "computed": 8, "recomputed": 2},
        }
        for bad in ({"hit": -1}, {"computed": 2.5}, {"recomputed": True}):
            with pytest.raises(KVError, match="whole numbers of tokens"):
                KVSession(pool, "s", "o", role="llm").count_prefix(**bad)
        assert pool.statistics()["prefix_tokens"]["llm"] == {"hit": 12, "computed": 8, "recomputed": 2}
    finally:
        pool.close()
