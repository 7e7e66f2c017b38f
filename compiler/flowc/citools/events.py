"""A call's events as `flowc test` records and compares them (docs/ci.md, "Golden event tests").

A recording is a `.events.jsonl` file: the lines `flowc run --once` prints (DESIGN §5), less
each error's `where` (a path relative to the working directory of the process that ran the
role, so not the same on every machine). Two recordings are equal when their *normal forms*
are, which follow the language's guarantees and nothing more:

- an `ordered` stream's values in production order, item by item;
- a stream that is not `ordered` as a multiset (sorted), since its frames reach the caller in
  any order;
- a return field's value exactly; how events of different fields interleave is not compared
  (a returned field may come before, between or after the frames of a stream);
- `done`: the status (and a cancelled call's reason), the fields `missing`, and the errors as
  a multiset of `role.interface`; their messages only with `messages=True`, since a message
  may hold an address, a path or a time.

Values are compared as canonical JSON (object keys sorted), so `1` and `1.0` differ but key
order does not. The normal form is also what a failing case shows: a unified diff of the
recorded form against this run's.
"""

from __future__ import annotations

import difflib
import json
from collections import defaultdict
from collections.abc import Mapping


class BadRecording(ValueError):
    """A `.events.jsonl` line that is not a JSON object: the message names the line."""


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def parse(text: str, source: str) -> list[dict]:
    """The events of a recording; BadRecording naming `source` and the line when one does not parse."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as error:
            raise BadRecording(f"{source}:{number}: not JSON ({error}); re-record it with `flowc test --update`") from None
        if not isinstance(event, dict):
            raise BadRecording(f"{source}:{number}: an event is a JSON object; re-record it with `flowc test --update`")
        if event.get("event") == "done":
            for key, kind in (("errors", list), ("missing", list), ("status", str)):
                if key in event and not isinstance(event[key], kind):
                    raise BadRecording(
                        f"{source}:{number}: a done event's `{key}` is a {kind.__name__}, not {json.dumps(event[key])}; "
                        "re-record it with `flowc test --update`"
                    )
        events.append(event)
    return events


def recordable(events: list[dict]) -> list[dict]:
    """The events as a recording keeps them: without the errors' `where`."""
    kept = []
    for event in events:
        if event.get("event") == "done" and isinstance(event.get("errors"), list):
            errors = [{k: v for k, v in e.items() if k != "where"} if isinstance(e, dict) else e for e in event["errors"]]
            event = {**event, "errors": errors}
        kept.append(event)
    return kept


def dump(events: list[dict]) -> str:
    """A recording's text: one event per line, as `flowc run --once` prints them."""
    return "".join(json.dumps(event, ensure_ascii=False) + "\n" for event in recordable(events))


def normal_form(events: list[dict], ordered: Mapping[str, bool], messages: bool = False) -> list[str]:
    """The lines two recordings are compared on. `ordered` maps each streamed field of the
    graph to whether it is `ordered`; a field it does not name is compared in order."""
    streams: dict[str, list[str]] = defaultdict(list)
    returns: dict[str, list[str]] = defaultdict(list)
    others: list[str] = []
    done: dict | None = None
    for event in events:
        kind, name = event.get("event"), str(event.get("field"))
        if kind == "stream":
            streams[name].append(canonical(event.get("value")))
        elif kind == "return":
            returns[name].append(canonical(event.get("value")))
        elif kind == "done" and done is None:
            done = event
        else:
            others.append(f"event: {canonical(event)}")
    lines: list[str] = []
    for name in sorted(streams):
        if ordered.get(name, True):
            lines += [f"stream {name} [{index}]: {value}" for index, value in enumerate(streams[name])]
        else:
            lines += [f"stream {name} (unordered): {value}" for value in sorted(streams[name])]
    for name in sorted(returns):
        lines += [f"return {name}: {value}" for value in returns[name]]
    lines += others
    lines += _done_lines(done, messages)
    return lines


def _done_lines(done: dict | None, messages: bool) -> list[str]:
    if done is None:
        return ["done: (no done event)"]
    reason = f" ({done['reason']})" if done.get("reason") is not None else ""
    lines = [f"done: {done.get('status')}{reason}"]
    errors = []
    for error in done.get("errors") or []:
        if not isinstance(error, dict):
            errors.append(f"error: {canonical(error)}")
            continue
        text = f"error: {error.get('role')}.{error.get('interface')}"
        errors.append(text + (f": {error.get('message')}" if messages else ""))
    lines += sorted(errors)
    lines += [f"missing: {name}" for name in sorted(map(str, done.get("missing") or []))]
    return lines


def difference(
    recorded: list[dict], observed: list[dict], ordered: Mapping[str, bool], messages: bool = False, label: str = "recorded"
) -> str | None:
    """None when the two are equal under the language's rules, else a unified diff of their
    normal forms (`-` recorded, `+` this run)."""
    before, after = normal_form(recorded, ordered, messages), normal_form(observed, ordered, messages)
    if before == after:
        return None
    lines = difflib.unified_diff(before, after, label, "this run", lineterm="", n=2)
    return "\n".join(lines) + "\n"
