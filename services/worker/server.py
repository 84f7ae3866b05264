"""The worker's gRPC face: converts messages and maps errors; the work is in
WorkerNode."""

from __future__ import annotations

import grpc

from gridstream import codec
from gridstream.errors import GridstreamError, InvalidArgument, ResourceExhausted, StaleEpoch
from gridstream.rpc import servicer_method
from gridstream.v1 import worker_pb2, worker_pb2_grpc
from services.worker.node import WorkerNode
from services.worker.queues import ContainerClosed

_MARGIN_S = 0.2


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Push, deploy, stop and progress calls of one worker."""

    def __init__(self, node: WorkerNode, max_batch_bytes: int) -> None:
        self.node = node
        self.max_batch_bytes = max_batch_bytes

    @servicer_method
    async def Push(
        self, request: worker_pb2.PushRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PushResponse:
        """Checks every segment first, then appends them; answers once each is committed."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty; name the job the batch is for")
        size = request.ByteSize()
        if size > self.max_batch_bytes:
            raise ResourceExhausted(
                f"push of {size} bytes exceeds worker.max_batch_bytes={self.max_batch_bytes}; "
                "send smaller batches (the SDK's batch_size)"
            )
        decoded = []
        for i, segment in enumerate(request.segments):
            if not segment.channel or segment.sequence == 0:
                raise InvalidArgument(
                    f"segment {i}: channel must be set and sequence start at 1"
                )
            try:
                keys, values = codec.decode_batch(segment.batch)
            except codec.PayloadError as exc:
                raise InvalidArgument(f"segment {i}: {exc}; nothing was appended") from None
            runner = await self.node.runner_for(
                request.job_id, segment.task, segment.partition, request.epoch
            )
            decoded.append((runner, segment, keys, values))
        if request.sender:
            self.node.check_sender(request.job_id, request.sender, request.epoch,
                                   [s.channel for s in request.segments])
        outcomes = []
        remaining = context.time_remaining()
        for runner, segment, keys, values in decoded:
            wait = None if remaining is None else max(0.0, remaining - _MARGIN_S)
            try:
                accepted = await runner.accept(
                    segment.channel, segment.sequence, keys, values, wait, segment.batch,
                    root=segment.root,
                )
            except TimeoutError:
                raise ResourceExhausted(
                    f"container {runner.container.container_id} is full or its backups are "
                    f"unreachable ({runner.container.pending_records} records waiting); "
                    "retry later"
                ) from None
            except ContainerClosed:
                raise StaleEpoch(
                    f"stale epoch {self.node.routing.epoch}: partition {segment.partition} of "
                    f"job {request.job_id} moved away from {self.node.node_id}; refresh the "
                    "routing table and resend",
                    self.node.routing.epoch,
                ) from None
            outcomes.append(
                worker_pb2.SEGMENT_OUTCOME_ACCEPTED
                if accepted
                else worker_pb2.SEGMENT_OUTCOME_DUPLICATE
            )
        return worker_pb2.PushResponse(outcomes=outcomes, epoch=self.node.routing.epoch)

    @servicer_method
    async def DeployJob(
        self, request: worker_pb2.DeployJobRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DeployJobResponse:
        """Imports a job's operators here so its records can be accepted."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        self.node.deploy(request.job_id, request.spec)
        return worker_pb2.DeployJobResponse()

    @servicer_method
    async def StopJob(
        self, request: worker_pb2.StopJobRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.StopJobResponse:
        """Stops a job's tasks on this worker."""
        await self.node.stop_job(request.job_id)
        return worker_pb2.StopJobResponse()

    @servicer_method
    async def Replicate(
        self, request: worker_pb2.ReplicateRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReplicateResponse:
        """Holds a primary's appends (or full copy) as a backup."""
        if not request.job_id or not request.primary:
            raise InvalidArgument("job_id and primary must be set")
        return worker_pb2.ReplicateResponse(next_offset=self.node.backups.replicate(request))

    async def FetchContainer(  # type: ignore[override]
        self, request: worker_pb2.FetchContainerRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Streams a container's committed log to its new owner."""
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
        """Counters of the job's tasks hosted here."""
        return worker_pb2.GetTaskProgressResponse(
            tasks=self.node.progress(request.job_id), epoch=self.node.routing.epoch
        )

    @servicer_method
    async def Track(
        self, request: worker_pb2.TrackRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.TrackResponse:
        """Applies a task's tracking report to a tracker hosted here."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty; name the job the roots belong to")
        if len(request.roots) % 8 or len(request.roots) != len(request.values):
            raise InvalidArgument("roots and values must be little-endian uint64 arrays of "
                                  "the same length; nothing applied")
        held = await self.node.trackers.track(request)
        return worker_pb2.TrackResponse(roots_held=held)

    @servicer_method
    async def TrackingEvents(
        self, request: worker_pb2.TrackingEventsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.TrackingEventsResponse:
        """Completed, failed and to-be-rebuilt roots, for this worker's tasks."""
        for name in ("completed", "failed", "collect"):
            if len(getattr(request, name)) % 8:
                raise InvalidArgument(f"{name} must be a little-endian uint64 array")
        return await self.node.tracking_events(request)
