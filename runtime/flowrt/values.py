"""JSON summaries of values for events: JSON values pass through, tensors become their shape
and dtype, anything else a short description (DESIGN §5: `{"tensor": {"shape": [...], ...}}`)."""

from __future__ import annotations

from typing import Any


def summarize(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 16:
        return {"object": type(value).__name__}
    if isinstance(value, dict):
        return {str(k): summarize(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [summarize(v, depth + 1) for v in value]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return {"tensor": {"shape": [int(d) for d in value.shape], "dtype": str(value.dtype).removeprefix("torch.")}}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": {"length": len(value)}}
    summary = getattr(value, "summary", None)
    if callable(summary):
        return summarize(summary(), depth + 1)
    return {"object": type(value).__name__}
