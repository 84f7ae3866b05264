"""The worker's gRPC face: converts messages and maps errors; the work is in
WorkerNode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from gridstream import codec
from gridstream.auth import caller_is_member
from gridstream.errors import (
    GridstreamError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    StaleEpoch,
    Unavailable,
    status_number,
)
from gridstream.jobspec import JobSpec, check_allowed
from gridstream.rpc import StreamAnswers, servicer_method
from gridstream.v1 import worker_pb2, worker_pb2_grpc
from gridstream.validation import (
    MAX_CLIENT_SEQUENCE,
    SOURCE_CHANNEL_PREFIX,
    check_id,
    check_nesting,
    check_path_id,
    short,
)
from gridstream.wiresize import push_bound
from services.worker.node import WorkerNode
from services.worker.queues import ContainerClosed
from services.worker.replicacalls import MAX_REPLICATIONS_PER_CALL
from services.worker.tasks import TaskRunner
from services.worker.tracker_answers import answer_tracking_events
from services.worker.trackreports import MAX_REPORTS_PER_CALL

_MARGIN_S = 0.2


def check_client_segment(index: int, segment: worker_pb2.Segment) -> None:
    """Clients write only to a job's sources: the first task, on a channel of
    their own (``src/<producer>``), below the sequences reserved for the
    cluster, as their own roots. Anything else is how one worker hands a batch
    to the next task, and only members may do it."""
    where = f"segment {index}"
    if segment.task != 0:
        raise PermissionDenied(
            f"{where}: clients write only to a job's source (task 0), not task {segment.task}; "
            "later tasks are fed by the cluster (nothing was appended)")
    if not segment.channel.startswith(SOURCE_CHANNEL_PREFIX):
        raise PermissionDenied(
            f"{where}: client channels are 'src/<producer>'; other channels are internal to "
            "the cluster (nothing was appended)")
    check_path_id(segment.channel, f"{where}: channel")
    if segment.sequence > MAX_CLIENT_SEQUENCE:
        raise PermissionDenied(
            f"{where}: sequence {segment.sequence} is in the range reserved for the cluster "
            f"(above {MAX_CLIENT_SEQUENCE}); number client batches from 1 (nothing was "
            "appended)")
    if segment.root:
        raise PermissionDenied(f"{where}: root is set by the cluster; clients leave it 0 "
                               "(nothing was appended)")


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Push, deploy, stop and progress calls of one worker."""

    def __init__(self, node: WorkerNode, max_batch_bytes: int,
                 streams: StreamAnswers | None = None) -> None:
        self.node = node
        self.max_batch_bytes = max_batch_bytes
        self.streams = streams or StreamAnswers()
        """Answers ReplicateStream and TrackStream (the host's, so a stop ends them)."""

    def _check_container(self, job_id: str, task: int, partition: int) -> None:
        """Refuses a task or partition the job (when deployed here) does not
        have, so no copy or fence is ever kept for a container that cannot exist."""
        runtime = self.node.jobs.get(job_id)
        if runtime is not None and (task >= len(runtime.tasks)
                                    or partition >= runtime.spec.partitions):
            raise InvalidArgument(
                f"job {job_id} has {len(runtime.tasks)} tasks and {runtime.spec.partitions} "
                f"partitions, not task {task} partition {partition} (nothing was done)")

    async def _check_from_primary(
        self, request: worker_pb2.ReplicateRequest | worker_pb2.ShipStateRequest, what: str
    ) -> None:
        """Checks what a primary copies to this holder (its log, or a window
        of its state): who sends it, for a job and container that exist, at
        an epoch this worker has reached."""
        if not request.job_id or not request.primary:
            raise InvalidArgument("job_id and primary must be set")
        check_id(request.job_id, "job_id")
        check_id(request.primary, "primary")
        await self._check_listed(request.job_id, what)
        self._check_container(request.job_id, request.task, request.partition)
        await self.node.routing.reach(request.epoch, what)

    async def _check_listed(self, job_id: str, what: str) -> None:
        """Refuses a member's call for a job the routing table does not list,
        so no backup copy, fence or tracking table is kept for a job that does
        not exist. A worker may hear of a job from its peers before it has
        deployed it (a backup, a tracker host), so the test is the table, not
        the deployed jobs; the table is fetched again first (one shared,
        spaced fetch) in case this worker's copy is behind."""
        routing = self.node.routing
        if job_id in routing.owners:
            return
        await routing.refresh()
        if job_id not in routing.owners:
            raise NotFound(
                f"job {short(job_id)} is not in the routing table (epoch {routing.epoch}); "
                f"{what} refused, nothing was kept")

    @servicer_method
    async def Push(
        self, request: worker_pb2.PushRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PushResponse:
        """Checks every segment first, then appends them; answers once each is committed."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty; name the job the batch is for")
        check_id(request.job_id, "job_id")
        member = caller_is_member.get()
        if request.sender and not member:
            raise PermissionDenied("only workers set sender; clients leave it empty "
                                   "(nothing was appended)")
        request.DiscardUnknownFields()  # not ours to keep, and not counted by the bound
        # Each payload read once (every read copies it), for the bound and the
        # decoding; ByteSize() would encode the whole push to tell the size.
        payloads = [segment.batch.payload for segment in request.segments]
        size = push_bound(request, payloads)
        if size > self.max_batch_bytes:
            raise ResourceExhausted(
                f"push of about {size} bytes exceeds worker.max_batch_bytes="
                f"{self.max_batch_bytes}; "
                "send smaller batches (the SDK's batch_size)"
            )
        decoded = []
        for i, segment in enumerate(request.segments):
            if not segment.channel or segment.sequence == 0:
                raise InvalidArgument(
                    f"segment {i}: channel must be set and sequence start at 1"
                )
            if not member:
                check_client_segment(i, segment)
            try:
                keys, values = codec.decode_batch(segment.batch, payloads[i])
            except codec.PayloadError as exc:
                raise InvalidArgument(f"segment {i}: {exc}; nothing was appended") from None
            if not member:
                check_nesting(values, f"segment {i}: record")
                if keys is not None:
                    check_nesting(keys, f"segment {i}: key")
            runner = await self.node.runner_for(
                request.job_id, segment.task, segment.partition, request.epoch
            )
            # runner_for fetched the table if the epoch was newer: one fetch
            # per push, and an epoch still ahead is refused, not fetched again.
            self.node.routing.check_reached(request.epoch, f"segment {i}")
            decoded.append((runner, segment, keys, values))
        del payloads  # decoded: the copies need not live through the commits
        if request.sender:
            self.node.check_sender(request.job_id, request.sender, request.epoch,
                                   [s.channel for s in request.segments])
        # Appended one after another (a channel's batches enter in order; the
        # first refusal stops the rest), then committed together: the segments'
        # replications overlap instead of taking a round trip each.
        commits = []
        remaining = context.time_remaining()
        wait = None if remaining is None else max(0.0, remaining - _MARGIN_S)
        for runner, segment, keys, values in decoded:
            try:
                commit = await runner.append(
                    segment.channel, segment.sequence, keys, values, wait, segment.batch,
                    root=segment.root, previous_sequence=segment.previous_sequence,
                )
            except (TimeoutError, ContainerClosed) as exc:
                raise self._refusal(runner, segment.partition, exc) from None
            commits.append((runner, segment.partition, commit))
        results = await asyncio.gather(*(commit() for _, _, commit in commits),
                                        return_exceptions=True)
        outcomes = []
        for (runner, partition, _), result in zip(commits, results, strict=True):
            if isinstance(result, (TimeoutError, ContainerClosed)):
                raise self._refusal(runner, partition, result) from None
            if isinstance(result, BaseException):
                raise result
            outcomes.append(worker_pb2.SEGMENT_OUTCOME_ACCEPTED if result
                            else worker_pb2.SEGMENT_OUTCOME_DUPLICATE)
        return worker_pb2.PushResponse(outcomes=outcomes, epoch=self.node.routing.epoch)

    def _refusal(self, runner: TaskRunner, partition: int, exc: BaseException
                 ) -> GridstreamError:
        """The error a sender gets for a segment that was not committed in time
        (TimeoutError) or whose container moved away (ContainerClosed)."""
        if isinstance(exc, ContainerClosed):
            return StaleEpoch(
                f"stale epoch {self.node.routing.epoch}: partition {partition} of "
                f"job {runner.job_id} moved away from {self.node.node_id}; refresh the "
                "routing table and resend",
                self.node.routing.epoch,
            )
        shortfall = runner.replicator.shortfall if runner.replicator else ""
        if shortfall:
            return Unavailable(
                f"container {runner.container.container_id} cannot be acknowledged: "
                f"{shortfall}; nothing was acknowledged, retry once workers are back"
            )
        return ResourceExhausted(
            f"container {runner.container.container_id} is full or its backups are "
            f"unreachable ({runner.container.pending_records} records waiting); "
            "retry later"
        )

    @servicer_method
    async def DeployJob(
        self, request: worker_pb2.DeployJobRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DeployJobResponse:
        """Imports a job's operators here so its records can be accepted, once
        every import path is found in the modules this cluster allows."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        check_id(request.job_id, "job_id")
        check_allowed(JobSpec.from_proto(request.spec), self.node.config.cluster.job_modules)
        self.node.deploy(request.job_id, request.spec)
        return worker_pb2.DeployJobResponse()

    @servicer_method
    async def StopJob(
        self, request: worker_pb2.StopJobRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.StopJobResponse:
        """Stops a job's tasks on this worker."""
        check_id(request.job_id, "job_id")
        await self.node.stop_job(request.job_id)
        return worker_pb2.StopJobResponse()

    @servicer_method
    async def ReplicateMany(
        self, request: worker_pb2.ReplicateManyRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReplicateManyResponse:
        """Holds primaries' appends (or full copies) as a backup: each
        replication checked, applied and answered on its own."""
        if len(request.requests) > MAX_REPLICATIONS_PER_CALL:
            raise InvalidArgument(
                f"{len(request.requests)} replications in one call; at most "
                f"{MAX_REPLICATIONS_PER_CALL} (nothing was applied)")
        outcomes = []
        for one in request.requests:
            try:
                await self._check_from_primary(one, "replication")
                outcomes.append(worker_pb2.ReplicateOutcome(
                    next_offset=self.node.backups.replicate(one)))
            except GridstreamError as exc:
                outcomes.append(worker_pb2.ReplicateOutcome(code=status_number(exc),
                                                            details=str(exc)))
        return worker_pb2.ReplicateManyResponse(outcomes=outcomes)

    async def ReplicateStream(  # type: ignore[override]
        self, requests: AsyncIterator[worker_pb2.ReplicateManyRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """ReplicateMany's answer to each request of a primary's stream, in order."""
        await self.streams.answer_each(requests, context, self.ReplicateMany)

    @servicer_method
    async def ShipState(
        self, request: worker_pb2.ShipStateRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ShipStateResponse:
        """Applies a primary's durable window to this holder's standby of the task."""
        await self._check_from_primary(request, "state shipment")
        return self.node.standbys.receive(request)

    @servicer_method
    async def FetchContainer(  # type: ignore[override]
        self, request: worker_pb2.FetchContainerRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Streams a container's committed log to its new owner."""
        check_id(request.job_id, "job_id")
        await self._check_listed(request.job_id, "log fetch")
        self._check_container(request.job_id, request.task, request.partition)
        if request.epoch > self.node.routing.epoch:
            await self.node.catch_up(request.epoch)  # fetch_container would do it
        self.node.routing.check_reached(request.epoch, "log fetch")
        try:
            chunks = await self.node.fetch_container(
                (request.job_id, request.task, request.partition), request.epoch
            )
        except GridstreamError as exc:
            await context.abort(exc.code, str(exc))
            return
        for chunk in chunks:
            await context.write(chunk)

    @servicer_method
    async def GetTaskProgress(
        self, request: worker_pb2.GetTaskProgressRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetTaskProgressResponse:
        """Counters of the job's tasks hosted here; with ``flush`` (someone is
        draining the job), their pending windows are closed first and, once
        they are all idle, the trackers hosted here announce completions as
        they come for a while. While a backlog is still being processed,
        completions keep going out once a tick, many per broadcast."""
        check_id(request.job_id, "job_id")
        runtime = self.node.jobs.get(request.job_id) if request.flush else None
        runners = list(runtime.runners.values()) if runtime is not None else []
        for runner in runners:
            await runner.flush_soon()
        if request.flush:
            self.node.trackers.drain_asked(request.job_id)
        if request.flush and all(runner.idle for runner in runners):
            self.node.trackers.hurry()
        return worker_pb2.GetTaskProgressResponse(
            tasks=self.node.progress(request.job_id), epoch=self.node.routing.epoch
        )

    @servicer_method
    async def TrackMany(
        self, request: worker_pb2.TrackManyRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.TrackManyResponse:
        """Applies a worker's tracking reports to trackers hosted here: each
        report checked, applied and answered on its own."""
        if len(request.reports) > MAX_REPORTS_PER_CALL:
            raise InvalidArgument(
                f"{len(request.reports)} tracking reports in one call; at most "
                f"{MAX_REPORTS_PER_CALL} (nothing was applied)")
        outcomes = []
        for report in request.reports:
            try:
                outcomes.append(worker_pb2.TrackOutcome(roots_held=await self._track(report)))
            except GridstreamError as exc:
                outcomes.append(worker_pb2.TrackOutcome(code=status_number(exc),
                                                        details=str(exc)))
        return worker_pb2.TrackManyResponse(outcomes=outcomes)

    async def TrackStream(  # type: ignore[override]
        self, requests: AsyncIterator[worker_pb2.TrackManyRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """TrackMany's answer to each request of a reporting worker's stream, in order."""
        await self.streams.answer_each(requests, context, self.TrackMany)

    async def _track(self, request: worker_pb2.TrackRequest) -> int:
        """Applies one task's tracking report to a tracker hosted here."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty; name the job the roots belong to")
        check_id(request.job_id, "job_id")
        check_id(request.node_id, "node_id", required=False)
        check_path_id(request.reporter, "reporter", required=False)
        if len(request.roots) % 8 or len(request.roots) != len(request.values):
            raise InvalidArgument("roots and values must be little-endian uint64 arrays of "
                                  "the same length; nothing applied")
        await self._check_listed(request.job_id, "tracking report")
        return await self.node.trackers.track(request)

    @servicer_method
    async def TrackingEvents(
        self, request: worker_pb2.TrackingEventsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.TrackingEventsResponse:
        """Completed, failed and to-be-rebuilt roots, for this worker's tasks."""
        check_id(request.job_id, "job_id")
        for name in ("completed", "failed", "collect"):
            if len(getattr(request, name)) % 8:
                raise InvalidArgument(f"{name} must be a little-endian uint64 array")
        return await answer_tracking_events(self.node, request)
