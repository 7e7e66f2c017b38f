"""What a call accepts before any role runs: entry values against their declared types
(flowrt.entry_types), timeouts, and how `call_batches` hands events to a server."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from flowrt.control import BadInputs, BadTimeout
from flowrt.entry_types import EntryTypeError, checker
from tests.runtime.harness import assert_clean, collect, open_runtime, returned

TYPED = """
type Frames = [Image]

placeholder text: Text
placeholder blob: Bytes
placeholder frames: Frames
placeholder weights: Tensor

role probe {
    impl "m:Probe"
    interface run { in text & blob & frames & weights  out seen: Json }
}

graph g {
    entry  text, blob, frames, weights
    return seen
}
"""


class Probe:
    async def run(self, ctx, text, blob, frames, weights):
        return {"seen": [type(text).__name__, bytes(blob), len(frames), weights]}


class Array:
    shape = (2, 2)
    dtype = "float16"


GOOD = {"text": "hi", "blob": "aGk=", "frames": [{"url": "a.png"}, "data:image/png;base64,AA=="], "weights": [[1, 2], [3.5, 4]]}


def test_values_that_fit_their_types_reach_the_role_bytes_decoded(tmp_path):
    async def main():
        runtime = await open_runtime(TYPED, tmp_path, {"probe": Probe()})
        assert returned(await collect(runtime, "g", GOOD)) == {"seen": ["str", b"hi", 2, [[1, 2], [3.5, 4]]]}
        from_python = {**GOOD, "blob": bytearray(b"yo"), "weights": 3.0}
        assert returned(await collect(runtime, "g", from_python))["seen"][1] == b"yo"
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("entry", "value", "words"),
    [
        ("text", None, "entry `text` is declared `Text` and takes a string, not null"),
        ("text", ["a"], "takes a string, not a list of 1"),
        ("blob", "not base64!", "entry `blob` is declared `Bytes` and takes bytes, as a base64 string over JSON"),
        ("blob", 12, "takes bytes (a base64 string over JSON), not a number (12)"),
        ("frames", {"url": "a.png"}, "entry `frames` is declared `[Image]` and takes a list, not an object"),
        ("frames", [{"url": "a"}, 7], "item 1: takes an object"),
        ("frames", [None], 'item 0: takes an object (e.g. {"url": ...}'),
        ("weights", "big", "entry `weights` is declared `Tensor` and takes an array (shape and dtype)"),
        ("weights", [[1, "2"]], "takes numbers, or (nested) lists of numbers; it holds a string ('2')"),
        ("weights", [True], "it holds a boolean (true)"),
    ],
)
def test_a_value_that_does_not_fit_is_refused_before_any_role_runs(tmp_path, entry, value, words):
    async def main():
        probe = Probe()
        runtime = await open_runtime(TYPED, tmp_path, {"probe": probe})
        with pytest.raises(BadInputs) as error:
            await collect(runtime, "g", {**GOOD, entry: value})
        assert words in str(error.value)
        with pytest.raises(BadInputs):
            runtime.call_batches("g", {**GOOD, entry: value})  # refused at once, before any event
        assert runtime.last_call is None  # no call ran
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


def test_the_rules_of_each_type():
    assert checker("Json") is None and checker("Any") is None and checker("Unknown") is None  # take anything
    tokens = checker("Tokens")
    assert tokens([1, 2, 3]) == [1, 2, 3]
    with pytest.raises(EntryTypeError, match="item 1 is a number"):
        tokens([1, 2.5])
    tensor = checker("Tensor")
    assert tensor(Array) is Array and tensor(2) == 2
    deep = [1.0]
    for _ in range(100_000):  # the check is iterative: no RecursionError
        deep = [deep]
    assert tensor(deep) is deep
    with pytest.raises(EntryTypeError):
        checker("Image")(math.pi)
    assert checker("Audio")(Array) is Array  # any Python object that is not a JSON scalar or list
    assert checker("[[Text]]")([["a"], []]) == [["a"], []]
    with pytest.raises(EntryTypeError, match="item 0: item 1: takes a string"):
        checker("[[Text]]")([["a", 1]])
    assert checker("[Json]")([None]) == [None]


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, "soon", True])
def test_a_timeout_that_would_hang_or_cancel_at_once_is_refused(tmp_path, timeout):
    async def main():
        runtime = await open_runtime(TYPED, tmp_path, {"probe": Probe()})
        with pytest.raises(BadTimeout, match="timeout: "):
            await collect(runtime, "g", GOOD, timeout=timeout)
        await runtime.close()

    asyncio.run(main())


@pytest.mark.parametrize("session", [12, b"s1", ["s"]])
def test_a_session_that_is_not_a_str_is_refused_before_the_call_runs(tmp_path, session):
    async def main():
        runtime = await open_runtime(TYPED, tmp_path, {"probe": Probe()})
        with pytest.raises(BadInputs, match=r"session must be a str .* not "):
            await collect(runtime, "g", GOOD, session=session)
        assert [e["event"] for e in await collect(runtime, "g", GOOD, session=str(session))][-1] == "done"
        assert runtime.statistics()["calls"] == 0  # (the refused call left nothing behind)
        await runtime.close()

    asyncio.run(main())


BURST = """
placeholder start: Json

role burst {
    impl "m:Burst"
    interface run { in start  out stream n: Json }
}

graph g {
    entry  start
    stream n ordered
}
"""


class Burst:
    """Yields 10 frames without awaiting, then one more once `go` is set."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def run(self, ctx, start):
        for i in range(10):
            yield {"n": i}
        await self.go.wait()
        yield {"n": 10}


def test_batches_hold_the_events_ready_together_and_never_wait_for_later_ones(tmp_path):
    async def main():
        burst = Burst()
        runtime = await open_runtime(BURST, tmp_path, {"burst": burst})
        batches = runtime.call_batches("g", {"start": 1})
        first = await asyncio.wait_for(batches.__anext__(), 10)  # arrives while the role waits for `go`
        assert [e["value"] for e in first] == list(range(10))  # the burst: one batch, one write
        assert not burst.go.is_set()
        burst.go.set()
        rest = [batch async for batch in batches]
        assert [e["value"] for batch in rest for e in batch if e["event"] == "stream"] == [10]
        assert rest[-1][-1] == {"event": "done", "status": "ok", "errors": [], "missing": []}
        assert_clean(runtime)
        await runtime.close()

    asyncio.run(main())


class BrokenSummary:
    def summary(self):
        raise ValueError("no pixels")


class BrokenShape:
    dtype = "float32"

    @property
    def shape(self):
        raise RuntimeError("freed")


def test_an_output_whose_summary_fails_is_described_not_a_crash():
    from flowrt.values import event_json

    line = event_json({"event": "return", "field": "image", "value": [BrokenSummary(), BrokenShape()]})
    assert json.loads(line)["value"] == [
        {"object": "BrokenSummary", "error": "ValueError: no pixels"},
        {"object": "BrokenShape", "error": "RuntimeError: freed"},
    ]
