"""Python literals for generated modules: deterministic, sorted, laid out as `ruff format` would.

Mappings open one entry per line (they are tables to read) unless they hold only plain values
and fit on one line, like a slot or a control edge; lists likewise; strings use double quotes.
The same value always prints the same.
"""

from __future__ import annotations

import json

WIDTH = 100
RUFF_WIDTH = 88  # what `ruff format` wraps at with its defaults: no one-line value may pass it
INDENT = "    "


def literal(value: object, depth: int = 0, key: int = 0) -> str:
    """`value` as it is written at `depth`, after a dict key of `key` characters (its `"k": `)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        if not value:
            return "{}"
        if all(_plain(v) for v in value.values()):
            one_line = "{" + ", ".join(f"{literal(k)}: {literal(value[k])}" for k in sorted(value)) + "}"
            if len(INDENT * depth) + len(one_line) + 24 <= WIDTH and _fits(one_line, depth, key):
                return one_line
        inner = INDENT * (depth + 1)
        items = [f"{inner}{literal(k)}: {literal(value[k], depth + 1, len(literal(k)) + 2)}," for k in sorted(value)]
        return "{\n" + "\n".join(items) + "\n" + INDENT * depth + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        parts = [literal(v, depth + 1) for v in value]
        one_line = "[" + ", ".join(parts) + "]"
        if "\n" not in one_line and len(INDENT * depth) + len(one_line) + 20 <= WIDTH and _fits(one_line, depth, key):
            return one_line
        inner = INDENT * (depth + 1)
        return "[\n" + "\n".join(f"{inner}{p}," for p in parts) + "\n" + INDENT * depth + "]"
    raise TypeError(f"no literal for {type(value).__name__}")


def _fits(one_line: str, depth: int, key: int) -> bool:
    """Whether the line holding `one_line` (its indent, its key, the value, a comma) fits ruff's width."""
    return len(INDENT * depth) + key + len(one_line) + 1 <= RUFF_WIDTH


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
