"""JSON summaries of values for events: JSON values pass through, tensors become their shape
and dtype, anything else a short description (DESIGN §5: `{"tensor": {"shape": [...], ...}}`),
and `event_json`, the one line an event prints as (`flowc run --once` and the HTTP server).

With `media=True`, a value that has a `media()` method (flowstd's images and audio) is carried in
full instead: `media()` gives `{"format": "png" | "wav", "base64": ..., ...}` (flowrt.media.carried).
Summaries stay the default; a failing `media()` is described like a failing `summary()`.

`json_text` is how every front door writes JSON: a float that is NaN or infinite, which JSON
cannot spell (Python's `json` would write `NaN`, which parsers refuse), is written as `null`,
as JavaScript's `JSON.stringify` does."""

from __future__ import annotations

import json
import math
from typing import Any

_SCALARS = frozenset({str, int, float, bool, type(None)})
# one encoder for every event: json.dumps with non-default options builds a new one per call;
# summaries are trees (depth-limited), so the circular-reference check is not needed
_ENCODE = json.JSONEncoder(ensure_ascii=False, check_circular=False, allow_nan=False).encode
_ENCODE_ASCII = json.JSONEncoder(check_circular=False, allow_nan=False).encode


def _plain(mapping: dict) -> bool:
    """A dict of scalars under string keys: its summary is itself."""
    for key, value in mapping.items():  # noqa: SIM110 - a loop: all() over a generator costs twice as much here
        if type(key) is not str or type(value) not in _SCALARS:
            return False
    return True


def summarize(value: Any, depth: int = 0, *, media: bool = False) -> Any:
    if type(value) in _SCALARS or isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if depth > 16:
        return {"object": type(value).__name__}
    if isinstance(value, dict):
        if type(value) is dict and _plain(value):
            return value  # nothing to change: no copy
        return {str(k): summarize(v, depth + 1, media=media) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [summarize(v, depth + 1, media=media) for v in value]
    try:  # a role's object whose `shape` or `summary()` fails is described, not a crash of the stream
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return {"tensor": {"shape": [int(d) for d in value.shape], "dtype": str(value.dtype).removeprefix("torch.")}}
        if isinstance(value, (bytes, bytearray)):
            return {"bytes": {"length": len(value)}}
        carried = getattr(value, "media", None) if media else None
        if callable(carried):
            return summarize(carried(), depth + 1)
        summary = getattr(value, "summary", None)
        if callable(summary):
            return summarize(summary(), depth + 1, media=media)
    except Exception as error:  # noqa: BLE001 - user code: its failure is part of the description
        return {"object": type(value).__name__, "error": f"{type(error).__name__}: {error}"}
    return {"object": type(value).__name__}


def event_json(event: dict[str, Any], *, media: bool = False) -> str:
    """One event as one line of JSON (no newline): its values summarised, or with `media` its
    images and audio in full (see the module docstring)."""
    return json_text(summarize(event, media=media))


def json_text(value: Any, *, ascii: bool = False) -> str:
    """`value` (JSON types) as JSON text every parser reads: NaN and the infinities as `null`.
    `ascii`: every character past ASCII (and a lone surrogate) written as a `\\u` escape."""
    encode = _ENCODE_ASCII if ascii else _ENCODE
    try:
        return encode(value)
    except ValueError:  # (only a float JSON cannot spell raises it: the rest is written as it is)
        return encode(_finite(value))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
