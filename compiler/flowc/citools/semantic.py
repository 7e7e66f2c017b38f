"""`flowc diff`: the changes between two surfaces (`flowc.citools.surface`), each classified.

A change is **breaking** when a caller that worked against the old version can be refused or
get an answer of another shape, or when a deployment of the old version may no longer fit or
be found by its name; it is **compatible** otherwise. The table (docs/ci.md, "Breaking or
compatible") in code:

    flow renamed                                   breaking    bundle, Ray job and KubeRay names change
    graph added / removed                          compatible / breaking
    graph timeout lowered or added / raised or removed    breaking / compatible
    entry placeholder added / removed              breaking (calls without it, or with it, are refused)
    entry type widened (to Json or Any) / changed  compatible / breaking
    entry made streaming / no longer streaming     breaking (its value is given at the call, or sent in frames)
    streamed or returned field added / removed     compatible / breaking
    field moved between stream and return          breaking
    stream made unordered / made ordered           breaking / compatible
    output type narrowed (from Json or Any) / changed     compatible / breaking
    role added / removed                           compatible / breaking (deployments and errors name it)
    impl, replicas, uses, batch changed            compatible
    lb changed from `session` / otherwise          breaking (order and affinity lost) / compatible
    gpus or nodes more / fewer                     breaking (may no longer fit) / compatible
    `share gpus with` added or changed / removed   breaking (placement) / compatible
    interface added / removed                      compatible / breaking (errors and logs name it)
    interface inputs, outputs, streaming, batch    compatible (callers see them through the graphs)
    interface timeout lowered or added / raised or removed    breaking / compatible
    global added, removed or changed               compatible
"""

from __future__ import annotations

from dataclasses import dataclass

from flowc.citools.surface import Fact, GraphSurface, RoleSurface, Surface
from flowc.spans import Span

BREAKING, COMPATIBLE = "breaking", "compatible"
WIDE_TYPES = ("Json", "Any")  # an entry of these accepts any value (docs/runtime.md, "Entry values")


@dataclass(frozen=True)
class Change:
    severity: str  # BREAKING or COMPATIBLE
    code: str  # what kind of change, for tools: "output.unordered", "role.gpus", ...
    subject: str  # "flow", "graph chat", "role llm", "role llm, interface generate", "global kv"
    detail: str  # for people
    place: Span  # in the new version; in the old one for what was removed

    def as_json(self) -> dict:
        return {
            "severity": self.severity,
            "code": self.code,
            "subject": self.subject,
            "detail": self.detail,
            "place": {"file": self.place.file, "line": self.place.line, "column": self.place.column},
        }


def compare(old: Surface, new: Surface) -> list[Change]:
    """Every change from `old` to `new`, sorted: the flow, graphs, roles (with their
    interfaces), globals; by name within each."""
    changes: list[Change] = []
    if old.flow.value != new.flow.value:
        changes.append(
            Change(
                BREAKING,
                "flow.renamed",
                "flow",
                f"renamed `{old.flow.value}` → `{new.flow.value}`: the bundle's, Ray jobs' and KubeRay resources' names change",
                new.flow.place,
            )
        )
    for name in sorted(old.graphs.keys() | new.graphs.keys()):
        subject = f"graph {name}"
        if name not in new.graphs:
            changes.append(Change(BREAKING, "graph.removed", subject, "removed: calls of it are refused", old.graphs[name].place))
        elif name not in old.graphs:
            changes.append(Change(COMPATIBLE, "graph.added", subject, "added", new.graphs[name].place))
        else:
            changes += _graph(subject, old.graphs[name], new.graphs[name])
    for name in sorted(old.roles.keys() | new.roles.keys()):
        subject = f"role {name}"
        if name not in new.roles:
            changes.append(
                Change(
                    BREAKING,
                    "role.removed",
                    subject,
                    "removed: deployments, dashboards and errors that name it",
                    old.roles[name].place,
                )
            )
        elif name not in old.roles:
            changes.append(Change(COMPATIBLE, "role.added", subject, "added", new.roles[name].place))
        else:
            changes += _role(subject, old.roles[name], new.roles[name])
    for name in sorted(old.globals.keys() | new.globals.keys()):
        subject = f"global {name}"
        if name not in new.globals:
            changes.append(Change(COMPATIBLE, "global.removed", subject, "removed", old.globals[name].place))
        elif name not in old.globals:
            changes.append(Change(COMPATIBLE, "global.added", subject, "added", new.globals[name].place))
        else:
            before, after = old.globals[name], new.globals[name]
            if before.kind.value != after.kind.value:
                detail = f"kind {before.kind.value} → {after.kind.value}"
                changes.append(Change(COMPATIBLE, "global.kind", subject, detail, after.kind.place))
            for key in sorted(before.settings.value.keys() | after.settings.value.keys()):  # type: ignore[union-attr]
                a, b = before.settings.value.get(key), after.settings.value.get(key)  # type: ignore[union-attr]
                if a != b:
                    changes.append(Change(COMPATIBLE, "global.setting", subject, f"{key} {_shown(a)} → {_shown(b)}", after.place))
    return changes


def _graph(subject: str, old: GraphSurface, new: GraphSurface) -> list[Change]:
    changes: list[Change] = []
    for name in sorted(old.entry.keys() | new.entry.keys()):
        if name not in new.entry:
            detail = f"entry `{name}` removed: calls that send it are refused"
            changes.append(Change(BREAKING, "entry.removed", subject, detail, old.entry[name].place))
        elif name not in old.entry:
            detail = f"entry `{name}: {new.entry[name].value}` added: calls without it are refused"
            changes.append(Change(BREAKING, "entry.added", subject, detail, new.entry[name].place))
        elif old.entry[name].value != new.entry[name].value:
            before, after = str(old.entry[name].value), str(new.entry[name].value)
            place = new.entry_types[name].place
            if _covers(after, before):
                detail = f"entry `{name}` widened {before} → {after}: it accepts every value it did"
                changes.append(Change(COMPATIBLE, "entry.type-widened", subject, detail, place))
            else:
                detail = f"entry `{name}` changed {before} → {after}: calls that send a {before} may be refused"
                changes.append(Change(BREAKING, "entry.type-changed", subject, detail, place))
        if name in old.entry and name in new.entry and old.entry_stream[name].value != new.entry_stream[name].value:
            if new.entry_stream[name].value:
                detail = f"entry `{name}` now streams: its frames are sent while the call runs, not given when it starts"
            else:
                detail = f"entry `{name}` no longer streams: its value is given when the call starts, not sent in frames"
            changes.append(Change(BREAKING, "entry.stream", subject, detail, new.entry_stream[name].place))
    for name in sorted(old.outputs.keys() | new.outputs.keys()):
        changes += _output(subject, name, old.outputs.get(name), new.outputs.get(name))
    changes += _timeout(subject, "graph.timeout", "timeout", old.timeout, new.timeout, "calls")
    if old.interruptible.value != new.interruptible.value:
        if new.interruptible.value:
            detail = "made `interruptible`: a call may now end cancelled (reason `interrupted`) when a later call of its session interrupts it"
            changes.append(Change(BREAKING, "graph.interruptible", subject, detail, new.interruptible.place))
        else:
            detail = "no longer `interruptible`: a call made with `interrupt` waits for its running call, which ends as it would"
            changes.append(Change(COMPATIBLE, "graph.interruptible", subject, detail, new.interruptible.place))
    return changes


def _output(subject: str, name: str, old, new) -> list[Change]:
    if new is None:
        detail = f"{old.kind} `{name}` removed: callers no longer get it"
        return [Change(BREAKING, "output.removed", subject, detail, old.place)]
    if old is None:
        ordered = " ordered" if new.ordered else ""
        return [Change(COMPATIBLE, "output.added", subject, f"{new.kind} `{name}`{ordered} added", new.place)]
    changes = []
    if old.kind != new.kind:
        detail = f"`{name}` moved from {old.kind} to {new.kind}: callers get its values as other events"
        changes.append(Change(BREAKING, "output.kind", subject, detail, new.place))
    elif old.ordered and not new.ordered:
        detail = f"stream `{name}` is no longer ordered: callers get its frames in any order, not production order"
        changes.append(Change(BREAKING, "output.unordered", subject, detail, new.place))
    elif new.ordered and not old.ordered:
        detail = f"stream `{name}` is now ordered: its frames arrive in production order"
        changes.append(Change(COMPATIBLE, "output.ordered", subject, detail, new.place))
    if old.type.value != new.type.value:
        before, after = str(old.type.value), str(new.type.value)
        if _covers(before, after):
            detail = f"{new.kind} `{name}` narrowed {before} → {after}: every value fits what callers expected"
            changes.append(Change(COMPATIBLE, "output.type-narrowed", subject, detail, new.type.place))
        else:
            detail = f"{new.kind} `{name}` changed {before} → {after}: callers get values of another type"
            changes.append(Change(BREAKING, "output.type-changed", subject, detail, new.type.place))
    return changes


def _role(subject: str, old: RoleSurface, new: RoleSurface) -> list[Change]:
    changes: list[Change] = []
    facts_old, facts_new = old.facts, new.facts
    for key in ("impl", "replicas", "uses", "batch"):
        before, after = facts_old[key].value, facts_new[key].value
        if before != after:
            changes.append(
                Change(COMPATIBLE, f"role.{key}", subject, f"{key} {_shown(before)} → {_shown(after)}", facts_new[key].place)
            )
    lb_old, lb_new = facts_old["lb"].value, facts_new["lb"].value
    if lb_old != lb_new:
        lost = lb_old == "session"
        why = ": its activations are no longer released in order, nor a session's calls kept on one replica" if lost else ""
        changes.append(
            Change(BREAKING if lost else COMPATIBLE, "role.lb", subject, f"lb {lb_old} → {lb_new}{why}", facts_new["lb"].place)
        )
    for key, unit in (("gpus", "GPUs"), ("nodes", "machines")):
        before, after = int(facts_old[key].value), int(facts_new[key].value)  # type: ignore[call-overload]
        if before != after:
            more = after > before
            why = f": each replica needs more {unit}, and may no longer fit where it ran" if more else ""
            changes.append(
                Change(
                    BREAKING if more else COMPATIBLE,
                    f"role.{key}",
                    subject,
                    f"{key} {before} → {after}{why}",
                    facts_new[key].place,
                )
            )
    share_old, share_new = facts_old["share_gpus_with"].value, facts_new["share_gpus_with"].value
    if share_old != share_new:
        place = facts_new["share_gpus_with"].place
        if share_new is None:
            changes.append(Change(COMPATIBLE, "role.share", subject, f"no longer shares the GPUs of `{share_old}`", place))
        else:
            detail = f"now shares the GPUs of `{share_new}`" + (f" (was `{share_old}`)" if share_old else "")
            changes.append(Change(BREAKING, "role.share", subject, detail + ": it is placed on that role's cards", place))
    for name in sorted(old.interfaces.keys() | new.interfaces.keys()):
        where = f"{subject}, interface {name}"
        if name not in new.interfaces:
            detail = "removed: errors, logs and implementations that name it"
            changes.append(Change(BREAKING, "interface.removed", where, detail, old.interfaces[name].place))
        elif name not in old.interfaces:
            detail = f"added: the impl needs an `async def {name}(self, ctx, ...)`"
            changes.append(Change(COMPATIBLE, "interface.added", where, detail, new.interfaces[name].place))
        else:
            changes += _interface(where, old.interfaces[name].facts, new.interfaces[name].facts)
    return changes


def _interface(subject: str, old: dict[str, Fact], new: dict[str, Fact]) -> list[Change]:
    changes = []
    for key in ("inputs", "outputs", "stream", "batch"):
        before, after = old[key].value, new[key].value
        if before != after:
            detail = f"{key} {_shown(before)} → {_shown(after)}"
            if key == "stream":
                detail = "now streams (out stream)" if after else "no longer streams"
            changes.append(Change(COMPATIBLE, f"interface.{key}", subject, detail, new[key].place))
    changes += _timeout(subject, "interface.timeout", "timeout", old["timeout"], new["timeout"], "activations")
    return changes


def _timeout(subject: str, code: str, name: str, old: Fact, new: Fact, what: str) -> list[Change]:
    before, after = old.value, new.value
    if before == after:
        return []
    shorter = after is not None and (before is None or after < before)  # type: ignore[operator]
    detail = f"{name} {_seconds(before)} → {_seconds(after)}"
    if shorter:
        detail += f": {what} that took longer are now cancelled"
    return [Change(BREAKING if shorter else COMPATIBLE, code, subject, detail, new.place)]


def _covers(wide: str, narrow: str) -> bool:
    """Whether every value of type `narrow` is a value of type `wide` (`[Text]` in `[Any]`)."""
    while wide.startswith("[") and narrow.startswith("["):
        wide, narrow = wide[1:-1], narrow[1:-1]
    return wide in WIDE_TYPES or wide == narrow


def _seconds(value: object) -> str:
    """A duration as the language writes it: `90s`, `5m`, `2h`; `none` for no timeout."""
    if not isinstance(value, (int, float)):
        return "none"
    for unit, size in (("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    return str(value)
