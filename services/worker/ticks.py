"""Ticks: processing time for a partition that receives nothing.

A timed ``stateful`` stage's processing time is the time recorded with the
batch being processed (services.worker.timers), so that a replay sees the
same times (design invariant 6). Without more, a partition that receives no
batch would never fire a processing-time timer. So a task whose chain can set
processing-time timers runs a :class:`Ticker`: every :data:`CHECK_S`, when
the task is idle (nothing queued) and its earliest processing-time timer is
due by the wall clock, it appends a *tick*: an empty batch on the channel
:func:`tick_channel` of its own, numbered after the container's last
sequence on that channel, with the wall-clock time as its recorded time.

A tick goes through the same append path as any batch: it is replicated
before it is processed, a replay from the log sees the same tick with the
same time, and a new owner after a failover numbers its ticks after the ones
its log copy or snapshot holds (a tick it numbers again was never committed,
so never processed). Processing it moves the chain's processing time to the
tick's time, which fires the due timers; their outputs go downstream like
any output, carrying the tick's time.

Ticks are outside tuple tracking: a tick's root is
:data:`~gridstream.ids.UNTRACKED_ROOT`, which its outputs inherit, and a task
retains no batch of it (TaskTracking.retain) and owes no contribution for
one. No tracker ever hears of such a tree, so none times out or is reported
lost, and a source's pending roots (the drain check) never include one. Its
batches are still exactly-once by the idempotence rule, acknowledged only
once replicated, and a loss of them beyond ``backup_count`` is still named
by the receiving container's sequence gaps.

Once the task has been idle ``tracking_flush_s`` after a tick, the ticker has
its window closed (as the tracking flush timer does for tracked batches), so
what the timers changed becomes durable and the ticks are trimmed from the
log rather than kept while no record comes.

Cost: a job without a timed stage that has ``on_timer`` runs no ticker. A
ticker reads one cached number per timed stage every 100 ms, and appends at
most one tick at a time (the next only once the last was processed), and
only while a timer is due.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gridstream import codec
from gridstream.ids import UNTRACKED_ROOT
from services.worker.queues import ContainerClosed
from services.worker.timers import TimerStep

if TYPE_CHECKING:
    from services.worker.tasks import TaskRunner

log = logging.getLogger(__name__)

CHECK_S = 0.1
"""How often an idle task looks whether a processing-time timer is due."""
COMMIT_TIMEOUT_S = 5.0
"""How long a tick's append and commit may take before the ticker looks again
(the tick stays queued meanwhile, so no second one is appended)."""
TICK_CHANNEL_PREFIX = "tick/"
"""Channels of ticks: never a client's (``src/``) nor a task's (``t<i>/``)."""


def tick_channel(partition: int) -> str:
    """The channel a partition's ticks are appended on."""
    return f"{TICK_CHANNEL_PREFIX}p{partition}"


def next_tick_sequence(sequences: Mapping[str, int], partition: int) -> int:
    """The sequence of the partition's next tick: after the highest the
    container holds on the tick channel (its log, or a snapshot's sequences
    after a restore)."""
    return sequences.get(tick_channel(partition), 0) + 1


def timed_steps(windows: Sequence[object]) -> list[TimerStep]:
    """The chain's stages that can fire processing-time timers."""
    return [w for w in windows if isinstance(w, TimerStep) and w.on_timer is not None]


def earliest_timer(steps: Sequence[TimerStep]) -> float:
    """The earliest pending processing-time timer of the stages (inf: none)."""
    return min((step.next_processing_timer() for step in steps), default=math.inf)


def tick_due(wall: float, earliest: float, queued_batches: int) -> bool:
    """Whether to append a tick: the task is idle (no batch queued, a tick
    included) and a processing-time timer is due by the wall clock."""
    return queued_batches == 0 and earliest <= wall


class Ticker:
    """Appends a task's ticks (see the module docstring)."""

    def __init__(self, runner: TaskRunner, steps: list[TimerStep],
                 clock: Callable[[], float] = time.time) -> None:
        self.runner = runner
        self.steps = steps
        self.clock = clock
        self.channel = tick_channel(runner.partition)
        self.ticks = 0
        """Ticks appended by this runner."""
        self._unclosed = False
        """A tick was appended since the ticker last asked for a window close."""

    async def run(self) -> None:
        """Checks every :data:`CHECK_S` until the task ends."""
        runner = self.runner
        while True:
            await asyncio.sleep(CHECK_S)
            wall = self.clock()
            queued = runner.container.pending_batches
            if not tick_due(wall, earliest_timer(self.steps), queued):
                if self._unclosed and queued == 0:
                    await self._close_window()
                continue
            try:
                await self._tick(wall)
            except ContainerClosed:
                return  # the partition moved away; its task is ending
            except TimeoutError:
                log.info("%s: a processing-time tick is slow to commit; it stays queued",
                         runner.operator_id)

    async def _tick(self, wall: float) -> None:
        # The container's append is one step (no await between its duplicate
        # check and the entry going in), so a cancel leaves either no tick or
        # a whole one, which is then replicated and committed as any batch is.
        runner = self.runner
        batch = codec.encode_batch([])
        batch.ingest_unix_s = wall  # the recorded time: what processing it reads
        sequence = next_tick_sequence(runner.container.sequences(), runner.partition)
        commit = await runner.append(self.channel, sequence, None, [], COMMIT_TIMEOUT_S,
                                     batch, root=UNTRACKED_ROOT)
        self.ticks += 1
        self._unclosed = True
        await commit()

    async def _close_window(self) -> None:
        """Has the window the ticks went into closed once the task has been
        idle ``tracking_flush_s`` since the last close, as a tracked batch's
        window is: what the timers changed becomes durable, and the ticks
        leave the log instead of piling up while no record comes."""
        runner = self.runner
        if time.monotonic() - runner._last_close < runner.tracking_flush_s:
            return
        self._unclosed = False
        if runner.window.batches:
            runner._close_requested = True
            await runner.container.poke()


def ticker_of(runner: TaskRunner) -> Ticker | None:
    """The task's ticker, or None when its chain sets no processing-time timers."""
    steps = timed_steps(runner.chain.windows)
    return Ticker(runner, steps) if steps else None
