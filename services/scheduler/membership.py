"""Who is in the cluster: registrations, heartbeats, and the verdicts of the
phi-accrual detector, with the routing epoch that every change bumps."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gridstream.v1 import scheduler_pb2
from services.scheduler.detector import PhiAccrualDetector, Verdict

log = logging.getLogger(__name__)

_STATE_OF = {
    Verdict.ALIVE: scheduler_pb2.MEMBER_STATE_ALIVE,
    Verdict.SUSPECT: scheduler_pb2.MEMBER_STATE_SUSPECT,
    Verdict.DEAD: scheduler_pb2.MEMBER_STATE_DEAD,
}


LOOP_LAG_MEMORY_S = 10.0
"""How long a member's worst reported event-loop lag stays in its status."""


@dataclass
class MemberRecord:
    """What the scheduler knows of one member."""

    node_id: str
    role: int
    address: str
    incarnation: str
    state: int = scheduler_pb2.MEMBER_STATE_ALIVE
    last_heartbeat: float = 0.0
    phi: float = 0.0
    detected_at: float = 0.0
    """When it was last declared dead (monotonic), for recovery figures."""
    snapshots: int = 0
    """State servers: window snapshots held, from the last heartbeat."""
    snapshot_bytes: int = 0
    """State servers: bytes of those snapshots."""
    loop_lag_ms: int = 0
    """Worst lateness of its event loop its heartbeats reported lately (see
    :meth:`note_loop_lag`)."""
    loop_lag_at: float = 0.0

    def note_loop_lag(self, lag_ms: int, now: float) -> None:
        """Keeps the worst loop lag reported in the last
        :data:`LOOP_LAG_MEMORY_S` or so: a member busy for a moment shows it
        for a while, not only until its next heartbeat, 0.25 s later."""
        if lag_ms >= self.loop_lag_ms or now - self.loop_lag_at > LOOP_LAG_MEMORY_S:
            self.loop_lag_ms, self.loop_lag_at = lag_ms, now


@dataclass(frozen=True)
class Transition:
    """A change of a member's state, with the phi that caused it."""

    node_id: str
    old: int
    new: int
    phi: float


class Membership:
    """Members and the epoch of the routing table built from them."""

    def __init__(self, detector: PhiAccrualDetector, epoch: int = 1) -> None:
        self.detector = detector
        self.members: dict[str, MemberRecord] = {}
        self.epoch = epoch

    def bump(self, why: str) -> int:
        """Starts a new routing epoch."""
        self.epoch += 1
        log.info("epoch %d: %s", self.epoch, why)
        return self.epoch

    def register(self, node_id: str, role: int, address: str, incarnation: str,
                 now: float) -> bool:
        """Adds or refreshes a member; True (and a new epoch) when anything changed."""
        record = self.members.get(node_id)
        changed = (
            record is None
            or record.address != address
            or record.incarnation != incarnation
            or record.role != role
            or record.state == scheduler_pb2.MEMBER_STATE_DEAD
        )
        if record is None or changed:
            self.detector.forget(node_id)
            record = MemberRecord(node_id, role, address, incarnation)
            self.members[node_id] = record
        record.state = scheduler_pb2.MEMBER_STATE_ALIVE
        record.last_heartbeat = now
        self.detector.heartbeat(node_id, now)
        if changed:
            self.bump(f"{node_id} registered at {address} (incarnation {incarnation[:8]})")
        return changed

    def restore(self, node_id: str, role: int, address: str, incarnation: str,
                now: float) -> None:
        """Re-admits a member from durable state after a scheduler restart. Its
        phi is not trusted until it has sent a few fresh heartbeats (the
        detector's bootstrap), so a restart convicts nobody who is alive."""
        self.members[node_id] = MemberRecord(node_id, role, address, incarnation,
                                             last_heartbeat=now)
        self.detector.readmit(node_id, now)

    def heartbeat(self, node_id: str, incarnation: str, now: float) -> bool:
        """Records a heartbeat; False when the member must register again
        (unknown, restarted, or already declared dead)."""
        record = self.members.get(node_id)
        if (
            record is None
            or record.incarnation != incarnation
            or record.state == scheduler_pb2.MEMBER_STATE_DEAD
        ):
            return False
        record.last_heartbeat = now
        self.detector.heartbeat(node_id, now)
        return True

    def check(self, now: float) -> list[Transition]:
        """Runs the detector; returns state changes (a death bumps the epoch)."""
        transitions = []
        verdicts = self.detector.tick(now)
        for node_id, record in self.members.items():
            if record.state == scheduler_pb2.MEMBER_STATE_DEAD or node_id not in verdicts:
                continue
            verdict, phi = verdicts[node_id]
            record.phi = phi
            new = _STATE_OF[verdict]
            if record.state == scheduler_pb2.MEMBER_STATE_LEAVING and verdict != Verdict.DEAD:
                continue  # retiring: stays out of the write ring until it leaves or dies
            if new != record.state:
                transitions.append(Transition(node_id, record.state, new, phi))
                record.state = new
                if new == scheduler_pb2.MEMBER_STATE_DEAD:
                    record.detected_at = now
                    self.detector.forget(node_id)
                    self.bump(f"{node_id} declared dead (phi {phi:.1f})")
        return transitions

    def retire(self, node_id: str) -> MemberRecord:
        """Marks a live state server as leaving (a new epoch); raises KeyError
        for an unknown member and ValueError for one that cannot be retired."""
        record = self.members[node_id]
        if record.role != scheduler_pb2.MEMBER_ROLE_STATE_SERVER:
            raise ValueError(f"{node_id} is a worker; only state servers are retired "
                             "(stop a worker with SIGTERM and its partitions move)")
        if record.state == scheduler_pb2.MEMBER_STATE_DEAD:
            raise ValueError(f"{node_id} is dead; start it again before retiring it, so "
                             "its data can be handed over")
        if record.state != scheduler_pb2.MEMBER_STATE_LEAVING:
            record.state = scheduler_pb2.MEMBER_STATE_LEAVING
            self.bump(f"{node_id} retiring")
        return record

    def remove(self, node_id: str, incarnation: str) -> bool:
        """Forgets a member that left (a new epoch); False if it is unknown or
        ``incarnation`` is not its current one."""
        record = self.members.get(node_id)
        if record is None or record.incarnation != incarnation:
            return False
        del self.members[node_id]
        self.detector.forget(node_id)
        self.bump(f"{node_id} left")
        return True

    def mark_dead(self, node_id: str, now: float) -> None:
        """Declares a member dead without waiting for the detector."""
        record = self.members.get(node_id)
        if record is not None and record.state != scheduler_pb2.MEMBER_STATE_DEAD:
            record.state = scheduler_pb2.MEMBER_STATE_DEAD
            record.detected_at = now
            self.detector.forget(node_id)
            self.bump(f"{node_id} marked dead")

    def live(self, role: int) -> list[MemberRecord]:
        """Members of a role that are not dead, by node id."""
        return sorted(
            (m for m in self.members.values()
             if m.role == role and m.state != scheduler_pb2.MEMBER_STATE_DEAD),
            key=lambda m: m.node_id,
        )
