"""The engines the suite runs against: the reference engine in two shapes, or those named by
`--engine MODULE:FACTORY` / FLOWRT_TEST_ENGINE (a factory takes no arguments and returns an
unbound EngineAdapter). No torch here: collection works without it (the tests then skip)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flowrt.compute.engine import EngineAdapter, ReferenceConfig, ReferenceEngine

ENGINE_ENV = "FLOWRT_TEST_ENGINE"  # MODULE:FACTORY[,MODULE:FACTORY...], as --engine
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
    factory = getattr(importlib.import_module(module), attribute)
    return EngineCase(text, factory)


def engine_cases(option: Sequence[str]) -> list[EngineCase]:
    """The engines to run: those named by --engine or FLOWRT_TEST_ENGINE, else the reference ones."""
    named = [*option, *(name for name in os.environ.get(ENGINE_ENV, "").split(",") if name.strip())]
    return [load_factory(name.strip()) for name in named] if named else REFERENCE_CASES
