"""What the gateway tells callers about the deployment behind it (docs/security.md, "Exposure").

- `/stats` without an admin key (`public_stats`): counters only. Every string value is left out
  (session ids, socket and /dev/shm paths, addresses, reasons), and so is every key that is a
  path, a URL or a number (the memory manager's clients are keyed by PID), and `in_flight` lists
  each call's graph, call id and age, not its session. An admin key sees everything.
- Error events (`client_events`): each error keeps its role, interface and message, with any
  ipc/tcp address and absolute path in the message replaced by `<hidden>`; `where` becomes a
  file:line relative to the impl's own directory (the bundle's python_path), or the file's
  name alone when it is elsewhere (a library the role called). The server's log keeps it all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HIDDEN = "<hidden>"
# an address (ipc://..., tcp://...) or an absolute path of two parts or more (/dev/shm/x, /tmp/d/s)
_SECRETS = re.compile(r"\b(?:ipc|tcp|inproc|redis|rediss)://[^\s'\",;)\]]+|(?<![\w.:/])/(?:[\w.@+-]+/)+[\w.@+-]*")


def public_stats(stats: Any) -> Any:
    """`stats` with what only an admin may read left out (the module docstring)."""
    if isinstance(stats, dict):
        kept = {}
        for key, value in stats.items():
            if key == "in_flight" and isinstance(value, list):
                kept[key] = [{k: call[k] for k in ("graph", "call_id", "age_s") if k in call} for call in value]
            elif key in ("session", "sessions_listed") or _private_key(key) or isinstance(value, str):
                continue
            else:
                kept[key] = public_stats(value)
        return kept
    if isinstance(stats, list):
        return [public_stats(item) for item in stats if not isinstance(item, str)]
    return stats


def _private_key(key: Any) -> bool:
    text = str(key)
    return text.isdigit() or text.startswith("/") or "://" in text


def hide_paths(text: str) -> str:
    return _SECRETS.sub(HIDDEN, text)


def client_where(where: str, roots: Iterable[Path]) -> str:
    """`file:line` relative to the impl's directory (one of `roots`), else the file's name."""
    if not where:
        return where
    file, colon, line = where.rpartition(":")
    if not colon or not line.isdigit():
        return hide_paths(where)
    path = Path(file) if os.path.isabs(file) else Path.cwd() / file
    resolved = os.path.normpath(path)
    for root in roots:
        base = os.path.normpath(root)
        if resolved.startswith(base + os.sep):
            return f"{os.path.relpath(resolved, base)}:{line}"
    return f"{os.path.basename(file)}:{line}"


def client_events(batch: list[dict[str, Any]], roots: Iterable[Path]) -> list[dict[str, Any]]:
    """`batch` as a caller sees it: its done event's errors told without paths (the docstring)."""
    done = batch[-1]
    if done.get("event") != "done" or not done.get("errors"):
        return batch
    roots = list(roots)
    errors = [
        {**error, "message": hide_paths(error["message"]), "where": client_where(error["where"], roots)}
        for error in done["errors"]
    ]
    return [*batch[:-1], {**done, "errors": errors}]
