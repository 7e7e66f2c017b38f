"""A deliberately simple reference interpreter of DESIGN §4, written apart from flowrt.

It shares no code with flowrt: it reads the compiler's static plan (which tests/plan checks
against path enumeration) and runs one call sequentially from a worklist. Instead of activation
ids it keys buckets by frame lineage: every frame remembers the chain of frames it descends
from, a bucket with root R groups the messages that descend from the same frame of R, a direct
group keys by the sending frame, a join by the call. Roles are plain functions.

Rules (DESIGN §4): every frame resolves every control edge, as present or absent; an absent
frame at a direct or bucket slot marks it unreachable; a stream slot collects present frames
and ends when its producer's activation ends (unreachable if nothing came or it failed); a
bucket fires when every slot is resolved and one was received, and dies when a critical slot
or every slot of one field is unreachable, or nothing was received; an activation that yields nothing, fails, or a bucket
that dies sends one absent frame on every edge; absent frames are dropped the second time the
same (origin, node, group, slot) sees them; a join fires once, when its counts are met and every
node its `all` fields depend on has finished, or dies once nothing can feed it any more.

Order keys (DESIGN §4.3): an entry value has the empty key; an activation has the key of the
frame that activated it (at a bucket, the smallest key among the frames that arrived in it; a
join's, the empty key); its frame j has that key extended by j if it streams, the same key if
not, and (c,) if it is an `lb session` node, c counting the node's frames in the order its
activations ran. An `lb session` node outside loops runs its activations in key order: here,
simply, it holds them until nothing else is left to do and nothing held or open elsewhere can
still reach it, then runs the one with the smallest key. Absent frames carry no key.

A streaming entry (`placeholder stream`) is given as the list of its frames: its placeholder
node is one activation that yields them in that order (frame j has the key (j,)) and then ends,
exactly as a streaming role would; with no frames it yields nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Behaviour = Callable[[str, dict], list[dict]]  # (node, inputs) -> frames; raises to fail


@dataclass
class Result:
    activations: list[tuple[str, tuple]] = field(default_factory=list)  # (node, sorted inputs)
    streams: dict[str, list] = field(default_factory=dict)  # field -> values in reference order
    stream_keys: dict[str, list] = field(default_factory=dict)  # field -> (order key, value)
    returns: dict[str, Any] = field(default_factory=dict)
    errors: int = 0
    errored_outputs: set = field(default_factory=set)
    # session nodes whose run order (so their output keys) depends on timing: in a loop (FIFO)
    # with two or more activations, or holding two activations with one key (arrival order)
    untimed: set = field(default_factory=set)


def freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def run_reference(plan: dict, graph: str, inputs: dict, behaviour: Behaviour) -> Result:
    g = plan["graphs"][graph]
    nodes = g["nodes"]
    out = Result()
    work: deque = deque()
    buckets: dict[tuple, dict] = {}
    finished: set[tuple] = set()  # buckets that fired or died: later messages for them are dropped
    joins: dict[str, dict] = {}
    joins_done: set[str] = set()
    seen_absent: set[tuple] = set()
    running: dict[str, int] = {n: 0 for n in nodes}
    counter = iter(range(1, 1 << 62))
    outputs = {o["field"]: o for o in g["outputs"]}
    reach = _reach(nodes)
    held: dict[str, list] = {}  # ordered session node -> [(key, arrival, inputs, lineage)]
    arrivals = iter(range(1 << 62))
    session_frames: dict[str, int] = {n: 0 for n in nodes}
    session_runs: dict[str, list] = {}  # session node -> keys of its activations

    def frame_key(node_id, key, yidx):
        node = nodes[node_id]
        if node["session"]:
            session_frames[node_id] += 1
            return (session_frames[node_id] - 1,)
        return key + (yidx,) if node["stream"] else key

    def emit(node_id, act_id, lineage, frames, failed, key=()):
        """Send an activation's frames (or one absent frame) along every control edge."""
        control = nodes[node_id]["control"]
        phantom = not frames
        for yidx, frame in enumerate(frames or [{}]):
            frame_id = (node_id, act_id, yidx)
            line = lineage + (frame_id,)
            order = None if phantom else frame_key(node_id, key, yidx)
            for name, targets in control.items():
                for t in targets:
                    present = name in frame and not phantom
                    work.append(("msg", t, name, present, frame.get(name), line, frame_id, failed if phantom else None, order))
        for name, targets in control.items():
            for t in targets:
                if frames and t["node"] != "caller" and t["aid_rule"] != "join" and is_stream_slot(t):
                    key_line = lineage + ((node_id, act_id, 0),)
                    got = any(name in f for f in frames) and not failed
                    work.append(("end", t, name, got, key_line, (node_id, act_id), failed))

    def is_stream_slot(t):
        return nodes[t["node"]]["groups"][t["group"]]["slots"][t["slot"]]["stream"]

    def key_for(t, line):
        group = nodes[t["node"]]["groups"][t["group"]]
        if group["routing"] == "bucket":
            for frame_id in reversed(line):
                if frame_id[0] == group["root"]:
                    return frame_id
        return line[-1]

    def fire(node_id, group_index, inputs_, lineage, key):
        node = nodes[node_id]
        if node["session"] and not node["in_cycle"]:
            held.setdefault(node_id, []).append((key, next(arrivals), inputs_, lineage))
            return
        run(node_id, inputs_, lineage, key)

    def run(node_id, inputs_, lineage, key):
        act_id = next(counter)
        node = nodes[node_id]
        if node["kind"] != "interface":
            frames = [dict(inputs_)]
            if node["kind"] == "placeholder" and node["stream"]:  # a streaming entry: the list of its frames
                ((name, values),) = inputs_.items()
                frames = [{name: value} for value in values]
            emit(node_id, act_id, lineage, frames, None if frames else "empty", key)
            return
        if node["session"]:
            session_runs.setdefault(node_id, []).append(key)
        out.activations.append((node_id, tuple(sorted((k, freeze(v)) for k, v in inputs_.items()))))
        running[node_id] += 1
        try:
            frames = behaviour(node_id, inputs_)
            failed = None
        except Exception:  # noqa: BLE001
            frames, failed = [], "error"
            out.errors += 1
        running[node_id] -= 1
        emit(node_id, act_id, lineage, frames, failed or ("empty" if not frames else None), key)

    def die(node_id, lineage, reason, origin):
        act_id = next(counter)
        control = nodes[node_id]["control"]
        frame_id = (node_id, act_id, 0)
        for name, targets in control.items():
            for t in targets:  # the absent frame also resolves a stream slot: nothing came
                work.append(("msg", t, name, False, None, lineage + (frame_id,), origin, reason, None))

    def decide(node_id, group_index, key):
        b = buckets[(node_id, group_index, key)]
        slots_ = nodes[node_id]["groups"][group_index]["slots"]
        dead_field = any(
            all(b["state"][i][0] == "unreachable" for i, s in enumerate(slots_) if s["field"] == name)
            for name in {s["field"] for s in slots_}
        )
        if dead_field or not any(st[0] == "pending" for st in b["state"]):
            finished.add((node_id, group_index, key))
        slots = nodes[node_id]["groups"][group_index]["slots"]
        states = b["state"]
        for name in {s["field"] for s in slots}:
            mine = [i for i, s in enumerate(slots) if s["field"] == name]
            if all(states[i][0] == "unreachable" for i in mine):
                del buckets[(node_id, group_index, key)]
                reasons = [states[i][1] for i in mine]
                reason = "error" if "error" in reasons else ("cancel" if "cancel" in reasons else "empty")
                die(node_id, b["lineage"], reason, b["origin"] or ("dead", node_id, key))
                return
        if any(st[0] == "pending" for st in states):
            return
        del buckets[(node_id, group_index, key)]
        if not any(st[0] == "received" for st in states):
            reasons = [st[1] for st in states]
            reason = "error" if "error" in reasons else ("cancel" if "cancel" in reasons else "empty")
            die(node_id, b["lineage"], reason, b["origin"] or ("dead", node_id, key))
            return
        inputs_: dict = {}
        for i, s in enumerate(slots):
            if states[i][0] == "received" and s["field"] not in inputs_:
                inputs_[s["field"]] = states[i][1]
        fire(node_id, group_index, inputs_, b["lineage"], b["order"])

    def bucket(t, line, origin):
        node = nodes[t["node"]]
        key = key_for(t, line)
        k = (t["node"], t["group"], key)
        if k in finished:
            return None
        if k not in buckets:
            slots = node["groups"][t["group"]]["slots"]
            buckets[k] = {
                "state": [["pending", [] if s["stream"] else None] for s in slots],
                "lineage": line if node["groups"][t["group"]]["routing"] != "bucket" else line[: line.index(key) + 1],
                "origin": origin,
                "order": None,  # the smallest key that arrived
            }
        return k

    def arrived(k, order):
        b = buckets[k]
        if b["order"] is None or order < b["order"]:
            b["order"] = order

    def caller(name, present, value, line, reason, order):
        spec = outputs[name]
        if reason in ("error", "cancel"):
            out.errored_outputs.add(name)
        if not present:
            return
        if spec["kind"] == "return":
            out.returns.setdefault(name, value)
        else:
            out.streams.setdefault(name, []).append(value)
            out.stream_keys.setdefault(name, []).append((order, value))

    def try_join(node_id, final):
        if node_id in joins_done:
            return False
        state = joins.setdefault(node_id, {})
        complete = True
        for j in nodes[node_id]["join"]:
            got = state.get(j["field"], [])
            if j["threshold"] is not None:
                complete &= len(got) >= j["threshold"]
            else:
                complete &= final or (all(running[n] == 0 for n in j["upstream"]) and not pending_at(j["upstream"]))
        if not complete and not final:
            return False
        joins_done.add(node_id)
        if complete:
            taken = {j["field"]: list(state.get(j["field"], []))[: j["threshold"]] for j in nodes[node_id]["join"]}
            fire(node_id, 0, taken, (), ())
        else:
            die(node_id, (), "error" if out.errors else "empty", ("join", node_id))
        return True

    def pending_at(upstream):
        """Anything still to happen at, or on its way from, the upstream nodes."""
        wanted = set(upstream)
        if any(k[0] in wanted for k in buckets) or any(held.get(n) for n in wanted):
            return True
        for w in work:
            sender = w[5][-1][0] if w[0] == "msg" else w[5][0]
            if w[1]["node"] in wanted or sender in wanted:
                return True
        return False

    def pending_reaches(target):
        """Anything held or open (session queues, buckets, joins) that can still reach `target`."""
        sources = [n for n, queue in held.items() if queue and n != target]
        sources += [k[0] for k in buckets]
        sources += [n for n, node in nodes.items() if node["join"] is not None and n not in joins_done and n != target]
        return any(target in reach[n] for n in sources)

    def release_one():
        for node_id in sorted(held):
            queue = held[node_id]
            if queue and not pending_reaches(node_id):
                queue.sort(key=lambda h: (h[0], h[1]))
                key, _, inputs_, lineage = queue.pop(0)
                if queue and queue[0][0] == key:
                    out.untimed.add(node_id)  # equal keys go in arrival order, which is the runtime's
                run(node_id, inputs_, lineage, key)
                return True
        return False

    fire(g["start"], 0, dict(inputs), (), ())
    while True:
        while work:
            item = work.popleft()
            if item[0] == "msg":
                _, t, name, present, value, line, origin, reason, order = item
                if t["node"] == "caller":
                    caller(name, present, value, line, reason, order)
                    continue
                node = nodes[t["node"]]
                group = node["groups"][t["group"]]
                if group["routing"] == "join":
                    if present and t["node"] not in joins_done:
                        joins.setdefault(t["node"], {}).setdefault(name, []).append(value)
                    continue
                stream = group["slots"][t["slot"]]["stream"]
                if stream and present:
                    k = bucket(t, line, None)
                    if k is not None:
                        buckets[k]["state"][t["slot"]][1].append(value)
                        arrived(k, order)
                    continue
                if not present:
                    if stream and reason is None:
                        continue  # a frame without the field: the slot waits for its end
                    if node["in_cycle"]:
                        d = (origin, t["node"], t["group"], t["slot"])
                        if d in seen_absent:
                            continue
                        seen_absent.add(d)
                    k = bucket(t, line, origin)
                    if k is None:
                        continue
                    st = buckets[k]["state"][t["slot"]]
                    if st[0] != "received":
                        buckets[k]["state"][t["slot"]] = ["unreachable", reason or "empty"]
                    decide(*k)
                else:
                    k = bucket(t, line, None)
                    if k is None:
                        continue
                    buckets[k]["state"][t["slot"]] = ["received", value]
                    arrived(k, order)
                    decide(*k)
            else:
                _, t, name, got, line, origin, failed = item
                k = bucket(t, line, None)
                if k is None:
                    continue
                st = buckets[k]["state"][t["slot"]]
                if st[0] == "pending":
                    if got and st[1]:
                        buckets[k]["state"][t["slot"]] = ["received", st[1]]
                    else:
                        buckets[k]["state"][t["slot"]] = ["unreachable", failed or "empty"]
                decide(*k)
            for node_id, node in nodes.items():
                if node["join"] is not None and node_id in joins:
                    try_join(node_id, final=False)
        if release_one():
            continue
        pending_joins = [n for n, node in nodes.items() if node["join"] is not None and n not in joins_done]
        ready = [n for n in pending_joins if not pending_reaches(n)]
        if not ready:
            break
        try_join(ready[0], final=True)
    out.leftover_buckets = len(buckets) + sum(map(len, held.values()))  # type: ignore[attr-defined]
    for node_id, keys in session_runs.items():
        if nodes[node_id]["in_cycle"] and len(keys) > 1:
            out.untimed.add(node_id)
    out.reach = reach  # type: ignore[attr-defined]
    return out


def _reach(nodes: dict) -> dict[str, set[str]]:
    """Every node's descendants along control edges (itself only through a loop)."""
    succ = {n: {t["node"] for ts in node["control"].values() for t in ts if t["node"] != "caller"} for n, node in nodes.items()}
    reach: dict[str, set[str]] = {}
    for start in nodes:
        seen: set[str] = set()
        stack = list(succ[start])
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(succ[n])
        reach[start] = seen
    return reach
