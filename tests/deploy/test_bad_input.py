"""Client errors (flowrt.BadInput): a role that raises it makes the answer 400 with its message
on both endpoints (`/graphs`, and `/v1` as OpenAI's `invalid_request_error`, which the official
client does not retry), under `inproc` and across processes under `local` (the replica's
`Failed` message carries the flag). flowstd's input errors are BadInputs."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import openai
import pytest

import flowrt
from flowrt.errors import BadInput, FlowrtError
from flowrt.transport import messages as m
from tests.gateway import guarded
from tests.gateway.guarded import events, request
from tests.runtime.test_serve import serving


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return guarded.bundle(tmp_path_factory.mktemp("bad_input"))


def calls_counted(server, graph: str, status: str) -> float:
    text = request(server, "GET", "/metrics")[2].decode()
    label = f'flowrt_calls_total{{graph="{graph}",status="{status}"}} '
    return next((float(line[len(label) :]) for line in text.splitlines() if line.startswith(label)), 0.0)


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_a_bad_input_is_400_with_the_roles_message_on_both_endpoints(bundle: Path, deploy: str):
    with serving(bundle, guarded.command(bundle, "--deploy", deploy, "--grace", "0")) as server:
        status, _, body = request(server, "POST", "/graphs/g", {"request": {"bad": True}})
        answer = json.loads(body)
        assert status == 400 and answer["code"] == "bad_input", answer
        assert "role `worker` (interface `run`): BadInput: `bad` asks for a bad request: leave it out" in answer["error"]
        client = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="none", timeout=30)  # retries: 2
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="talk", messages=[{"role": "user", "content": "bad"}])
        assert raised.value.status_code == 400 and raised.value.code == "bad_input"
        assert raised.value.body["type"] == "invalid_request_error"
        assert "the prompt may not be `bad`: say something else" in raised.value.message
        assert calls_counted(server, "talk", "error") == 1  # the client did not retry it
        # a role's own failure is still a 500 (and the NDJSON stream's error), not the caller's to fix
        status, _, body = request(server, "POST", "/graphs/g", {"request": {"leak": True}})
        assert status == 200 and events(body)[-1]["status"] == "error" and "bad_input" not in events(body)[-1]["errors"][0]
        assert client.chat.completions.create(model="talk", messages=[{"role": "user", "content": "fine"}]).choices


def test_the_failed_message_carries_the_flag_and_reads_without_it():
    failed = m.Failed(m.VERSION, 7, "BadInput: no", "roles.py:3", False, False, True)
    assert m.decode("replica", m.encode(failed)).bad_input is True
    older = msgspec.msgpack.encode(["failed", m.VERSION, 7, "ValueError: no", "", False, False])  # (no flag)
    assert m.decode("replica", older).bad_input is False


def test_bad_input_is_exported_once_and_flowstds_input_errors_are_bad_inputs():
    from flowstd.roles.llm import LlmError, LlmRequestError, sampling_request
    from flowstd.roles.multimodal import MultimodalInputError
    from flowstd.roles.voice import VoiceInputError

    assert flowrt.BadInput is BadInput and issubclass(BadInput, FlowrtError) and issubclass(BadInput, ValueError)
    assert issubclass(MultimodalInputError, BadInput) and issubclass(VoiceInputError, BadInput)
    assert issubclass(LlmRequestError, BadInput) and issubclass(LlmRequestError, LlmError)
    assert not issubclass(LlmError, BadInput)  # a pool or global that does not fit is the deployer's to fix
    with pytest.raises(BadInput, match="top_p is 0"):
        sampling_request({"top_p": 0})
