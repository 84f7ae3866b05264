"""Recoveries as an operator sees them: when a member was declared dead, when
every partition of every running job was served again (resumed), and when
the cluster was whole again (healthy: the member back, every partition
reporting and none stalled, backups caught up).

Built from the scheduler's own membership events and the job progress its
monitor samples; plain logic, so unit tests can feed it hand-made samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gridstream.v1 import scheduler_pb2

KEEP = 20
"""Recoveries remembered (the most recent)."""


@dataclass
class Recovery:
    """One member's failure and the cluster's way back."""

    node_id: str
    reason: str
    """Why it was declared dead: "detector" (phi), "restarted" (a new
    incarnation registered first) or "marked"."""
    detected_at: float
    """Wall-clock time it was declared dead."""
    phi: float
    epoch: int
    """Routing epoch after the detection."""
    resumed_at: float | None = None
    """First sample after the detection at which every partition of every
    running job was reported by a live worker."""
    rejoined_at: float | None = None
    """When the member registered again."""
    rejoined_epoch: int = 0
    healthy_at: float | None = None
    """First sample after resuming with the member back, no partition stalled
    and every task's backups confirmed at the epoch of its return."""

    @property
    def phase(self) -> str:
        """detected, resumed or healthy."""
        if self.healthy_at is not None:
            return "healthy"
        return "resumed" if self.resumed_at is not None else "detected"

    def to_json(self) -> dict[str, Any]:
        """The console's form, with durations from the detection."""
        out = asdict(self)
        out["phase"] = self.phase
        for name in ("resumed", "rejoined", "healthy"):
            at = out[f"{name}_at"]
            out[f"{name}_after_s"] = None if at is None else round(at - self.detected_at, 2)
        return out


@dataclass(frozen=True)
class CoverageSample:
    """What one monitor sample says about the running jobs."""

    started_at: float
    """Wall-clock time the sample began (figures are at least this fresh)."""
    covered: bool
    """Every (task, partition) of every running job reported exactly once."""
    stalled: bool
    """Some partition is not draining."""
    replicated_epoch: int
    """Lowest replicated_epoch over every task (0 with no jobs)."""
    has_tasks: bool


class RecoveryTimeline:
    """Follows each member declared dead until the cluster is healthy again."""

    def __init__(self) -> None:
        self.recoveries: deque[Recovery] = deque(maxlen=KEEP)
        self._seen: set[tuple[str, float]] = set()

    def observe(self, events: list[scheduler_pb2.MemberEvent],
                members: Mapping[str, int], sample: CoverageSample) -> None:
        """Feeds membership events (any order, repeats ignored), the members'
        states now, and one sample of the jobs."""
        for event in sorted(events, key=lambda e: e.at):
            mark = (event.node_id, event.at)
            if mark in self._seen:
                continue
            self._seen.add(mark)
            if event.new_state == scheduler_pb2.MEMBER_STATE_DEAD:
                self.recoveries.append(Recovery(event.node_id, event.reason or "detector",
                                                event.at, event.phi, event.epoch))
            elif (event.new_state == scheduler_pb2.MEMBER_STATE_ALIVE
                  and event.reason == "registered"):
                for recovery in self.recoveries:
                    if (recovery.node_id == event.node_id and recovery.rejoined_at is None
                            and event.at >= recovery.detected_at):
                        recovery.rejoined_at = event.at
                        recovery.rejoined_epoch = event.epoch
        for recovery in self.recoveries:
            if recovery.healthy_at is not None or sample.started_at < recovery.detected_at:
                continue
            if recovery.resumed_at is None and sample.covered:
                recovery.resumed_at = sample.started_at
            back = (recovery.rejoined_at is not None
                    and members.get(recovery.node_id) == scheduler_pb2.MEMBER_STATE_ALIVE)
            caught_up = (not sample.has_tasks
                         or sample.replicated_epoch >= recovery.rejoined_epoch)
            if (recovery.resumed_at is not None and back and sample.covered
                    and not sample.stalled and caught_up
                    and recovery.rejoined_at is not None
                    and sample.started_at >= recovery.rejoined_at):
                recovery.healthy_at = sample.started_at
        if len(self._seen) > 10 * KEEP:
            keep = {(e.node_id, e.at) for e in events}
            self._seen &= keep

    def to_json(self) -> list[dict[str, Any]]:
        """Most recent first."""
        return [r.to_json() for r in reversed(self.recoveries)]
