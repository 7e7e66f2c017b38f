"""What each flow type accepts as a graph's entry value, checked when a call starts.

`flowc build` records every entry placeholder's declared type in bundle.json (`graphs.G.types`,
aliases resolved, `[T]` for lists). A call whose entry value does not fit is refused before any
role runs (BadInputs: 422 over HTTP, exit 2 for `flowc run --once`), naming the placeholder,
its type and what came. The rules (docs/runtime.md, "Entry values"):

    Json, Any      anything (over JSON: any JSON value)
    Text           a string
    Tokens         a list of integers
    Bytes          bytes (bytearray, memoryview); a string is read as base64 and the role gets bytes
    Tensor         an object with `shape` and `dtype` (numpy, torch, ...), a number, or a (nested)
                   list of numbers; the role gets it as given
    Image, Audio   an object (e.g. {"url": ...} or {"base64": ..., "format": ...}) or a string (a
                   URL or data: URI), or any Python object that is not a number, bool, list or
                   None; the role gets it as given and decodes it
    [T]            a list whose every item is a T

A bundle without recorded types (built by an older flowc) is not checked.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

MAX_SHOWN = 60  # characters of an offending value quoted in a message


class EntryTypeError(ValueError):
    """A value does not fit its declared type; the message says what came and what fits."""


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        shown = value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _anything(value: Any) -> Any:
    return value


def _text(value: Any) -> Any:
    if isinstance(value, str):
        return value
    raise EntryTypeError(f"takes a string, not {_describe(value)}")


def _tokens(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if not isinstance(item, int) or isinstance(item, bool):
                raise EntryTypeError(f"takes a list of integers; item {index} is {_describe(item)}")
        return value
    raise EntryTypeError(f"takes a list of integers, not {_describe(value)}")


def _bytes(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise EntryTypeError("takes bytes, as a base64 string over JSON; this string is not base64") from None
    raise EntryTypeError(f"takes bytes (a base64 string over JSON), not {_describe(value)}")


def _tensor(value: Any) -> Any:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return value
    if _is_number(value):
        return value
    if isinstance(value, (list, tuple)):
        stack = [value]
        while stack:  # iterative: a deeply nested list must not exhaust the stack
            for item in stack.pop():
                if isinstance(item, (list, tuple)):
                    stack.append(item)
                elif not _is_number(item):
                    raise EntryTypeError(f"takes numbers, or (nested) lists of numbers; it holds {_describe(item)}")
        return value
    raise EntryTypeError(f"takes an array (shape and dtype), a number or a (nested) list of numbers, not {_describe(value)}")


def _media(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, list, tuple)):
        raise EntryTypeError(
            'takes an object (e.g. {"url": ...}, {"base64": ..., "format": ...}, or an audio chunk {"format": "pcm16", '
            '"data": base64}) or a string (a URL or data: URI), '
            f"not {_describe(value)}"
        )
    return value


CHECKS: dict[str, Callable[[Any], Any]] = {
    "Json": _anything,
    "Any": _anything,
    "Text": _text,
    "Tokens": _tokens,
    "Bytes": _bytes,
    "Tensor": _tensor,
    "Image": _media,
    "Audio": _media,
}


def checker(type_text: str) -> Callable[[Any], Any] | None:
    """The check of a recorded type (`Text`, `[Image]`, ...); None when it takes anything
    (or the type is unknown to this flowrt, so a newer bundle is not refused)."""
    depth = 0
    while type_text.startswith("[") and type_text.endswith("]"):
        type_text, depth = type_text[1:-1], depth + 1
    check = CHECKS.get(type_text)
    if check is None or (check is _anything and depth == 0):
        return None
    for _ in range(depth):
        check = _list_of(check)
    return check


def _list_of(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check_list(value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise EntryTypeError(f"takes a list, not {_describe(value)}")
        checked = []
        for index, item in enumerate(value):
            try:
                checked.append(check(item))
            except EntryTypeError as error:
                raise EntryTypeError(f"item {index}: {error}") from None
        return checked

    return check_list
