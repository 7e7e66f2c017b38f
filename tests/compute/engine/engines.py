"""The engines the suite runs against: the reference engine in two shapes, or those named by
`--engine MODULE:FACTORY` / FLOWRT_TEST_ENGINE (a factory takes no arguments and returns an
unbound EngineAdapter; it reads whatever else it needs, a model path say, from the environment).
An engine's device is its `describe().device`: the suite's stacks and pools are made there.
Tolerances: `--engine-tolerance RTOL,ATOL` / FLOWRT_TEST_TOLERANCE override the engine's own
`conformance_tolerance` and the KV dtype's defaults (support.tolerance). No torch here:
collection works without it (the tests then skip)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flowrt.compute.engine import EngineAdapter, ReferenceConfig, ReferenceEngine

ENGINE_ENV = "FLOWRT_TEST_ENGINE"  # MODULE:FACTORY[,MODULE:FACTORY...], as --engine
TOLERANCE_ENV = "FLOWRT_TEST_TOLERANCE"  # RTOL,ATOL, as --engine-tolerance
VOCAB = 97  # a prime: the reference engine takes any vocabulary size


@dataclass(frozen=True)
class EngineCase:
    name: str
    make: Callable[[], EngineAdapter]

    def __str__(self) -> str:
        return self.name


REFERENCE_CASES = [
    EngineCase("reference", lambda: ReferenceEngine(ReferenceConfig(vocab_size=VOCAB, seed=1))),
    EngineCase(  # another shape: one K/V head for all query heads (MQA), 3 layers, bfloat16 K/V
        "reference-mqa-bf16",
        lambda: ReferenceEngine(
            ReferenceConfig(
                vocab_size=VOCAB,
                hidden_size=48,
                num_layers=3,
                num_heads=6,
                num_kv_heads=1,
                head_dim=8,
                seed=2,
                kv_dtype="bfloat16",
            )
        ),
    ),
]


def load_factory(text: str) -> EngineCase:
    module, _, attribute = text.partition(":")
    if not module or not attribute:
        raise ValueError(f"--engine {text!r}: give MODULE:FACTORY, a callable returning an unbound EngineAdapter")
    try:
        loaded = importlib.import_module(module)
    except ImportError as error:  # the engine's framework is missing or another version: say which engine
        raise ImportError(f"--engine {text}: {error}") from error
    factory = getattr(loaded, attribute, None)
    if not callable(factory):
        raise ValueError(f"--engine {text!r}: module {module} has no callable {attribute!r}")
    return EngineCase(text, factory)


def parse_tolerance(text: str | None) -> tuple[float, float] | None:
    """`RTOL,ATOL` (or one number for both) -> (rtol, atol); None for no text."""
    if text is None or not text.strip():
        return None
    parts = [part.strip() for part in text.split(",")]
    try:
        numbers = [float(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or any(not number >= 0 for number in numbers):
        raise ValueError(f"engine tolerance {text!r}: give RTOL,ATOL (two numbers >= 0), or one number for both")
    return (numbers[0], numbers[-1])


TOLERANCE_OVERRIDE: dict[str, tuple[float, float] | None] = {"option": None}  # --engine-tolerance, set by conftest


def tolerance_override() -> tuple[float, float] | None:
    """--engine-tolerance, else FLOWRT_TEST_TOLERANCE, else None."""
    return TOLERANCE_OVERRIDE["option"] or parse_tolerance(os.environ.get(TOLERANCE_ENV))


def engine_cases(option: Sequence[str]) -> list[EngineCase]:
    """The engines to run: those named by --engine or FLOWRT_TEST_ENGINE, else the reference ones."""
    named = [*option, *(name for name in os.environ.get(ENGINE_ENV, "").split(",") if name.strip())]
    return [load_factory(name.strip()) for name in named] if named else REFERENCE_CASES
