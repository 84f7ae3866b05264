"""``gridstream status --watch``: the live cluster at a glance, with early
warnings — a queue that keeps growing, persistence falling behind, a member
whose phi is rising — before they become failures (seed 003: easy to
administer)."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from itertools import pairwise

from gridstream.client import Client
from gridstream.errors import GridstreamError
from gridstream.v1 import scheduler_pb2

STATES = {1: "alive", 2: "suspect", 3: "dead"}
GROWTH_WINDOW = 3


@dataclass
class StageFigures:
    """Totals of one task index of one job at one refresh."""

    processed: int = 0
    queued: int = 0
    persist_pending: int = 0


def job_warnings(job_id: str, progress: scheduler_pb2.JobProgress) -> list[str]:
    """What an operator must know about a job now, with what to do: lost
    batches, abandoned or long-pending tuple trees, tasks that restarted, and
    what holds a drain. Plain logic over one progress report (unit-tested)."""
    warnings = [f"{job_id}: DATA LOSS {loss} — more simultaneous failures than "
                "cluster.backup_count; results are incomplete" for loss in progress.losses]
    warnings += [f"{moved} — the task could not run there; see that worker's log"
                 for moved in progress.moved]
    failed = sum(t.roots_failed for t in progress.tasks)
    pending = sum(t.roots_pending for t in progress.tasks)
    if failed:
        warnings.append(f"{job_id}: {failed} tuple trees timed out and were rebuilt, {pending} "
                        "pending; if it keeps growing, a task is stuck or tracking_timeout_s "
                        "is below the queueing delay")
    for t in sorted(progress.tasks, key=lambda t: (t.task, t.partition)):
        if t.restarts:
            warnings.append(f"{job_id} task {t.task} partition {t.partition} on {t.node_id}: "
                            f"restarted {t.restarts} times from its snapshot (last error: "
                            f"{t.last_error or '?'}); see that worker's log")
    if not progress.drained and progress.holding and pending:
        warnings.append(f"{job_id}: not drained: {progress.holding}")
    return warnings


def trend_warnings(job_id: str, task: int, past: list[StageFigures]) -> list[str]:
    """Warnings for a stage whose queue or persistence backlog grew at every one
    of the last GROWTH_WINDOW refreshes."""
    warnings = []
    queued = [f.queued for f in past]
    if len(queued) > GROWTH_WINDOW and all(b > a for a, b in pairwise(queued)):
        warnings.append(f"{job_id} task {task}: queue growing for {GROWTH_WINDOW} refreshes "
                        f"({queued[-1]:,} records)")
    backlog = [f.persist_pending for f in past]
    if len(backlog) > GROWTH_WINDOW and all(b > a for a, b in pairwise(backlog)):
        warnings.append(f"{job_id} task {task}: snapshot/result persistence falling behind "
                        f"({backlog[-1]:,} pending)")
    return warnings


@dataclass
class Watcher:
    """Keeps the previous refreshes to compute rates and trends."""

    client: Client
    history: dict[tuple[str, int], deque[tuple[float, StageFigures]]] = field(
        default_factory=lambda: defaultdict(lambda: deque(maxlen=GROWTH_WINDOW + 1)))

    async def render(self) -> str:
        """One screen of text."""
        status = await self.client.status()
        lines = [f"gridstream — epoch {status.epoch} — {time.strftime('%H:%M:%S')}", ""]
        lines.append(f"{'member':<12}{'role':<12}{'state':<9}{'partitions':>10}{'phi':>7}")
        pending_roots: dict[str, tuple[int, int, int]] = {}
        warnings: list[str] = []
        for m in status.members:
            role = "worker" if m.member.role == scheduler_pb2.MEMBER_ROLE_WORKER else "state"
            lines.append(f"{m.member.node_id:<12}{role:<12}{STATES.get(m.member.state, '?'):<9}"
                         f"{m.partitions_owned:>10}{m.phi:>7.2f}")
            if m.member.state == scheduler_pb2.MEMBER_STATE_ALIVE and m.phi >= 2.0:
                warnings.append(f"{m.member.node_id}: phi {m.phi:.1f} and rising "
                                f"(heartbeat {m.last_heartbeat_age_s:.2f}s ago)")
            elif m.member.state == scheduler_pb2.MEMBER_STATE_SUSPECT:
                warnings.append(f"{m.member.node_id} is suspect (phi {m.phi:.1f})")
        running = [j for j in status.jobs if j.state == 1]
        if running:
            lines += ["", f"{'job':<24}{'task':>5}{'records/s':>12}{'queued':>10}"
                      f"{'persist backlog':>17}"]
        now = time.monotonic()
        for job in running:
            try:
                progress = await self.client.progress(job.job_id)
            except GridstreamError as exc:
                warnings.append(f"{job.job_id}: progress unavailable ({exc})")
                continue
            warnings += job_warnings(job.job_id, progress)
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
                warnings += trend_warnings(job.job_id, task, [f for _, f in past])
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
        lines += ["", "warnings:" if warnings else "no warnings"]
        lines += [f"  ! {w}" for w in warnings]
        return "\n".join(lines)
