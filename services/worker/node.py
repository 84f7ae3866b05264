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
from typing import Any

import grpc

from gridstream import codec
from gridstream.config import Config
from gridstream.errors import (
    GridstreamError,
    InvalidArgument,
    NotFound,
    StaleEpoch,
    Unavailable,
    describe_error,
    innermost_error,
)
from gridstream.jobspec import JobSpec, Stage, check_imports, plan_tasks
from gridstream.metrics import Metric
from gridstream.pbcopy import copy_into
from gridstream.retry import Backoff, RetryExhausted
from gridstream.routing import RoutingView
from gridstream.v1 import common_pb2, scheduler_pb2, worker_pb2, worker_pb2_grpc
from services.worker.metrics import node_metrics
from services.worker.peers import Channels, Commit, OutSegment, PeerRouter, StateClient
from services.worker.queues import Entry, JobContainer, OwnerFenced
from services.worker.replication import BackupStore, ContainerKey, to_log_entry
from services.worker.standby import StandbyStore
from services.worker.stopping import stop_handle
from services.worker.tasks import FetchedLog, TaskRunner
from services.worker.tracker_layout import TrackerLayout
from services.worker.trackers import TrackerHost
from services.worker.trackreports import TrackingReporter

FETCH_TIMEOUT_S = 10.0
FETCH_DEADLINE_S = 30.0
"""How long a new owner keeps asking a live member for its copy of a log."""
TASK_RESTART_DELAY_S = (0.1, 5.0)
"""First and longest wait before a task whose loop failed is started again."""
CHUNK_ENTRIES = 256

log = logging.getLogger(__name__)



def _entries_of(chunk: worker_pb2.ContainerChunk) -> list[Entry]:
    """The container entries of one chunk of a log copy."""
    return [Entry(item.offset, item.channel, item.sequence, *codec.decode_batch(item.batch),
                  item.batch, root=item.root, previous_sequence=item.previous_sequence)
            for item in chunk.entries]


@dataclass
class JobRuntime:
    """One deployed job: its spec, its task plan and the runners hosted here."""

    job_id: str
    spec: JobSpec
    tasks: list[list[Stage]]
    runners: dict[tuple[int, int], TaskRunner] = field(default_factory=dict)
    handles: dict[tuple[int, int], asyncio.Task[None]] = field(default_factory=dict)
    started: set[tuple[int, int]] = field(default_factory=set)
    """Every (task, partition) ever started here (a restart of one is not its first start)."""


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
        self.backups = BackupStore()
        self.standbys = StandbyStore(node_id, routing, channels, self.state,
                                     self.jobs.get, config.cluster.backup_count)
        self.retired: dict[ContainerKey, JobContainer] = {}
        self._sync_lock = asyncio.Lock()
        self._synced_epoch = 0  # the table epoch our tasks were last aligned with
        self.recoveries = 0
        self.trackers = TrackerHost(node_id, routing, channels)
        self.reporter = TrackingReporter(node_id, routing, channels, self.trackers)
        self._layout: TrackerLayout | None = None
        self._align_target = 0
        self._align_wake = asyncio.Event()
        self._aligner = group.create_task(self._align_loop(), name="align with the table")
        self._catch_up = group.create_task(self.standbys.run(), name="standby catch-up")

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
        self.backups.drop_job(job_id)
        self.standbys.drop_job(job_id)
        for key in [k for k in self.retired if k[0] == job_id]:
            del self.retired[key]
        if runtime is None:
            return
        for handle in runtime.handles.values():
            handle.cancel()
        for (task, partition), handle in runtime.handles.items():
            await stop_handle(handle, f"task {job_id}/t{task}/p{partition}")
        log.info("stopped job %s", job_id)

    def _start_task(self, runtime: JobRuntime, task: int, partition: int) -> TaskRunner:
        runner = self._new_runner(runtime, task, partition)
        runtime.runners[(task, partition)] = runner
        runtime.handles[(task, partition)] = self.group.create_task(
            self._supervise(runner), name=f"task {runner.operator_id}"
        )
        return runner

    def _new_runner(self, runtime: JobRuntime, task: int, partition: int) -> TaskRunner:
        runner = TaskRunner(
            runtime.job_id, runtime.spec, runtime.tasks, task, partition,
            self.node_id,
            self.router,
            self.state,
            self.fetch_log,
            self.config.worker.queue_max_records,
            self.config.worker.output_batch_records,
            self.config.cluster.backup_count,
            self.reporter,
            self.config.cluster.tracking_flush_s,
            self.config.worker.results_linger_s,
        )
        runner.epoch = self.routing.epoch
        runner.first_owner = ((task, partition) not in runtime.started
                              and self.routing.in_first_epoch_of(runtime.job_id)
                              and self.routing.owner(runtime.job_id, partition) == self.node_id)
        runtime.started.add((task, partition))
        self.standbys.attach(runner)
        if runtime.spec.tracking_timeout_s:
            self.trackers.set_timeout(runtime.job_id, runtime.spec.tracking_timeout_s)
        return runner

    async def _supervise(self, runner: TaskRunner) -> None:
        """Keeps a task running: an unexpected error in its loop (or in its
        start, e.g. a log copy that could not be fetched) is logged at ERROR,
        counted in the task's progress (``restarts``, ``last_error``), and the
        task is started again from its durable snapshot and the log this worker
        holds, after a growing delay. Only its partition moving away (the
        handle is cancelled) ends it."""
        backoff = Backoff(f"restarting {runner.operator_id}", *TASK_RESTART_DELAY_S)
        while True:
            try:
                await runner.run(on_restored=self._count_recovery)
                return
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # an ExceptionGroup from the runner's TaskGroup
                if self._stopped(runner):
                    # The task was stopped (its partition moved) while it failed:
                    # a TaskGroup that sees a child error and its own cancellation
                    # raises the error and swallows the cancellation, so leave
                    # here, or _stop_task would wait for us forever.
                    return
                superseded = innermost_error(exc)
                if isinstance(superseded, OwnerFenced):
                    # Not an error of the task: a newer owner took over (maybe
                    # at an epoch this worker skipped). Start again at the epoch
                    # known now; if the partition is gone, sync cancels us.
                    log.warning("task %s superseded (%s); starting it again from the "
                                "newest state at epoch %d", runner.operator_id, superseded,
                                self.routing.epoch)
                    await backoff.wait()
                    runner = await self._restart_task(runner, "", count=False)
                    continue
                error = describe_error(exc)
                log.error("task %s failed (%s); starting it again from its snapshot",
                          runner.operator_id, error, exc_info=exc)
            await backoff.wait()
            runner = await self._restart_task(runner, error)

    def _stopped(self, runner: TaskRunner) -> bool:
        """Whether ``runner``'s task was stopped (or replaced) by sync, fence or
        a handoff: it is no longer the registered runner of its key."""
        runtime = self.jobs.get(runner.job_id)
        return (runtime is None
                or runtime.runners.get((runner.task_index, runner.partition)) is not runner)

    async def _restart_task(self, failed: TaskRunner, error: str, count: bool = True
                            ) -> TaskRunner:
        """A fresh runner for a failed one's (task, partition): the failed
        runner's container is retired here, so the fresh runner's restore takes
        it as this worker's copy of the log (nothing committed is dropped).
        Raises CancelledError if the task was stopped meanwhile."""
        if self._stopped(failed):
            raise asyncio.CancelledError
        await failed.container.close()
        if self._stopped(failed):  # stopped while the container closed
            raise asyncio.CancelledError
        await self._await_ownership(failed)
        if failed.ready.is_set():
            self.retired[failed.key] = failed.container
        runtime = self.jobs[failed.job_id]
        runner = self._new_runner(runtime, failed.task_index, failed.partition)
        runner.restarts = failed.restarts + (1 if count else 0)
        runner.last_error = error or failed.last_error
        runtime.runners[(failed.task_index, failed.partition)] = runner
        return runner

    async def _await_ownership(self, failed: TaskRunner) -> None:
        """Returns once the routing table this worker holds gives ``failed``'s
        partition to this worker. A table can arrive (a refresh by a shuffle
        or a replicator) before the tasks are aligned with it: a task
        superseded meanwhile must not start again at that table's epoch,
        where another worker owns the partition, or two owners would claim
        it at the same epoch (one fence cannot tell them apart) and number
        their windows alike. Aligning stops it instead (CancelledError)."""
        backoff = Backoff(f"waiting to own {failed.operator_id} again", 0.05, 0.5)
        while self.routing.owner(failed.job_id, failed.partition) != self.node_id:
            if self._stopped(failed):
                raise asyncio.CancelledError
            await backoff.wait()

    async def sync(self) -> None:
        """Brings hosted jobs and tasks in line with the routing table. At a
        newer epoch a backup holder may have restarted empty or been replaced,
        so every primary checks its holders now, not at its next append,
        whichever call aligns (a heartbeat, a push naming a newer epoch). An
        epoch counts as aligned once all is: a sync failing part-way is redone."""
        async with self._sync_lock:
            table = self.routing.table
            advanced = table.epoch > self._synced_epoch
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
            self._synced_epoch = max(self._synced_epoch, table.epoch)
            self.standbys.prune()
            self._check_tracker_layout()
            if advanced:
                for runtime in self.jobs.values():
                    for runner in runtime.runners.values():
                        if runner.replicator is not None:
                            runner.replicator.notify()

    def _check_tracker_layout(self) -> None:
        """When trackers moved (a host died or joined, or the count changed),
        source tasks ask the new trackers of their pending roots to rebuild
        them: only the roots whose tracker or host changed."""
        new = TrackerLayout.from_routing(self.routing)
        old, self._layout = self._layout, new
        if old is None or old.same_hosts(new):
            return
        for runtime in self.jobs.values():
            for runner in runtime.runners.values():
                tracking = runner.tracking
                if tracking is None or not tracking.is_source or not tracking.pending:
                    continue
                moved = old.moved(new, tracking.pending)
                if moved:
                    runner.request_rebuild(moved)

    async def _stop_task(self, runtime: JobRuntime, key: tuple[int, int]) -> None:
        """Stops a task whose partition moved away; its container stays readable
        (retired) for the new owner, also if the task ended in error (raised after)."""
        runner, handle = runtime.runners.pop(key, None), runtime.handles.pop(key, None)
        try:
            if handle is not None:
                await stop_handle(handle, f"task {runtime.job_id}/t{key[0]}/p{key[1]}")
        finally:
            if runner is not None:
                await runner.container.close()
                if runner.ready.is_set():
                    self.retired[runner.key] = runner.container
                log.info("handed off %s (offsets %d..%d)", runner.operator_id,
                         runner.container.base_offset, runner.container.handoff_end)

    async def fence(self) -> None:
        """The scheduler no longer counts us as a member (we were declared dead,
        e.g. after a pause): stop every task at once so nothing more is emitted
        for partitions that now belong to others. Their logs stay readable for
        the new owners; after re-registering, the routing table decides anew."""
        async with self._sync_lock:
            for runtime in self.jobs.values():
                for key in list(runtime.runners):
                    await self._stop_task(runtime, key)
            self._synced_epoch = 0  # rejoining: align with the next table whatever it is
        log.warning("fenced: every task stopped until the routing table says otherwise")

    async def catch_up(self, epoch: int) -> None:
        """Fetches the table of ``epoch`` and applies it (:meth:`sync`)."""
        await self.routing.refresh(at_least=epoch)
        await self.sync()

    async def on_epoch(self, epoch: int) -> None:
        """Called with the epoch every heartbeat reports: aligns our tasks with
        it unless they are. Aligning runs in its own task, never in the one
        serving heartbeat answers: a slow handoff must not hold them up."""
        if epoch > self._synced_epoch:
            self._align_target = max(self._align_target, epoch)
            self._align_wake.set()

    async def _align_loop(self) -> None:
        """Catches up with the newest epoch heartbeats reported, one alignment
        at a time; owned by the worker's TaskGroup."""
        while True:
            await self._align_wake.wait()
            self._align_wake.clear()
            target = self._align_target
            if target <= self._synced_epoch:
                continue
            try:
                await self.catch_up(target)
            except Exception as exc:  # the scheduler away, a peer unreachable: try again
                log.warning("aligning with epoch %d failed (%s); retrying", target, exc)
                await asyncio.sleep(0.1)
                self._align_wake.set()

    def _count_recovery(self) -> None:
        self.recoveries += 1

    def check_sender(self, job_id: str, sender: str, epoch: int, channels: list[str]) -> None:
        """Fencing: refuses batches from a worker that routed with an older epoch
        and no longer owns the partition it sends from (a zombie after a pause)."""
        if epoch >= self.routing.epoch:
            return
        for channel in set(channels):
            task, _, part = channel.partition("/p")
            if not task.startswith("t") or not part.isdigit():
                continue
            owner = self.routing.owner(job_id, int(part))
            if owner is not None and owner != sender:
                raise StaleEpoch(
                    f"stale epoch {epoch}: {sender} no longer owns partition {part} of job "
                    f"{job_id} (owner {owner} at epoch {self.routing.epoch}); it must rejoin",
                    self.routing.epoch,
                )

    async def runner_for(self, job_id: str, task: int, partition: int, epoch: int) -> TaskRunner:
        """The runner a segment is for, refreshing the table once if the sender
        knows a newer epoch; raises NotFound or StaleEpoch with what to do."""
        if epoch > self.routing.epoch or job_id not in self.jobs:
            await self.catch_up(max(epoch, self.routing.epoch + 1))
        runtime = self.jobs.get(job_id)
        if runtime is None:
            raise NotFound(f"unknown job id {job_id!r}; submit the job first or list jobs "
                           "with `gridstream status`")
        if task >= len(runtime.tasks) or partition >= runtime.spec.partitions:
            raise InvalidArgument(
                f"job {job_id} has {len(runtime.tasks)} tasks and {runtime.spec.partitions} "
                f"partitions; segment names task {task} partition {partition}"
            )
        runner = self._open_runner(runtime, task, partition)
        if runner is None and self.routing.owner(job_id, partition) == self.node_id:
            # The table here gives us the partition before our tasks are aligned
            # with it (it came with another call): align now, or wait for the
            # alignment under way, rather than have the sender back off; not
            # after a fence (synced epoch 0): that waits for a new table.
            if 0 < self._synced_epoch < self.routing.epoch:
                await self.catch_up(self.routing.epoch)
            else:
                async with self._sync_lock:
                    pass
            runner = self._open_runner(runtime, task, partition)
        if runner is None:
            owner = self.routing.owner(job_id, partition)
            if owner == self.node_id:
                raise StaleEpoch(
                    f"stale epoch {self.routing.epoch}: partition {partition} of job {job_id} "
                    f"is owned here, but its task {task} is not running (restarting or "
                    "handing over); resend", self.routing.epoch)
            raise StaleEpoch(
                f"stale epoch {self.routing.epoch}: partition {partition} of job {job_id} is "
                f"owned by {owner}, not {self.node_id}; refresh the routing table and resend",
                self.routing.epoch,
            )
        return runner

    @staticmethod
    def _open_runner(runtime: JobRuntime, task: int, partition: int) -> TaskRunner | None:
        """The task's runner here, unless it has none or its container was retired."""
        runner = runtime.runners.get((task, partition))
        return None if runner is not None and runner.container.closed else runner

    async def append_local(self, job_id: str, segment: OutSegment, timeout_s: float) -> Commit:
        """Appends a segment produced on this worker to one of its containers."""
        runner = await self.runner_for(job_id, segment.task, segment.partition, 0)
        return await runner.append_segment(segment, timeout_s)

    # -- replication and handoff ----------------------------------------------

    def container_log(self, key: ContainerKey) -> list[worker_pb2.ContainerChunk]:
        """The committed log of a container held here: a retired primary copy
        (handoff) or a backup copy; an empty answer if neither."""
        retired = self.retired.get(key)
        backup = self.backups.logs.get(key)
        if retired is not None and backup is not None and backup.next_offset > (
            retired.handoff_end
        ):
            # A partition can move away and come back: our retired copy is then
            # older than the backup copy we have been holding since.
            retired = None
        if retired is not None:
            end = retired.handoff_end
            entries = [to_log_entry(e) for e in retired.entries(retired.base_offset, end)]
            base, sequences, primary = retired.base_offset, retired.sequences_below(end), True
        else:
            if backup is None:
                return [worker_pb2.ContainerChunk(found=False)]
            end = backup.next_offset
            entries = [backup.entries[o] for o in range(backup.base, end)]
            base, sequences, primary = backup.base, dict(backup.sequences), False
        chunks = []
        for start in range(0, max(len(entries), 1), CHUNK_ENTRIES):
            chunk = worker_pb2.ContainerChunk(
                found=True, base_offset=base, next_offset=end,
                sequences=sequences if start == 0 else {}, primary=primary,
            )
            copy_into(chunk.entries, entries[start:start + CHUNK_ENTRIES])
            chunks.append(chunk)
        return chunks

    async def fetch_container(
        self, key: ContainerKey, epoch: int
    ) -> list[worker_pb2.ContainerChunk]:
        """Serves a new owner: first catch up with its epoch, which stops our own
        task for the partition if we still ran it, so the log we hand over is final."""
        if epoch > self.routing.epoch:
            await self.catch_up(epoch)
        async with self._sync_lock:  # a sync in progress finishes first
            runtime = self.jobs.get(key[0])
            if runtime is not None and (key[1], key[2]) in runtime.runners:
                if self.routing.owner(key[0], key[2]) == self.node_id:
                    # We still own it at our epoch: the asker is not the owner.
                    return [worker_pb2.ContainerChunk(found=False)]
                # Moved away but not yet stopped: stop it now, so nothing more is
                # committed after the new owner has read the log.
                await self._stop_task(runtime, (key[1], key[2]))
            # Fence the copy here and read it in one step (no await between):
            # whatever an old owner committed is in what we hand over, and it
            # can commit nothing more through this worker.
            self.backups.fence(key, epoch)
            return self.container_log(key)

    async def _fetch_from(self, node: str, key: ContainerKey, epoch: int
                          ) -> FetchedLog | None:
        """A worker's copy of a container's log; None only when it answered
        that it holds none, or when it left the membership (declared dead)
        while we were asking. An RPC error is never read as "no copy": the
        call is retried while the worker is a member, and after
        FETCH_DEADLINE_S the error is raised (the task's start fails and is
        retried by its supervisor, loudly)."""
        backoff = Backoff(f"fetching {key} from {node}", first_s=0.05, max_s=0.5,
                          deadline_s=FETCH_DEADLINE_S)
        while True:
            if node not in self.routing.workers:
                log.warning("fetching %s: %s is no longer a member; not waiting for its copy",
                            key, node)
                return None
            address = self.routing.addresses.get(node)
            if address is None:
                return None
            try:
                return await self._fetch_once(node, address, key, epoch)
            except grpc.aio.AioRpcError as exc:
                log.warning("fetching %s from %s failed (%s); retrying while it is a member",
                            key, node, exc.code().name)
                try:
                    await backoff.wait(exc)
                except RetryExhausted as exhausted:
                    raise Unavailable(str(exhausted)) from None
                with contextlib.suppress(GridstreamError):
                    await self.routing.refresh()

    async def _fetch_once(self, node: str, address: str, key: ContainerKey, epoch: int
                          ) -> FetchedLog | None:
        stub = self.channels.stub(address, worker_pb2_grpc.WorkerStub)
        request = worker_pb2.FetchContainerRequest(
            job_id=key[0], task=key[1], partition=key[2], epoch=epoch)
        base = 0
        sequences: dict[str, int] = {}
        entries: list[Entry] = []
        async for chunk in stub.FetchContainer(request, timeout=FETCH_TIMEOUT_S):
            if not chunk.found:
                return None
            if not entries and not sequences:
                base = chunk.base_offset
                sequences = dict(chunk.sequences)
            entries.extend(_entries_of(chunk))
        return base, sequences, entries

    def _local_log(self, key: ContainerKey) -> FetchedLog | None:
        chunks = self.container_log(key)
        if not chunks[0].found:
            return None
        entries = [entry for chunk in chunks for entry in _entries_of(chunk)]
        return chunks[0].base_offset, dict(chunks[0].sequences), entries

    async def fetch_log(self, key: ContainerKey, epoch: int) -> FetchedLog | None:
        """The fullest copy of a container's log: here (a backup, or our own
        retired copy) or among the other live workers. Every copy is fenced at
        ``epoch`` (the new owner's) as it is read."""
        others = [w for w in self.routing.workers if w != self.node_id]
        self.backups.fence(key, epoch)
        found = [self._local_log(key)]
        found += await asyncio.gather(*(self._fetch_from(w, key, epoch) for w in others))
        best: FetchedLog | None = None
        for candidate in found:
            if candidate is None:
                continue
            if best is None or (candidate[0] + len(candidate[2])) > (best[0] + len(best[2])):
                best = candidate
        return best

    def heartbeat_fields(self) -> dict[str, Any]:
        """What heartbeats carry besides liveness: the tasks that keep failing
        here, so the scheduler moves their partitions elsewhere."""
        limit = self.config.cluster.task_restarts_before_move
        failing = [
            scheduler_pb2.FailingTask(job_id=runner.job_id, partition=runner.partition,
                                      task=runner.task_index, restarts=runner.restarts,
                                      error=runner.last_error[:300])
            for runtime in self.jobs.values() for runner in runtime.runners.values()
            if runner.restarts >= limit
        ]
        return {"failing": failing} if failing else {}

    def progress(self, job_id: str) -> list[common_pb2.TaskProgress]:
        """Counters of the job's tasks hosted here."""
        runtime = self.jobs.get(job_id)
        if runtime is None:
            return []
        return [runner.progress(self.node_id) for runner in runtime.runners.values()]

    def metrics(self) -> list[Metric]:
        """Per-task series for Prometheus, read from live state at scrape time."""
        return node_metrics(self)

    async def close(self) -> None:
        """Stops aligning and every job, then writes still running beyond
        their quorum."""
        for task in (self._aligner, self._catch_up):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for job_id in list(self.jobs):
            await self.stop_job(job_id)
        await self.state.close()


__all__ = ["JobRuntime", "WorkerNode"]
