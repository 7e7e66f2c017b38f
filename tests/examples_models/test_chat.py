"""examples/chat through `/v1/chat/completions`, driven by the official `openai` client against
real `flowc run --http` servers on loopback, under `--deploy inproc` and `local`: a session's
turn 2 reuses turn 1's KV pages (the `generation` counts in `flow`) and answers exactly what a
fresh server, with nothing cached, answers; streaming and not; sampling parameters from the
request. Servers run torch on one thread and are stopped by PID (tests.runtime.test_serve)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tokenizers", reason="flowstd's tokenizer needs `tokenizers`: pip install 'flowc[models]'")
pytest.importorskip("torch", reason="the llm role runs flowrt's reference engine: pip install 'flowc[torch]'")

import openai  # noqa: E402

from tests.conftest import REPO  # noqa: E402
from tests.runtime.test_serve import Server, flowc, serving  # noqa: E402

EXAMPLE = REPO / "examples" / "chat"
PAGE_TOKENS = 16  # examples/chat/pipeline.flow's `page_tokens`
# the llm role's budget when the request sets none: the tests leave `max_tokens` out where they read the counts,
# since the endpoint ends a call at `max_tokens` text chunks, which may come before the `generation` frame
DEFAULT_MAX_TOKENS = 32
TURN_1 = [
    {"role": "system", "content": "You answer questions about flowc, the workflow compiler."},
    {"role": "user", "content": "How does a role reuse the KV cache of a session across turns?"},
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("chat") / "bundle"
    result = flowc("build", str(EXAMPLE / "pipeline.flow"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    # the servers inherit this: torch on one thread, as every test here runs it
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


def start(bundle: Path, deploy: str):
    return serving(bundle, [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", "--deploy", deploy])


def client_of(server: Server) -> openai.OpenAI:
    # no retries: every error surfaces from the one request that caused it
    return openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="unused", max_retries=0, timeout=60)


def streamed(client: openai.OpenAI, session: str, messages: list, **options) -> tuple[str, dict]:
    """The reply's text and `flow` of a streaming completion."""
    chunks = list(
        client.chat.completions.create(
            model="chat", messages=messages, stream=True, extra_headers={"X-Flow-Session": session}, **options
        )
    )
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1, chunks[-1]
    # the answer ends as the model's budget or <|eos|> ended it (the llm reports it), not by chunk count
    assert final[0].choices[0].finish_reason == final[0].flow["generation"]["finish_reason"]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), final[0].flow


def completed(client: openai.OpenAI, session: str, messages: list, **options) -> tuple[str, dict]:
    """The reply's text and `flow` of a completion without `stream`."""
    completion = client.chat.completions.create(
        model="chat", messages=messages, extra_headers={"X-Flow-Session": session}, **options
    )
    generation = completion.flow["generation"]
    assert completion.choices[0].finish_reason == generation["finish_reason"]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        generation["prompt_tokens"],
        generation["generated_tokens"],
    )
    return completion.choices[0].message.content, completion.flow


def turn_two(reply: str) -> list[dict]:
    return [*TURN_1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And on another replica?"}]


@pytest.fixture(scope="module")
def fresh_answers(bundle: Path, one_thread) -> dict:
    """What a server with nothing cached answers to turn 1, and then to turn 2 in a new session
    (its own process finds turn 1's pages by hash alone, so turn 2 goes first, on a fresh server)."""
    with start(bundle, "inproc") as server:
        client = client_of(server)
        # turn 1 alone first, to learn the reply turn 2 repeats (greedy: the same on every server)
        reply, counts = completed(client, "probe", TURN_1)
    with start(bundle, "inproc") as server:
        text, counts_2 = completed(client_of(server), "fresh", turn_two(reply))
    assert counts["generation"]["reused_tokens"] == counts_2["generation"]["reused_tokens"] == 0
    return {"reply": reply, "turn_two": text, "turn_two_prompt": counts_2["generation"]["prompt_tokens"]}


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_turn_two_reuses_turn_ones_pages_and_answers_as_a_fresh_server(bundle: Path, one_thread, fresh_answers, deploy):
    with start(bundle, deploy) as server:
        client = client_of(server)
        reply, flow = streamed(client, "s1", TURN_1)
        assert reply == fresh_answers["reply"]  # greedy and deterministic: the same text everywhere
        first = flow["generation"]
        assert first["reused_tokens"] == 0 and first["computed_tokens"] == first["prompt_tokens"] > 2 * PAGE_TOKENS
        assert first["generated_tokens"] == DEFAULT_MAX_TOKENS and first["finish_reason"] == "length"

        text, flow = completed(client, "s1", turn_two(reply))
        second = flow["generation"]
        assert text == fresh_answers["turn_two"]  # reuse changes no token
        assert second["prompt_tokens"] == fresh_answers["turn_two_prompt"]
        # every full page of turn 1's prompt is found: only the tokens after it are prefilled
        prompt_pages = first["prompt_tokens"] // PAGE_TOKENS
        assert second["reused_tokens"] >= prompt_pages * PAGE_TOKENS, second
        assert second["computed_tokens"] == second["prompt_tokens"] - second["reused_tokens"]

        # streaming turn 2 again: everything up to its trailing partial page is cached now
        again, flow = streamed(client, "s1", turn_two(reply), stream_options={"include_usage": True})
        assert again == text
        assert flow["generation"]["computed_tokens"] < PAGE_TOKENS + 1, flow


def test_sampling_parameters_come_from_the_request(bundle: Path, one_thread, fresh_answers):
    with start(bundle, "inproc") as server:
        client = client_of(server)
        seeded = [completed(client, f"t{n}", TURN_1, temperature=1.5, seed=11)[0] for n in range(2)]
        assert seeded[0] == seeded[1] != fresh_answers["reply"]  # a seeded draw repeats; greedy it is not
        other, _ = completed(client, "t2", TURN_1, temperature=1.5, seed=12, top_p=0.9)
        assert other != seeded[0]
        # the role stops at the budget too, so a short answer is the start of the long one
        short = client.chat.completions.create(model="chat", messages=TURN_1, max_completion_tokens=3)
        assert fresh_answers["reply"].startswith(short.choices[0].message.content)
        assert short.choices[0].finish_reason == "length"  # 3 tokens, whatever the number of text chunks
        with pytest.raises(openai.BadRequestError) as raised:  # refused at the edge: the graph never runs
            completed(client, "t4", TURN_1, top_p=0)
        assert "`top_p` must be a number above 0" in raised.value.message
