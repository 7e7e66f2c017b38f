"""The language server's check scheduling rules (`flowc.lsp.scheduler`) with plain functions.

A check here upper-cases the text on the scheduler's worker thread; a test that needs a check
to stay in flight closes a gate the check waits on and opens it when it has arranged the rest.
Tests wait on the scheduler's `idle()` and on threading events, with deadlines; none sleeps.
"""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from flowc.lsp.scheduler import CheckScheduler, Snapshot

pytestmark = pytest.mark.asyncio

DEADLINE_S = 10
URI = "file:///work/a.flow"


class Harness:
    """Documents as a dict, a check that records what it saw, and the deliveries in order."""

    def __init__(self, debounce_s: float = 0.0) -> None:
        self.documents: dict[str, Snapshot] = {}
        self.checked: list[int | None] = []  # versions, in the order checks started
        self.delivered: list[tuple[int | None, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.scheduler: CheckScheduler[str] = CheckScheduler(self.documents.get, self.check, self.deliver, debounce_s)

    def check(self, snapshot: Snapshot) -> str:
        self.checked.append(snapshot.version)
        self.entered.set()
        assert self.gate.wait(DEADLINE_S), "the test never opened the gate"
        if snapshot.text == "boom":
            raise ValueError("a broken check")
        return snapshot.text.upper()

    def deliver(self, snapshot: Snapshot, result: str) -> None:
        assert result == snapshot.text.upper()
        self.delivered.append((snapshot.version, result))

    def edit(self, version: int, text: str, uri: str = URI) -> None:
        self.documents[uri] = Snapshot(uri, version, text)

    async def check_in_flight(self) -> None:
        """Wait until a check has entered the (closed) gate."""
        assert await asyncio.to_thread(self.entered.wait, DEADLINE_S)
        self.entered.clear()

    async def idle(self) -> None:
        await asyncio.wait_for(self.scheduler.idle(), DEADLINE_S)

    def close(self) -> None:
        self.gate.set()
        self.scheduler.close()


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(debounce_s: float = 0.0) -> Harness:
        made.append(Harness(debounce_s))
        return made[-1]

    yield make
    for h in made:
        h.close()


async def test_a_burst_of_edits_is_checked_once_on_its_last_text(harness):
    h = harness(debounce_s=0.05)
    h.edit(1, "v1")
    h.scheduler.now(URI)  # open: at once
    await h.idle()
    assert h.delivered == [(1, "V1")]
    for version in range(2, 12):  # ten edits, faster than the delay
        h.edit(version, f"v{version}")
        h.scheduler.changed(URI)
        assert h.scheduler.statistics()["waiting"] == 1
    await h.idle()
    assert h.checked == [1, 11]
    assert h.delivered == [(1, "V1"), (11, "V11")]
    assert h.scheduler.statistics() | {"debounce_ms": None} == {
        "started": 2,
        "delivered": 2,
        "stale": 0,
        "failed": 0,
        "documents": 1,
        "waiting": 0,
        "running": 0,
        "debounce_ms": None,
    }


async def test_a_result_for_a_version_edited_meanwhile_is_dropped_and_the_latest_checked_next(harness):
    h = harness()
    h.gate.clear()
    h.edit(1, "v1")
    h.scheduler.now(URI)
    await h.check_in_flight()
    h.edit(2, "v2")
    h.scheduler.changed(URI)
    h.edit(3, "v3")
    h.scheduler.changed(URI)
    assert h.scheduler.statistics()["running"] == 1
    h.gate.set()
    await h.idle()
    assert h.checked == [1, 3]  # one check in flight per document; v2 was never the latest when one could start
    assert h.delivered == [(3, "V3")]
    stats = h.scheduler.statistics()
    assert (stats["stale"], stats["delivered"]) == (1, 1)


async def test_save_during_the_delay_checks_at_once_and_only_once(harness):
    h = harness(debounce_s=60)
    h.edit(1, "v1")
    h.scheduler.now(URI)
    await h.idle()
    h.edit(2, "v2")
    h.scheduler.changed(URI)
    assert h.scheduler.statistics()["waiting"] == 1
    h.scheduler.now(URI)  # save: the pending delayed check is replaced by an immediate one
    assert h.scheduler.statistics()["waiting"] == 0
    await h.idle()
    assert h.checked == [1, 2]
    assert h.delivered == [(1, "V1"), (2, "V2")]


async def test_save_while_checking_checks_again_after_the_running_check(harness):
    h = harness()
    h.gate.clear()
    h.edit(1, "v1")
    h.scheduler.now(URI)
    await h.check_in_flight()
    h.scheduler.now(URI)  # saved: the same version, but imported files may have changed
    h.gate.set()
    await h.idle()
    assert h.checked == [1, 1]
    assert h.delivered == [(1, "V1"), (1, "V1")]


async def test_a_version_older_than_the_delivered_one_is_never_delivered(harness):
    h = harness()
    h.edit(5, "v5")
    h.scheduler.now(URI)
    await h.idle()
    h.edit(3, "v3")  # a client sending versions out of order
    h.scheduler.now(URI)
    await h.idle()
    assert h.checked == [5, 3]
    assert h.delivered == [(5, "V5")]
    assert h.scheduler.statistics()["stale"] == 1


async def test_a_document_closed_while_checked_gets_nothing_and_leaves_nothing(harness):
    h = harness(debounce_s=60)
    h.gate.clear()
    h.edit(1, "v1")
    h.scheduler.now(URI)
    await h.check_in_flight()
    h.edit(2, "v2", uri="file:///work/b.flow")
    h.scheduler.changed("file:///work/b.flow")  # a delayed check of another document, closed before it starts
    del h.documents[URI]
    h.scheduler.forget(URI)
    h.scheduler.forget("file:///work/b.flow")
    assert h.scheduler.statistics()["running"] == 1  # the worker cannot be interrupted; its result is dropped
    h.gate.set()
    await h.idle()
    assert h.delivered == []
    stats = h.scheduler.statistics()
    assert (stats["documents"], stats["waiting"], stats["running"], stats["stale"]) == (0, 0, 0, 1)


async def test_a_document_closed_and_opened_again_while_checked_gets_only_the_new_result(harness):
    h = harness()
    h.gate.clear()
    h.edit(1, "old")
    h.scheduler.now(URI)
    await h.check_in_flight()
    h.scheduler.forget(URI)
    h.edit(1, "new")  # reopened with the same version number and another text
    h.scheduler.now(URI)
    h.gate.set()
    await h.idle()
    assert h.delivered == [(1, "NEW")]


async def test_a_failing_check_is_counted_and_the_next_edit_checks_again(harness):
    h = harness()
    h.edit(1, "boom")
    h.scheduler.now(URI)
    await h.idle()
    h.edit(2, "fine")
    h.scheduler.changed(URI)
    await h.idle()
    assert h.delivered == [(2, "FINE")]
    stats = h.scheduler.statistics()
    assert (stats["failed"], stats["delivered"]) == (1, 1)


async def test_run_checks_for_a_request_without_delivering(harness):
    h = harness()
    assert await h.scheduler.run(Snapshot(URI, 7, "asked")) == "ASKED"
    assert h.delivered == []
    assert h.scheduler.statistics()["started"] == 0


async def test_close_cancels_delayed_checks_and_ignores_later_edits(harness):
    h = harness(debounce_s=60)
    h.edit(1, "v1")
    h.scheduler.changed(URI)
    h.scheduler.close()
    h.scheduler.changed(URI)
    h.scheduler.now(URI)
    await h.idle()
    assert h.checked == [] and h.delivered == []
    assert h.scheduler.statistics()["documents"] == 0


@pytest.mark.parametrize("seconds", [-0.001, math.nan, math.inf])
async def test_the_delay_must_be_a_finite_number_of_seconds(seconds):
    with pytest.raises(ValueError, match="finite number of seconds >= 0"):
        CheckScheduler(lambda uri: None, str, lambda s, r: None, seconds)
