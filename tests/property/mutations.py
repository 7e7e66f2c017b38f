"""Random mutations of valid .flow programs, for the property test and bench/fuzz_bench.py.

Each mutation takes the text and a `random.Random`, so hypothesis can drive it (and shrink it)
through `st.randoms()`, and the bench can run it at scale from a seed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from tests.conftest import EXAMPLES, INVALID, REPO

TOKEN = re.compile(r'\s+|[A-Za-z_]\w*|\d+(?:\.\d+)?[A-Za-z]*|"(?:[^"\\\n]|\\.)*"|#[^\n]*|.', re.DOTALL)
ALPHABET = "{}[]()|&,:.=#\"\\ \n\tabcxyz019_→é\x00\x7f;'/-"


def seeds() -> list[str]:
    """Valid programs (the examples and the standard library) and the invalid corpus."""
    paths = EXAMPLES + sorted((REPO / "stdlib/flowstd/lib").rglob("*.flow")) + INVALID
    return [p.read_text(encoding="utf-8") for p in paths]


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def delete_token(text: str, rng: random.Random) -> str:
    parts = tokens(text)
    if parts:
        del parts[rng.randrange(len(parts))]
    return "".join(parts)


def swap_tokens(text: str, rng: random.Random) -> str:
    parts = tokens(text)
    if len(parts) > 1:
        i, j = rng.randrange(len(parts)), rng.randrange(len(parts))
        parts[i], parts[j] = parts[j], parts[i]
    return "".join(parts)


def duplicate_token(text: str, rng: random.Random) -> str:
    parts = tokens(text)
    if parts:
        i = rng.randrange(len(parts))
        parts.insert(rng.randrange(len(parts) + 1), parts[i])
    return "".join(parts)


def truncate(text: str, rng: random.Random) -> str:
    return text[: rng.randrange(len(text) + 1)]


def random_bytes(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text) + 1)
    junk = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 12)))
    return text[:at] + junk + text[at:]


def deep_nesting(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text) + 1)
    depth = rng.choice([5, 31, 33, 200, 5000])
    opener = rng.choice(["[", "{", "[{"])
    closer = "".join({"[": "]", "{": "}"}[c] for c in reversed(opener))
    return text[:at] + opener * depth + rng.choice(["Json", "x 1", ""]) + closer * rng.choice([0, depth]) + text[at:]


def huge_token(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice(["9", "a", "#", '"']) * rng.choice([50, 5000]) + text[at:]


MUTATIONS: list[Callable[[str, random.Random], str]] = [
    delete_token,
    swap_tokens,
    duplicate_token,
    truncate,
    random_bytes,
    deep_nesting,
    huge_token,
]


def mutate(text: str, rng: random.Random, rounds: int = 3) -> str:
    for _ in range(rng.randrange(1, rounds + 1)):
        text = rng.choice(MUTATIONS)(text, rng)
    return text
