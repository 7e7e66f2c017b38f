"""Candidate combinations and provider choice: pure functions, no store.

A node may hold only part of a parameter's page (node A the k slices, node B the v slices).
A **candidate combination** of a full layout is a set of registered partial layouts (by layout
id) whose (sub, slice) chunks together cover every chunk of the full layout, and that is
*minimal*: dropping any member leaves a chunk uncovered. A page has a **complete replica** of
a combination when, for each of its layouts, some live node provides the page in that layout.

Order (best first), as the paper gives it: combination size (fewer members, fewer sources),
then **occurrence frequency**, higher first, then lexicographically by the sorted layout ids.
Frequency of a combination = the sum, over its layouts, of how many live nodes hold that
layout (as registered): a combination made of widely held layouts is more likely to have a
complete replica for any page and spreads reads over more nodes.

Enumeration is bounded: covers are found by branching on the uncovered chunk with the fewest
holders, by iterative deepening on the size (so the smallest covers are found first), at most
`max_size` members, stopping after `budget` search steps; the answer keeps the best `cap`.

`assign` is the provider choice the stores share (the Redis store's Lua mirrors it line by
line): keep the previous page's providers while they all provide the next page; otherwise the
first complete combination in order, each of its layouts read from the node whose run of
consecutive pages from here is the longest (then the smaller name): fewer source switches,
less cross-machine traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flowrt.params.layout import KVLayout

CAP = 64  # combinations kept per full layout
MAX_SIZE = 8  # members in one combination
BUDGET = 50_000  # search steps per enumeration

Avail = Mapping[str, frozenset[str] | set[str]]  # layout id -> live nodes providing a page in it


def candidate_combinations(
    full: KVLayout,
    parts: Mapping[str, KVLayout],
    frequency: Mapping[str, int] | None = None,
    *,
    cap: int = CAP,
    max_size: int = MAX_SIZE,
    budget: int = BUDGET,
) -> list[tuple[str, ...]]:
    """The minimal covers of `full` by `parts` (layout id -> partial layout; parts of another
    page shape are ignored), best first, at most `cap`. `frequency`: layout id -> live holders."""
    frequency = frequency or {}
    everything = frozenset(full.chunks())
    chunks_of = {lid: frozenset(part.chunks()) & everything for lid, part in parts.items() if full.covers(part) and part.chunks()}
    holders = {chunk: sorted(lid for lid, chunks in chunks_of.items() if chunk in chunks) for chunk in everything}
    if not chunks_of or any(not h for h in holders.values()):
        return []
    found: set[frozenset[str]] = set()
    steps = 0

    def search(chosen: frozenset[str], covered: frozenset[str], limit: int) -> None:
        nonlocal steps
        steps += 1
        if steps > budget:
            return
        if covered == everything:
            found.add(chosen)
            return
        if len(chosen) >= limit:
            return
        chunk = min(everything - covered, key=lambda c: (len(holders[c]), c))
        for lid in holders[chunk]:
            if lid not in chosen:
                search(chosen | {lid}, covered | chunks_of[lid], limit)

    for limit in range(1, min(max_size, len(chunks_of)) + 1):
        search(frozenset(), frozenset(), limit)
        if steps > budget or len(found) >= cap:
            break
    minimal = [
        combo
        for combo in found
        if all(frozenset().union(*(chunks_of[m] for m in combo if m != drop)) != everything for drop in combo)
    ]
    ordered = sorted(minimal, key=lambda c: (len(c), -sum(frequency.get(m, 0) for m in c), sorted(c)))
    return [tuple(sorted(combo)) for combo in ordered[:cap]]


def first_complete(avail: Avail, combos: Sequence[Sequence[str]]) -> int | None:
    """The index of the first combination with a complete replica of a page, or None."""
    for index, combo in enumerate(combos):
        if all(avail.get(lid) for lid in combo):
            return index
    return None


def assign(avail: Sequence[Avail], combos: Sequence[Sequence[str]]) -> list[tuple[int, int, tuple[tuple[str, str], ...]]]:
    """Providers for pages 0..len(avail)-1, each of which has a complete combination: segments
    (start, stop, ((layout_id, node), ...)) in the combination's order."""
    count = len(avail)
    runs: list[dict[tuple[str, str], int]] = [{} for _ in range(count + 1)]
    for i in range(count - 1, -1, -1):
        for lid, nodes in avail[i].items():
            for node in nodes:
                runs[i][(lid, node)] = 1 + runs[i + 1].get((lid, node), 0)
    segments: list[tuple[int, int, tuple[tuple[str, str], ...]]] = []
    current: tuple[tuple[str, str], ...] | None = None
    for i in range(count):
        if current is not None and all(node in avail[i].get(lid, ()) for lid, node in current):
            start, _, providers = segments[-1]
            segments[-1] = (start, i + 1, providers)
            continue
        index = first_complete(avail[i], combos)
        assert index is not None, "assign() takes pages that each have a complete combination"
        current = tuple(
            (lid, min(avail[i][lid], key=lambda node, lid=lid: (-runs[i][(lid, node)], node))) for lid in combos[index]
        )
        segments.append((i, i + 1, current))
    return segments
