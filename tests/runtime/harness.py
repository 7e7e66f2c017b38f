"""Running inline .flow programs with inline role classes on the real embedded runtime."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

from flowc.check import check_source
from flowc.codegen import build_bundle
from flowrt.control import Runtime
from flowrt.errors import shown


def bundle_of(text: str, directory: Path) -> Path:
    source = directory / "pipeline.flow"
    source.write_text(text)
    result = check_source(text, "pipeline.flow", source)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    out = directory / "bundle"
    build_bundle(result.program, source, out).write(out)
    return out


async def open_runtime(text: str, directory: Path, roles: dict[str, object]) -> Runtime:
    """`roles` maps each role to an instance, or a list of instances (its replicas)."""
    instances = {name: (value if isinstance(value, list) else [value]) for name, value in roles.items()}
    return await Runtime.open(bundle_of(text, directory), instances=instances)


async def collect(runtime: Runtime, graph: str, inputs: dict, **kwargs) -> list[dict]:
    return [event async for event in runtime.call(graph, inputs, **kwargs)]


def streamed(events: list[dict], field: str) -> list:
    return [e["value"] for e in events if e["event"] == "stream" and e["field"] == field]


def returned(events: list[dict]) -> dict:
    return {e["field"]: e["value"] for e in events if e["event"] == "return"}


def done(events: list[dict]) -> dict:
    assert events[-1]["event"] == "done"
    return events[-1]


async def jitter(rng: random.Random, most: int = 6) -> None:
    """Let other activations run a random number of times: reorders work without sleeping."""
    for _ in range(rng.randint(0, most)):
        await asyncio.sleep(0)


def assert_clean(runtime: Runtime) -> None:
    stats = runtime.statistics()
    assert all(v == 0 for v in stats.values()), stats


def where_in(function, text: str = "") -> str:
    """The `where` of an error raised in `function`: `file:line` of the first line of its source
    holding `text` (its `def` line when `text` is empty), as the runtime shows it."""
    code = function.__code__
    if not text:
        return f"{shown(code.co_filename)}:{code.co_firstlineno}"
    lines = Path(code.co_filename).read_text().splitlines()
    found = next(n for n in range(code.co_firstlineno, len(lines) + 1) if text in lines[n - 1])
    return f"{shown(code.co_filename)}:{found}"


def finishes_within(seconds: float, coroutine) -> object:
    """Run `coroutine` on a loop of its own thread: a role that starves the loop would hang the
    test for ever, so the thread is given `seconds` and the test fails if it is still going."""
    outcome: dict[str, object] = {}

    def body():
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s: the loop never got a turn"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
