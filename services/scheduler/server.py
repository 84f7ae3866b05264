"""The scheduler's gRPC face and the control logic beneath it: registration,
heartbeats and failure detection, the routing table, and the job registry."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterable

import grpc

from gridstream import rpc
from gridstream.config import Config
from gridstream.errors import (
    FailedPrecondition,
    GridstreamError,
    InvalidArgument,
    NotFound,
    from_rpc_error,
)
from gridstream.jobspec import JobSpec, check_allowed
from gridstream.metrics import Metric, counter, gauge
from gridstream.rpc import servicer_method
from gridstream.v1 import (
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    stateserver_pb2,
    stateserver_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from gridstream.validation import check_address, check_id, short
from services.scheduler.jobs import JobRecord, JobRegistry
from services.scheduler.membership import Membership, Transition
from services.scheduler.progress import DrainVerdict, drain_verdict
from services.scheduler.routing import RoutingTables

log = logging.getLogger(__name__)

DETECTOR_TICK_S = 0.05
_ROLES = (scheduler_pb2.MEMBER_ROLE_WORKER, scheduler_pb2.MEMBER_ROLE_STATE_SERVER)
_STATE_NAMES = {1: "alive", 2: "suspect", 3: "dead", 4: "leaving"}


class SchedulerCore:
    """Everything the scheduler decides, without gRPC server plumbing."""

    def __init__(self, config: Config, registry: JobRegistry, membership: Membership) -> None:
        self.config = config
        self.registry = registry
        self.membership = membership
        self.tables = RoutingTables(config.cluster.virtual_nodes)
        self.events: collections.deque[scheduler_pb2.MemberEvent] = collections.deque(maxlen=50)
        self.losses: dict[str, set[str]] = {}
        self.avoid: dict[str, dict[int, set[str]]] = {}
        """job -> partition -> workers its task kept failing on (until they restart)."""
        self.moved: dict[str, list[str]] = {}
        """job -> one line per partition moved off a worker where its task kept failing."""
        """job -> data-loss lines its tasks reported (since this scheduler started)."""
        self._channels = rpc.ChannelPool()
        self._jobs_version = 0
        self._saved_epoch = membership.epoch
        self.detections = 0
        self.stopping: dict[str, str] = {}
        """node id -> the incarnation that announced its stop (see ``announced``)."""
        self.tracker_count = config.cluster.tracker_count
        self.warnings: list[scheduler_pb2.ClusterWarning] = []
        """Warnings active at the monitor's last sample (services.scheduler.monitor)."""

    async def close(self) -> None:
        """Closes member channels."""
        await self._channels.close()

    async def persist_epoch(self) -> None:
        """Saves the epoch whenever it moved past the saved one, so restarts
        never reuse one (a job's submission may have saved one ahead)."""
        if self.membership.epoch > self._saved_epoch:
            self._saved_epoch = self.membership.epoch
            await self.registry.save_epoch(self.membership.epoch)

    def record(self, node_id: str, old: int, new: int, phi: float, reason: str) -> None:
        """Remembers a state change for `gridstream status`."""
        self.events.append(scheduler_pb2.MemberEvent(
            node_id=node_id, old_state=old, new_state=new,  # type: ignore[arg-type]
            phi=phi, at=time.time(), epoch=self.membership.epoch, reason=reason))

    # -- membership -----------------------------------------------------------

    async def register(self, request: scheduler_pb2.RegisterRequest) -> int:
        """Validates and records a registration; bumps the epoch when membership changed."""
        if request.role not in _ROLES:
            raise InvalidArgument("role must be MEMBER_ROLE_WORKER or MEMBER_ROLE_STATE_SERVER")
        if not request.node_id or not request.address or not request.incarnation:
            raise InvalidArgument("node_id, address and incarnation must all be set")
        check_id(request.node_id, "node_id")
        check_id(request.incarnation, "incarnation")
        check_address(request.address)
        old = self.membership.members.get(request.node_id)
        old_state = old.state if old else 0
        if (old is not None and old.incarnation != request.incarnation
                and old_state != scheduler_pb2.MEMBER_STATE_DEAD):
            # The old incarnation died (its memory is gone) before the detector
            # convicted it: that is a failure like any other, and is named so.
            log.log(logging.INFO if self.announced(request.node_id) else logging.WARNING,
                    "%s restarted (incarnation %s replaces %s) before it was "
                    "declared dead", request.node_id, request.incarnation[:8],
                    old.incarnation[:8])
            self.detections += 1
            self.record(request.node_id, old_state, scheduler_pb2.MEMBER_STATE_DEAD,
                        old.phi, "stopped" if self.announced(request.node_id) else "restarted")
            old_state = scheduler_pb2.MEMBER_STATE_DEAD
        if old is not None and old.incarnation != request.incarnation:
            self.forgive(request.node_id)
            self.stopping.pop(request.node_id, None)
        if self.membership.register(request.node_id, request.role, request.address,
                                    request.incarnation, time.monotonic()):
            self.record(request.node_id, old_state, scheduler_pb2.MEMBER_STATE_ALIVE, 0.0,
                        "registered")
            log.info("%s registered (%s) at %s", request.node_id,
                     "worker" if request.role == 1 else "state server", request.address)
            await self.registry.save_member(request.node_id, request.role, request.address,
                                            request.incarnation)
            await self.persist_epoch()
        return self.membership.epoch

    async def failing_tasks(self, node_id: str,
                            failing: Iterable[scheduler_pb2.FailingTask]) -> None:
        """Moves the partitions whose task keeps failing on ``node_id`` to
        other workers (a new epoch): the one place where that is decided."""
        moved = False
        for task in failing:
            if task.job_id not in self.registry.jobs:
                continue
            avoided = self.avoid.setdefault(task.job_id, {}).setdefault(task.partition, set())
            if node_id in avoided:
                continue
            avoided.add(node_id)
            error = task.error[:300] or "no error text"
            line = (f"{task.job_id}/t{task.task}/p{task.partition}: moved off {node_id} after "
                    f"{task.restarts} restarts ({error})")
            self.moved.setdefault(task.job_id, []).append(line)
            log.error("job %s: task %d of partition %d keeps failing on %s (%d restarts: %s); "
                      "moving the partition to another worker", task.job_id, task.task,
                      task.partition, node_id, task.restarts, error)
            moved = True
        if moved:
            self.membership.bump(f"partitions moved off {node_id} (failing tasks)")
            await self.persist_epoch()

    def forgive(self, node_id: str) -> None:
        """A restarted worker may run the tasks it failed before: it is no
        longer avoided (the next epoch, which its registration starts, shows it)."""
        for partitions in self.avoid.values():
            for avoided in partitions.values():
                avoided.discard(node_id)

    async def retire(self, node_id: str) -> int:
        """Starts retiring a state server; the epoch at which it stops taking writes."""
        old = self.membership.members.get(node_id)
        if old is None:
            raise NotFound(f"unknown member {short(node_id)}; see `gridstream status` for "
                           "members")
        old_state = old.state
        try:
            record = self.membership.retire(node_id)
        except ValueError as exc:
            raise FailedPrecondition(str(exc)) from None
        if old_state != record.state:
            self.record(node_id, old_state, record.state, record.phi, "retiring")
            log.info("%s retiring: out of the write ring at epoch %d", node_id,
                     self.membership.epoch)
            await self.persist_epoch()
        return self.membership.epoch

    async def set_tracker_count(self, count: int) -> int:
        """Changes the number of trackers at a new epoch (kept until restart;
        set cluster.tracker_count in the config to make it permanent)."""
        if not 1 <= count <= 4096:
            raise InvalidArgument(f"tracker count {count} is out of range; use 1..4096")
        if count != self.tracker_count:
            self.tracker_count = count
            self.membership.bump(f"tracker count set to {count}")
            await self.persist_epoch()
        return self.membership.epoch

    async def deregister(self, node_id: str, incarnation: str) -> int:
        """Forgets a member that handed over everything and is leaving."""
        record = self.membership.members.get(node_id)
        if record is None:
            return self.membership.epoch
        if record.state != scheduler_pb2.MEMBER_STATE_LEAVING:
            raise FailedPrecondition(f"{node_id} is not retiring; retire it first "
                                     "(gridstream stateserver retire)")
        if not self.membership.remove(node_id, incarnation):
            raise FailedPrecondition(f"{node_id} has registered again since; not removed")
        self.record(node_id, scheduler_pb2.MEMBER_STATE_LEAVING, 0, 0.0, "left")
        await self.registry.delete_member(node_id)
        await self.persist_epoch()
        log.info("%s left the cluster", node_id)
        return self.membership.epoch

    def metrics(self) -> list[Metric]:
        """Membership series for Prometheus, read at scrape time."""
        now = time.monotonic()
        phi = gauge("gridstream_member_phi", "Phi-accrual suspicion of each member",
                    ["node", "role"])
        state = gauge("gridstream_member_state", "1 alive, 2 suspect, 3 dead", ["node", "role"])
        lag = gauge("gridstream_member_loop_lag_seconds",
                    "Worst event-loop lateness a member reported in about the last 10 s",
                    ["node", "role"])
        for record in self.membership.members.values():
            labels = [record.node_id, "worker" if record.role == 1 else "stateserver"]
            phi.add_metric(labels, self.membership.detector.phi(record.node_id, now))
            state.add_metric(labels, record.state)
            lag.add_metric(labels, record.loop_lag_ms / 1000)
        detections = counter("gridstream_detections", "Members declared dead", [])
        detections.add_metric([], self.detections)
        epoch = gauge("gridstream_routing_epoch", "Current routing-table epoch", [])
        epoch.add_metric([], self.membership.epoch)
        jobs = gauge("gridstream_jobs", "Jobs by state", ["state"])
        for name, value in (("running", 1), ("cancelled", 2), ("failed", 3)):
            jobs.add_metric([name], sum(1 for j in self.registry.jobs.values()
                                        if j.state == value))
        return [phi, state, lag, detections, epoch, jobs]

    def announced(self, node_id: str) -> bool:
        """True when the member's current incarnation said it was stopping:
        its silence is an operator's restart, not news worth a WARNING."""
        record = self.membership.members.get(node_id)
        return record is not None and self.stopping.get(node_id) == record.incarnation

    def apply_transitions(self, transitions: list[Transition]) -> None:
        """Logs every detector verdict change with its phi."""
        for t in transitions:
            if t.new == scheduler_pb2.MEMBER_STATE_DEAD:
                self.detections += 1
            log.log(logging.INFO if self.announced(t.node_id) else logging.WARNING,
                    "%s: %s -> %s (phi %.2f)%s", t.node_id, _STATE_NAMES.get(t.old, "?"),
                    _STATE_NAMES.get(t.new, "?"), t.phi,
                    " after it announced its stop" if self.announced(t.node_id) else "")
            announced = t.new == scheduler_pb2.MEMBER_STATE_DEAD and self.announced(t.node_id)
            self.record(t.node_id, t.old, t.new, t.phi, "stopped" if announced else "detector")

    async def detect_forever(self) -> None:
        """The failure detector's loop; owned by the service's TaskGroup."""
        while True:
            await asyncio.sleep(DETECTOR_TICK_S)
            self.apply_transitions(self.membership.check(time.monotonic()))
            await self.persist_epoch()

    def table(self) -> scheduler_pb2.RoutingTable:
        """The routing table of the current epoch."""
        table = self.tables.build(self.membership, self.registry.running(), self._jobs_version,
                                  self.avoid)
        table.state_replicas = self.config.cluster.replica_count
        table.state_write_quorum = self.config.cluster.write_quorum
        table.tracker_count = self.tracker_count
        table.tracker_virtual_positions = self.config.cluster.tracker_virtual_positions
        table.tracking_timeout_s = self.config.cluster.tracking_timeout_s
        return table

    def workers(self) -> list[tuple[str, str]]:
        """(node_id, address) of live workers."""
        return [(m.node_id, m.address)
                for m in self.membership.live(scheduler_pb2.MEMBER_ROLE_WORKER)]

    # -- jobs -------------------------------------------------------------------

    def job(self, job_id: str) -> JobRecord:
        """A job's record; NotFound that says where to look for valid ids."""
        check_id(job_id, "job_id")
        record = self.registry.jobs.get(job_id)
        if record is None:
            raise NotFound(f"unknown job id {short(job_id)}; list jobs with `gridstream status`")
        return record

    async def submit(self, spec_proto: common_pb2.JobSpec) -> tuple[str, int]:
        """Fills defaults, deploys on every live worker (an import error on any
        fails the job) and registers it."""
        spec = JobSpec.from_proto(spec_proto).with_defaults(
            self.config.cluster.partitions, self.config.cluster.window_size)
        check_allowed(spec, self.config.cluster.job_modules)  # before any worker imports
        workers = self.workers()
        if not workers:
            raise FailedPrecondition(
                "no workers are registered; start workers (gridstream worker) before submitting")
        record = self.registry.new_record(spec)
        request = worker_pb2.DeployJobRequest(job_id=record.job_id, spec=spec.to_proto())

        async def deploy(node_id: str, address: str) -> GridstreamError | None:
            stub = self._channels.stub(address, worker_pb2_grpc.WorkerStub)
            try:
                await stub.DeployJob(request, timeout=rpc.CONTROL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.PERMISSION_DENIED):
                    return from_rpc_error(exc, f"worker {node_id}")
                log.warning("deploying %s on %s failed (%s); it will deploy from the routing "
                            "table", record.job_id, node_id, exc.code().name)
            return None

        errors = [e for e in await asyncio.gather(*(deploy(n, a) for n, a in workers)) if e]
        if errors:
            record.state = common_pb2.JOB_STATE_FAILED
            record.error = str(errors[0])
            await self.registry.put(record)
            await self._stop_on_workers(record.job_id)
            raise type(errors[0])(str(errors[0]))
        # The job's first epoch is saved before any table lists the job, so a
        # restarted scheduler never serves another table at it: a task
        # started at exactly that epoch has had no owner before (its worker
        # skips recovery). Another epoch begun while saving takes the chance
        # away from this job only (created_epoch 0: the usual recovery).
        first = self.membership.epoch + 1
        self._saved_epoch = max(self._saved_epoch, first)
        await self.registry.save_epoch(self._saved_epoch)
        await self.registry.put(record)
        self._jobs_version += 1
        self.membership.bump(f"job {record.job_id} submitted")
        if self.membership.epoch == first:
            record.created_epoch = first
        await self.persist_epoch()
        log.info("job %s submitted: %d partitions, %d stages", record.job_id, spec.partitions,
                 len(spec.stages))
        return record.job_id, self.membership.epoch

    async def _stop_on_workers(self, job_id: str) -> None:
        async def stop(address: str) -> None:
            stub = self._channels.stub(address, worker_pb2_grpc.WorkerStub)
            try:
                await stub.StopJob(worker_pb2.StopJobRequest(job_id=job_id),
                                   timeout=rpc.CONTROL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                log.warning("stopping %s at %s failed: %s", job_id, address, exc.code().name)

        await asyncio.gather(*(stop(a) for _, a in self.workers()))

    async def cancel(self, job_id: str) -> JobRecord:
        """Marks a job cancelled, stops it on the workers and deletes its data on
        the state servers."""
        record = self.job(job_id)
        if record.state == common_pb2.JOB_STATE_RUNNING:
            record.state = common_pb2.JOB_STATE_CANCELLED
            await self.registry.put(record)
            self._jobs_version += 1
            self.membership.bump(f"job {job_id} cancelled")
            await self.persist_epoch()
            await self._stop_on_workers(job_id)
            for member in self.membership.live(scheduler_pb2.MEMBER_ROLE_STATE_SERVER):
                stub = self._channels.stub(member.address, stateserver_pb2_grpc.StateServerStub)
                try:
                    await stub.DeleteJob(stateserver_pb2.DeleteJobRequest(job_id=job_id),
                                         timeout=rpc.CONTROL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    log.warning("deleting %s on %s failed: %s", job_id, member.node_id,
                                exc.code().name)
        return record

    async def progress(self, job_id: str, flush: bool = False) -> scheduler_pb2.JobProgress:
        """Gathers task counters from every live worker and decides if the job
        has drained (the rule is ``progress.drain_verdict``). Also not drained:
        a worker that could not be asked, a job that is not running, or an
        epoch that moved while the counters were gathered. ``flush``: the
        caller is draining; workers close pending windows of the job now."""
        record = self.job(job_id)
        epoch = self.membership.epoch
        request = worker_pb2.GetTaskProgressRequest(job_id=job_id, flush=flush)
        unreachable: list[str] = []

        async def ask(node_id: str, address: str) -> list[common_pb2.TaskProgress]:
            stub = self._channels.stub(address, worker_pb2_grpc.WorkerStub)
            try:
                response = await stub.GetTaskProgress(request, timeout=rpc.CONTROL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                unreachable.append(f"{node_id} ({exc.code().name})")
                return []
            return list(response.tasks)

        answers = await asyncio.gather(*(ask(n, a) for n, a in self.workers()))
        tasks = [t for answer in answers for t in answer]
        if unreachable:
            verdict = DrainVerdict(False, f"no progress from {', '.join(unreachable)}")
        elif record.state != common_pb2.JOB_STATE_RUNNING:
            verdict = DrainVerdict(False, "the job is not running")
        elif epoch != self.membership.epoch:
            verdict = DrainVerdict(False, "the epoch changed while gathering")
        else:
            verdict = drain_verdict(record.spec, tasks)
        if not verdict.drained:
            log.debug("%s not drained: %s", job_id, verdict.reason)
        # Losses are remembered here too: the task that noticed one may move
        # (its in-memory list goes with it; the dead-letter rows stay).
        known = self.losses.setdefault(job_id, set())
        for task in tasks:
            abandoned = ([f"{job_id}/t{task.task}/p{task.partition}: {task.roots_abandoned} "
                          "tuple trees abandoned on "
                          f"{task.node_id} (incomplete after repeated rebuilds)"]
                         if task.roots_abandoned and record.spec.delivery == "exactly_once"
                         else [])
            for loss in [*task.losses, *abandoned]:
                if loss not in known:
                    known.add(loss)
                    log.error("job %s: DATA LOSS %s", job_id, loss)
        return scheduler_pb2.JobProgress(job_id=job_id, tasks=tasks, drained=verdict.drained,
                                         epoch=epoch, holding=verdict.reason,
                                         losses=sorted(known), moved=self.moved.get(job_id, []))

    def status(self) -> scheduler_pb2.ClusterStatus:
        """Members with their shares and phi, jobs and recent events."""
        table = self.table()
        owned: dict[str, int] = {}
        for job in table.jobs:
            for owner in job.owners:
                owned[owner] = owned.get(owner, 0) + 1
        now = time.monotonic()
        members = []
        for record in sorted(self.membership.members.values(), key=lambda m: m.node_id):
            members.append(scheduler_pb2.MemberStatus(
                member=scheduler_pb2.Member(node_id=record.node_id,
                                            role=record.role,  # type: ignore[arg-type]
                                            address=record.address,
                                            state=record.state),  # type: ignore[arg-type]
                partitions_owned=owned.get(record.node_id, 0),
                last_heartbeat_age_s=now - record.last_heartbeat,
                phi=self.membership.detector.phi(record.node_id, now),
                snapshots=record.snapshots, snapshot_bytes=record.snapshot_bytes,
                loop_lag_ms=record.loop_lag_ms))
        return scheduler_pb2.ClusterStatus(
            epoch=self.membership.epoch, members=members,
            jobs=[j.to_proto() for j in self.registry.jobs.values()],
            events=list(self.events), warnings=self.warnings)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    """Thin gRPC layer over SchedulerCore."""

    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    @servicer_method
    async def Register(self, request: scheduler_pb2.RegisterRequest,
                       context: grpc.aio.ServicerContext) -> scheduler_pb2.RegisterResponse:
        """Admits a member (or re-admits it after a restart); answers the heartbeat interval."""
        epoch = await self.core.register(request)
        interval_ms = int(self.core.config.cluster.heartbeat_interval_s * 1000)
        return scheduler_pb2.RegisterResponse(epoch=epoch, heartbeat_interval_ms=interval_ms)

    @servicer_method
    async def Heartbeat(self, request: scheduler_pb2.HeartbeatRequest,
                        context: grpc.aio.ServicerContext) -> scheduler_pb2.HeartbeatResponse:
        """Feeds the failure detector; tells a member it must register again if
        it was declared dead."""
        check_id(request.node_id, "node_id")
        check_id(request.incarnation, "incarnation")
        known = self.core.membership.heartbeat(request.node_id, request.incarnation,
                                               time.monotonic())
        record = self.core.membership.members.get(request.node_id)
        if known and record is not None and request.stopping:
            self.core.stopping[request.node_id] = request.incarnation
            log.info("%s is stopping (announced)", request.node_id)
        if known and record is not None:
            record.snapshots = request.snapshots
            record.snapshot_bytes = request.snapshot_bytes
            record.note_loop_lag(request.loop_lag_ms, time.monotonic())
            if request.failing:
                await self.core.failing_tasks(request.node_id, request.failing)
        return scheduler_pb2.HeartbeatResponse(epoch=self.core.membership.epoch,
                                               reregister=not known)

    @servicer_method
    async def GetRoutingTable(self, request: scheduler_pb2.GetRoutingTableRequest,
                              context: grpc.aio.ServicerContext) -> scheduler_pb2.RoutingTable:
        """The table of the current epoch, optionally for some jobs only."""
        table = self.core.table()
        if not request.job_ids:
            return table
        for job_id in request.job_ids:
            self.core.job(job_id)
        wanted = set(request.job_ids)
        return scheduler_pb2.RoutingTable(
            epoch=table.epoch, members=table.members,
            jobs=[j for j in table.jobs if j.job_id in wanted])

    @servicer_method
    async def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest,
                        context: grpc.aio.ServicerContext) -> scheduler_pb2.SubmitJobResponse:
        """Validates, deploys on every worker and registers a job."""
        job_id, epoch = await self.core.submit(request.spec)
        return scheduler_pb2.SubmitJobResponse(job_id=job_id, epoch=epoch)

    @servicer_method
    async def GetJob(self, request: scheduler_pb2.GetJobRequest,
                     context: grpc.aio.ServicerContext) -> common_pb2.JobInfo:
        """One job's spec and state."""
        return self.core.job(request.job_id).to_proto()

    @servicer_method
    async def ListJobs(self, request: scheduler_pb2.ListJobsRequest,
                       context: grpc.aio.ServicerContext) -> scheduler_pb2.ListJobsResponse:
        """Every job the registry holds."""
        return scheduler_pb2.ListJobsResponse(
            jobs=[j.to_proto() for j in self.core.registry.jobs.values()])

    @servicer_method
    async def CancelJob(self, request: scheduler_pb2.CancelJobRequest,
                        context: grpc.aio.ServicerContext) -> common_pb2.JobInfo:
        """Stops a job everywhere and deletes its state."""
        return (await self.core.cancel(request.job_id)).to_proto()

    @servicer_method
    async def GetJobProgress(self, request: scheduler_pb2.GetJobProgressRequest,
                             context: grpc.aio.ServicerContext) -> scheduler_pb2.JobProgress:
        """Per-task counters and the drained verdict."""
        return await self.core.progress(request.job_id, request.flush)

    @servicer_method
    async def GetClusterStatus(self, request: scheduler_pb2.GetClusterStatusRequest,
                               context: grpc.aio.ServicerContext) -> scheduler_pb2.ClusterStatus:
        """Members, shares, phi, jobs and recent membership changes."""
        return self.core.status()

    @servicer_method
    async def RetireMember(self, request: scheduler_pb2.RetireMemberRequest,
                           context: grpc.aio.ServicerContext
                           ) -> scheduler_pb2.RetireMemberResponse:
        """Starts retiring a state server."""
        if not request.node_id:
            raise InvalidArgument("node_id is empty; name the state server to retire")
        check_id(request.node_id, "node_id")
        return scheduler_pb2.RetireMemberResponse(epoch=await self.core.retire(request.node_id))

    @servicer_method
    async def Deregister(self, request: scheduler_pb2.DeregisterRequest,
                         context: grpc.aio.ServicerContext) -> scheduler_pb2.DeregisterResponse:
        """Removes a retired member that handed over everything."""
        if not request.node_id or not request.incarnation:
            raise InvalidArgument("node_id and incarnation must both be set")
        check_id(request.node_id, "node_id")
        check_id(request.incarnation, "incarnation")
        return scheduler_pb2.DeregisterResponse(
            epoch=await self.core.deregister(request.node_id, request.incarnation))

    @servicer_method
    async def SetTrackerCount(self, request: scheduler_pb2.SetTrackerCountRequest,
                              context: grpc.aio.ServicerContext
                              ) -> scheduler_pb2.SetTrackerCountResponse:
        """Changes the number of trackers while jobs run."""
        return scheduler_pb2.SetTrackerCountResponse(
            epoch=await self.core.set_tracker_count(request.count))
