"""The OpenAI-compatible endpoint (`/v1/chat/completions`, `/v1/models`), driven by the official
`openai` client against a real `flowc run --http` server on loopback, under `--deploy inproc`
and `local`.

The pipeline is tests/gateway/data: `echo` (a Text entry; an ordered Text stream whose frames
pass through replicas that finish out of order, plus a returned `words`), `greet` (a Text
return), `chat` (a Json entry: the whole request), `numbers` (no text) and `pair` (two
entries). One server per deployment serves every test of this module; waits are on the
server's answers (`/stats?idle=`), never sleeps, and the server is stopped by PID.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from flowrt.control import Runtime
from flowrt.gateway.openai import Answer, ChatShape, chat_shape
from tests.runtime.test_serve import Server, flowc, serving

DATA = Path(__file__).parent / "data"
SENTENCE = "the quick brown fox jumps over a lazy dog"
WORDS = SENTENCE.split()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gateway") / "bundle"
    result = flowc("build", str(DATA / "pipeline.flow"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module", params=["inproc", "local"])
def server(request, bundle: Path) -> Iterator[Server]:
    command = [sys.executable, "-m", "flowc", "run", str(bundle), "--http", "127.0.0.1:0", "--deploy", request.param]
    with serving(bundle, [*command, "--max-body-mb", "1"]) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    # no retries: every error must surface from the one request that caused it
    return openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="unused", max_retries=0, timeout=30)


def user(text) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def assert_nothing_running(server: Server) -> None:
    """No call is left running or queued (waiting at most 15 s for the calls in flight to end)."""
    status, statistics = server.get("/stats?idle=15")
    assert status == 200 and statistics["calls"] == statistics["queued_calls"] == statistics["busy_replicas"] == 0, statistics


def test_models_are_the_graphs_a_chat_client_can_drive(client: openai.OpenAI):
    models = {model.id: model for model in client.models.list()}
    assert {"echo", "greet", "chat"} <= models.keys() and "pair" not in models  # `pair` takes two entries
    assert all(m.object == "model" and m.owned_by == "flowc" and isinstance(m.created, int) for m in models.values())
    assert client.models.retrieve("echo").id == "echo"
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("pair")
    assert "takes 2 entry values" in raised.value.message and raised.value.code == "model_not_found"


def test_streaming_sends_the_ordered_text_stream_as_content_chunks(client: openai.OpenAI, server: Server):
    stream = client.chat.completions.create(
        model="echo",
        messages=user(SENTENCE),
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Flow-Session": "s-stream"},
    )
    chunks = list(stream)
    first, *content, final, usage = chunks
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    # one chunk per frame, in the order the writer produced them (the shapers finish out of order)
    assert [c.choices[0].delta.content for c in content] == [word + " " for word in WORDS]
    assert all(c.choices[0].finish_reason is None and c.object == "chat.completion.chunk" for c in content)
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].delta.content
    assert final.flow == {"words": {"count": len(WORDS), "session": "s-stream"}}  # the other returned field
    assert usage.choices == [] and usage.usage.completion_tokens == len(WORDS) == usage.usage.total_tokens
    assert usage.usage.prompt_tokens == 0
    assert len({c.id for c in chunks}) == 1 and all(c.model == "echo" for c in chunks)
    assert_nothing_running(server)


def test_without_stream_the_text_is_gathered_into_one_message(client: openai.OpenAI):
    completion = client.chat.completions.create(model="echo", messages=user(SENTENCE), user="alice")
    assert completion.object == "chat.completion" and completion.model == "echo"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == SENTENCE + " "
    assert choice.finish_reason == "stop"
    assert completion.usage.completion_tokens == len(WORDS) and completion.usage.prompt_tokens == 0
    assert completion.flow == {"words": {"count": len(WORDS), "session": "alice"}}  # `user` is the session


def test_a_text_entry_gets_the_last_user_messages_text_parts(client: openai.OpenAI):
    messages = [
        {"role": "user", "content": "not this one"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "first part"}, {"type": "text", "text": "second"}]},
    ]
    completion = client.chat.completions.create(model="echo", messages=messages)
    assert completion.choices[0].message.content == "first part second "
    assert completion.flow["words"]["count"] == 3


def test_a_text_return_is_one_content_chunk(client: openai.OpenAI):
    completion = client.chat.completions.create(model="greet", messages=user("Ada"))
    assert completion.choices[0].message.content == "hello, Ada" and completion.flow == {}
    chunks = list(client.chat.completions.create(model="greet", messages=user("Ada"), stream=True))
    assert [c.choices[0].delta.content for c in chunks] == ["", "hello, Ada", None]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_json_entry_gets_the_whole_request(client: openai.OpenAI):
    completion = client.chat.completions.create(model="chat", messages=user("hello there"), temperature=0.5)
    assert completion.choices[0].message.content == "HELLO THERE "
    assert completion.flow == {"seen": {"model": "chat", "messages": 2, "keys": ["messages", "model", "temperature"]}}
    chunks = list(client.chat.completions.create(model="chat", messages=user("hello there"), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "HELLO THERE "
    assert chunks[-1].flow["seen"]["keys"] == ["messages", "model", "stream"]


def test_max_tokens_caps_the_content_chunks_and_ends_the_call(client: openai.OpenAI, server: Server):
    # `wait` would keep the call running for two minutes: only ending it at the cap lets it go idle
    prompt = "one two wait three"
    stream = client.chat.completions.create(model="echo", messages=user(prompt), stream=True, max_tokens=2)
    chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks[1:-1]] == ["one ", "two "]
    assert chunks[-1].choices[0].finish_reason == "length"
    completion = client.chat.completions.create(model="echo", messages=user(prompt), max_completion_tokens=1)
    assert completion.choices[0].message.content == "one " and completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 1
    assert_nothing_running(server)


def test_a_json_graph_past_max_tokens_still_reports_its_other_outputs(client: openai.OpenAI, server: Server):
    # `counted` gets the whole body (max_tokens too), streams one word a frame, then its `tally`:
    # the endpoint sends no text past the cap but lets the call end, so `flow` still has the tally
    for stream in (False, True):
        answer = client.chat.completions.create(model="counted", messages=user("a b c d"), stream=stream, max_tokens=2)
        if stream:
            chunks = list(answer)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish, flow = chunks[-1].choices[0].finish_reason, chunks[-1].flow
        else:
            text, finish, flow = answer.choices[0].message.content, answer.choices[0].finish_reason, answer.flow
        assert (text, finish) == ("A B ", "length")
        assert flow["tally"] == [{"words": 4, "finish_reason": "stop"}]
    assert_nothing_running(server)


def test_a_graph_reports_its_own_finish_reason_and_token_counts(client: openai.OpenAI):
    # `counted` stops at its own `budget` and says so (finish_reason length), then counts its tokens:
    # the endpoint's finish_reason and usage are the graph's, not its own count of text chunks
    for stream in (False, True):
        answer = client.chat.completions.create(
            model="counted",
            messages=user("a b c d"),
            stream=stream,
            extra_body={"budget": 2},
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        if stream:
            chunks = list(answer)
            finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
            usage = chunks[-1].usage
        else:
            finish, usage = answer.choices[0].finish_reason, answer.usage
        assert finish == "length"
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (4, 20, 24)
        assert usage.prompt_tokens_details is None  # (it said nothing of reused tokens)
    plain = client.chat.completions.create(model="counted", messages=user("a b c"))
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens == 3  # no counts: its chunks
    # reused tokens are OpenAI's cached tokens, where they can be (never more than the prompt)
    for reused, cached in ((3, 3), (0, 0), (9, None), (-1, None), (True, None), (2**53, None)):
        answer = client.chat.completions.create(
            model="counted", messages=user("a b c d"), extra_body={"budget": 2, "reused": reused}
        )
        details = answer.usage.prompt_tokens_details
        assert (details.cached_tokens if details is not None else None) == cached, reused


@pytest.mark.parametrize(
    ("request_", "error", "param", "words"),
    [
        ({"model": "draw"}, openai.NotFoundError, "model", "the model `draw` does not exist"),
        ({"model": "pair"}, openai.BadRequestError, "model", "graph `pair` takes 2 entry values"),
        ({"model": "numbers"}, openai.BadRequestError, "model", "`numbers` cannot be served as a chat model"),
        ({"messages": []}, openai.BadRequestError, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, openai.BadRequestError, "messages[0].role", "must be one of"),
        ({"messages": [{"role": "user", "content": 5}]}, openai.BadRequestError, "messages[0].content", "a string or a list"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            openai.BadRequestError,
            "messages[0].content[0]",
            "type",
        ),
        ({"messages": [{"role": "system", "content": "x"}]}, openai.BadRequestError, "messages", "no user message"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
            openai.BadRequestError,
            "messages[0].content[0]",
            "graph `echo` takes Text",
        ),
        ({"n": 2}, openai.BadRequestError, "n", "`n` must be 1"),
        ({"logprobs": True}, openai.BadRequestError, "logprobs", "no log probabilities"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, openai.BadRequestError, "tools", "never with tool calls"),
        ({"stream_options": {"include_usage": True}}, openai.BadRequestError, "stream_options", "only allowed with"),
        ({"max_tokens": 0}, openai.BadRequestError, "max_tokens", "greater than 0"),
        ({"stream": "yes"}, openai.BadRequestError, "stream", "true or false"),
        ({"max_tokens": 1.5}, openai.BadRequestError, "max_tokens", "greater than 0, not 1.5"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            openai.BadRequestError,
            "stream_options.include_usage",
            "true or false, not a string",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]},
            openai.BadRequestError,
            "messages[0].content[0]",
            "`messages[0].content[0].type` must be one of text, image_url",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            openai.BadRequestError,
            "messages[0].content[0]",
            "`messages[0].content[0].text` must be a string, not a number",
        ),
        ({"temperature": "hot"}, openai.BadRequestError, "temperature", "a number from 0 to 2, not a string"),
        ({"top_p": 1.5}, openai.BadRequestError, "top_p", "a number above 0 and at most 1, not 1.5"),
        ({"top_p": 0}, openai.BadRequestError, "top_p", "a number above 0 and at most 1, not 0"),
        ({"stop": 5}, openai.BadRequestError, "stop", "a string or a list of at most 4 strings"),
        ({"seed": "abc"}, openai.BadRequestError, "seed", "a whole number, not a string"),
        ({"response_format": {"type": "json_object"}}, openai.BadRequestError, "response_format", '"json_object"'),
    ],
    ids=[
        "unknown-model",
        "two-entries",
        "no-text-output",
        "no-messages",
        "unknown-role",
        "content-a-number",
        "unknown-part",
        "no-user-message",
        "image-to-a-text-entry",
        "n",
        "logprobs",
        "tools",
        "stream-options-without-stream",
        "max-tokens-0",
        "stream-not-a-boolean",
        "max-tokens-not-whole",
        "include-usage-not-a-boolean",
        "part-type-a-list",
        "text-part-a-number",
        "temperature-a-string",
        "top-p-out-of-range",
        "top-p-zero",
        "stop-a-number",
        "seed-a-string",
        "json-mode",
    ],
)
def test_bad_requests_are_openai_errors_naming_the_parameter(client: openai.OpenAI, request_, error, param, words):
    body = {"model": "echo", "messages": user("hello"), **request_}
    with pytest.raises(error) as raised:
        client.chat.completions.create(**body)
    assert words in raised.value.message and raised.value.param == param
    assert raised.value.type == "invalid_request_error"
    assert client.chat.completions.create(model="echo", messages=user("still serving")).choices[0].finish_reason == "stop"


def test_bodies_that_are_not_chat_requests_get_openai_error_objects(server: Server):
    cases = [
        ("POST", "/v1/chat/completions", b"{not json", 400, "the body is not JSON"),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400, "the body is a list, not a JSON object"),
        ("POST", "/v1/chat/completions", b'{"model": "echo", "messages": "' + b"x" * 2**21 + b'"}', 413, "larger than"),
        ("GET", "/v1/chat/completions", None, 405, "does not answer GET; it answers POST"),
        ("GET", "/v1/embeddings", None, 405, "/v1/embeddings does not answer GET; it answers POST"),
        ("GET", "/v1/completions", None, 404, "no such path: /v1/completions"),
    ]
    for method, path, body, status, words in cases:
        connection = server.connect()
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == status, (path, answer)
        assert set(answer["error"]) == {"message", "type", "param", "code"} and words in answer["error"]["message"]


def test_a_role_that_raises_mid_stream_ends_the_stream_with_an_error_object(client: openai.OpenAI, server: Server):
    stream = client.chat.completions.create(model="echo", messages=user("alpha beta boom gamma"), stream=True)
    received = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            received.append(chunk)
    assert [c.choices[0].delta.content for c in received[1:-1]] == ["alpha ", "beta "]
    assert received[-1].choices[0].finish_reason == "error" and received[-1].flow["words"]["count"] == 4
    assert raised.value.code == "role_error" and raised.value.type == "server_error"
    assert "role `writer` (interface `write`): RuntimeError: the writer hit `boom`" in raised.value.message
    # before the first byte, the same failure is an HTTP error
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model="echo", messages=user("boom alpha"), stream=True)
    assert raised.value.code == "role_error" and "the writer hit `boom`" in raised.value.message
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="echo", messages=user("alpha boom"))
    assert_nothing_running(server)


def test_a_client_that_disconnects_cancels_its_call(client: openai.OpenAI, server: Server):
    # after two words the writer waits two minutes: only the disconnect can end the call in time
    stream = client.chat.completions.create(model="echo", messages=user("one two wait three"), stream=True)
    assert [next(stream).choices[0].delta.content for _ in range(3)] == ["", "one ", "two "]
    assert server.get("/stats")[1]["calls"] == 1
    stream.close()
    assert_nothing_running(server)


def test_recorded_output_types_pick_the_text_field_up_front(bundle: Path):
    """A bundle from a flowc that recorded output types but no endpoints: a graph without a Text
    output is no model at all (with neither, `numbers` is refused by its first value, above)."""

    async def shapes(types: dict[str, dict[str, str]]) -> dict:
        runtime = await Runtime.open(bundle)
        try:
            for graph, recorded in types.items():
                runtime.bundle.manifest["graphs"][graph].pop("endpoints", None)
                runtime.bundle.manifest["graphs"][graph]["output_types"] = recorded
            return {graph: chat_shape(runtime, graph) for graph in types}
        finally:
            await runtime.close()

    found = asyncio.run(shapes({"numbers": {"number": "Json"}, "echo": {"piece": "Json", "words": "Text"}}))
    assert (
        found["numbers"] == "graph `numbers` has no Text output (number: Json); the chat endpoint sends a Text stream or return"
    )
    assert found["echo"] == ChatShape("echo", "prompt", whole_body=False, text_field="words", declared=True)


def raw_answer(server: Server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    connection = server.connect()
    connection.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, response.getheader("Content-Type"), data


def test_hostile_bodies_are_client_errors_not_500s(server: Server):
    """Bodies a client got wrong are 400s naming the place, under every deployment, never the 500
    of a bug in flowrt (each of these was one) nor aiohttp's plain-text errors."""
    deep = b"[" * 300 + b"]" * 300  # parses, but a replica process could not be sent it (pickle recursion)
    cases = [
        # an unhashable part `type` could not be looked up (TypeError)
        (
            b'{"model": "echo", "messages": [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]}',
            None,
            "`messages[0].content[0].type` must be one of",
        ),
        # a Json entry gets the body whole: under `local` this nesting failed crossing to the replica
        (b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "x": ' + deep + b"}", None, "`x` nests more than"),
        # `Content-Encoding: gzip` on a body that is not gzip: aiohttp's RequestPayloadError
        (json.dumps({"model": "echo", "messages": user("hi")}).encode(), {"Content-Encoding": "gzip"}, "could not be read"),
    ]
    for body, headers, words in cases:
        status, kind, data = raw_answer(server, "POST", "/v1/chat/completions", body, headers)
        answer = json.loads(data)
        assert status == 400 and kind.startswith("application/json"), (status, data[:300])
        assert answer["error"]["type"] == "invalid_request_error" and words in answer["error"]["message"], answer
    status, _, data = raw_answer(server, "GET", "/v1")  # (was the gateway's own {"error", "hint"}, not OpenAI's)
    assert status == 404 and json.loads(data)["error"]["code"] == "unknown_url"
    assert_nothing_running(server)


def test_a_lone_surrogate_streams_as_a_json_escape(server: Server):
    """JSON may carry a lone surrogate ("\\ud800"), UTF-8 may not: the stream sends it escaped
    (it was a 500 before the first chunk, and an internal error after it)."""
    body = b'{"model": "echo", "stream": true, "messages": [{"role": "user", "content": "odd \\ud800 one"}]}'
    status, kind, data = raw_answer(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and kind == "text/event-stream", data[:300]
    lines = [line.removeprefix(b"data: ") for line in data.split(b"\n\n") if line]
    assert lines[-1] == b"[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "odd ", "\ud800 ", "one ", None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_call_that_ends_without_a_role_failing_says_why_and_the_fix():
    """A graph's timeout and a server stopping are named with their fix (was "call ended cancelled (timeout)")."""
    shape = ChatShape("write", "prompt", whole_body=False, text_field="line", declared=True)
    expected = {
        "timeout": (504, "graph `write` ran past its `timeout`", "raise the graph's `timeout` in its .flow"),
        "shutdown": (503, "the server is stopping", "send the request again once a server is running"),
    }
    for reason, (status, what, fix) in expected.items():
        answer = Answer(shape, None)
        answer.done = {"event": "done", "status": "cancelled", "errors": [], "missing": [], "reason": reason}
        finish, error = answer.ending()
        assert finish == "error" and error.status == status and error.code == reason
        assert what in error.message and fix in error.message, error.message


def test_sampling_parameters_of_the_right_type_are_accepted(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model="echo",
        messages=user("hello"),
        temperature=0.7,
        top_p=1,
        presence_penalty=-2,
        frequency_penalty=0.5,
        seed=3,
        stop=["x", "y"],
        response_format={"type": "text"},
    )
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content


def test_counts_a_json_reader_cannot_hold_exactly_are_not_read():
    from flowrt.gateway.openai_request import MAX_COUNT, TokenCounts

    assert TokenCounts.reported({"prompt_tokens": MAX_COUNT, "completion_tokens": 1}) == TokenCounts(MAX_COUNT, 1)
    for prompt in (MAX_COUNT + 1, 10**5000):  # (the second is past what json.dumps writes at all)
        assert TokenCounts.reported({"prompt_tokens": prompt, "completion_tokens": 1}) is None
