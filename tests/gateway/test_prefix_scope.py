"""Prefix privacy (`--prefix-scope key|shared`, docs/security.md): examples/chat served by a real
`flowc run --http` server on loopback with two API keys. Under `key` (the default with keys) a
prompt another key already sent reuses nothing (`reused_tokens` 0: no oracle across tenants),
while the same key's next session reuses its pages; under `shared` the second key reuses the
first's pages, as without keys. Servers run torch on one thread and stop by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tokenizers", reason="flowstd's tokenizer needs `tokenizers`: pip install 'flowc[models]'")
pytest.importorskip("torch", reason="the llm role runs flowrt's reference engine: pip install 'flowc[torch]'")

from flowrt.frontdoor import front_door  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.gateway import guarded  # noqa: E402
from tests.gateway.guarded import events, request  # noqa: E402
from tests.runtime.test_serve import Server, flowc, serving  # noqa: E402

KEY_A = "tenant-a-0123456789abcdef"
KEY_B = "tenant-b-0123456789abcdef"
PAGE_TOKENS = 16  # examples/chat/pipeline.flow's `page_tokens`
PROMPT = [
    {"role": "system", "content": "You answer questions about flowc, the workflow compiler, in one line."},
    {"role": "user", "content": "Which secret project name did the finance team choose this quarter?"},
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prefix_scope") / "bundle"
    built = flowc("build", str(REPO / "examples" / "chat" / "pipeline.flow"), "-o", str(out))
    assert built.returncode == 0, built.stderr
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # the servers inherit it: torch on one thread
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


def generation(server: Server, key: str, session: str) -> dict:
    body = {"messages": {"model": "chat", "max_tokens": 2, "messages": PROMPT}}
    status, _, answer = request(server, "POST", "/graphs/chat", body, key, {"X-Flow-Session": session})
    assert status == 200, answer
    told = events(answer)
    assert told[-1]["status"] == "ok", told[-1]
    (value,) = [e["value"] for e in told if e["event"] == "return" and e["field"] == "generation"]
    return value


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_under_key_scope_another_key_reuses_nothing_and_the_same_key_reuses(bundle: Path, deploy: str):
    # --prefix-scope key: the default with keys; under `local` the scope travels to the llm's replica process
    options = ["--api-key", KEY_A, "--api-key", KEY_B, "--grace", "0", "--deploy", deploy]
    with serving(bundle, guarded.command(bundle, *options)) as server:
        first = generation(server, KEY_A, "a-1")
        assert first["reused_tokens"] == 0 and first["prompt_tokens"] >= 2 * PAGE_TOKENS
        other = generation(server, KEY_B, "b-1")  # the same prompt, another tenant: nothing to tell it
        assert other["reused_tokens"] == 0, other
        again = generation(server, KEY_A, "a-2")  # the same tenant, another session: its pages are reused
        assert again["reused_tokens"] >= PAGE_TOKENS, again
        assert generation(server, KEY_B, "b-2")["reused_tokens"] >= PAGE_TOKENS  # B's own pages, from b-1
        metrics = request(server, "GET", "/metrics")[2].decode()
        assert "flowrt_prefix_tokens_total" in metrics


def test_under_shared_scope_reuse_crosses_keys(bundle: Path):
    options = ["--api-key", KEY_A, "--api-key", KEY_B, "--prefix-scope", "shared", "--grace", "0"]
    with serving(bundle, guarded.command(bundle, *options)) as server:
        assert generation(server, KEY_A, "a-1")["reused_tokens"] == 0
        assert generation(server, KEY_B, "b-1")["reused_tokens"] >= PAGE_TOKENS  # A's pages, told to B


def test_the_option_is_checked():
    assert front_door({}, {}).prefix_scope == "shared"
    assert front_door({"api_key": [KEY_A]}, {}).prefix_scope == "key"
    assert front_door({"api_key": [KEY_A], "prefix_scope": "shared"}, {}).prefix_scope == "shared"
    with pytest.raises(ValueError, match="--prefix-scope: expected key or shared, not 'tenant'"):
        front_door({"api_key": [KEY_A], "prefix_scope": "tenant"}, {})
    with pytest.raises(ValueError, match="--prefix-scope key scopes prefix reuse to API keys: give --api-key too"):
        front_door({"prefix_scope": "key"}, {})
