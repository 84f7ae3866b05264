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
import itertools
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc

from gridstream import codec, rpc
from gridstream.config import SecurityConfig
from gridstream.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    GridstreamError,
    NotFound,
    StaleEpoch,
    Unavailable,
    from_rpc_error,
)
from gridstream.ids import partition_for_key
from gridstream.jobspec import JobSpec, load_job_file
from gridstream.replicas import ReplicaClient
from gridstream.routing import RoutingView
from gridstream.v1 import (
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

DEFAULT_BATCH_SIZE = 5_000
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class Client:
    """An asyncio connection to a gridstream cluster."""

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
        continue from ``start_sequence``). ``security`` gives the CA, client
        certificate and bearer token for a cluster that requires TLS and tokens."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.scheduler_address = scheduler
        self.batch_size = batch_size
        self.channel_name = f"src/{producer_id or uuid.uuid4().hex}"
        self.send_timeout_s = send_timeout_s
        self._channels = rpc.ChannelPool(security)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._channel(scheduler))
        self._table = scheduler_pb2.RoutingTable()
        self._sequences: dict[tuple[str, int], int] = {}
        self._partition_locks: dict[tuple[str, int], asyncio.Lock] = {}
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

    async def _call(self, what: str, call: Any, request: Any, deadline_s: float) -> Any:
        try:
            return await call(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, what) from None

    # -- jobs -------------------------------------------------------------

    async def submit(self, job: JobSpec | str | Path) -> str:
        """Submits a job (a JobSpec or the path of a job TOML file); returns its id.
        Raises InvalidArgument when the job is malformed or an import path does
        not resolve on the workers."""
        spec = job if isinstance(job, JobSpec) else load_job_file(job)
        response = await self._call(
            "submitting job", self._scheduler.SubmitJob,
            scheduler_pb2.SubmitJobRequest(spec=spec.to_proto()), rpc.CONTROL_TIMEOUT_S * 3,
        )
        return str(response.job_id)

    async def job(self, job_id: str) -> common_pb2.JobInfo:
        """A job's description and state; NotFound for an unknown id."""
        info: common_pb2.JobInfo = await self._call(
            f"job {job_id}", self._scheduler.GetJob,
            scheduler_pb2.GetJobRequest(job_id=job_id), rpc.CONTROL_TIMEOUT_S,
        )
        return info

    async def jobs(self) -> list[common_pb2.JobInfo]:
        """Every job the scheduler knows."""
        response = await self._call("listing jobs", self._scheduler.ListJobs,
                                    scheduler_pb2.ListJobsRequest(), rpc.CONTROL_TIMEOUT_S)
        return list(response.jobs)

    async def cancel(self, job_id: str) -> common_pb2.JobInfo:
        """Cancels a job and deletes its state."""
        info: common_pb2.JobInfo = await self._call(
            f"cancelling {job_id}", self._scheduler.CancelJob,
            scheduler_pb2.CancelJobRequest(job_id=job_id), rpc.CONTROL_TIMEOUT_S * 3,
        )
        return info

    async def progress(self, job_id: str) -> scheduler_pb2.JobProgress:
        """Per-task counters and whether the job has drained."""
        progress: scheduler_pb2.JobProgress = await self._call(
            f"progress of {job_id}", self._scheduler.GetJobProgress,
            scheduler_pb2.GetJobProgressRequest(job_id=job_id), rpc.CONTROL_TIMEOUT_S * 2,
        )
        return progress

    async def status(self) -> scheduler_pb2.ClusterStatus:
        """Members, ring shares and jobs."""
        status: scheduler_pb2.ClusterStatus = await self._call(
            "cluster status", self._scheduler.GetClusterStatus,
            scheduler_pb2.GetClusterStatusRequest(), rpc.CONTROL_TIMEOUT_S,
        )
        return status

    async def drain(self, job_id: str, timeout_s: float = 300.0,
                    poll_s: float = 0.1) -> scheduler_pb2.JobProgress:
        """Waits until every record accepted so far is processed and its results
        are durable (two consecutive drained reports with the same counters)."""
        deadline = time.monotonic() + timeout_s
        previous: tuple[int, ...] | None = None
        while True:
            progress = await self.progress(job_id)
            totals = tuple(
                itertools.chain.from_iterable(
                    (t.records_in, t.records_processed, t.records_out) for t in progress.tasks
                )
            )
            if progress.drained and totals == previous:
                return progress
            previous = totals if progress.drained else None
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"job {job_id} did not drain within {timeout_s:.0f}s; "
                    "see `gridstream status` for queue depths"
                )
            await asyncio.sleep(poll_s)

    # -- data -------------------------------------------------------------

    async def _routing(self, job_id: str, refresh: bool = False) -> scheduler_pb2.JobRouting:
        if refresh or not any(j.job_id == job_id for j in self._table.jobs):
            self._table = await self._call(
                "fetching the routing table", self._scheduler.GetRoutingTable,
                scheduler_pb2.GetRoutingTableRequest(), rpc.CONTROL_TIMEOUT_S,
            )
        for job in self._table.jobs:
            if job.job_id == job_id:
                if not job.owners:
                    raise Unavailable(f"job {job_id} has no workers to run on; start workers")
                return job
        info = await self.job(job_id)  # NotFound for an id the scheduler never gave out
        state = common_pb2.JobState.Name(info.state).removeprefix("JOB_STATE_").lower()
        raise FailedPrecondition(f"job {job_id} is {state}{': ' + info.error if info.error else ''}"
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
        partitions in turn. Returns the number of records sent.

        Exactly once across sender restarts: give a stable ``producer`` (its
        channel becomes ``src/<producer>``) and a ``first_sequence`` that is
        the same whenever the same records are sent again and larger than any
        sequence this producer used before (e.g. ``(batch_id + 1) << 24`` for a
        micro-batch). The n-th batch sent to a partition then carries sequence
        ``first_sequence + n``; a partition that already holds it acknowledges
        it as a duplicate instead of appending it again."""
        if (producer is None) != (first_sequence is None):
            raise ValueError("give producer and first_sequence together")
        routing = await self._routing(job_id)
        partitions = routing.partitions
        per_partition: dict[int, list[tuple[list[Any] | None, list[Any]]]] = {}
        total = 0
        if keys is not None:
            values = list(values)
            if len(keys) != len(values):
                raise ValueError("keys and values differ in length")
            grouped: dict[int, tuple[list[Any], list[Any]]] = {}
            for k, v in zip(keys, values, strict=True):
                bucket = grouped.setdefault(partition_for_key(k, partitions), ([], []))
                bucket[0].append(k)
                bucket[1].append(v)
            for p, (bk, bv) in grouped.items():
                for start in range(0, len(bv), self.batch_size):
                    per_partition.setdefault(p, []).append(
                        (bk[start:start + self.batch_size], bv[start:start + self.batch_size])
                    )
                total += len(bv)
        else:
            iterator = iter(values)
            while chunk := list(itertools.islice(iterator, self.batch_size)):
                p = next(self._round_robin) % partitions
                per_partition.setdefault(p, []).append((None, chunk))
                total += len(chunk)
        if producer is not None and first_sequence is not None:
            channel = f"src/{producer}"
            await asyncio.gather(*(
                self._send_sequenced(job_id, p, batches, channel, first_sequence)
                for p, batches in per_partition.items()
            ))
            return total
        await asyncio.gather(
            *(self._send_partition(job_id, p, batches) for p, batches in per_partition.items())
        )
        return total

    async def _send_sequenced(
        self, job_id: str, partition: int, batches: list[tuple[list[Any] | None, list[Any]]],
        channel: str, first_sequence: int,
    ) -> None:
        for n, (keys, values) in enumerate(batches):
            segment = worker_pb2.Segment(
                task=0, partition=partition, channel=channel, sequence=first_sequence + n,
                batch=codec.encode_batch(values, keys),
            )
            await self._push(job_id, segment)

    async def _send_partition(
        self, job_id: str, partition: int, batches: list[tuple[list[Any] | None, list[Any]]]
    ) -> None:
        lock = self._partition_locks.setdefault((job_id, partition), asyncio.Lock())
        async with lock:
            for keys, values in batches:
                seq_key = (job_id, partition)
                sequence = self._sequences.get(seq_key, 0) + 1
                segment = worker_pb2.Segment(
                    task=0,
                    partition=partition,
                    channel=self.channel_name,
                    sequence=sequence,
                    batch=codec.encode_batch(values, keys),
                )
                await self._push(job_id, segment)
                self._sequences[seq_key] = sequence

    async def _push(self, job_id: str, segment: worker_pb2.Segment) -> None:
        """Pushes one segment to its owner until acknowledged, following
        re-routes and retrying transient failures with backoff."""
        deadline = time.monotonic() + self.send_timeout_s
        delay = 0.02
        refresh = False
        while True:
            routing = await self._routing(job_id, refresh)
            owner = routing.owners[segment.partition]
            address = next((m.address for m in self._table.members if m.node_id == owner), None)
            if address is None:
                raise Unavailable(f"owner {owner} of partition {segment.partition} has no address")
            stub = worker_pb2_grpc.WorkerStub(self._channel(address))
            try:
                await stub.Push(
                    worker_pb2.PushRequest(job_id=job_id, epoch=self._table.epoch,
                                           segments=[segment]),
                    timeout=rpc.DATA_TIMEOUT_S,
                )
                return
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc, f"sending to {owner}")
                if isinstance(error, NotFound) and not refresh:
                    # The job may have been cancelled since our table was fetched:
                    # the fresh table says so (and _routing raises the right error).
                    refresh = True
                    continue
                if not isinstance(error, StaleEpoch) and exc.code() not in _RETRYABLE:
                    raise error from None
                if time.monotonic() + delay > deadline:
                    raise error from None
                refresh = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- results ----------------------------------------------------------

    async def results(self, job_id: str) -> dict[str, Any]:
        """The job's sink table: {key: value}, merged from the state-server
        replicas (the newest version of each key wins)."""
        await self.job(job_id)  # NotFound for an unknown job
        await self._state.routing.refresh()
        rows = await self._state.read_results(job_id)
        return {key: json.loads(value) for key, (value, _version) in rows.items()}

    async def dead_letters(self, job_id: str) -> list[dict[str, str]]:
        """Records an operator raised on: id, stage, record and error."""
        await self.job(job_id)
        await self._state.routing.refresh()
        return [
            {"id": entry_id, "stage": stage, "record": record, "error": error}
            for entry_id, stage, record, error in await self._state.read_dead_letters(job_id)
        ]

    # -- administration -----------------------------------------------------

    async def set_tracker_count(self, count: int) -> int:
        """Changes the number of tuple trackers while jobs run (admin right);
        returns the epoch of the new layout."""
        response = await self._call(
            "setting the tracker count", self._scheduler.SetTrackerCount,
            scheduler_pb2.SetTrackerCountRequest(count=count), rpc.CONTROL_TIMEOUT_S,
        )
        return int(response.epoch)

    async def retire_state_server(self, node_id: str) -> int:
        """Starts retiring a state server (admin right): it takes no new writes,
        hands its share to the other replicas, then leaves. Returns the epoch."""
        response = await self._call(
            f"retiring {node_id}", self._scheduler.RetireMember,
            scheduler_pb2.RetireMemberRequest(node_id=node_id), rpc.CONTROL_TIMEOUT_S,
        )
        return int(response.epoch)


__all__ = ["DEFAULT_BATCH_SIZE", "Client", "GridstreamError"]
