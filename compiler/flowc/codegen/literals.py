"""Python literals for generated modules: deterministic, sorted, laid out as `ruff format` would.

Mappings open one entry per line (they are tables to read) unless they hold only plain values
and fit on one line, like a slot or a control edge; lists likewise; strings use double quotes.
The same value always prints the same.
"""

from __future__ import annotations

import json

WIDTH = 100
INDENT = "    "


def literal(value: object, depth: int = 0) -> str:
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
            if len(INDENT * depth) + len(one_line) + 24 <= WIDTH:
                return one_line
        inner = INDENT * (depth + 1)
        items = [f"{inner}{literal(k)}: {literal(value[k], depth + 1)}," for k in sorted(value)]
        return "{\n" + "\n".join(items) + "\n" + INDENT * depth + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        parts = [literal(v, depth + 1) for v in value]
        one_line = "[" + ", ".join(parts) + "]"
        if "\n" not in one_line and len(INDENT * depth) + len(one_line) + 20 <= WIDTH:
            return one_line
        inner = INDENT * (depth + 1)
        return "[\n" + "\n".join(f"{inner}{p}," for p in parts) + "\n" + INDENT * depth + "]"
    raise TypeError(f"no literal for {type(value).__name__}")


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
