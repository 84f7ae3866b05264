"""The scheduler's monitor: about once a second it samples its own view of
the cluster (membership, and every running job's progress), keeps a ring
buffer of per-stage figures for the web console, follows recoveries, and
runs the warning rules of :mod:`gridstream.watch` — logging each warning
once per episode at WARNING, exporting it as metrics and publishing it in
``ClusterStatus.warnings`` for ``gridstream status --watch``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from gridstream.client import Client
from gridstream.errors import GridstreamError
from gridstream.jobspec import plan_tasks
from gridstream.metrics import Metric, counter, gauge
from gridstream.v1 import scheduler_pb2
from gridstream.watch import KINDS, Alert, Episodes, JobSample, WarningDetector, WarningRules
from services.scheduler.recoveries import CoverageSample, RecoveryTimeline
from services.scheduler.server import SchedulerCore

log = logging.getLogger("gridstream.scheduler.monitor")

SAMPLE_S = 1.0
"""Seconds between samples."""
KEEP_S = 600.0
"""Seconds of per-stage figures kept (the console shows the last minutes)."""
DEAD_LETTERS_S = 2.0
"""Seconds between looks for new dead letters (read only when the counters rose)."""
DEAD_LETTERS_SHOWN = 20
"""Most recent dead letters kept per job."""


@dataclass
class StagePoint:
    """One stage of one job at one sample."""

    at: float
    """Wall-clock time of the sample."""
    rate: float
    """Records processed per second since the previous sample."""
    queued: int
    """Records waiting in the stage's JobContainers."""
    lag: int
    """Records accepted by the stage and not processed yet (queued, or in an
    operator, or replayed)."""


@dataclass
class JobView:
    """The latest figures of one running job."""

    sample: JobSample
    stages: dict[int, deque[StagePoint]] = field(default_factory=dict)
    dead_letters: int = 0


@dataclass
class DeadLetters:
    """The dead letters last read for a job, or why they could not be."""

    count: int = 0
    """Dead letters stored for the job when last read."""
    seen: int = -1
    """The workers' dead-letter counters at that read."""
    letters: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    read_at: float = 0.0


def _letter(letter: object) -> dict[str, Any]:
    """A dead letter as `gridstream dead-letters` prints it (one JSON object)."""
    to_json = getattr(letter, "to_json", None)
    return dict(to_json()) if callable(to_json) else dict(letter)  # type: ignore[call-overload]


class Monitor:
    """Samples, warns and remembers; owned by the scheduler's TaskGroup."""

    def __init__(self, core: SchedulerCore, self_address: str,
                 rules: WarningRules | None = None, sample_s: float = SAMPLE_S) -> None:
        self.core = core
        self.self_address = self_address
        self.sample_s = sample_s
        self.detector = WarningDetector(rules or WarningRules())
        self.episodes = Episodes()
        self.alerts: list[Alert] = []
        self.raised: dict[str, int] = defaultdict(int)
        self.recoveries = RecoveryTimeline()
        self.jobs: dict[str, JobView] = {}
        self.dead: dict[str, DeadLetters] = {}
        self.sampled_at = 0.0
        self._processed: dict[tuple[str, int, int, str], int] = {}
        self._last_sample = 0.0

    async def run(self) -> None:
        """Samples and reads dead letters until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._sample_forever(), name="monitor samples")
            group.create_task(self._dead_letters_forever(), name="monitor dead letters")

    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("monitor sample failed", exc_info=True)
            await asyncio.sleep(max(0.05, self.sample_s - (time.monotonic() - started)))

    async def sample(self) -> None:
        """One sample: progress of every running job, warnings, recoveries."""
        now, wall = time.monotonic(), time.time()
        samples = [await self._job_sample(record.job_id) for record in self.core.registry.running()]
        status = self.core.status()
        announced = frozenset(n for n in self.core.membership.members if self.core.announced(n))
        alerts = self.detector.observe(now, wall, status, samples, announced)
        started, cleared = self.episodes.update(wall, alerts)
        for alert in started:
            self.raised[alert.kind] += 1
            log.warning("%s: %s — %s", alert.kind, alert.text, alert.action)
        for alert in cleared:
            log.info("cleared %s: %s", alert.kind, alert.text)
        self.alerts = alerts
        self.core.warnings = [a.to_proto(self.episodes.since(a)) for a in alerts]
        self._figures(now, wall, samples)
        members = {m.member.node_id: m.member.state for m in status.members}
        self.recoveries.observe(list(status.events), members, self._coverage(wall, samples))
        self.sampled_at = wall
        self._last_sample = now

    async def _job_sample(self, job_id: str) -> JobSample:
        record = self.core.registry.jobs[job_id]
        tasks = plan_tasks(record.spec)
        names = tuple(" → ".join(s.name for s in task) or "(source)" for task in tasks)
        progress: scheduler_pb2.JobProgress | None = None
        error = ""
        try:
            progress = await self.core.progress(job_id)
        except GridstreamError as exc:
            error = str(exc)
        return JobSample(job_id, len(tasks), record.spec.partitions,
                         record.spec.delivery == "exactly_once", names, progress, error,
                         record.submitted_at)

    def _figures(self, now: float, wall: float, samples: list[JobSample]) -> None:
        """Appends each stage's throughput, queue and lag to the ring buffer."""
        elapsed = now - self._last_sample if self._last_sample else 0.0
        running = {s.job_id for s in samples}
        for job_id in [j for j in self.jobs if j not in running]:
            del self.jobs[job_id]
            self.dead.pop(job_id, None)
        for key in [k for k in self._processed if k[0] not in running]:
            del self._processed[key]
        for sample in samples:
            view = self.jobs.setdefault(sample.job_id, JobView(sample))
            view.sample = sample
            if sample.progress is None:
                continue
            done: dict[int, int] = defaultdict(int)
            queued: dict[int, int] = defaultdict(int)
            lag: dict[int, int] = defaultdict(int)
            for t in sample.progress.tasks:
                key = (sample.job_id, t.task, t.partition, t.node_id)
                before = self._processed.get(key)
                self._processed[key] = t.records_processed
                if before is not None and t.records_processed > before:
                    done[t.task] += t.records_processed - before
                queued[t.task] += t.queue_records
                lag[t.task] += max(0, t.records_in - t.records_processed)
            view.dead_letters = sum(t.dead_letters for t in sample.progress.tasks)
            points = int(KEEP_S / self.sample_s)
            for task in range(sample.tasks):
                series = view.stages.setdefault(task, deque(maxlen=points))
                rate = done[task] / elapsed if elapsed > 0 else 0.0
                series.append(StagePoint(wall, rate, queued[task], lag[task]))

    def _coverage(self, wall: float, samples: list[JobSample]) -> CoverageSample:
        covered = True
        epochs: list[int] = []
        for sample in samples:
            progress = sample.progress
            if progress is None or progress.holding.startswith("no progress from"):
                covered = False
                continue
            seen = [(t.task, t.partition) for t in progress.tasks]
            covered &= (len(seen) == len(set(seen)) == sample.tasks * sample.partitions)
            epochs += [t.replicated_epoch for t in progress.tasks]
        stalled = any(a.kind == "partition_not_draining" for a in self.alerts)
        return CoverageSample(wall - self.sample_s, covered, stalled, min(epochs, default=0),
                              bool(epochs))

    async def _dead_letters_forever(self) -> None:
        """Reads a job's dead letters as `gridstream dead-letters` does, when
        its workers' counters say there are new ones."""
        async with Client(self.self_address) as client:
            while True:
                await asyncio.sleep(DEAD_LETTERS_S)
                for job_id, view in list(self.jobs.items()):
                    known = self.dead.setdefault(job_id, DeadLetters())
                    # Rows become durable a little after the counters move:
                    # a short read is read again a while later.
                    short = (known.count < known.seen
                             and time.time() - known.read_at > 5 * DEAD_LETTERS_S)
                    if view.dead_letters == known.seen and not known.error and not short:
                        continue
                    if view.dead_letters == 0 and known.seen < 0:
                        known.seen = 0
                        continue
                    seen = view.dead_letters
                    try:
                        letters = await client.dead_letters(job_id)
                    except GridstreamError as exc:
                        known.error = f"dead letters unavailable: {exc}"
                        continue
                    known.error = ""
                    known.seen, known.count = seen, len(letters)
                    known.letters = [_letter(x) for x in letters[-DEAD_LETTERS_SHOWN:]]
                    known.read_at = time.time()

    def metrics(self) -> list[Metric]:
        """Warnings and per-stage figures for Prometheus, read at scrape time."""
        active = gauge("gridstream_warnings", "Warnings active now, by kind", ["kind"])
        counts: dict[str, int] = defaultdict(int)
        for alert in self.alerts:
            counts[alert.kind] += 1
        for kind in KINDS:
            active.add_metric([kind], counts[kind])
        each = gauge("gridstream_warning_active", "1 for each warning active now",
                     ["kind", "job", "task", "partitions", "node"])
        for alert in self.alerts:
            each.add_metric([alert.kind, alert.job_id, str(alert.task),
                             ",".join(str(p) for p in alert.partitions), alert.node_id], 1)
        raised = counter("gridstream_warnings_raised", "Warning episodes begun, by kind",
                         ["kind"])
        for kind in KINDS:
            raised.add_metric([kind], self.raised[kind])
        lag = gauge("gridstream_stage_lag_records",
                    "Records accepted by a stage and not processed yet", ["job", "task", "stage"])
        rate = gauge("gridstream_stage_records_per_second",
                     "Records a stage processed per second at the last sample",
                     ["job", "task", "stage"])
        for job_id, view in self.jobs.items():
            for task, series in view.stages.items():
                if series:
                    labels = [job_id, str(task), view.sample.stage_names[task]]
                    lag.add_metric(labels, series[-1].lag)
                    rate.add_metric(labels, series[-1].rate)
        return [active, each, raised, lag, rate]

    def snapshot_jobs(self, since: float) -> list[dict[str, Any]]:
        """Running jobs with their stage series from ``since`` (wall clock)."""
        out = []
        for job_id, view in self.jobs.items():
            sample = view.sample
            progress = sample.progress
            tasks = list(progress.tasks) if progress is not None else []
            dead = self.dead.get(job_id, DeadLetters())
            out.append({
                "job_id": job_id,
                "error": sample.error,
                "drained": bool(progress.drained) if progress is not None else False,
                "holding": progress.holding if progress is not None else sample.error,
                "losses": list(progress.losses) if progress is not None else [],
                "roots": {
                    "pending": sum(t.roots_pending for t in tasks),
                    "failed": sum(t.roots_failed for t in tasks),
                    "finished": sum(t.roots_finished for t in tasks),
                    "abandoned": sum(t.roots_abandoned for t in tasks),
                    "batches_lost": sum(t.batches_lost for t in tasks),
                    "replayed_batches": sum(t.batches_replayed for t in tasks),
                },
                "stages": [{
                    "task": task, "name": sample.stage_names[task],
                    "points": [[round(p.at, 1), round(p.rate, 1), p.queued, p.lag]
                               for p in view.stages.get(task, ()) if p.at >= since],
                } for task in range(sample.tasks)],
                "dead_letters": {"count": view.dead_letters, "stored": dead.count,
                                 "letters": dead.letters, "error": dead.error,
                                 "read_at": dead.read_at},
            })
        return out
