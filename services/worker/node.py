"""WorkerNode: the jobs and tasks hosted by one worker process.

It deploys jobs (importing their operators), starts a TaskRunner for every
(task, partition) the routing table gives it, appends incoming batches to the
right JobContainer, and stops tasks it no longer owns. Task runners are owned
by the node's TaskGroup and cancelled and awaited when they stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from gridstream.config import Config
from gridstream.errors import InvalidArgument, NotFound, StaleEpoch
from gridstream.jobspec import JobSpec, Stage, check_imports, plan_tasks
from gridstream.v1 import common_pb2
from services.worker.peers import Channels, OutSegment, PeerRouter, StateClient
from services.worker.routing import RoutingView
from services.worker.tasks import TaskRunner

log = logging.getLogger(__name__)


@dataclass
class JobRuntime:
    """One deployed job: its spec, its task plan and the runners hosted here."""

    job_id: str
    spec: JobSpec
    tasks: list[list[Stage]]
    runners: dict[tuple[int, int], TaskRunner] = field(default_factory=dict)
    handles: dict[tuple[int, int], asyncio.Task[None]] = field(default_factory=dict)


class WorkerNode:
    """Everything one worker hosts, independent of gRPC (the servicer is thin)."""

    def __init__(
        self,
        config: Config,
        node_id: str,
        routing: RoutingView,
        channels: Channels,
        group: asyncio.TaskGroup,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.routing = routing
        self.channels = channels
        self.group = group
        self.jobs: dict[str, JobRuntime] = {}
        self.router = PeerRouter(node_id, routing, channels, self.append_local,
                                 config.worker.push_timeout_s)
        self.state = StateClient(routing, channels)
        self._sync_lock = asyncio.Lock()

    def deploy(self, job_id: str, spec_proto: common_pb2.JobSpec) -> JobRuntime:
        """Installs a job (idempotent); raises InvalidArgument if an import path
        does not resolve here."""
        runtime = self.jobs.get(job_id)
        if runtime is not None:
            return runtime
        spec = JobSpec.from_proto(spec_proto)
        if spec.partitions == 0 or spec.window_size == 0:
            spec = spec.with_defaults(self.config.cluster.partitions,
                                      self.config.cluster.window_size)
        check_imports(spec)
        runtime = JobRuntime(job_id, spec, plan_tasks(spec))
        self.jobs[job_id] = runtime
        log.info("deployed job %s (%s): %d tasks x %d partitions", job_id, spec.name,
                 len(runtime.tasks), spec.partitions)
        return runtime

    async def stop_job(self, job_id: str) -> None:
        """Stops every task of a job and forgets it."""
        runtime = self.jobs.pop(job_id, None)
        if runtime is None:
            return
        for handle in runtime.handles.values():
            handle.cancel()
        for handle in runtime.handles.values():
            with contextlib.suppress(asyncio.CancelledError):
                await handle
        log.info("stopped job %s", job_id)

    def _start_task(self, runtime: JobRuntime, task: int, partition: int) -> TaskRunner:
        runner = TaskRunner(
            runtime.job_id,
            runtime.spec,
            runtime.tasks,
            task,
            partition,
            self.router,
            self.state,
            self.config.worker.queue_max_records,
            self.config.worker.output_batch_records,
        )
        runner.epoch = self.routing.epoch
        runtime.runners[(task, partition)] = runner
        runtime.handles[(task, partition)] = self.group.create_task(
            self._supervise(runner), name=f"task {runner.operator_id}"
        )
        return runner

    async def _supervise(self, runner: TaskRunner) -> None:
        """Keeps an unexpected error in one task from taking the worker down."""
        try:
            await runner.run()
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("task %s failed", runner.operator_id)

    async def sync(self) -> None:
        """Brings hosted jobs and tasks in line with the routing table."""
        async with self._sync_lock:
            table = self.routing.table
            listed = {job.job_id for job in table.jobs}
            for job in table.jobs:
                runtime = self.jobs.get(job.job_id)
                if runtime is None:
                    try:
                        runtime = self.deploy(job.job_id, job.spec)
                    except InvalidArgument as exc:
                        log.error("cannot deploy job %s: %s", job.job_id, exc)
                        continue
                for partition, owner in enumerate(job.owners):
                    for task in range(len(runtime.tasks)):
                        key = (task, partition)
                        if owner == self.node_id and key not in runtime.runners:
                            self._start_task(runtime, task, partition)
                        elif owner != self.node_id and key in runtime.runners:
                            await self._stop_task(runtime, key)
            for job_id in list(self.jobs):
                if job_id not in listed and self.jobs[job_id].runners:
                    await self.stop_job(job_id)

    async def _stop_task(self, runtime: JobRuntime, key: tuple[int, int]) -> None:
        runtime.runners.pop(key, None)
        handle = runtime.handles.pop(key, None)
        if handle is not None:
            handle.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handle

    async def on_epoch(self, epoch: int) -> None:
        """Called when a heartbeat reports a newer epoch."""
        if epoch > self.routing.epoch:
            await self.routing.refresh(at_least=epoch)
            await self.sync()

    async def runner_for(self, job_id: str, task: int, partition: int, epoch: int) -> TaskRunner:
        """The runner a segment is for, refreshing the table once if the sender
        knows a newer epoch; raises NotFound or StaleEpoch with what to do."""
        if epoch > self.routing.epoch or job_id not in self.jobs:
            await self.routing.refresh(at_least=max(epoch, self.routing.epoch + 1))
            await self.sync()
        runtime = self.jobs.get(job_id)
        if runtime is None:
            raise NotFound(f"unknown job id {job_id!r}; submit the job first or list jobs "
                           "with `gridstream status`")
        if task >= len(runtime.tasks) or partition >= runtime.spec.partitions:
            raise InvalidArgument(
                f"job {job_id} has {len(runtime.tasks)} tasks and {runtime.spec.partitions} "
                f"partitions; segment names task {task} partition {partition}"
            )
        runner = runtime.runners.get((task, partition))
        if runner is None:
            owner = self.routing.owner(job_id, partition)
            raise StaleEpoch(
                f"stale epoch {self.routing.epoch}: partition {partition} of job {job_id} is "
                f"owned by {owner}, not {self.node_id}; refresh the routing table and resend",
                self.routing.epoch,
            )
        return runner

    async def append_local(self, job_id: str, segment: OutSegment, timeout_s: float) -> bool:
        """Appends a segment produced on this worker to one of its containers."""
        runner = await self.runner_for(job_id, segment.task, segment.partition, 0)
        return await runner.container.append(
            segment.channel, segment.sequence, segment.keys, segment.values, timeout_s
        )

    def progress(self, job_id: str) -> list[common_pb2.TaskProgress]:
        """Counters of the job's tasks hosted here."""
        runtime = self.jobs.get(job_id)
        if runtime is None:
            return []
        return [runner.progress(self.node_id) for runner in runtime.runners.values()]

    async def close(self) -> None:
        """Stops every job."""
        for job_id in list(self.jobs):
            await self.stop_job(job_id)


__all__ = ["JobRuntime", "WorkerNode"]
