"""How long the worker's event loop was held: the heartbeat's real budget.

Heartbeats, acknowledgements and replication share one event loop with
snapshotting and restoring state. A step that holds the loop delays all of
them, and a delay of three heartbeat intervals gets a busy worker suspected
(docs/recovery.md). :class:`LoopLagMonitor` wakes every ``tick_s`` and
measures how late it woke; the worst lateness of each ``period_s`` is logged
(INFO from ``report_s``, WARNING from a heartbeat interval) so a stall is
named with its size, and :attr:`LoopLagMonitor.worst_s` keeps the worst
since the start for status and benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)


class LoopLagMonitor:
    """Measures the event loop's lateness beside the heartbeats.

    Costs one wake-up per ``tick_s``; lateness below ``report_s`` is not
    logged (a loaded machine's scheduling noise). The log line
    ``event loop lag: worst <s> s`` is what ``bench/recovery.py`` reads.
    """

    def __init__(self, heartbeat_interval_s: float, tick_s: float = 0.02,
                 period_s: float = 2.0, report_s: float = 0.05) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.tick_s = tick_s
        self.period_s = period_s
        self.report_s = report_s
        self.worst_s = 0.0
        """Worst lateness since the monitor started."""
        self.period_worst_s = 0.0
        """Worst lateness of the period being measured."""

    def observe(self, lateness_s: float) -> None:
        """Counts one wake-up that came ``lateness_s`` late."""
        self.worst_s = max(self.worst_s, lateness_s)
        self.period_worst_s = max(self.period_worst_s, lateness_s)

    def report(self) -> None:
        """Logs the period's worst lateness when it matters, and starts a new period."""
        worst, self.period_worst_s = self.period_worst_s, 0.0
        if worst < self.report_s:
            return
        level = logging.WARNING if worst >= self.heartbeat_interval_s else logging.INFO
        log.log(level, "event loop lag: worst %.3f s in the last %.0f s (%.3f s since start; "
                "heartbeat interval %.2f s)", worst, self.period_s, self.worst_s,
                self.heartbeat_interval_s)

    async def run(self) -> None:
        """Ticks until cancelled; the last period is reported on the way out."""
        period_end = time.monotonic() + self.period_s
        try:
            while True:
                before = time.monotonic()
                await asyncio.sleep(self.tick_s)
                now = time.monotonic()
                self.observe(max(0.0, now - before - self.tick_s))
                if now >= period_end:
                    self.report()
                    period_end = now + self.period_s
        finally:
            self.report()
