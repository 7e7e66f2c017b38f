"""examples/pd_split: the prefill role computes a prompt's KV pages and commits them; the decode
role (its own replicas) finds them by prefix match and decodes, prefilling nothing itself; the
tokens equal the unsplit model's (a dense forward of the same weights, no cache). Under
`--deploy local` the roles are separate processes sharing a metadata store (a redis-server of
the test's own, stopped by its PID), so decode reads prefill's pages from the other process's L2."""

from __future__ import annotations

import asyncio
import shutil

import pytest

pytest.importorskip("tokenizers", reason="flowstd's tokenizer needs `tokenizers`: pip install 'flowc[models]'")
torch = pytest.importorskip("torch", reason="the roles run flowrt's reference engine: pip install 'flowc[torch]'")
pytest.importorskip("redis", reason="the local case shares pages through Redis")

from flowrt.compute.engine import ReferenceEngine, SamplingParams, TokenSampler  # noqa: E402
from flowrt.params.layout import KVLayout  # noqa: E402
from flowstd.roles.llm import model_config  # noqa: E402
from flowstd.tokenizer import Tokenizer  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.deploy.helpers import calls, deployed, free_port  # noqa: E402
from tests.params.test_meta_helpers import redis_server  # noqa: E402
from tests.runtime.test_serve import flowc  # noqa: E402

EXAMPLE = REPO / "examples" / "pd_split"
MESSAGES = [
    {"role": "system", "content": "You answer questions about flowc, the workflow compiler."},
    {"role": "user", "content": "Which role computes the prompt, and which one decodes it?"},
]
MAX_TOKENS = 10


def unsplit_tokens(prompt: list[int], count: int, sampling: SamplingParams | None = None) -> list[int]:
    """The tokens of the same model run dense, the whole sequence each step, nothing cached:
    greedy, or drawn by one sampler of `sampling` from start to end."""
    layout = KVLayout("kv", ("0", "1"), ("k", "v"), 16, 2, 16, "float32")  # the example's `global kv`
    model = ReferenceEngine(model_config(layout, Tokenizer.load().vocab_size)).model
    sampler = TokenSampler(sampling) if sampling is not None else None
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(count):
            logits = model.dense_forward(tokens).logits[-1]
            tokens.append(sampler(logits) if sampler is not None else int(logits.argmax()))
    return tokens[len(prompt) :]


def split_of(events: list[dict]) -> dict:
    assert events[-1]["status"] == "ok", events[-1]
    return next(e["value"] for e in events if e.get("field") == "split")


async def ask(deployment, session: str, **sampling) -> dict:
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": MAX_TOKENS, **sampling}
    return split_of(await calls(deployment.runtime, "chat", {"messages": body}, session=session))


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_decode_prefills_nothing_and_gives_the_unsplit_models_tokens(tmp_path, monkeypatch, deploy):
    if deploy == "local" and shutil.which("redis-server") is None:
        pytest.skip("needs redis-server (the CI machine has it)")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    bundle = tmp_path / "bundle"
    built = flowc("build", str(EXAMPLE / "pipeline.flow"), "-o", str(bundle))
    assert built.returncode == 0, built.stderr
    prompt = Tokenizer.load().apply_chat_template(MESSAGES).ids
    expected = unsplit_tokens(prompt, MAX_TOKENS)
    drawn = {seed: unsplit_tokens(prompt, MAX_TOKENS, SamplingParams(1.3, top_p=0.95, seed=seed)) for seed in (5, 6)}
    assert drawn[5] != drawn[6] != expected  # (else sampling would not be tested)

    async def scenario():
        async with deployed(bundle, deploy) as deployment:
            split = await ask(deployment, "s1")
            assert split["tokens"] == expected
            assert split["prefill"] == {"computed_tokens": len(prompt), "reused_tokens": 0}
            # decode found every prompt token's K/V (the partial page's too) and ran only its own tokens
            assert split["decode"]["computed_tokens"] == 0 and split["decode"]["reused_tokens"] == len(prompt)
            assert split["decode"]["decode_steps"] == MAX_TOKENS - 1  # the first token came from prefill
            assert split["decode"]["sources"] == (["peer"] if deploy == "local" else ["device"])
            # asked again, prefill too finds the pages: it recomputes only the last page, for the first token's logits
            again = await ask(deployment, "s1")
            assert again["tokens"] == expected and again["decode"]["computed_tokens"] == 0
            assert 0 < again["prefill"]["computed_tokens"] <= 16
            # sampled: decode resumes prefill's stream, so the tokens are one sampler's, start to end
            for seed in (5, 6):
                sampled = await ask(deployment, "s1", temperature=1.3, top_p=0.95, seed=seed)
                assert sampled["tokens"] == drawn[seed]

    if deploy == "local":
        port = free_port()
        monkeypatch.setenv("FLOWRT_KV_META", f"redis://127.0.0.1:{port}/0")
        with redis_server(port):
            asyncio.run(scenario())
    else:
        asyncio.run(scenario())
