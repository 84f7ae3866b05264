"""What an operator must be warned about, decided in one place.

The rules live here as plain logic over the scheduler's own figures (job
progress and cluster status), so that unit tests can feed them hand-made
samples. The scheduler's monitor runs :class:`WarningDetector` about once a
second and logs, exports and publishes what it finds (``ClusterStatus.warnings``);
``gridstream status --watch`` and the web console show those same warnings
(seed 003: early warnings, and the root of a problem found fast).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

from gridstream.client import Client
from gridstream.errors import GridstreamError
from gridstream.types import ClusterWarning
from gridstream.v1 import common_pb2, scheduler_pb2

STATES = {1: "alive", 2: "suspect", 3: "dead", 4: "leaving"}
GROWTH_WINDOW = 3

KINDS = ("partition_not_draining", "roots_timing_out", "dead_letters_rising", "member_suspect",
         "member_dead", "data_loss", "partition_moved", "task_restarting", "queue_growing",
         "persistence_behind")
"""Every kind of warning; each has a series in ``gridstream_warnings`` even at 0."""


class TaskFigures(Protocol):
    """The counters of one task of one partition the rules read: a
    ``common_pb2.TaskProgress`` (the scheduler) or the SDK's dataclass."""

    @property
    def task(self) -> int: ...
    @property
    def partition(self) -> int: ...
    @property
    def node_id(self) -> str: ...
    @property
    def restarts(self) -> int: ...
    @property
    def last_error(self) -> str: ...
    @property
    def roots_failed(self) -> int: ...
    @property
    def roots_pending(self) -> int: ...


class ProgressReport(Protocol):
    """A job's progress as the rules read it: a ``scheduler_pb2.JobProgress``
    or the SDK's dataclass."""

    @property
    def tasks(self) -> Sequence[TaskFigures]: ...
    @property
    def losses(self) -> Sequence[str]: ...
    @property
    def moved(self) -> Sequence[str]: ...
    @property
    def drained(self) -> bool: ...
    @property
    def holding(self) -> str: ...


@dataclass(frozen=True)
class Alert:
    """One warning: what is wrong, naming the job, task, partitions and member,
    and what to do about it. ``key`` identifies its episode (the same trouble
    seen at successive samples), so it is logged once, not every second."""

    kind: str
    text: str
    action: str
    key: str
    job_id: str = ""
    task: int = -1
    partitions: tuple[int, ...] = ()
    node_id: str = ""

    def line(self) -> str:
        """What is wrong and what to do, in one line."""
        return f"{self.text} — {self.action}"

    def to_proto(self, since: float) -> scheduler_pb2.ClusterWarning:
        """The wire form, with the wall-clock start of its episode."""
        return scheduler_pb2.ClusterWarning(
            kind=self.kind, job_id=self.job_id, task=self.task, partitions=self.partitions,
            node_id=self.node_id, text=self.text, action=self.action, since=since)


@dataclass
class StageFigures:
    """Totals of one task index of one job at one refresh."""

    processed: int = 0
    queued: int = 0
    persist_pending: int = 0


def _span(partitions: Iterable[int]) -> str:
    ordered = sorted(set(partitions))
    shown = ", ".join(str(p) for p in ordered[:8])
    return shown + (f" and {len(ordered) - 8} more" if len(ordered) > 8 else "")


def job_alerts(job_id: str, progress: ProgressReport) -> list[Alert]:
    """What one progress report alone says is wrong: lost batches, partitions
    moved off a worker where their task kept failing, and restarted tasks."""
    alerts = [Alert("data_loss", f"{job_id}: DATA LOSS {loss}",
                    "more simultaneous failures than cluster.backup_count; results are "
                    "incomplete (raise backup_count to survive more)",
                    f"data_loss/{job_id}/{loss}", job_id) for loss in progress.losses]
    alerts += [Alert("partition_moved", moved, "the task could not run there; see that "
                     "worker's log", f"partition_moved/{job_id}/{moved}", job_id)
               for moved in progress.moved]
    for t in sorted(progress.tasks, key=lambda t: (t.task, t.partition)):
        if t.restarts:
            alerts.append(Alert(
                "task_restarting", f"{job_id} task {t.task} partition {t.partition} on "
                f"{t.node_id}: restarted {t.restarts} times from its snapshot (last error: "
                f"{t.last_error or '?'})", "see that worker's log",
                f"task_restarting/{job_id}/{t.task}/{t.partition}/{t.node_id}", job_id, t.task,
                (t.partition,), t.node_id))
    return alerts


def warning_lines(warnings: Iterable[ClusterWarning], job_id: str | None = None,
                  now: float | None = None) -> list[str]:
    """The scheduler's warnings (``ClusterStatus.warnings``) as lines, each
    with what to do and how long it has lasted: ``gridstream status`` and
    ``status --watch`` print these, the console shows the same list. With
    ``job_id``, that job's warnings and those of the cluster itself (a
    member suspect or dead concerns every job)."""
    wall = time.time() if now is None else now
    lines = []
    for w in warnings:
        if job_id is not None and w.job_id not in ("", job_id):
            continue
        lasted = f" (for {_duration(wall - w.since)})" if w.since else ""
        lines.append(f"{w.text} — {w.action}{lasted}")
    return lines


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def trend_alerts(job_id: str, task: int, past: list[StageFigures]) -> list[Alert]:
    """A stage whose queue or persistence backlog grew at every one of the
    last GROWTH_WINDOW refreshes."""
    alerts = []
    queued = [f.queued for f in past]
    if len(queued) > GROWTH_WINDOW and all(b > a for a, b in pairwise(queued)):
        alerts.append(Alert(
            "queue_growing", f"{job_id} task {task}: queue growing for {GROWTH_WINDOW} "
            f"refreshes ({queued[-1]:,} records)", "the stage is slower than its input; "
            "add workers or slow the senders", f"queue_growing/{job_id}/{task}", job_id, task))
    backlog = [f.persist_pending for f in past]
    if len(backlog) > GROWTH_WINDOW and all(b > a for a, b in pairwise(backlog)):
        alerts.append(Alert(
            "persistence_behind", f"{job_id} task {task}: snapshot/result persistence falling "
            f"behind ({backlog[-1]:,} pending)", "check the state servers (`gridstream "
            "health`, their logs and disks)", f"persistence_behind/{job_id}/{task}", job_id,
            task))
    return alerts


# -- the rules that need history ---------------------------------------------------


@dataclass(frozen=True)
class WarningRules:
    """Thresholds of the rules that look at more than one sample."""

    stall_s: float = 15.0
    """A partition holding work whose counters have not moved for this long is
    not draining (a stuck operator, a lost owner, an unreachable next task)."""
    window_s: float = 30.0
    """Roots timing out and dead letters rising: any increase within this
    window keeps the warning on (so one burst is one episode)."""
    trend_every_s: float = 5.0
    """Spacing of the stage figures the growth rules compare (growth at every
    one of GROWTH_WINDOW steps: 15 s of steady growth by default)."""
    suspect_recent_s: float = 30.0
    """A member that was suspect this recently (and is alive now) is still
    named: a blip of phi is news too."""
    died_recent_s: float = 60.0
    """A member that died this recently without announcing its stop (and is
    back now, restarted by its supervisor) is still named: a crash that
    healed itself in a second is exactly what an operator must not miss."""


@dataclass(frozen=True)
class JobSample:
    """One running job at one sample: its shape and its progress report
    (None when it could not be gathered; ``error`` says why)."""

    job_id: str
    tasks: int
    partitions: int
    exactly_once: bool
    stage_names: tuple[str, ...]
    progress: scheduler_pb2.JobProgress | None
    error: str = ""
    submitted_at: float = 0.0
    """Wall clock of submission: a job submitted after the detector started
    has every counter counted from zero."""


@dataclass
class _Track:
    signature: tuple[object, ...] | None
    moved_at: float


def _holding(entry: common_pb2.TaskProgress | None, exactly_once: bool) -> str:
    """What a partition still holds ('' when nothing)."""
    if entry is None:
        return "no worker reports it (not deployed, or its owner is gone)"
    if entry.queue_batches:
        return f"{entry.queue_batches} batches queued"
    if entry.outbound_pending:
        return f"{entry.outbound_pending} batches not acknowledged by the next task"
    if entry.persist_pending:
        return f"{entry.persist_pending} writes not durable yet"
    if entry.records_processed != entry.records_in:
        return f"processed {entry.records_processed:,} of {entry.records_in:,} records"
    if entry.roots_pending and exactly_once:
        return f"{entry.roots_pending} tuple trees incomplete"
    return ""


def _signature(entry: common_pb2.TaskProgress) -> tuple[object, ...]:
    """The counters that move whenever a partition gets work done."""
    return (entry.node_id, entry.records_processed, entry.records_out, entry.windows_persisted,
            entry.roots_finished, entry.outbound_pending, entry.persist_pending,
            entry.roots_pending)


@dataclass
class WarningDetector:
    """Turns successive samples into the warnings active now. Counters restart
    when a task moves to another worker, so increases are taken per
    (job, task, partition, node) and a restart is never read as a decrease."""

    rules: WarningRules = field(default_factory=WarningRules)
    _tracks: dict[tuple[str, int, int], _Track] = field(default_factory=dict)
    _last: dict[tuple[str, str, int, int, str], int] = field(default_factory=dict)
    _rises: dict[tuple[str, str, int], deque[tuple[float, int, int]]] = field(
        default_factory=lambda: defaultdict(deque))
    _stages: dict[tuple[str, int], deque[tuple[float, StageFigures]]] = field(
        default_factory=lambda: defaultdict(lambda: deque(maxlen=GROWTH_WINDOW + 1)))
    _known: set[str] = field(default_factory=set)
    """Jobs seen at an earlier sample: a new entry of theirs counts from zero."""
    _started: float | None = None

    def observe(self, now: float, wall: float, status: scheduler_pb2.ClusterStatus,
                jobs: list[JobSample], announced: frozenset[str] = frozenset()) -> list[Alert]:
        """The warnings of this sample. ``now`` is monotonic, ``wall`` the
        wall clock of membership events; ``announced`` members stopped on
        purpose (an operator's restart is not a warning)."""
        if self._started is None:
            self._started = wall
        alerts = self._members(wall, status, announced)
        running = {j.job_id for j in jobs}
        self._known &= running
        for key in [k for k in self._tracks if k[0] not in running]:
            del self._tracks[key]
        for key2 in [k for k in self._stages if k[0] not in running]:
            del self._stages[key2]
        for key3 in [k for k in self._rises if k[1] not in running]:
            del self._rises[key3]
        for key4 in [k for k in self._last if k[1] not in running]:
            del self._last[key4]
        for job in jobs:
            if job.progress is None:
                continue
            alerts += job_alerts(job.job_id, job.progress)
            alerts += self._not_draining(now, job)
            alerts += self._rising(now, job)
            alerts += self._trends(now, job)
            self._known.add(job.job_id)
        return alerts

    def _members(self, wall: float, status: scheduler_pb2.ClusterStatus,
                 announced: frozenset[str]) -> list[Alert]:
        alerts = []
        last: dict[str, scheduler_pb2.MemberEvent] = {}
        for e in status.events:
            last[e.node_id] = e
        # Suspect, then alive again (not dead): late heartbeats worth naming.
        suspected = {node: e for node, e in last.items()
                     if e.old_state == scheduler_pb2.MEMBER_STATE_SUSPECT
                     and e.new_state == scheduler_pb2.MEMBER_STATE_ALIVE
                     and wall - e.at <= self.rules.suspect_recent_s}
        # Died (not an announced stop), then registered again: a crash that
        # its supervisor healed. "stopped" marks an announced stop.
        died: dict[str, scheduler_pb2.MemberEvent] = {}
        for e in status.events:
            if (e.new_state == scheduler_pb2.MEMBER_STATE_DEAD and e.reason != "stopped"
                    and wall - e.at <= self.rules.died_recent_s):
                died[e.node_id] = e
        for m in status.members:
            node = m.member.node_id
            if node in announced:
                continue
            if m.member.state == scheduler_pb2.MEMBER_STATE_SUSPECT:
                alerts.append(Alert(
                    "member_suspect", f"{node} is suspect: phi {m.phi:.1f}, last heartbeat "
                    f"{m.last_heartbeat_age_s:.1f}s ago", "it is declared dead if its heartbeats "
                    "stay away; check its host (load, swapping, network) and its log",
                    f"member_suspect/{node}", node_id=node))
            elif m.member.state == scheduler_pb2.MEMBER_STATE_DEAD:
                alerts.append(Alert(
                    "member_dead", f"{node} is dead; its partitions moved to the others",
                    "a supervisor (gridstream up, systemd) restarts it; if it does not come "
                    "back, see its log", f"member_dead/{node}", node_id=node))
            elif m.member.state == scheduler_pb2.MEMBER_STATE_ALIVE and node in died:
                event = died[node]
                how = ("restarted before it was declared dead" if event.reason == "restarted"
                       else f"declared dead at phi {event.phi:.1f}")
                alerts.append(Alert(
                    "member_dead", f"{node} died {wall - event.at:.0f}s ago ({how}) and is "
                    "back; its partitions moved and returned", "it did not announce a stop: "
                    "see its log and its host's (a kill, out of memory, a crash)",
                    f"member_dead/{node}", node_id=node))
            elif m.member.state == scheduler_pb2.MEMBER_STATE_ALIVE and node in suspected:
                event = suspected[node]
                alerts.append(Alert(
                    "member_suspect", f"{node} was suspect until {wall - event.at:.0f}s ago, "
                    "alive now", "late heartbeats: check its host (load, "
                    "swapping, network) if it happens again", f"member_suspect/{node}",
                    node_id=node))
        return alerts

    def _not_draining(self, now: float, job: JobSample) -> list[Alert]:
        assert job.progress is not None
        entries: dict[tuple[int, int], common_pb2.TaskProgress] = {}
        for reported in job.progress.tasks:
            entries.setdefault((reported.task, reported.partition), reported)
        alerts = []
        for task in range(job.tasks):
            for partition in range(job.partitions):
                entry: common_pb2.TaskProgress | None = entries.get((task, partition))
                holding = _holding(entry, job.exactly_once)
                signature = _signature(entry) if entry is not None else None
                key = (job.job_id, task, partition)
                track = self._tracks.get(key)
                if track is None or not holding or track.signature != signature:
                    self._tracks[key] = track = _Track(signature, now)
                stalled = now - track.moved_at
                if not holding or stalled < self.rules.stall_s:
                    continue
                node = entry.node_id if entry is not None else ""
                stage = _stage(job, task)
                action = (f"see {node}'s log: a stuck operator or an unreachable next task "
                          "holds it; restarting that worker moves its partitions"
                          if node else "check that the workers are alive (`gridstream "
                          "health`) and own this partition (`gridstream status --job`)")
                alerts.append(Alert(
                    "partition_not_draining", f"{job.job_id} task {task}{stage} partition "
                    f"{partition}{' on ' + node if node else ''}: not draining for "
                    f"{stalled:.0f}s ({holding})", action,
                    f"partition_not_draining/{job.job_id}/{task}/{partition}", job.job_id,
                    task, (partition,), node))
        return alerts

    def _increase(self, what: str, job: JobSample, entry: common_pb2.TaskProgress,
                  value: int) -> int:
        """How much a counter grew since the last sample. A counter seen for
        the first time grew from zero if its job is new (known before, or
        submitted since the detector started); else it is only a baseline
        (a scheduler that restarts does not report old dead letters anew)."""
        key = (what, job.job_id, entry.task, entry.partition, entry.node_id)
        fresh = (job.job_id in self._known
                 or job.submitted_at >= (self._started or 0.0))
        before = self._last.get(key, 0 if fresh else None)
        self._last[key] = value
        return value - before if before is not None and value > before else 0

    def _rising(self, now: float, job: JobSample) -> list[Alert]:
        assert job.progress is not None
        totals: dict[tuple[str, int], int] = defaultdict(int)
        for entry in job.progress.tasks:
            for what, value in (("roots", entry.roots_failed), ("dead", entry.dead_letters)):
                task = entry.task if what == "dead" else -1
                totals[(what, task)] += value
                grew = self._increase(what, job, entry, value)
                if grew:
                    self._rises[(what, job.job_id, task)].append((now, entry.partition, grew))
        alerts = []
        for (what, job_id, task), rises in list(self._rises.items()):
            if job_id != job.job_id:
                continue
            while rises and now - rises[0][0] > self.rules.window_s:
                rises.popleft()
            if not rises:
                del self._rises[(what, job_id, task)]
                continue
            count = sum(r[2] for r in rises)
            partitions = tuple(sorted({r[1] for r in rises}))
            window = f"{self.rules.window_s:.0f}s"
            if what == "roots":
                pending = sum(t.roots_pending for t in job.progress.tasks)
                alerts.append(Alert(
                    "roots_timing_out", f"{job_id}: {count} tuple trees timed out in the last "
                    f"{window} on partitions {_span(partitions)} ({pending} pending)",
                    "their batches are replayed; if it keeps rising, a task is stuck (see "
                    "partition_not_draining) or tracking_timeout_s is below the queueing delay",
                    f"roots_timing_out/{job_id}", job_id, -1, partitions))
            else:
                alerts.append(Alert(
                    "dead_letters_rising", f"{job_id} task {task}{_stage(job, task)}: {count} "
                    f"records went to the dead letters in the last {window} on partitions "
                    f"{_span(partitions)} ({totals[(what, task)]:,} in all)",
                    f"`gridstream dead-letters {job_id}` lists them with their errors; fix the "
                    "operator or the input", f"dead_letters_rising/{job_id}/{task}", job_id,
                    task, partitions))
        return alerts

    def _trends(self, now: float, job: JobSample) -> list[Alert]:
        assert job.progress is not None
        stages: dict[int, StageFigures] = defaultdict(StageFigures)
        for t in job.progress.tasks:
            figures = stages[t.task]
            figures.processed += t.records_processed
            figures.queued += t.queue_records
            figures.persist_pending += t.persist_pending
        alerts = []
        for task, figures in sorted(stages.items()):
            past = self._stages[(job.job_id, task)]
            if not past or now - past[-1][0] >= self.rules.trend_every_s:
                past.append((now, figures))
            alerts += trend_alerts(job.job_id, task, [f for _, f in past])
        return alerts


def _stage(job: JobSample, task: int) -> str:
    name = job.stage_names[task] if 0 <= task < len(job.stage_names) else ""
    return f" ({name})" if name else ""


@dataclass
class Episode:
    """One warning from the sample it appeared at until it has been absent
    for a while."""

    alert: Alert
    since: float
    seen: float


@dataclass
class Episodes:
    """Which warnings are new and which have cleared, so each is logged once
    per episode. A warning absent for less than ``clear_s`` (a flapping rule)
    continues its episode when it comes back."""

    clear_s: float = 10.0
    open: dict[str, Episode] = field(default_factory=dict)

    def update(self, wall: float, alerts: list[Alert]) -> tuple[list[Alert], list[Alert]]:
        """Records this sample's warnings; (new episodes, cleared episodes)."""
        started = []
        for alert in alerts:
            episode = self.open.get(alert.key)
            if episode is None:
                self.open[alert.key] = Episode(alert, wall, wall)
                started.append(alert)
            else:
                episode.alert, episode.seen = alert, wall
        cleared = [e.alert for key, e in list(self.open.items())
                   if e.seen < wall and wall - e.seen >= self.clear_s]
        for alert in cleared:
            del self.open[alert.key]
        return started, cleared

    def since(self, alert: Alert) -> float:
        """Wall-clock start of the episode of a current warning."""
        episode = self.open.get(alert.key)
        return episode.since if episode is not None else time.time()


# -- gridstream status --watch ------------------------------------------------------


@dataclass
class Watcher:
    """Keeps the previous refreshes to compute rates; the warnings are the
    scheduler's own (``ClusterStatus.warnings``)."""

    client: Client
    history: dict[tuple[str, int], deque[tuple[float, StageFigures]]] = field(
        default_factory=lambda: defaultdict(lambda: deque(maxlen=GROWTH_WINDOW + 1)))

    async def render(self) -> str:
        """One screen of text."""
        status = await self.client.status()
        lines = [f"gridstream — epoch {status.epoch} — {time.strftime('%H:%M:%S')}", ""]
        lines.append(f"{'member':<12}{'role':<12}{'state':<9}{'partitions':>10}{'phi':>7}")
        pending_roots: dict[str, tuple[int, int, int]] = {}
        notes: list[str] = []
        for m in status.members:
            role = "worker" if m.member.role == scheduler_pb2.MEMBER_ROLE_WORKER else "state"
            lines.append(f"{m.member.node_id:<12}{role:<12}{STATES.get(m.member.state, '?'):<9}"
                         f"{m.partitions_owned:>10}{m.phi:>7.2f}")
        running = [j for j in status.jobs if j.state == 1]
        if running:
            lines += ["", f"{'job':<24}{'task':>5}{'records/s':>12}{'queued':>10}"
                      f"{'persist backlog':>17}"]
        now = time.monotonic()
        for job in running:
            try:
                progress = await self.client.progress(job.job_id)
            except GridstreamError as exc:
                notes.append(f"{job.job_id}: progress unavailable ({exc})")
                continue
            pending_roots[job.job_id] = (
                sum(t.roots_pending for t in progress.tasks),
                sum(t.roots_failed for t in progress.tasks),
                sum(t.batches_lost for t in progress.tasks))
            stages: dict[int, StageFigures] = defaultdict(StageFigures)
            for t in progress.tasks:
                figures = stages[t.task]
                figures.processed += t.records_processed
                figures.queued += t.queue_records
                figures.persist_pending += t.persist_pending
            for task, figures in sorted(stages.items()):
                past = self.history[(job.job_id, task)]
                rate = 0.0
                if past:
                    then, before = past[-1]
                    rate = max(0, figures.processed - before.processed) / max(now - then, 1e-3)
                past.append((now, figures))
                lines.append(f"{job.job_id:<24}{task:>5}{rate:>12,.0f}{figures.queued:>10,}"
                             f"{figures.persist_pending:>17,}")
        if pending_roots:
            lines += ["", f"{'job':<24}{'roots pending':>14}{'roots failed':>13}"
                      f"{'batches lost':>13}"]
            for job_id, (pending, failed, lost) in pending_roots.items():
                lines.append(f"{job_id:<24}{pending:>14,}{failed:>13,}{lost:>13,}")
        if status.events:
            lines += ["", "recent failures and recoveries:"]
            for e in list(status.events)[-6:]:
                when = time.strftime("%H:%M:%S", time.localtime(e.at))
                lines.append(f"  {when} {e.node_id}: {STATES.get(e.old_state, 'new')} -> "
                             f"{STATES.get(e.new_state, '?')} ({e.reason or 'detector'}, "
                             f"phi {e.phi:.1f})")
        warnings = warning_lines(status.warnings) + notes
        lines += ["", "warnings:" if warnings else "no warnings"]
        lines += [f"  ! {w}" for w in warnings]
        return "\n".join(lines)
