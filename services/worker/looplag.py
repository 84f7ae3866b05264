"""How long the worker's event loop was held.

Acknowledgements, replication and tracking share one event loop with
snapshotting and restoring state. A step that holds the loop delays all of
them (heartbeats have a thread of their own, gridstream/member.py, so a
busy worker is not convicted; a loop stuck for ``cluster.loop_stall_limit_s``
stops them). :class:`LoopLagMonitor` wakes every ``tick_s`` and
measures how late it woke; the worst lateness of each ``period_s`` is logged
(INFO from ``report_s``, WARNING from a heartbeat interval) so a stall is
named with its size, and :attr:`LoopLagMonitor.worst_s` keeps the worst
since the start for status and benchmarks. A stall that lasts a heartbeat
interval is also named by *where* it is: a watcher thread logs the loop
thread's stack while it is still held, once per stall, so the step to chunk
or move off the loop is in the log, not left to guessing.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger(__name__)


class LoopLagMonitor:
    """Measures the event loop's lateness beside the heartbeats.

    Costs one wake-up per ``tick_s``; lateness below ``report_s`` is not
    logged (a loaded machine's scheduling noise). The log line
    ``event loop lag: worst <s> s`` is what ``bench/recovery.py`` reads.

    ``tick_s`` is 50 ms, the heartbeat pulse's period (gridstream.member):
    a wake-up of a worker's loop costs about 0.1 ms of CPU, and at 20 ms
    the monitor's own wake-ups were about a quarter of an idle worker's CPU
    (22 ms a second; 15 to 17 ms with this tick and the watcher's 0.1 s
    checks). A stall still shows in full but for at most one tick: the
    first wake-up due inside it comes as late as the stall lasted after it
    was due.
    """

    def __init__(self, heartbeat_interval_s: float, tick_s: float = 0.05,
                 period_s: float = 2.0, report_s: float = 0.05) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.tick_s = tick_s
        self.period_s = period_s
        self.report_s = report_s
        self.worst_s = 0.0
        """Worst lateness since the monitor started."""
        self.period_worst_s = 0.0
        """Worst lateness of the period being measured."""
        self.worst_held_s = 0.0
        """Worst lateness the loop thread spent computing (its CPU time over
        the late tick, at most the lateness): what a step of ours holds the
        loop for. The rest of a lateness is the thread not computing: the
        machine not running the process (a loaded host), which no chunking on
        our side can shorten, or a blocking call (the stall watcher's stack
        names it)."""
        self.period_worst_held_s = 0.0

    def observe(self, lateness_s: float, held_s: float = 0.0) -> None:
        """Counts one wake-up that came ``lateness_s`` late, ``held_s`` of it
        with the loop thread computing."""
        self.worst_s = max(self.worst_s, lateness_s)
        self.period_worst_s = max(self.period_worst_s, lateness_s)
        held_s = min(held_s, lateness_s)
        self.worst_held_s = max(self.worst_held_s, held_s)
        self.period_worst_held_s = max(self.period_worst_held_s, held_s)

    def report(self) -> None:
        """Logs the period's worst lateness when it matters, and starts a new period."""
        worst, self.period_worst_s = self.period_worst_s, 0.0
        held, self.period_worst_held_s = self.period_worst_held_s, 0.0
        if worst < self.report_s:
            return
        level = logging.WARNING if worst >= self.heartbeat_interval_s else logging.INFO
        log.log(level, "event loop lag: worst %.3f s in the last %.0f s, %.3f s of it computing "
                "(since start: %.3f s, computing %.3f s; heartbeat interval %.2f s)", worst,
                self.period_s, held, self.worst_s, self.worst_held_s, self.heartbeat_interval_s)

    async def run(self) -> None:
        """Ticks until cancelled; the last period is reported on the way out."""
        period_end = time.monotonic() + self.period_s
        watcher = StallWatcher(threading.get_ident(), self.heartbeat_interval_s)
        watcher.start()
        try:
            while True:
                before, cpu_before = time.monotonic(), time.thread_time()
                await asyncio.sleep(self.tick_s)
                now = time.monotonic()
                watcher.ticked(now)
                self.observe(max(0.0, now - before - self.tick_s),
                             time.thread_time() - cpu_before)
                if now >= period_end:
                    self.report()
                    period_end = now + self.period_s
        finally:
            watcher.stop()
            self.report()


class StallWatcher:
    """A thread that logs where the event loop is held while it is held.

    The loop calls :meth:`ticked` at every wake-up; when none came for
    ``threshold_s``, the thread takes the loop thread's current stack
    (``sys._current_frames``) and logs it at WARNING, once per stall. It
    sleeps ``check_s`` between checks (a tenth of a second: a stall is
    named while it lasts, within a check of reaching ``threshold_s``); it is
    a daemon and :meth:`stop` joins it.
    """

    def __init__(self, loop_thread: int, threshold_s: float, check_s: float = 0.1) -> None:
        self.loop_thread = loop_thread
        self.threshold_s = threshold_s
        self.check_s = check_s
        self.stalls_logged = 0
        self._last_tick = time.monotonic()
        self._reported_tick = -1.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop stall watcher",
                                        daemon=True)
        self._gc_started = self._gc_cpu_started = 0.0
        self.last_collection: tuple[int, float, float] | None = None
        """(generation, seconds, when it ended) of the latest garbage
        collection: the watcher cannot run during one (the collector holds
        the GIL), so a stall it caused is named by its duration instead."""

    def start(self) -> None:
        """Starts watching."""
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        if phase == "start":
            self._gc_started, self._gc_cpu_started = now, cpu
            return
        # Its CPU time, not its wall time: a loaded machine that does not run
        # the process during a short collection is not the collector's doing.
        took = cpu - self._gc_cpu_started
        self.last_collection = (info["generation"], took, now)
        if took >= self.threshold_s:
            log.warning("a garbage collection of generation %d held the event loop for %.2f s "
                        "of CPU time (%.2f s in all; %d objects freed)", info["generation"],
                        took, now - self._gc_started, info["collected"])

    def ticked(self, now: float) -> None:
        """The loop woke up at ``now``."""
        self._last_tick = now

    def stop(self) -> None:
        """Stops the thread and waits for it."""
        self._stopped.set()
        self._thread.join(timeout=1.0)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _watch(self) -> None:
        while not self._stopped.wait(self.check_s):
            last = self._last_tick
            held = time.monotonic() - last
            if held < self.threshold_s or last == self._reported_tick:
                continue
            self._reported_tick = last
            frame = sys._current_frames().get(self.loop_thread)
            if frame is None:
                continue
            stack = "".join(traceback.format_stack(frame, limit=12))
            collection = self.last_collection
            during = ("" if collection is None or collection[2] < last
                      or collection[1] < held / 4 else
                      f", {collection[1]:.2f} s of it in a garbage collection of generation "
                      f"{collection[0]}")
            self.stalls_logged += 1
            log.warning("event loop held for %.2f s so far (heartbeat interval %.2f s)%s, "
                        "at:\n%s", held, self.threshold_s, during, stack.rstrip())
