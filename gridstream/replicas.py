"""Reading and writing an operator's snapshots and rows on its replicas.

Writes go to the operator's R replicas at once and count once W of them
have acknowledged (the rest finish in the background, owned by this
client). Reads ask every live state server and keep the newest copy, so a
reader sees every acknowledged write as long as fewer than W state servers
are silent (see :mod:`gridstream.placement`). Snapshots are checked against
their checksum on arrival: a corrupt or half-sent copy is never used while a
good one exists.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from gridstream import codec, rpc
from gridstream.errors import (
    DataLoss,
    GridstreamError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StaleEpoch,
    Unavailable,
    from_rpc_error,
)
from gridstream.ids import checksum, stable_hash64
from gridstream.pbcopy import copy_into
from gridstream.peercalls import CoalescedCalls, Waiting, many_outcomes
from gridstream.placement import Holdings, ReplicaSet, replicas_ahead
from gridstream.routing import RoutingView
from gridstream.statewindows import StoredState, read_state, state_messages, state_timeout_s
from gridstream.v1 import stateserver_pb2, stateserver_pb2_grpc
from gridstream.validation import short
from gridstream.wiresize import result_write_bound

log = logging.getLogger(__name__)

_FINAL = (StaleEpoch, InvalidArgument, NotFound, ResourceExhausted)
"""Refusals that another replica or a retry would repeat: the caller must act."""

Call = Callable[[stateserver_pb2_grpc.StateServerStub], Awaitable[Any]]
WriteCall = Callable[[str, str], Awaitable[Any]]
"""A write to one state server, given its node id and address."""

MAX_RESULT_WRITES_PER_CALL = 64
"""Result writes in one WriteResultsMany call at most (the state server refuses more)."""

MAX_RESULT_BYTES_PER_CALL = 8 * 1024 * 1024
"""A WriteResultsMany call takes no more writes once it carries this many
bytes (it always takes one)."""

RESULT_WRITE_LINGER_S = 0.005
"""How long the first result write for an idle state server waits for others
to join its call. A worker's operators write their rows at the same clock
boundaries (``worker.results_linger_s``), but each reaches the call a few
event-loop steps after its timer fired, so with one step of waiting a
boundary's writes went out in two or three calls. Measured at 100,000 words/s
paced (bench/latency.py's job, 10 s): 320-349 calls per worker with one
step, 216-242 with 5 ms; in three runs of each, the cluster's CPU went from
13.34-14.00 CPU-seconds (median 13.91) to 12.50-12.81 (12.69), each state
server's from 2.19-2.38 to 2.02-2.12. Rows already wait up to a linger for
their boundary; a window's write waits these 5 ms more (900,000-word jobs,
ten of each mode on one cluster, medians: exactly_once drained in 0.182 and
0.171 s with the wait, 0.171 and 0.171 s without; at_most_once, which
writes its rows, in 0.121 and 0.117 s against 0.114 and 0.101 s)."""


MAX_STATE_WRITES_PER_CALL = 64
"""Windows in one PutStateMany call at most (the state server refuses more)."""

MAX_STATE_BYTES_PER_CALL = 8 * 1024 * 1024
"""A PutStateMany call takes no more windows once it carries this many bytes
(it always takes one)."""


class _NotServed(Exception):
    """A state server answered that it has no PutStateMany (an older version)."""


class ReplicaClient:
    """Quorum writes and newest-copy reads of operators' state on the state servers.

    One per process; :meth:`close` cancels and awaits writes still running to
    replicas beyond the quorum.
    """

    def __init__(self, routing: RoutingView, channels: rpc.ChannelPool) -> None:
        self.routing = routing
        self.channels = channels
        self._stragglers: set[asyncio.Future[Any]] = set()
        self._result_writes: CoalescedCalls[stateserver_pb2.WriteResultsRequest, None] = (
            CoalescedCalls(self._write_results_many, MAX_RESULT_WRITES_PER_CALL,
                           MAX_RESULT_BYTES_PER_CALL, linger_s=RESULT_WRITE_LINGER_S))
        """Result writes of this process's operators, one WriteResultsMany
        call per state server at a time (see :mod:`gridstream.peercalls`)."""
        self._state_writes: CoalescedCalls[stateserver_pb2.StateChunk, bool] = CoalescedCalls(
            self._put_state_many, MAX_STATE_WRITES_PER_CALL, MAX_STATE_BYTES_PER_CALL)
        """Windows of one chunk from this process's operators, one
        PutStateMany call per state server at a time: at a drain every task
        closes a window at once, a stream call each before."""
        self._streams_only: set[str] = set()
        """State servers that answered PutStateMany UNIMPLEMENTED (an older
        version): their windows go by PutState."""

    @property
    def result_write_calls(self) -> int:
        """WriteResultsMany calls made so far (fewer than the writes they carried)."""
        return self._result_writes.calls

    @property
    def state_write_calls(self) -> int:
        """PutStateMany calls made so far (fewer than the windows they carried)."""
        return self._state_writes.calls

    def _stub(self, address: str) -> stateserver_pb2_grpc.StateServerStub:
        return self.channels.stub(address, stateserver_pb2_grpc.StateServerStub)

    async def _replica_set(self) -> ReplicaSet:
        replicas = self.routing.replica_set
        if not replicas.readable:
            await self.routing.refresh(at_least=self.routing.epoch + 1)
            replicas = self.routing.replica_set
        if not replicas.readable:
            raise Unavailable("no state server is registered; start one (gridstream stateserver)")
        return replicas

    # -- writes ----------------------------------------------------------------

    async def _write(self, operator_id: str, what: str, call: WriteCall) -> None:
        """Sends ``call`` to the operator's replicas; returns once W acknowledged.

        Raises the replicas' refusal (stale epoch, bad request) at once, and
        Unavailable when too few replicas answered (the caller retries; every
        write is idempotent).
        """
        replicas = await self._replica_set()
        targets = replicas.placement(operator_id)
        needed = replicas.quorum
        if len(targets) < needed:
            await self.routing.refresh(at_least=self.routing.epoch + 1)
            raise Unavailable(f"{what}: only {len(targets)} writable state servers, "
                              f"{needed} must acknowledge; waiting for replicas to come back")
        pending: dict[asyncio.Future[Any], str] = {
            asyncio.ensure_future(call(node, replicas.writable[node])): node
            for node in targets
        }
        acked = 0
        failures: list[str] = []
        try:
            while pending and acked < needed:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    node = pending.pop(task)
                    error = _error_of(task, f"{what} on {node}")
                    if error is None:
                        acked += 1
                    elif isinstance(error, _FINAL):
                        raise error
                    else:
                        failures.append(str(error))
        finally:
            for task in pending:
                if acked >= needed:
                    self._stragglers.add(task)
                    task.add_done_callback(self._straggler_done)
                else:
                    task.cancel()
        if acked < needed:
            await self.routing.refresh(at_least=self.routing.epoch + 1)
            raise Unavailable(f"{what}: {acked} of {needed} replicas acknowledged "
                              f"({'; '.join(failures)}); retrying")

    def _straggler_done(self, task: asyncio.Future[Any]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a write beyond the quorum failed: %s", task.exception())

    async def put_snapshot(
        self, job_id: str, operator_id: str, window: int, epoch: int, payload: bytes
    ) -> None:
        """Stores a window snapshot on the operator's replicas; durable (on W) on return."""
        request = stateserver_pb2.PutSnapshotRequest(
            meta=stateserver_pb2.SnapshotMeta(
                job_id=job_id, operator_id=operator_id, window=window, epoch=epoch,
                size=len(payload), checksum=checksum(payload)),
            payload=payload)
        await self._write(operator_id, f"storing window {window} of {operator_id}",
                          lambda node, address: self._stub(address).PutSnapshot(
                              request, timeout=rpc.DATA_TIMEOUT_S))

    async def put_state(
        self, job_id: str, operator_id: str, window: int, epoch: int, parent: int | None,
        header: bytes, chunks: Sequence[tuple[bytes, int]],
    ) -> None:
        """Stores one window of keyed state (a delta on ``parent``, or a whole
        state when None) on the operator's replicas, sent as one PutState
        stream of ``chunks`` (msgpack entries, entry count); durable (on W) on
        return. A replica missing ``parent`` refuses (retryable; catch-up
        fills it): the write fails only when fewer than W replicas stored it."""
        messages = await state_messages(job_id, operator_id, window, epoch, parent, header,
                                        chunks)
        size = sum(len(m.header) + len(m.entries) for m in messages)
        what = f"storing window {window} of {operator_id}'s state"
        if len(messages) == 1:  # most windows: shares a call with the others waiting
            only = messages[0]
            await self._write(operator_id, what, lambda node, address: self._state_writes.call(
                address, only, size, f"{what} on {node}"))
            return
        timeout = state_timeout_s(size)
        await self._write(operator_id, what, lambda node, address: self._stub(address).PutState(
            iter(messages), timeout=timeout))

    async def _put_state_many(self, address: str,
                              batch: list[Waiting[stateserver_pb2.StateChunk, bool]]
                              ) -> list[bool | Exception]:
        """One PutStateMany call; an outcome per window (whether it was
        created, or its refusal). A state server that does not know the call
        gets each window as a PutState of its own, now and from then on."""
        stub = self._stub(address)
        timeout = state_timeout_s(sum(waiting.size for waiting in batch))

        async def reply() -> Sequence[stateserver_pb2.PutStateOutcome]:
            try:
                request = stateserver_pb2.PutStateManyRequest()
                copy_into(request.windows, (w.request for w in batch))
                response: stateserver_pb2.PutStateManyResponse = await stub.PutStateMany(
                    request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise _NotServed from None
                raise
            return response.outcomes

        if address not in self._streams_only:
            try:
                return await many_outcomes(batch, reply(), lambda outcome: bool(outcome.created))
            except _NotServed:
                log.info("state server at %s does not take PutStateMany (an older version); "
                         "sending it windows one call each", address)
                self._streams_only.add(address)

        async def alone(waiting: Waiting[stateserver_pb2.StateChunk, bool]) -> bool | Exception:
            try:
                reply = await stub.PutState(iter([waiting.request]), timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                return from_rpc_error(exc, waiting.what)
            return bool(reply.created)

        return list(await asyncio.gather(*(alone(waiting) for waiting in batch)))

    async def read_state(self, job_id: str, operator_id: str, epoch: int,
                         after: int | None = None) -> StoredState | None:
        """The newest state of an operator on any replica, checked chunk by chunk:
        the windows to apply in order (a whole state, then deltas).

        With ``epoch``, every replica that answers first raises the operator's
        fence to it, so the previous owner cannot store anything newer than
        what this read sees (StaleEpoch when a newer owner claimed it); 0
        reads without claiming. Only the replica with the newest head is read
        in full; another is tried when its stream fails or does not check out.

        With ``after`` (a window the reader already holds, e.g. a standby),
        only the deltas after it are read when the replica's chain still
        holds it: the first window then has ``after`` as its parent, and a
        head equal to ``after`` reads nothing (no windows, an empty header).
        Otherwise the whole state comes as usual; the reader tells the two
        apart by the first window's parent."""
        request = stateserver_pb2.StateHeadRequest(job_id=job_id, operator_id=operator_id,
                                                   epoch=epoch)
        answers = await self._ask_all(
            f"claiming and reading the state of {operator_id}",
            lambda stub: stub.StateHead(request, timeout=rpc.CONTROL_TIMEOUT_S))
        heads = sorted(((int(r.head_window), node) for node, r in answers if r.found),
                       reverse=True)
        replicas = self.routing.replica_set
        for head, node in heads:
            address = replicas.readable.get(node)
            if address is None:
                continue
            if after is not None and head == after:
                return StoredState(after, b"", [])
            try:
                state = await read_state(self._stub(address), job_id, operator_id, after)
            except (GridstreamError, grpc.aio.AioRpcError) as exc:
                error = from_rpc_error(exc) if isinstance(exc, grpc.aio.AioRpcError) else exc
                log.error("reading the state of %s from %s failed (%s); trying another copy",
                          operator_id, node, error)
                continue
            if state is None or state.window < head:
                log.error("%s's state on %s ends at window %s, below its head %d; trying "
                          "another copy", operator_id, node, state and state.window, head)
                continue
            return state
        if heads:
            raise Unavailable(f"no replica could hand out a whole copy of {operator_id}'s state "
                              f"(heads {heads}); retrying")
        return None

    async def write_results(
        self,
        job_id: str,
        operator_id: str,
        rows: list[list[Any]],
        dead_letters: list[tuple[str, str, str, str]],
        epoch: int = 0,
        version: int = 0,
    ) -> None:
        """Upserts rows ([key, json]) and dead letters at ``version`` on the
        operator's replicas; durable (on W) on return."""
        request = stateserver_pb2.WriteResultsRequest(
            job_id=job_id, operator_id=operator_id, rows=codec.pack(rows), row_count=len(rows),
            dead_letters=codec.pack([list(d) for d in dead_letters]),
            dead_letter_count=len(dead_letters), epoch=epoch, version=version)
        what = f"writing results of {operator_id}"
        size = result_write_bound(request)  # ByteSize() would encode the rows to tell
        await self._write(operator_id, what, lambda node, address: self._result_writes.call(
            address, request, size, f"{what} on {node}"))

    async def _write_results_many(
        self, address: str, batch: list[Waiting[stateserver_pb2.WriteResultsRequest, None]]
    ) -> list[Exception | None]:
        """One WriteResultsMany call; an outcome per write."""
        stub = self._stub(address)

        async def reply() -> Sequence[stateserver_pb2.WriteResultsOutcome]:
            request = stateserver_pb2.WriteResultsManyRequest()
            copy_into(request.writes, (w.request for w in batch))
            response: stateserver_pb2.WriteResultsManyResponse = await stub.WriteResultsMany(
                request, timeout=rpc.DATA_TIMEOUT_S)
            return response.outcomes

        return await many_outcomes(batch, reply(), lambda outcome: None)

    # -- reads -----------------------------------------------------------------

    async def _ask_all(self, what: str, call: Call) -> list[Any]:
        """Answers of every live state server; Unavailable unless enough answered."""
        replicas = await self._replica_set()
        nodes = sorted(replicas.readable)
        answers, silent = await self._ask(what, call, replicas, nodes)
        return await self._enough(what, replicas, answers, silent)

    async def _ask_enough(self, what: str, call: Call, spread: str) -> list[Any]:
        """Answers of as few live state servers as the read rule needs
        (:meth:`ReplicaSet.enough_heard`): with every copy acknowledged by
        every server (two state servers, R = W = 2, the default), one answer
        holds every acknowledged write, so one server does the work of the
        read rather than each doing all of it. A server that fails is
        replaced by the next; ``spread`` (a job id) picks where the walk over
        the servers starts, so different jobs' reads go to different ones."""
        replicas = await self._replica_set()
        nodes = sorted(replicas.readable)
        if nodes:
            start = stable_hash64(spread) % len(nodes)
            nodes = nodes[start:] + nodes[:start]
        needed = next((n for n in range(1, len(nodes) + 1) if replicas.enough_heard(n)),
                      len(nodes))
        answers: list[Any] = []
        silent: list[str] = []
        while len(answers) < needed and nodes:
            asked, nodes = nodes[:needed - len(answers)], nodes[needed - len(answers):]
            more, failed = await self._ask(what, call, replicas, asked)
            answers += more
            silent += failed
        return await self._enough(what, replicas, answers, silent)

    async def _read_job(self, what: str, job_id: str, call: Call) -> None:
        """Runs ``call``, a read of job ``job_id`` that merges what it gets,
        on as few servers as the read rule needs (:meth:`_ask_enough`), and
        meanwhile asks every live server what it holds of the job (per
        operator, a small answer). A server not read that holds a newer
        result version or state window of an operator than every server
        read is read too (logged at WARNING): the read rule assumes a server
        keeps what it acknowledged, which a machine crash can break
        (``docs/stateservers.md``), and then the rows of its last writes
        would be missing from the read until its catch-up."""
        holdings = asyncio.ensure_future(self._holdings(job_id))
        try:
            answers = await self._ask_enough(what, call, job_id)
        except BaseException:
            holdings.cancel()
            await asyncio.gather(holdings, return_exceptions=True)
            raise
        ahead = replicas_ahead({node for node, _ in answers}, await holdings)
        if ahead:
            log.warning("%s: %s held newer rows of the job than the replica read; reading it "
                        "too", what, ", ".join(ahead))
            replicas = await self._replica_set()
            _, failed = await self._ask(what, call, replicas,
                                        [n for n in ahead if n in replicas.readable])
            if failed:
                log.warning("%s: went on without %s", what, "; ".join(failed))

    async def _holdings(self, job_id: str) -> dict[str, Holdings | None]:
        """Per live server, (result version, state window or -1) per operator
        of the job it holds; None for a server that did not answer."""
        replicas = await self._replica_set()
        request = stateserver_pb2.ReadResultsRequest(job_id=job_id, holdings_only=True)

        async def held(stub: stateserver_pb2_grpc.StateServerStub) -> Holdings:
            out: Holdings = {}
            async for chunk in rpc.idle_stream(stub.ReadResults(request),
                                               f"holdings of {job_id}"):
                for h in chunk.holdings:
                    out[h.operator_id] = (h.results_version,
                                          h.state_window if h.has_state else -1)
            return out

        nodes = sorted(replicas.readable)
        answers, _ = await self._ask(f"holdings of {job_id}", held, replicas, nodes)
        answered = dict(answers)
        return {node: answered.get(node) for node in nodes}

    async def _ask(self, what: str, call: Call, replicas: ReplicaSet, nodes: list[str]
                   ) -> tuple[list[Any], list[str]]:
        """(answers as (node, result), failures as text) of ``nodes``, asked at
        once; an error no other server can mend (:data:`_FINAL`) is raised."""
        results = await asyncio.gather(
            *(call(self._stub(replicas.readable[n])) for n in nodes), return_exceptions=True)
        answers = []
        silent = []
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                error = (from_rpc_error(result, f"{what} on {node}")
                         if isinstance(result, grpc.aio.AioRpcError) else result)
                if isinstance(error, _FINAL):
                    raise error
                silent.append(f"{node}: {error}")
            else:
                answers.append((node, result))
        return answers, silent

    async def _enough(self, what: str, replicas: ReplicaSet, answers: list[Any],
                      silent: list[str]) -> list[Any]:
        """``answers``, or Unavailable (after a routing refresh) when they are
        too few to be sure of the newest copy."""
        if not replicas.enough_heard(len(answers)):
            await self.routing.refresh(at_least=self.routing.epoch + 1)
            raise Unavailable(f"{what}: {len(answers)} of {replicas.members} state servers "
                              f"answered, too few to be sure of the newest copy "
                              f"({'; '.join(silent)}); retrying")
        if silent:
            log.info("%s: went on without %s", what, "; ".join(silent))
        return answers

    async def get_latest_snapshot(
        self, job_id: str, operator_id: str
    ) -> tuple[int, bytes] | None:
        """(window, payload) of the newest snapshot on any replica, checksum-checked."""
        request = stateserver_pb2.GetLatestSnapshotRequest(job_id=job_id,
                                                           operator_id=operator_id)
        answers = await self._ask_all(
            f"reading the latest snapshot of {operator_id}",
            lambda stub: _latest_or_corrupt(stub, request))
        best: tuple[int, bytes] | None = None
        for node, response in answers:
            if response is None or not response.found:
                continue
            if checksum(response.payload) != response.meta.checksum:
                log.error("snapshot %s window %d from %s failed its checksum; using another "
                          "copy", operator_id, response.meta.window, node)
                continue
            if best is None or response.meta.window > best[0]:
                best = (int(response.meta.window), bytes(response.payload))
        return best

    async def read_results(self, job_id: str, from_state: Sequence[tuple[str, str]] = ()
                           ) -> dict[str, tuple[Any, int]]:
        """key -> (value, version): the rows of as many replicas as the read
        rule needs (:meth:`_ask_enough`; one by default), merged with the
        newest version winning; with the rows of the reduces in
        ``from_state`` ((stage, key prefix) pairs,
        :func:`gridstream.taskplan.state_result_sources`) read from their
        stored state. Each value is as its row's JSON shows it: a written
        row's JSON text parsed, a row read from state unpacked from msgpack
        (:func:`gridstream.codec.as_row_value`). Only the winning rows are
        decoded; a value that cannot be is DataLoss naming its key."""
        merged: dict[str, tuple[Any, int, bool]] = {}
        request = stateserver_pb2.ReadResultsRequest(job_id=job_id, from_state=[
            stateserver_pb2.ResultsFromState(stage=stage, key_prefix=prefix)
            for stage, prefix in from_state], state_values_packed=True)

        async def read(stub: stateserver_pb2_grpc.StateServerStub) -> None:
            async for chunk in rpc.idle_stream(
                stub.ReadResults(request),
                f"reading results of {job_id}",
            ):
                packed = chunk.values_packed
                for key, value, version in codec.unpack(chunk.rows):
                    held = merged.get(key)
                    if held is None or version >= held[1]:
                        merged[key] = (value, version, packed)

        await self._read_job(f"reading results of {job_id}", job_id, read)
        return {key: (_row_value(job_id, key, value, packed), version)
                for key, (value, version, packed) in merged.items()}

    async def read_dead_letters(self, job_id: str) -> list[tuple[str, str, str, str]]:
        """A job's dead letters, one per id, from as many replicas as the read
        rule needs (:meth:`_ask_enough`)."""
        merged: dict[str, tuple[str, str, str, str]] = {}

        async def read(stub: stateserver_pb2_grpc.StateServerStub) -> None:
            async for chunk in rpc.idle_stream(
                stub.ReadDeadLetters(stateserver_pb2.ReadDeadLettersRequest(job_id=job_id)),
                f"reading dead letters of {job_id}",
            ):
                for entry_id, stage, record, error in codec.unpack(chunk.entries):
                    merged[entry_id] = (entry_id, stage, record, error)

        await self._read_job(f"reading dead letters of {job_id}", job_id, read)
        return [merged[k] for k in sorted(merged)]

    async def close(self) -> None:
        """Cancels and awaits writes still running beyond their quorum."""
        stragglers = list(self._stragglers)
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*stragglers, return_exceptions=True)
        self._stragglers.clear()


def _row_value(job_id: str, key: str, value: Any, packed: bool) -> Any:
    """A result row's value as its JSON shows it (see :meth:`ReplicaClient.read_results`)."""
    if packed:
        try:
            return codec.as_row_value(value)
        except ValueError as exc:
            raise DataLoss(f"job {job_id}: the stored value of key {short(key)} cannot be "
                           f"shown as JSON ({exc})") from None
    try:
        return json.loads(value)
    except (TypeError, ValueError, RecursionError):
        raise DataLoss(f"job {job_id}: the stored value of key {short(key)} is not "
                       f"valid JSON ({short(str(value))})") from None


async def _latest_or_corrupt(
    stub: stateserver_pb2_grpc.StateServerStub,
    request: stateserver_pb2.GetLatestSnapshotRequest,
) -> stateserver_pb2.GetLatestSnapshotResponse | None:
    """A replica's newest snapshot; None when its copy is corrupt on disk (the
    replica refused it with DATA_LOSS), so the reader uses another copy."""
    try:
        response: stateserver_pb2.GetLatestSnapshotResponse = await stub.GetLatestSnapshot(
            request, timeout=rpc.DATA_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.DATA_LOSS:
            log.error("a replica holds a corrupt copy of %s: %s", request.operator_id,
                      exc.details())
            return None
        raise
    return response


def _error_of(task: asyncio.Future[Any], what: str) -> GridstreamError | None:
    """The typed error a finished write task raised, or None if it succeeded."""
    if task.cancelled():
        return Unavailable(f"{what}: cancelled")
    exc = task.exception()
    if exc is None:
        return None
    if isinstance(exc, grpc.aio.AioRpcError):
        return from_rpc_error(exc, what)
    if isinstance(exc, GridstreamError):
        return exc
    return Unavailable(f"{what}: {type(exc).__name__}: {exc}")


__all__ = ["ReplicaClient"]
