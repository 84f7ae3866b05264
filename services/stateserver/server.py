"""The StateServer gRPC servicer: checks requests, converts messages, calls the store.

Kept thin on purpose: storage rules live in :mod:`services.stateserver.store`
and the row wire format in :mod:`services.stateserver.rows`, both testable
without a server. Every refusal names what to fix, and a refused request
stores nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc

from gridstream.errors import GridstreamError, InvalidArgument, ResourceExhausted, status_number
from gridstream.faults import write_delay_s
from gridstream.replicas import MAX_RESULT_WRITES_PER_CALL, MAX_STATE_WRITES_PER_CALL
from gridstream.rpc import servicer_method
from gridstream.v1 import stateserver_pb2 as pb
from gridstream.v1 import stateserver_pb2_grpc
from gridstream.validation import check_id, check_path_id
from services.stateserver.directory import JobDirectory
from services.stateserver.layout import OperatorHoldings, SnapshotMeta
from services.stateserver.rows import decode_dead_letters, decode_rows, encode_entries
from services.stateserver.stateresults import (
    check_sources,
    read_packed_state_rows,
    read_state_rows,
)
from services.stateserver.statewire import first_chunk, receive_window, send_chunk
from services.stateserver.store import DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_ROWS, SnapshotStore

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 48 * 1024 * 1024
"""Largest snapshot payload accepted; below gRPC's 64 MiB message limit so the
caller gets RESOURCE_EXHAUSTED with advice instead of a transport error."""

_MAX_SQLITE_INT = 2**63 - 1


def _require(value: str, name: str) -> None:
    """Refuses an empty or malformed identifier with a message naming the
    field (job ids are plain ids, operator ids ``job/t<task>/p<partition>``)."""
    if not value:
        raise InvalidArgument(f"{name} is empty; set it (nothing was done)")
    if name.endswith("job_id"):
        check_id(value, name)
    else:
        check_path_id(value, name)


def _require_int(value: int, name: str) -> None:
    """Refuses numbers SQLite's signed 64-bit integers cannot hold."""
    if value > _MAX_SQLITE_INT:
        raise InvalidArgument(f"{name} is {value}, above 2**63-1; use a smaller number")


def _digest(h: OperatorHoldings) -> pb.OperatorDigest:
    """What the replica holds of one operator, as Digest and ReadResults tell it."""
    return pb.OperatorDigest(
        job_id=h.job_id, operator_id=h.operator_id, latest_window=h.latest_window or 0,
        has_snapshot=h.latest_window is not None, results_version=h.results_version,
        epoch=h.epoch, state_window=h.state_window or 0, has_state=h.state_window is not None)


def _meta_to_pb(meta: SnapshotMeta) -> pb.SnapshotMeta:
    return pb.SnapshotMeta(
        job_id=meta.job_id, operator_id=meta.operator_id, window=meta.window,
        epoch=meta.epoch, size=meta.size, checksum=meta.checksum,
    )


_OutcomeT = TypeVar("_OutcomeT")


def _answers(done: Sequence[Any], outcome: Callable[..., _OutcomeT],
             fields: Callable[[Any], dict[str, Any]] = lambda _: {}) -> list[_OutcomeT]:
    """The outcome message of each write of a "many" call, from what it
    ended with: its refusal's status code and details, or ``fields`` of its
    result. An error that is not a refusal (the disk, say) fails the whole
    call, raised once every write has finished: the writer retries them all."""
    outcomes = []
    for result in done:
        if isinstance(result, GridstreamError):
            outcomes.append(outcome(code=status_number(result), details=str(result)))
        elif isinstance(result, BaseException):
            raise result
        else:
            outcomes.append(outcome(**fields(result)))
    return outcomes


async def _only(chunk: pb.StateChunk) -> AsyncIterator[pb.StateChunk]:
    """One chunk as the stream a PutState of it would be."""
    yield chunk


async def _injected_delay() -> None:
    """A slow replica, for tests: GRIDSTREAM_FAULT_WRITE_DELAY_S (off by default)."""
    delay = write_delay_s()
    if delay:
        await asyncio.sleep(delay)


class StateServerServicer(stateserver_pb2_grpc.StateServerServicer):
    """Serves stateserver.proto over a :class:`SnapshotStore`.

    With a ``directory``, writes for a job that is not running or an operator
    it does not have are refused with NOT_FOUND. ``max_snapshot_bytes``
    bounds a PutSnapshot payload and ``chunk_rows`` the rows of one
    ReadResults / ReadDeadLetters message.
    """

    def __init__(
        self,
        store: SnapshotStore,
        max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        directory: JobDirectory | None = None,
    ) -> None:
        self._store = store
        self._directory = directory
        self._max_snapshot_bytes = max_snapshot_bytes
        self._chunk_rows = chunk_rows

    @servicer_method
    async def PutSnapshot(
        self, request: pb.PutSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutSnapshotResponse:
        """Stores a window snapshot after checking ids, size and checksum."""
        await _injected_delay()
        meta = request.meta
        _require(meta.job_id, "meta.job_id")
        _require(meta.operator_id, "meta.operator_id")
        _require_int(meta.window, "meta.window")
        _require_int(meta.epoch, "meta.epoch")
        if len(request.payload) > self._max_snapshot_bytes:
            raise ResourceExhausted(
                f"snapshot {meta.operator_id} window {meta.window} is {len(request.payload)} "
                f"bytes, above the limit of {self._max_snapshot_bytes}; snapshot smaller state "
                "(or a delta) per window; nothing stored"
            )
        if self._directory is not None:
            await self._directory.check(meta.job_id, meta.operator_id)
        created = await self._store.put_snapshot(
            SnapshotMeta(
                job_id=meta.job_id, operator_id=meta.operator_id, window=meta.window,
                epoch=meta.epoch, size=meta.size, checksum=meta.checksum,
            ),
            request.payload,
        )
        return pb.PutSnapshotResponse(created=created)

    @servicer_method
    async def GetLatestSnapshot(
        self, request: pb.GetLatestSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLatestSnapshotResponse:
        """The operator's newest snapshot, or found=false."""
        _require(request.job_id, "job_id")
        _require(request.operator_id, "operator_id")
        snapshot = await self._store.get_latest_snapshot(request.job_id, request.operator_id)
        if snapshot is None:
            return pb.GetLatestSnapshotResponse(found=False)
        return pb.GetLatestSnapshotResponse(
            found=True, meta=_meta_to_pb(snapshot.meta), payload=snapshot.payload
        )

    @servicer_method
    async def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSnapshotsResponse:
        """Metadata of a job's snapshots, of one operator or all."""
        _require(request.job_id, "job_id")
        check_path_id(request.operator_id, "operator_id", required=False)
        metas = await self._store.list_snapshots(request.job_id, request.operator_id)
        return pb.ListSnapshotsResponse(snapshots=[_meta_to_pb(meta) for meta in metas])

    @servicer_method
    async def DeleteSnapshots(
        self, request: pb.DeleteSnapshotsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSnapshotsResponse:
        """Deletes a job's snapshots, optionally of one operator and below a window."""
        _require(request.job_id, "job_id")
        check_path_id(request.operator_id, "operator_id", required=False)
        _require_int(request.below_window, "below_window")
        deleted = await self._store.delete_snapshots(
            request.job_id, request.operator_id, request.below_window
        )
        return pb.DeleteSnapshotsResponse(deleted=deleted)

    @servicer_method
    async def WriteResults(
        self, request: pb.WriteResultsRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteResultsResponse:
        """Upserts result rows and dead letters; durable when the response is sent."""
        await _injected_delay()
        await self._write_results(request)
        return pb.WriteResultsResponse()

    @servicer_method
    async def WriteResultsMany(
        self, request: pb.WriteResultsManyRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteResultsManyResponse:
        """Several operators' result writes from one worker: each checked,
        applied and answered on its own, all at once, so they share the group
        commit. A failure that is not a refusal (the disk, say) fails the
        call, after every write has finished: the writer retries them all,
        and writes are idempotent."""
        if len(request.writes) > MAX_RESULT_WRITES_PER_CALL:
            raise InvalidArgument(
                f"{len(request.writes)} result writes in one call; at most "
                f"{MAX_RESULT_WRITES_PER_CALL} (nothing was stored)")
        await _injected_delay()
        done = await asyncio.gather(*(self._write_results(write) for write in request.writes),
                                    return_exceptions=True)
        return pb.WriteResultsManyResponse(outcomes=_answers(done, pb.WriteResultsOutcome))

    async def _write_results(self, request: pb.WriteResultsRequest) -> None:
        """Checks and stores one operator's rows and dead letters."""
        _require(request.job_id, "job_id")
        _require(request.operator_id, "operator_id")
        _require_int(request.epoch, "epoch")
        _require_int(request.version, "version")
        rows = decode_rows(request.rows, request.row_count)
        dead_letters = decode_dead_letters(request.dead_letters, request.dead_letter_count)
        if self._directory is not None:
            await self._directory.check(request.job_id, request.operator_id)
        await self._store.write_results(
            request.job_id, rows, dead_letters, operator_id=request.operator_id,
            epoch=request.epoch, version=request.version)

    # The two streaming calls write with context.write instead of being async
    # generators, because servicer_method wraps coroutines only.

    @servicer_method
    async def ReadResults(  # type: ignore[override]
        self, request: pb.ReadResultsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Streams a job's result rows, the written ones and then those read
        from the state of the reduces named in ``from_state``; an unknown job
        streams nothing. With ``holdings_only``, one chunk of the job's
        holdings per operator instead (a reader's check for a replica ahead
        of the one it read)."""
        _require(request.job_id, "job_id")
        if request.holdings_only:
            holdings = await self._store.holdings(request.job_id)
            await context.write(pb.ReadResultsChunk(holdings=[_digest(h) for h in holdings]))
            return
        sources = [(source.stage, source.key_prefix) for source in request.from_state]
        check_sources(sources)
        async for chunk in self._store.read_results(request.job_id, self._chunk_rows):
            await context.write(pb.ReadResultsChunk(rows=encode_entries(chunk),
                                                    row_count=len(chunk)))
        if request.state_values_packed:  # the stored bytes and a few per row
            async for rows, count in read_packed_state_rows(
                    self._store.path, request.job_id, sources, self._chunk_rows,
                    DEFAULT_CHUNK_BYTES):
                await context.write(pb.ReadResultsChunk(rows=rows, row_count=count,
                                                        values_packed=True))
            return
        # A quarter of the byte limit: a value's JSON may be longer than its msgpack.
        async for chunk in read_state_rows(self._store.path, request.job_id, sources,
                                           self._chunk_rows, DEFAULT_CHUNK_BYTES // 4):
            await context.write(pb.ReadResultsChunk(rows=encode_entries(chunk),
                                                    row_count=len(chunk)))

    @servicer_method
    async def ReadDeadLetters(  # type: ignore[override]
        self, request: pb.ReadDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Streams a job's dead letters; an unknown job streams nothing."""
        _require(request.job_id, "job_id")
        async for chunk in self._store.read_dead_letters(request.job_id, self._chunk_rows):
            await context.write(pb.ReadDeadLettersChunk(entries=encode_entries(chunk),
                                                        count=len(chunk)))

    @servicer_method
    async def DeleteJob(
        self, request: pb.DeleteJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteJobResponse:
        """Deletes every result, dead letter and snapshot of a job."""
        _require(request.job_id, "job_id")
        await self._store.delete_job(request.job_id)
        log.info("deleted all data of job %s", request.job_id)
        return pb.DeleteJobResponse()


    @servicer_method
    async def Digest(
        self, request: pb.DigestRequest, context: grpc.aio.ServicerContext
    ) -> pb.DigestResponse:
        """Per operator: newest window, highest result version, fence; and totals."""
        check_id(request.job_id, "job_id", required=False)
        holdings = await self._store.holdings(request.job_id)
        stats = await self._store.stats()
        return pb.DigestResponse(operators=[_digest(h) for h in holdings],
                                 snapshots=stats.snapshots, snapshot_bytes=stats.snapshot_bytes)

    @servicer_method
    async def ReadOperator(  # type: ignore[override]
        self, request: pb.ReadOperatorRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Streams one operator's rows and dead letters above a version."""
        _require(request.job_id, "job_id")
        _require(request.operator_id, "operator_id")
        _require_int(request.after_version, "after_version")
        async for rows, dead in self._store.read_operator(
            request.job_id, request.operator_id, request.after_version, self._chunk_rows
        ):
            await context.write(pb.ReadOperatorChunk(
                rows=encode_entries(rows), row_count=len(rows),
                dead_letters=encode_entries(dead), dead_letter_count=len(dead)))

    # Operators' keyed state: window deltas on top of a compacted base, in
    # chunks of any number (no size limit).

    @servicer_method
    async def PutState(
        self, request_iterator: AsyncIterator[pb.StateChunk],
        context: grpc.aio.ServicerContext,
    ) -> pb.PutStateResponse:
        """Stores one window of an operator's keyed state sent in chunks.

        A retry of a window already stored, or being stored, is answered
        from its first chunk: the rest is neither read nor checked."""
        await _injected_delay()
        return pb.PutStateResponse(created=await self._put_window(aiter(request_iterator)))

    @servicer_method
    async def PutStateMany(
        self, request: pb.PutStateManyRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutStateManyResponse:
        """Several small windows from one worker, each a single chunk: each
        checked, stored and answered on its own as a PutState of it would be,
        all at once so that they share the group commit (one operator's in
        the order given, as they chain). A failure that is not a refusal
        (the disk, say) fails the call once every window has finished: the
        writer retries them all, and windows are idempotent."""
        if len(request.windows) > MAX_STATE_WRITES_PER_CALL:
            raise InvalidArgument(
                f"{len(request.windows)} windows in one call; at most "
                f"{MAX_STATE_WRITES_PER_CALL} (nothing was stored)")
        await _injected_delay()
        done: list[bool | BaseException] = [False] * len(request.windows)
        by_operator: dict[tuple[str, str], list[int]] = {}
        for index, window in enumerate(request.windows):
            by_operator.setdefault((window.meta.job_id, window.meta.operator_id),
                                   []).append(index)

        async def store_in_order(indexes: list[int]) -> None:
            # An operator's windows chain: each is stored after the one before.
            for index in indexes:
                try:
                    done[index] = await self._put_window(_only(request.windows[index]))
                except Exception as exc:  # answered (or raised) below, per window
                    done[index] = exc

        await asyncio.gather(*(store_in_order(indexes) for indexes in by_operator.values()))
        return pb.PutStateManyResponse(outcomes=_answers(
            done, pb.PutStateOutcome, lambda created: {"created": created}))

    async def _put_window(self, chunks: AsyncIterator[pb.StateChunk]) -> bool:
        """Stores the window ``chunks`` carry; whether it was created. A retry
        of a window held, or being stored, is answered from its first chunk."""
        first = await first_chunk(chunks)
        job_id, operator_id = first.meta.job_id, first.meta.operator_id
        if self._directory is not None:
            await self._directory.check(job_id, operator_id)
        states = self._store.states
        known = await states.earlier_outcome(job_id, operator_id, first.meta.window,
                                             first.meta.epoch)
        if known is not None:
            return known
        return await states.put(await receive_window(first, chunks))

    @servicer_method
    async def StateHead(
        self, request: pb.StateHeadRequest, context: grpc.aio.ServicerContext
    ) -> pb.StateHeadResponse:
        """Which windows of an operator's state are held (claiming it first
        when the request carries an epoch)."""
        _require(request.job_id, "job_id")
        _require(request.operator_id, "operator_id")
        _require_int(request.epoch, "epoch")
        head = await self._store.states.head(request.job_id, request.operator_id, request.epoch)
        if head is None:
            return pb.StateHeadResponse(found=False)
        return pb.StateHeadResponse(found=True, head_window=head.head_window,
                                    base_window=head.base_window, deltas=head.deltas)

    @servicer_method
    async def ReadState(  # type: ignore[override]
        self, request: pb.ReadStateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Streams an operator's state: base, then deltas (or only the deltas
        after a window the reader holds)."""
        _require(request.job_id, "job_id")
        _require(request.operator_id, "operator_id")
        _require_int(request.after_window, "after_window")
        async for chunk in self._store.states.read(
            request.job_id, request.operator_id,
            request.after_window if request.has_after else None, request.packed,
        ):
            await context.write(await send_chunk(request.job_id, request.operator_id, chunk))
