"""Calls to peers coalesced by address: one call in flight per peer, carrying
every request waiting for it.

A worker's tasks each talk to the same few peers (backup holders, tracker
hosts, state servers) about their own containers and operators. As calls of
their own, that was a gRPC call per task and peer, each costing the two
processes about 0.4 to 0.9 ms of CPU however small it was (most of it in
gRPC's C core and the asyncio glue, not in our handlers). Here the requests
waiting for one peer go out together as one call of a "many" RPC
(``ReplicateMany``, ``TrackMany``, ``WriteResultsMany``).

At most one call per peer is in flight; whatever arrives meanwhile waits for
it and goes in the next one (as a group commit does). The first request for
an idle peer waits ``linger_s`` (one step of the event loop at 0), so the
requests that the same step started go with it. Each request keeps its own
outcome: the peer checks, applies and answers each on its own, and a refusal
raises for that caller alone the error a call of its own would have raised.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc

from gridstream.errors import Unavailable, from_rpc_error, from_status

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


@dataclass
class Waiting(Generic[RequestT, ResultT]):
    """A request waiting for its peer, and the outcome its caller awaits."""

    request: RequestT
    size: int
    what: str
    """What the request does, as its errors name it ("replicating to worker-2")."""
    outcome: asyncio.Future[ResultT]


SendMany = Callable[[str, list[Waiting[RequestT, ResultT]]],
                    Awaitable[list[ResultT | Exception]]]
"""Sends the requests in one call to the peer at an address; returns one
outcome per request, in order: its result, or the error it was refused with.
A call that failed as a whole returns that error for every request."""


class CoalescedCalls(Generic[RequestT, ResultT]):
    """One worker's calls of one kind to its peers, one call per peer at a
    time carrying every request waiting for that peer (at most
    ``max_per_call`` requests; no more once ``max_bytes`` are carried, but
    always one)."""

    def __init__(self, send_many: SendMany[RequestT, ResultT], max_per_call: int,
                 max_bytes: int, linger_s: float = 0.0) -> None:
        self._send_many = send_many
        self._max_per_call = max_per_call
        self._max_bytes = max_bytes
        self._linger_s = linger_s
        self._waiting: dict[str, list[Waiting[RequestT, ResultT]]] = {}
        self._turns: dict[str, asyncio.Lock] = {}
        self.calls = 0
        """Calls made so far (fewer than the requests they carried)."""

    async def call(self, address: str, request: RequestT, size: int, what: str) -> ResultT:
        """Has the peer at ``address`` handle ``request`` (``size`` bytes on
        the wire); returns its result or raises what a call of its own would
        have raised."""
        waiting: Waiting[RequestT, ResultT] = Waiting(
            request, size, what, asyncio.get_running_loop().create_future())
        queue = self._waiting.setdefault(address, [])
        queue.append(waiting)
        turn = self._turns.setdefault(address, asyncio.Lock())
        try:
            async with turn:  # FIFO: the holder of the turn sends for everyone waiting
                if len(queue) == 1 and not waiting.outcome.done():
                    # First for an idle peer: requests started meanwhile join it.
                    await asyncio.sleep(self._linger_s)
                while not waiting.outcome.done():
                    await self._call(address)
        except asyncio.CancelledError:
            if waiting in queue:
                queue.remove(waiting)
            if waiting.outcome.done() and not waiting.outcome.cancelled():
                waiting.outcome.exception()  # retrieved: nobody else will
            waiting.outcome.cancel()
            raise
        return waiting.outcome.result()

    def _take(self, address: str) -> list[Waiting[RequestT, ResultT]]:
        queue = self._waiting.get(address, [])
        taken, size = 0, 0
        while (taken < len(queue) and taken < self._max_per_call
               and (taken == 0 or size + queue[taken].size <= self._max_bytes)):
            size += queue[taken].size
            taken += 1
        batch, queue[:taken] = queue[:taken], []
        return batch

    async def _call(self, address: str) -> None:
        batch = self._take(address)
        if not batch:
            return
        self.calls += 1
        try:
            outcomes = await self._send_many(address, batch)
        except BaseException:
            # Cancelled while carrying others' requests: they are told to try
            # again (their callers retry, as after any failure).
            for waiting in batch:
                _settle(waiting, Unavailable(
                    f"{waiting.what}: the call carrying it was cancelled; retrying"))
            raise
        if len(outcomes) != len(batch):
            # A peer (or a send_many) that answered the wrong number of
            # outcomes: nobody can tell whose is whose, so every request
            # is retried; none is left waiting for an outcome never given.
            for waiting in batch:
                _settle(waiting, Unavailable(
                    f"{waiting.what}: the peer answered {len(outcomes)} outcomes for "
                    f"{len(batch)} requests; retrying"))
            return
        for waiting, outcome in zip(batch, outcomes, strict=True):
            _settle(waiting, outcome)


class Outcome(Protocol):
    """What a peer answers for one request of a "many" call."""

    code: int
    """0 when applied; otherwise the gRPC status code it was refused with."""
    details: str
    """Why it was refused."""


OutcomeT = TypeVar("OutcomeT", bound=Outcome)


async def many_outcomes(batch: list[Waiting[RequestT, ResultT]],
                        reply: Awaitable[Sequence[OutcomeT]],
                        result: Callable[[OutcomeT], ResultT]) -> list[ResultT | Exception]:
    """The outcome of each request of a "many" call whose answer is
    ``reply`` (the call's outcomes, in order): ``result`` of an applied
    one, or the typed error a call of its own would have raised, named
    by the request's ``what``. A failed call fails every request; an
    answer with a wrong number of outcomes is caught by
    :class:`CoalescedCalls`, which fails every request then."""
    try:
        outcomes = await reply
    except grpc.aio.AioRpcError as exc:
        return [from_rpc_error(exc, waiting.what) for waiting in batch]
    return [from_status(outcome.code, outcome.details, waiting.what) if outcome.code
            else result(outcome) for waiting, outcome in zip(batch, outcomes, strict=False)]


BOUNDARY_SLACK = 0.05
"""The fraction of a period before a boundary that counts as the boundary."""


def next_boundary(period_s: float, after: float) -> float:
    """The first multiple of ``period_s`` on the monotonic clock after
    ``after``. A process's tasks that wait for these moments (row writes,
    window closes) act together, so their calls to one peer coalesce. A
    moment up to :data:`BOUNDARY_SLACK` of a period before a multiple counts
    as that multiple: the event loop's timers fire up to a millisecond
    early, and a write made then must not be followed by another at once."""
    return (math.floor(after / period_s + BOUNDARY_SLACK) + 1) * period_s


def _settle(waiting: Waiting[RequestT, ResultT], outcome: ResultT | Exception) -> None:
    """Gives a request its outcome, unless its caller has gone."""
    if waiting.outcome.done():
        return
    if isinstance(outcome, Exception):
        waiting.outcome.set_exception(outcome)
    else:
        waiting.outcome.set_result(outcome)
