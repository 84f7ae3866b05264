"""RoutingView fetches the table for calls naming newer epochs at most once
per interval, shared by concurrent callers, and refuses an epoch the
scheduler does not have: a sender choosing epochs must not turn each of its
calls into a fetch at the scheduler. The scheduler here is a stand-in that
only counts calls (the fetch logic is what is tested; the integration tests
in test_member_requests.py run it against a real scheduler)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

import pytest

from gridstream.errors import FailedPrecondition
from gridstream.routing import RoutingView
from gridstream.v1 import scheduler_pb2

INTERVAL_S = 0.05
FAR_AHEAD = 2**62


class Scheduler:
    """Answers GetRoutingTable with the table of ``epoch``, counting calls."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.calls: list[float] = []

    async def GetRoutingTable(self, request: Any, **options: Any
                              ) -> scheduler_pb2.RoutingTable:
        self.calls.append(time.monotonic())
        table = scheduler_pb2.RoutingTable(epoch=self.epoch)
        await asyncio.sleep(0)  # another caller may run while the answer is on its way
        return table


def view(scheduler: Scheduler) -> RoutingView:
    return RoutingView(cast(Any, scheduler), virtual_nodes=8, min_interval_s=INTERVAL_S)


async def test_concurrent_calls_ahead_of_the_cluster_share_one_fetch() -> None:
    scheduler = Scheduler(epoch=5)
    routing = view(scheduler)
    outcomes = await asyncio.gather(
        *(routing.reach(FAR_AHEAD, f"call {i}") for i in range(50)), return_exceptions=True)
    # The first caller's fetch, and one begun after the others asked (they
    # asked while the first was on its way, so it may predate their epoch).
    assert len(scheduler.calls) == 2, scheduler.calls
    assert all(isinstance(o, FailedPrecondition) for o in outcomes), outcomes
    message = str(outcomes[0])
    assert f"routing epoch {FAR_AHEAD}, ahead of the cluster's (5)" in message, message
    assert routing.epoch == 5


async def test_calls_one_after_another_fetch_at_most_once_per_interval() -> None:
    scheduler = Scheduler(epoch=5)
    routing = view(scheduler)
    began = time.monotonic()
    for i in range(10):
        with pytest.raises(FailedPrecondition, match="ahead of the cluster's"):
            await routing.reach(FAR_AHEAD + i, "a push")
    elapsed = time.monotonic() - began
    assert len(scheduler.calls) <= elapsed / INTERVAL_S + 1, (len(scheduler.calls), elapsed)
    gaps = [b - a for a, b in zip(scheduler.calls, scheduler.calls[1:], strict=False)]
    assert all(gap >= INTERVAL_S * 0.99 for gap in gaps), gaps


async def test_a_member_that_learned_a_newer_epoch_first_is_answered() -> None:
    scheduler = Scheduler(epoch=5)
    routing = view(scheduler)
    await routing.refresh()
    scheduler.epoch = 6  # a peer heard of epoch 6 before this worker did
    await routing.reach(6, "a push from a peer")  # within the interval: fetched after it
    assert routing.epoch == 6 and len(scheduler.calls) == 2
    await routing.reach(6, "another push")  # the table is here: no fetch
    await routing.reach(3, "an older push")
    assert len(scheduler.calls) == 2


async def test_a_call_that_asked_during_a_fetch_gets_a_fetch_begun_after_it() -> None:
    """A fetch already under way when a caller asks may predate what the
    caller was told; only one begun after the ask answers it."""
    scheduler = Scheduler(epoch=5)
    routing = view(scheduler)
    first = asyncio.ensure_future(routing.refresh())
    await asyncio.sleep(0)  # the first fetch is on its way with epoch 5
    scheduler.epoch = 6
    await routing.reach(6, "a push naming the epoch just made")
    await first
    assert routing.epoch == 6 and len(scheduler.calls) == 2


async def test_a_newer_epoch_the_cluster_has_is_fetched_without_waiting_the_interval() -> None:
    # A job is submitted just after a fetch: the first push naming its epoch
    # must not wait out the interval that spaces fetches for epochs the
    # cluster does not have.
    scheduler = Scheduler(epoch=5)
    routing = RoutingView(cast(Any, scheduler), virtual_nodes=8, min_interval_s=30.0)
    await routing.reach(5, "a push")
    scheduler.epoch = 6
    await asyncio.wait_for(routing.reach(6, "the new job's first push"), 10)
    scheduler.epoch = 7
    await asyncio.wait_for(routing.reach(7, "the next job's first push"), 10)
    assert routing.epoch == 7 and len(scheduler.calls) == 3
    # An epoch the cluster does not have is fetched once, then spaced again.
    with pytest.raises(FailedPrecondition, match="ahead of the cluster's"):
        await asyncio.wait_for(routing.reach(FAR_AHEAD, "a made-up epoch"), 10)
    waiting = asyncio.ensure_future(routing.reach(FAR_AHEAD, "another"))
    done, _ = await asyncio.wait({waiting}, timeout=0.5)
    assert not done and len(scheduler.calls) == 4
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
