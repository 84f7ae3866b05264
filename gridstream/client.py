"""The gridstream client SDK (asyncio).

    async with Client("127.0.0.1:7400") as client:
        job_id = await client.submit(spec)
        await client.send(job_id, records)          # batched, straight to workers
        await client.drain(job_id)                  # every record processed, durable
        results = await client.results(job_id)      # {key: value}

The client fetches the routing table from the scheduler and pushes each batch
to the worker that owns its partition; the scheduler is not on the data path.
Each client is a producer with its own channel; every batch carries
(channel, sequence), so a retry after a timeout or a re-route after a failure
is recognised and never appended twice. A partition has at most one
unacknowledged batch per client, which keeps sequences gap-free and ordered.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import grpc

from gridstream import codec, rpc
from gridstream.config import SecurityConfig
from gridstream.control import ControlCalls
from gridstream.errors import (
    BATCH_TOO_LARGE,
    DeadlineExceeded,
    FailedPrecondition,
    GridstreamError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StaleEpoch,
    Unavailable,
    from_rpc_error,
)
from gridstream.pbcopy import copied, copy_into
from gridstream.replicas import ReplicaClient
from gridstream.retry import Backoff, RetryExhausted
from gridstream.routing import RoutingView
from gridstream.sendbatches import (
    Batch,
    BatchFeed,
    SendOrder,
    SendTurn,
    Step,
    halves,
    packed_steps,
    packs_surely,
    unkeyed_batch_size,
)
from gridstream.taskplan import sink_rows, state_result_sources
from gridstream.types import DeadLetter, RoutingTable
from gridstream.v1 import (
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from gridstream.validation import MAX_CLIENT_SEQUENCE, check_nesting, check_path_id
from gridstream.wiresize import batch_bound

DEFAULT_BATCH_SIZE = 20_000
"""Records per push at most. Every push costs a round trip, a replication and
a tracked batch whatever its size, so bulk sends go in large batches: 1M taxi
records (75 bytes each) in batches of 20,000 took 5.54 CPU-seconds across the
cluster and 3.13 s against 6.42 and 3.61 s in batches of 5,000 (medians of 3
rounds on one cluster). A batch above the workers' ``worker.max_batch_bytes``
is split in two and sent again."""
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_OUTCOME_UNKNOWN = (DeadlineExceeded, Unavailable, ResourceExhausted, StaleEpoch)
"""Failures after which a batch may or may not have been appended: it is kept
and pushed again with the same sequence, so it counts once either way."""
_MAX_SEGMENT_BYTES = rpc.MAX_MESSAGE_BYTES - 64 * 1024
"""Largest encoded batch the SDK tries to send (gRPC's limit less framing)."""


def _too_large(error: GridstreamError) -> bool:
    """A push refused for its size: the same batch will never be accepted."""
    return isinstance(error, ResourceExhausted) and BATCH_TOO_LARGE in str(error)


class Client(ControlCalls):
    """An asyncio connection to a gridstream cluster: the data path here, the
    scheduler calls (jobs, progress, drain, status) in :class:`ControlCalls`."""

    def __init__(
        self,
        scheduler: str,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        producer_id: str | None = None,
        send_timeout_s: float = 60.0,
        security: SecurityConfig | None = None,
    ) -> None:
        """``producer_id`` names this client's channel; give a stable one to
        resume a stream exactly once after the client restarts (sequences then
        continue from ``start_sequence``). ``send_timeout_s`` bounds how long
        a batch's pushes are tried (re-routes, restarts, each attempt's own
        deadline included) before :meth:`send` raises the last error.
        ``security`` gives the CA, client certificate and bearer token for a
        cluster that requires TLS and tokens."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.scheduler_address = scheduler
        self.batch_size = batch_size
        self.channel_name = check_path_id(f"src/{producer_id or uuid.uuid4().hex}",
                                          "producer_id")
        self.send_timeout_s = send_timeout_s
        self._channels = rpc.ChannelPool(security)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._channel(scheduler))
        self._table = scheduler_pb2.RoutingTable()
        self._sequences: dict[tuple[str, int], int] = {}
        self._pending: dict[tuple[str, int], worker_pb2.Segment] = {}
        self._acked: dict[tuple[str, int], int] = {}
        """(job, partition) -> the last sequence acknowledged on this client's channel."""
        self._unsent: dict[tuple[str, int], list[Batch]] = {}
        """(job, partition) -> batches after a held one, not pushed yet."""
        self._partition_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._send_orders: dict[str, SendOrder] = {}
        """job -> its sends, which pack in the order they were called (see SendOrder)."""
        self._round_robin = itertools.count()
        self._state = ReplicaClient(RoutingView(self._scheduler, virtual_nodes=100),
                                    self._channels)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes every channel."""
        await self._state.close()
        await self._channels.close()

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    # -- data -------------------------------------------------------------

    async def routing_table(self) -> RoutingTable:
        """The scheduler's current routing table: members with their
        incarnations, partition owners of every job, the tracker layout."""
        return RoutingTable.from_proto(await self._fetch_table())

    async def _fetch_table(self) -> scheduler_pb2.RoutingTable:
        """Fetches the table the data path routes by (kept as the message)."""
        self._table = await self._call(
            "fetching the routing table", self._scheduler.GetRoutingTable,
            scheduler_pb2.GetRoutingTableRequest(), rpc.CONTROL_TIMEOUT_S,
        )
        return self._table

    async def _routing(self, job_id: str, refresh: bool = False) -> scheduler_pb2.JobRouting:
        if refresh or not any(j.job_id == job_id for j in self._table.jobs):
            await self._fetch_table()
        for job in self._table.jobs:
            if job.job_id == job_id:
                if not job.owners:
                    raise Unavailable(f"job {job_id} has no workers to run on; start workers")
                return job
        info = await self.job(job_id)  # NotFound for an id the scheduler never gave out
        raise FailedPrecondition(f"job {job_id} is {info.state.label}"
                                 f"{': ' + info.error if info.error else ''}"
                                 "; it accepts no records")

    async def send(
        self,
        job_id: str,
        values: Iterable[Any],
        keys: Sequence[Any] | None = None,
        *,
        producer: str | None = None,
        first_sequence: int | None = None,
    ) -> int:
        """Sends records in batches; returns once every one is acknowledged
        (appended to its partition's JobContainer). With ``keys``, records go to
        the partition of their key; without, batches are spread over the
        partitions in turn (:func:`~gridstream.sendbatches.unkeyed_batch_size`:
        a send of fewer than ``batch_size`` records per partition goes in one
        batch to each, so it keeps every partition busy). Returns the number
        of records sent.

        Sends to one job reach each partition in the order they were called,
        also when they run at once as tasks of their own: a key's records
        are applied in the order they were sent. (A send packs its records
        once every send called before it has handed over all its batches;
        their pushes go on meanwhile.)

        Exactly once across sender restarts: give a stable ``producer`` (its
        channel becomes ``src/<producer>``) and a ``first_sequence`` that is
        the same whenever the same records are sent again and larger than any
        sequence this producer used before (e.g. ``(batch_id + 1) << 24`` for a
        micro-batch). The n-th batch sent to a partition then carries sequence
        ``first_sequence + n``, and unkeyed batches go to partitions 0, 1, 2, ...
        in order, so sending the same records again sends the same batches; a
        partition that already holds one acknowledges it as a duplicate
        instead of appending it again.

        A record nested deeper than ``gridstream.validation.MAX_NESTING`` is
        refused at once (InvalidArgument), as is one too large for any push
        (ResourceExhausted naming the limit); a keyed send whose records
        msgpack cannot carry (a set, an int over 64 bits) raises
        ``gridstream.codec.PayloadError`` before anything is pushed (so only
        a keyed send of ASCII text, certain to pack, starts pushing before
        all of it is packed: :mod:`gridstream.sendbatches`). When
        some partitions fail, every other partition's pushes still finish,
        and the error raised says which partitions were sent, which hold a
        batch the client will push again with the same sequence, and which
        were refused (see :class:`gridstream.errors.GridstreamError`)."""
        if (producer is None) != (first_sequence is None):
            raise ValueError("give producer and first_sequence together")
        if producer is not None:
            check_path_id(f"src/{producer}", "producer")
        if first_sequence is not None and not 1 <= first_sequence <= MAX_CLIENT_SEQUENCE:
            raise InvalidArgument(f"first_sequence must be between 1 and "
                                  f"{MAX_CLIENT_SEQUENCE} (the range above is the cluster's)")
        # Taken before any await, so in call order.
        turn = self._send_orders.setdefault(job_id, SendOrder()).take_turn()
        try:
            return await self._send_in_turn(job_id, values, keys, producer, first_sequence,
                                            turn)
        finally:
            turn.finish()

    async def _send_in_turn(self, job_id: str, values: Iterable[Any],
                            keys: Sequence[Any] | None, producer: str | None,
                            first_sequence: int | None, turn: SendTurn) -> int:
        """:meth:`send` once ``turn`` comes: packs and pushes the records."""
        await turn.wait()
        routing = await self._routing(job_id)
        partitions = routing.partitions
        steps: Iterator[Step]
        if keys is not None:
            values = list(values)
            if len(keys) != len(values):
                raise ValueError("keys and values differ in length")
            steps = packed_steps(keys, values, partitions, self.batch_size)
            if not packs_surely(keys, values):  # (text alone, which nests nothing)
                check_nesting(keys, "key")
                check_nesting(values, "record")
                # A PayloadError must come before any push: everything is packed first.
                steps = iter([list(itertools.chain.from_iterable(steps))])
            total = len(values)
        else:
            if not isinstance(values, Sized):
                values = list(values)  # every batch is held until acknowledged anyway
            iterator = iter(values)
            next_partition = itertools.count() if producer is not None else self._round_robin
            size = unkeyed_batch_size(self.batch_size, len(values), partitions)
            unkeyed: Step = []
            total = 0
            while chunk := list(itertools.islice(iterator, size)):
                check_nesting(chunk, "record")
                unkeyed.append((next(next_partition) % partitions, Batch(None, chunk)))
                total += len(chunk)
            steps = iter([unkeyed])
        outcomes = await self._push_steps(job_id, steps, producer, first_sequence, turn)
        self._raise_partial(job_id, outcomes, restart_safe=producer is not None)
        return total

    async def _push_steps(self, job_id: str, steps: Iterator[Step], producer: str | None,
                          first_sequence: int | None, turn: SendTurn
                          ) -> dict[int, BaseException | None]:
        """Pushes the batches of a send as packing makes them: a partition's
        pushes start with its first batch and take the rest in order while
        later steps are packed (sendbatches). Returns each partition's
        outcome, in partition order, once all its pushes have finished.
        A step that fails to pack ends the send with its error once the
        pushes of the batches already made have finished. The next send's
        ``turn`` comes once every batch is handed over."""
        feeds: dict[int, BatchFeed] = {}
        pushes: dict[int, asyncio.Task[None]] = {}
        try:
            for step in steps:
                for p, batch in step:
                    feed = feeds.get(p)
                    if feed is None:
                        feed = feeds[p] = BatchFeed()
                        pushes[p] = asyncio.create_task(
                            self._send_feed(job_id, p, feed, producer, first_sequence),
                            name=f"send to {job_id}/{p}")
                    feed.put(batch)
                await asyncio.sleep(0)  # the pushes go on while the next records are packed
        except asyncio.CancelledError:
            for push in pushes.values():
                push.cancel()
            await asyncio.gather(*pushes.values(), return_exceptions=True)
            raise
        except Exception:
            for feed in feeds.values():
                feed.close()
            await asyncio.gather(*pushes.values(), return_exceptions=True)
            raise
        turn.finish()  # every partition's pushes of this send are queued before the next's
        for feed in feeds.values():
            feed.close()
        outcomes = await asyncio.gather(*pushes.values(), return_exceptions=True)
        return dict(sorted(zip(pushes, outcomes, strict=True)))

    async def _send_feed(self, job_id: str, partition: int, feed: BatchFeed,
                         producer: str | None, first_sequence: int | None) -> None:
        """One send's pushes to one partition. Every send's hold the
        partition's lock, first come first served, and sends hand their
        batches over in call order (SendOrder), so a partition gets them in
        that order: a producer's later send arriving first would make the
        container drop the earlier one's batches as duplicates (lower
        sequences of the same channel), acknowledged but never appended."""
        if producer is not None and first_sequence is not None:
            async with self._partition_lock(job_id, partition):
                await self._send_sequenced(job_id, partition, feed, f"src/{producer}",
                                           first_sequence)
        else:
            await self._send_partition(job_id, partition, feed)

    def _partition_lock(self, job_id: str, partition: int) -> asyncio.Lock:
        """The lock a partition's pushes hold, one send at a time."""
        return self._partition_locks.setdefault((job_id, partition), asyncio.Lock())

    def _raise_partial(self, job_id: str, outcomes: dict[int, BaseException | None],
                       restart_safe: bool = False) -> None:
        """Raises one error that names what became of every partition, once
        every partition's pushes have finished. A restart-safe send holds
        nothing: its caller sends the same records again, and what had
        arrived counts once."""
        failures = {p: r for p, r in outcomes.items() if isinstance(r, BaseException)}
        if not failures:
            return
        for failure in failures.values():
            if not isinstance(failure, GridstreamError):
                raise failure
        first_partition = min(failures)
        first = failures[first_partition]
        assert isinstance(first, GridstreamError)
        sent = tuple(p for p in outcomes if p not in failures)
        pending = tuple(p for p in failures if (job_id, p) in self._pending)
        refused = tuple(p for p in failures if p not in pending)
        if restart_safe:
            message = (f"{first} (partition {first_partition}); partitions sent in full: "
                       f"{list(sent)}; not sent in full: {sorted(failures)}; send the same "
                       "records again with the same producer and first_sequence (what "
                       "arrived counts once)")
        else:
            message = (f"{first} (partition {first_partition}); partitions sent in full: "
                       f"{list(sent)}; holding what was not acknowledged, which the client "
                       "pushes again with the same sequences on the next send or flush (do "
                       f"not resend): {list(pending)}; "
                       f"refused (nothing of their unsent batches appended): {list(refused)}")
        error = type(first)(message)
        error.sent_partitions = sent
        error.pending_partitions = pending
        error.failed_partitions = refused
        raise error from first

    async def flush(self, job_id: str) -> None:
        """Pushes again, with their sequences, the batches earlier sends left
        with an unknown outcome (a push that timed out or found no worker);
        :meth:`send` does it first anyway."""
        parts = sorted(p for j, p in self._pending if j == job_id)
        outcomes = await asyncio.gather(
            *(self._send_partition(job_id, p, BatchFeed(closed=True)) for p in parts),
            return_exceptions=True)
        self._raise_partial(job_id, dict(zip(parts, outcomes, strict=True)))

    def _segment(self, partition: int, channel: str, sequence: int, batch: Batch,
                 can_split: bool) -> worker_pb2.Segment | None:
        """The wire form of a batch; None when it is too large for any push and
        can be split; an error naming the limit when a single record is."""
        encoded = batch.encoded
        if encoded is None:
            encoded = codec.encode_batch(batch.values, batch.keys)
        size = batch_bound(encoded)  # ByteSize() would encode the batch to tell
        if size > _MAX_SEGMENT_BYTES:
            if can_split and batch.count > 1:
                return None
            raise ResourceExhausted(
                f"a batch of {batch.count} record(s) to partition {partition} encodes to "
                f"about {size} bytes, above the {_MAX_SEGMENT_BYTES} bytes any push "
                "may carry; it can never be sent" + (
                    "" if batch.count == 1 else "; use a smaller batch_size"))
        encoded.ingest_unix_s = time.time()  # for the sink's latency histogram
        return copied(worker_pb2.Segment(task=0, partition=partition, channel=channel,
                                         sequence=sequence), batch=encoded)

    async def _send_sequenced(
        self, job_id: str, partition: int, feed: BatchFeed,
        channel: str, first_sequence: int,
    ) -> None:
        n = 0
        while (batch := await feed.next()) is not None:
            segment = self._segment(partition, channel, first_sequence + n, batch, False)
            n += 1
            assert segment is not None
            try:
                await self._push(job_id, segment)
            except GridstreamError as exc:
                if _too_large(exc):
                    raise self._never_fits(exc, batch, partition, "; use a smaller batch_size"
                                           if batch.count > 1 else "") from None
                raise

    @staticmethod
    def _never_fits(error: GridstreamError, batch: Batch, partition: int,
                    advice: str) -> ResourceExhausted:
        return ResourceExhausted(f"a batch of {batch.count} record(s) to partition "
                                 f"{partition} can never be sent: {error}{advice}")

    async def _send_partition(self, job_id: str, partition: int, feed: BatchFeed) -> None:
        """Pushes a partition's batches in order, each with the next sequence.
        A batch whose push ended with an unknown outcome keeps its sequence
        and is pushed again first by the next send; a batch refused for its
        size is split in two (a single record that does not fit fails at
        once, naming the limit)."""
        seq_key = (job_id, partition)
        async with self._partition_lock(job_id, partition):
            held = self._pending.get(seq_key)
            if held is not None:
                try:
                    await self._push(job_id, held)
                except GridstreamError as exc:
                    if not isinstance(exc, _OUTCOME_UNKNOWN):
                        del self._pending[seq_key]  # refused: it was never appended
                    raise
                del self._pending[seq_key]
                self._acked[seq_key] = held.sequence
            # Batches a failed send left unsent go first, in their order.
            queue: collections.deque[Batch] = collections.deque(self._unsent.pop(seq_key, []))
            while True:
                batch = queue.popleft() if queue else await feed.next()
                if batch is None:
                    break
                sequence = self._sequences.get(seq_key, 0) + 1
                segment = self._segment(partition, self.channel_name, sequence, batch, True)
                if segment is not None and self._acked.get(seq_key) == sequence - 1:
                    # The batch before was acknowledged: a container that does not
                    # hold it has lost it, and says so (docs/recovery.md).
                    segment.previous_sequence = sequence - 1
                if segment is None:
                    queue.extendleft(reversed(halves(batch)))
                    continue
                try:
                    await self._push(job_id, segment)
                except GridstreamError as exc:
                    if _too_large(exc) and batch.count > 1:
                        queue.extendleft(reversed(halves(batch)))  # nothing was appended
                        continue
                    if _too_large(exc):
                        raise self._never_fits(exc, batch, partition, "") from None
                    if isinstance(exc, _OUTCOME_UNKNOWN):
                        self._sequences[seq_key] = sequence
                        self._pending[seq_key] = segment
                        # The partition's later batches wait behind it, held too:
                        # the next send or flush pushes them after it, in order.
                        self._unsent[seq_key] = [*queue, *await feed.rest()]
                    raise
                self._sequences[seq_key] = sequence
                self._acked[seq_key] = sequence

    async def _push(self, job_id: str, segment: worker_pb2.Segment) -> None:
        """Pushes one segment to its owner until acknowledged, following
        re-routes and retrying transient failures with backoff (never a
        refusal for size, which no retry can cure). After ``send_timeout_s``
        the last error is raised (the outcome is then unknown); no attempt
        runs past it (each has at most what is left of it)."""
        backoff = Backoff(f"pushing to partition {segment.partition}", first_s=0.02,
                          max_s=1.0, deadline_s=self.send_timeout_s)
        refresh = False
        request = worker_pb2.PushRequest(job_id=job_id)  # its epoch is set per attempt
        copy_into(request.segments, [segment])
        while True:
            try:
                routing = await self._routing(job_id, refresh)
                owner = routing.owners[segment.partition]
                address = next((m.address for m in self._table.members
                                if m.node_id == owner), None)
                if address is None:
                    raise Unavailable(f"owner {owner} of partition {segment.partition} has no "
                                      "address")
            except Unavailable as unavailable:
                # Every worker briefly away (restarting) or the scheduler
                # restarting: the same wait as for a push that failed.
                refresh = True
                await self._wait_or_raise(backoff, unavailable)
                continue
            stub = self._channels.stub(address, worker_pb2_grpc.WorkerStub)
            request.epoch = self._table.epoch
            try:
                await stub.Push(request, timeout=backoff.attempt_timeout(rpc.DATA_TIMEOUT_S))
                return
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc, f"sending to {owner}")
                if isinstance(error, NotFound) and not refresh:
                    # The job may have been cancelled since our table was fetched:
                    # the fresh table says so (and _routing raises the right error).
                    refresh = True
                    continue
                if _too_large(error):
                    raise error from None
                if not isinstance(error, StaleEpoch) and exc.code() not in _RETRYABLE:
                    raise error from None
                refresh = True
            await self._wait_or_raise(backoff, error)

    @staticmethod
    async def _wait_or_raise(backoff: Backoff, error: GridstreamError) -> None:
        """Waits before the next attempt, or raises ``error`` itself once the
        send deadline has passed."""
        try:
            await backoff.wait(error)
        except RetryExhausted:
            raise error from None

    # -- results ----------------------------------------------------------

    async def results(self, job_id: str, sink: str | None = None) -> dict[str, Any]:
        """The job's sink table: {key: value}, read from as few state-server
        replicas as hold every acknowledged row (one when every write goes to
        every server, as with two; otherwise merged, the newest version of
        each key winning).

        A job with several sinks stores each sink's rows under
        ``"<sink>/<key>"``: ``sink`` picks one sink's rows, with their keys as
        that sink wrote them (without the prefix); left out, every row comes
        back as stored. For a job with one sink, ``sink`` may name it and
        changes nothing. An unknown sink name is InvalidArgument."""
        info = await self.job(job_id)  # NotFound for an unknown job
        if sink is not None:
            try:
                sink_rows(info.spec, {}, sink)
            except KeyError as exc:
                raise InvalidArgument(str(exc.args[0])) from None
        await self._state.routing.refresh()
        rows = await self._state.read_results(job_id, state_result_sources(info.spec))
        results = {key: value for key, (value, _version) in rows.items()}
        return results if sink is None else sink_rows(info.spec, results, sink)

    async def dead_letters(self, job_id: str) -> list[DeadLetter]:
        """Records an operator raised on, with the stage, the record (as JSON
        where representable) and the error with its traceback."""
        await self.job(job_id)
        await self._state.routing.refresh()
        return [DeadLetter.from_stored(*entry)
                for entry in await self._state.read_dead_letters(job_id)]


__all__ = ["DEFAULT_BATCH_SIZE", "Client", "GridstreamError"]
