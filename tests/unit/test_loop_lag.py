"""The worker's event-loop lag monitor names a stall with its size."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from services.worker.looplag import LoopLagMonitor


def hold_loop(seconds: float) -> None:
    """Computes for ``seconds`` of this thread's CPU time without yielding,
    like a step that holds the loop (CPU time, so a loaded machine that
    runs the thread only part of the time still sees it compute that long)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def test_a_stall_is_measured_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor(heartbeat_interval_s=0.25, tick_s=0.01, period_s=0.2)
    caplog.set_level(logging.INFO, logger="services.worker.looplag")
    task = asyncio.create_task(monitor.run())
    await asyncio.sleep(0.05)
    assert monitor.worst_s < 0.25  # the monitor is running and nothing stalled yet
    hold_loop(0.3)  # a step that holds the loop
    await asyncio.sleep(0.05)  # the monitor's next tick (due during the stall) measures it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 0.25 <= monitor.worst_s < 10.0
    assert monitor.worst_held_s >= 0.2  # the loop thread was computing, not starved
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "event loop lag: worst" in r.getMessage()]
    assert warnings, caplog.text
    where = [r.getMessage() for r in caplog.records if "event loop held for" in r.getMessage()]
    assert len(where) == 1 and "hold_loop" in where[0], caplog.text  # once, naming the step


def test_small_lateness_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor(heartbeat_interval_s=0.25, report_s=0.05)
    caplog.set_level(logging.INFO, logger="services.worker.looplag")
    monitor.observe(0.01)
    monitor.report()
    monitor.observe(0.08)
    monitor.report()
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert monitor.worst_s == 0.08 and monitor.period_worst_s == 0.0


async def test_a_blocked_loop_thread_is_not_counted_as_computing() -> None:
    # A blocking wait (like a starved process) delays the loop without CPU.
    monitor = LoopLagMonitor(heartbeat_interval_s=0.25, tick_s=0.01, period_s=0.2)
    task = asyncio.create_task(monitor.run())
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # noqa: ASYNC251 - holds the loop, computing nothing
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert monitor.worst_s >= 0.25
    assert monitor.worst_held_s < 0.1
