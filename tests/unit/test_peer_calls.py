"""The coalescing of calls to peers (gridstream/peercalls.py): one call
per peer at a time, every request settled whatever the peer answers, and
the clock boundaries at which a process's tasks act together."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from gridstream.errors import Unavailable
from gridstream.peercalls import CoalescedCalls, Waiting, many_outcomes, next_boundary


@dataclass
class FakeOutcome:
    """One outcome of a "many" answer, as the protobuf messages carry it."""

    code: int
    details: str
    value: int


async def test_an_answer_with_too_few_outcomes_fails_every_request_and_strands_none() -> None:
    calls: list[int] = []

    async def send_many(address: str, batch: list[Waiting[int, int]]) -> list[int | Exception]:
        calls.append(len(batch))

        async def reply() -> list[FakeOutcome]:
            return [FakeOutcome(0, "", w.request * 10) for w in batch[:-1]]  # one short

        return await many_outcomes(batch, reply(), lambda outcome: outcome.value)

    coalesced: CoalescedCalls[int, int] = CoalescedCalls(send_many, max_per_call=64,
                                                          max_bytes=1 << 20)
    async with asyncio.timeout(5):  # a stranded request would wait forever
        outcomes = await asyncio.gather(
            *(coalesced.call("peer-1", n, 1, f"request {n}") for n in range(3)),
            return_exceptions=True)
    assert calls == [3]  # one call carried all three
    assert all(isinstance(o, Unavailable) for o in outcomes), outcomes
    assert "answered 2 outcomes for 3 requests" in str(outcomes[0])


async def test_each_request_gets_its_own_outcome() -> None:
    async def send_many(address: str, batch: list[Waiting[int, int]]) -> list[int | Exception]:
        async def reply() -> list[FakeOutcome]:
            # The peer refuses odd requests (FAILED_PRECONDITION = 9).
            return [FakeOutcome(9 if w.request % 2 else 0, "odd", w.request * 10)
                    for w in batch]

        return await many_outcomes(batch, reply(), lambda outcome: outcome.value)

    coalesced: CoalescedCalls[int, int] = CoalescedCalls(send_many, max_per_call=64,
                                                          max_bytes=1 << 20)
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(
            *(coalesced.call("peer-1", n, 1, f"request {n}") for n in range(4)),
            return_exceptions=True)
    assert outcomes[0] == 0 and outcomes[2] == 20
    for refused in (outcomes[1], outcomes[3]):
        assert isinstance(refused, Exception) and "odd" in str(refused)


def test_a_moment_just_before_a_boundary_counts_as_the_boundary() -> None:
    # A timer for the boundary at 3.0 s that fired 0.8 ms early: the next
    # boundary is the one after, not the one the timer was set for.
    assert next_boundary(0.1, 2.9992) == pytest.approx(3.1)
    assert next_boundary(0.1, 3.0004) == pytest.approx(3.1)
    assert next_boundary(0.1, 2.9) == pytest.approx(3.0)
    assert next_boundary(0.1, 2.94) == pytest.approx(3.0)
