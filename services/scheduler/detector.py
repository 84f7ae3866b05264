"""Phi-accrual failure detection over heartbeat arrivals.

phi = -log10(P(a heartbeat is still coming | the inter-arrival history)). The
history is a sliding window of intervals, modelled as a normal distribution
(with Akka's logistic approximation of its tail) whose mean is shifted by an
acceptable pause. A member is *suspect* at half the threshold and *dead* at
the threshold. Detection time after the last heartbeat is about
``mean + acceptable_pause + ~5 sigma``: with 250 ms heartbeats, 750 ms pause
and 50 ms minimum sigma, about 1.3 s on loopback.

Everything takes ``now`` from the caller (``time.monotonic()`` in the
service), so tests can replay recorded heartbeat sequences exactly.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DetectorSettings:
    """Parameters of the detector."""

    interval_s: float = 0.25
    """Expected heartbeat interval; seeds the history."""
    threshold: float = 8.0
    """phi at which a member is declared dead (1e-8 chance of being wrong)."""
    acceptable_pause_s: float = 0.75
    """Pause added to the mean before phi rises (GC, busy loop, scheduling)."""
    min_std_s: float = 0.05
    """Floor of the standard deviation, so a very regular history is not brittle."""
    window: int = 100
    """Intervals remembered."""
    bootstrap_heartbeats: int = 3
    """After a scheduler restart, fresh heartbeats a re-admitted member must
    send before its phi is trusted: an empty history says nothing about a
    member whose heartbeats were failing while the scheduler was down (its
    channel may be in reconnect backoff)."""
    bootstrap_grace_s: float = 15.0
    """A re-admitted member that sends no fresh heartbeat for this long after
    the scheduler restarted is declared dead (it died while we were down)."""


@dataclass
class ArrivalHistory:
    """Inter-arrival intervals of one member."""

    settings: DetectorSettings
    last: float | None = None
    intervals: deque[float] = field(default_factory=deque)
    _sum: float = 0.0
    _sum_sq: float = 0.0
    bootstrap_left: int = 0
    """Heartbeats still needed before phi is trusted (0: trusted)."""
    bootstrap_since: float = 0.0

    def __post_init__(self) -> None:
        # Start the history at mean = interval, sigma = mean / 4.
        mean = self.settings.interval_s
        std = mean / 4
        for value in (mean - std, mean + std):
            self._add(value)

    def _add(self, interval: float) -> None:
        self.intervals.append(interval)
        self._sum += interval
        self._sum_sq += interval * interval
        if len(self.intervals) > self.settings.window:
            old = self.intervals.popleft()
            self._sum -= old
            self._sum_sq -= old * old

    def heartbeat(self, now: float) -> None:
        """Records an arrival."""
        if self.bootstrap_left:
            # Intervals spanning the scheduler's own outage are not the
            # member's rhythm: start the clock afresh at every bootstrap beat.
            self.bootstrap_left -= 1
            self.last = now
            return
        if self.last is not None:
            self._add(max(0.0, now - self.last))
        self.last = now

    def phi(self, now: float) -> float:
        """Suspicion level at ``now``; 0 before the first heartbeat and while
        bootstrapping (infinite once the bootstrap grace has passed)."""
        if self.bootstrap_left:
            grace_over = now - self.bootstrap_since > self.settings.bootstrap_grace_s
            return float("inf") if grace_over else 0.0
        if self.last is None:
            return 0.0
        n = len(self.intervals)
        mean = self._sum / n
        variance = max(0.0, self._sum_sq / n - mean * mean)
        std = max(math.sqrt(variance), self.settings.min_std_s)
        elapsed = now - self.last
        if elapsed <= 0:
            return 0.0
        y = (elapsed - mean - self.settings.acceptable_pause_s) / std
        e = math.exp(-y * (1.5976 + 0.070566 * y * y))
        if e == 0.0:  # far in the tail: P underflows
            return float("inf") if y > 0 else 0.0
        if y > 0:
            return -math.log10(e / (1.0 + e))
        return max(0.0, -math.log10(1.0 - 1.0 / (1.0 + e)))


class Verdict:
    """What the detector concludes about a member."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


class PhiAccrualDetector:
    """Phi over every member, with a guard against the detector's own pauses."""

    def __init__(self, settings: DetectorSettings, max_tick_gap_s: float = 1.0) -> None:
        self.settings = settings
        self.max_tick_gap_s = max_tick_gap_s
        self._histories: dict[str, ArrivalHistory] = {}
        self._last_tick: float | None = None

    def heartbeat(self, member: str, now: float) -> None:
        """Records a heartbeat of a member (creates its history on first use)."""
        history = self._histories.get(member)
        if history is None:
            history = self._histories[member] = ArrivalHistory(self.settings)
        history.heartbeat(now)

    def readmit(self, member: str, now: float) -> None:
        """Starts a member known from before a scheduler restart in bootstrap:
        no verdict until it has sent ``bootstrap_heartbeats`` fresh heartbeats,
        or dead once ``bootstrap_grace_s`` passes without them."""
        history = self._histories[member] = ArrivalHistory(self.settings)
        history.bootstrap_left = self.settings.bootstrap_heartbeats
        history.bootstrap_since = now
        history.last = now

    def forget(self, member: str) -> None:
        """Drops a member's history (it left, or it restarts afresh)."""
        self._histories.pop(member, None)

    def phi(self, member: str, now: float) -> float:
        """Current phi of a member (0 if unknown)."""
        history = self._histories.get(member)
        return history.phi(now) if history else 0.0

    def verdict(self, phi: float) -> str:
        """ALIVE, SUSPECT (phi >= threshold / 2) or DEAD (phi >= threshold)."""
        if phi >= self.settings.threshold:
            return Verdict.DEAD
        if phi >= self.settings.threshold / 2:
            return Verdict.SUSPECT
        return Verdict.ALIVE

    def tick(self, now: float) -> dict[str, tuple[str, float]]:
        """Verdict and phi of every member at ``now``.

        If the detector itself was paused longer than ``max_tick_gap_s`` (a
        stalled scheduler), every member would look dead; this tick convicts
        nobody and the histories' clocks restart at ``now`` instead.
        """
        paused = self._last_tick is not None and now - self._last_tick > self.max_tick_gap_s
        self._last_tick = now
        out: dict[str, tuple[str, float]] = {}
        for member, history in self._histories.items():
            if paused and history.last is not None:
                history.last = now
                if history.bootstrap_left:
                    history.bootstrap_since = now
            value = history.phi(now)
            out[member] = (self.verdict(value), value)
        return out
