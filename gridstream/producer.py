"""A streaming producer: records handed over as they arrive, sent in batches
that grow while the cluster is busy.

:meth:`Client.send <gridstream.client.Client.send>` sends a list and returns
once it is acknowledged. A stream's records (a sensor feed, a log tail)
arrive a few at a time, and both ways of sending them with ``send`` alone
cost something: a send per arrival costs the cluster a batch each (a push,
its replication, a step of every task it reaches: about as much as thousands
of records), and collecting arrivals for a fixed linger adds that linger to
every record's latency and still sends small batches once the cluster slows.

A :class:`Producer` keeps ``max_in_flight`` sends going (one by default)
and, whenever one is acknowledged, sends everything put since then as the
next. A record therefore waits for about one acknowledgement: a few
milliseconds on an idle cluster, longer when it is busy, and then the
batches are larger, which costs the cluster less per record, so a busy
cluster catches up instead of falling further behind. A send keeps the SDK's
guarantees: records reach each partition in the order they were put, and a
send's batches are pushed again with their sequences until acknowledged
(``Client.send_timeout_s``).

Nothing is silent: a send that fails stops the producer, and the next
:meth:`Producer.put`, :meth:`Producer.flush` or :meth:`Producer.close`
raises that error, saying how many records the failed send carried and how
many put after it were not sent (:attr:`Producer.unsent` holds them). Put
blocks once ``max_buffered_records`` wait to be sent, so a producer faster
than the cluster is held back rather than growing without bound.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any, Protocol

from gridstream.errors import GridstreamError

DEFAULT_MAX_SEND_RECORDS = 200_000
"""Records one send carries at most (the client cuts it into batches of its
``batch_size``): enough for a batch to every partition of a large job."""

DEFAULT_MAX_BUFFERED_RECORDS = 1_000_000
"""Records put and not yet handed to a send, at most, before :meth:`Producer.put` waits."""


class Sender(Protocol):
    """What a producer sends with: :class:`gridstream.client.Client`."""

    async def send(self, job_id: str, values: Sequence[Any],
                   keys: Sequence[Any] | None = None) -> int:
        """Sends records and returns once every one is acknowledged."""
        ...


class ProducerStopped(GridstreamError):
    """A producer used after :meth:`Producer.close` or :meth:`Producer.abort`."""


class Run:
    """Consecutive records put with keys, or without: one send takes from
    one run at a time (``Client.send`` takes keys for all its records or none)."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: list[Any] | None, values: list[Any]) -> None:
        self.keys = keys
        self.values = values

    def take(self, count: int) -> Run:
        """Removes and returns the first ``count`` records."""
        taken = Run(None if self.keys is None else self.keys[:count], self.values[:count])
        if self.keys is not None:
            del self.keys[:count]
        del self.values[:count]
        return taken


class Producer:
    """Sends the records put into it to one job, ``max_in_flight`` sends at
    a time, each carrying everything put while the one before was in flight
    (at most ``max_send_records``). Use it as an async context manager
    (``async with Producer(client, job_id) as producer``), which flushes on
    a clean exit and aborts on an error, or call :meth:`start` and
    :meth:`close` yourself."""

    def __init__(self, client: Sender, job_id: str, *, max_in_flight: int = 1,
                 max_send_records: int = DEFAULT_MAX_SEND_RECORDS,
                 max_buffered_records: int = DEFAULT_MAX_BUFFERED_RECORDS) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if max_send_records < 1:
            raise ValueError("max_send_records must be >= 1")
        if max_buffered_records < 1:
            raise ValueError("max_buffered_records must be >= 1")
        self.client = client
        self.job_id = job_id
        self.max_in_flight = max_in_flight
        self.max_send_records = max_send_records
        self.max_buffered_records = max_buffered_records
        self._runs: collections.deque[Run] = collections.deque()
        self._buffered = 0
        self._in_flight = 0
        """Records handed to sends that have not returned."""
        self._changed = asyncio.Condition()
        self._senders: list[asyncio.Task[None]] = []
        self._failure: BaseException | None = None
        self._failed_records = 0
        self._closed = False
        self.acknowledged = 0
        """Records whose send was acknowledged."""
        self.sends = 0
        """Sends made so far (each carrying one or more records)."""

    # -- life ----------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()

    def start(self) -> None:
        """Starts the sends (the producer owns them: :meth:`close` and
        :meth:`abort` cancel and await them)."""
        if self._senders or self._closed:
            raise ProducerStopped(f"the producer for job {self.job_id} was already started")
        self._senders = [asyncio.create_task(self._send_forever(),
                                             name=f"producer {self.job_id} send {n}")
                         for n in range(self.max_in_flight)]

    async def close(self) -> None:
        """Sends everything put, waits for its acknowledgement, then stops.
        Raises the error of a failed send (the producer stops either way)."""
        try:
            if not self._closed:
                await self.flush()
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Stops at once: sends in flight are cancelled (their records may or
        may not have arrived, as with a cancelled ``Client.send``); records
        not yet handed to a send stay in :attr:`unsent`."""
        self._closed = True
        for sender in self._senders:
            sender.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        async with self._changed:
            self._changed.notify_all()

    # -- records -------------------------------------------------------------

    async def put(self, values: Sequence[Any], keys: Sequence[Any] | None = None) -> None:
        """Adds records to send, with a key each (the partition of its key,
        as ``Client.send`` with keys) or without (spread over the
        partitions). Returns once they are buffered, which waits while
        ``max_buffered_records`` already are; their acknowledgement is
        :meth:`flush`'s. Raises the error that stopped the producer."""
        if keys is not None and len(keys) != len(values):
            raise ValueError("keys and values differ in length")
        if not self._senders and not self._closed:
            self.start()  # put before start: the records must not wait for nothing
        if not values:
            self._raise_if_stopped()
            return
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._stopped or self._buffered < self.max_buffered_records)
            self._raise_if_stopped()
            last = self._runs[-1] if self._runs else None
            if last is not None and (last.keys is None) == (keys is None):
                last.values.extend(values)
                if last.keys is not None and keys is not None:
                    last.keys.extend(keys)
            else:
                self._runs.append(Run(None if keys is None else list(keys), list(values)))
            self._buffered += len(values)
            self._changed.notify_all()

    async def flush(self) -> None:
        """Waits until every record put so far is acknowledged. Raises the
        error that stopped the producer."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._stopped or (self._buffered == 0 and self._in_flight == 0))
            self._raise_if_stopped()

    async def wait_stopped(self) -> None:
        """Returns once the producer has stopped: a send failed (the error
        :meth:`put`, :meth:`flush` and :meth:`close` raise), or it was closed
        or aborted. For a caller that waits on its input between puts (a
        pipe) and must not learn of a failure only at its next record."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._stopped)

    @property
    def buffered(self) -> int:
        """Records put and not yet handed to a send."""
        return self._buffered

    @property
    def unsent(self) -> list[tuple[list[Any] | None, list[Any]]]:
        """The records not handed to any send, as (keys or None, values) runs
        in the order they were put: after a failure, what to send again."""
        return [(run.keys, run.values) for run in self._runs]

    # -- sending -------------------------------------------------------------

    @property
    def _stopped(self) -> bool:
        return self._closed or self._failure is not None

    def _raise_if_stopped(self) -> None:
        if self._failure is not None:
            error = self._failure
            text = (f"the producer for job {self.job_id} stopped: a send of "
                    f"{self._failed_records} records failed ({error}); {self._buffered} "
                    "records put after it were not sent (Producer.unsent holds them)")
            if isinstance(error, GridstreamError):
                stopped = type(error)(text)
                stopped.sent_partitions = error.sent_partitions
                stopped.pending_partitions = error.pending_partitions
                stopped.failed_partitions = error.failed_partitions
                raise stopped from error
            raise ProducerStopped(text) from error
        if self._closed:
            raise ProducerStopped(f"the producer for job {self.job_id} is closed")

    async def _take(self) -> Run | None:
        """The next send's records: as many as wait, of one run, at most
        ``max_send_records``; None once the producer stops."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._stopped or self._buffered > 0)
            if self._stopped:
                return None
            run = self._runs[0]
            if len(run.values) <= self.max_send_records:
                taken = self._runs.popleft()
            else:
                taken = run.take(self.max_send_records)
            count = len(taken.values)
            self._buffered -= count
            self._in_flight += count
            self._changed.notify_all()  # room for puts waiting
            return taken

    async def _send_forever(self) -> None:
        while (run := await self._take()) is not None:
            count = len(run.values)
            self.sends += 1
            try:
                # No await between taking and calling: sends are called, and
                # so reach each partition, in the order their records were put.
                await self.client.send(self.job_id, run.values, run.keys)
            except Exception as exc:  # stops the producer; raised to its caller
                async with self._changed:
                    if self._failure is None:
                        self._failure, self._failed_records = exc, count
                    self._in_flight -= count
                    self._changed.notify_all()
                return
            async with self._changed:
                self._in_flight -= count
                self.acknowledged += count
                self._changed.notify_all()
