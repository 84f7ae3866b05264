"""Windows close by time as well as by count, and a drain closes them at once.

Windows of an exactly-once job close every W records, or
``cluster.tracking_flush_s`` after processed batches began waiting for a
durable window: that timer is the snapshot cadence of a task that sees
fewer than W records per interval. A caller that drains is waiting for
exactly that window, so ``Client.drain`` asks for it now. In the drain test
the timer is 25 s: a drain that ends within 12 s (with every count right)
can only have ended by that request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.client import Client
from gridstream.config import Config
from gridstream.examples import wordcount
from gridstream.local import LocalCluster

pytestmark = pytest.mark.integration

FLUSH_TIMER_S = 25.0


@contextlib.asynccontextmanager
async def cadence_cluster(tmp_path: Path, window_size: int,
                          flush_s: float) -> AsyncIterator[LocalCluster]:
    """A local cluster whose windows close every ``window_size`` records or
    ``flush_s`` after tracked batches began waiting."""
    base = Config()
    config = replace(base, cluster=replace(base.cluster, window_size=window_size,
                                           tracking_flush_s=flush_s))
    async with LocalCluster(tmp_path, config, workers=2, state_servers=2) as local:
        yield local


async def test_drain_closes_pending_windows_without_waiting_for_the_timer(
    tmp_path: Path,
) -> None:
    # Windows of 100,000 records and a 25 s flush timer: a small job's last
    # window closes only when asked.
    lines = wordcount.generate(5_000, seed=11)
    async with (cadence_cluster(tmp_path, 100_000, FLUSH_TIMER_S) as cluster,
                Client(cluster.scheduler_address) as client):
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, lines)
        progress = await client.drain(job_id, timeout_s=FLUSH_TIMER_S / 2)
        assert sum(t.windows_persisted for t in progress.tasks) >= 1
        assert await client.results(job_id) == wordcount.reference(lines)


CADENCE_S = 0.3
"""The flush timer of the cadence test; W there is far above what it sends."""


async def test_a_busy_task_stores_a_window_every_flush_interval_below_w(
    tmp_path: Path,
) -> None:
    # Windows of 1,000,000 records and a 0.3 s flush timer: windows of a job
    # that sends less than W can only close by time.
    lines = wordcount.generate(40_000, seed=12)
    sent: list[str] = []
    async with (cadence_cluster(tmp_path, 1_000_000, CADENCE_S) as cluster,
                Client(cluster.scheduler_address) as client):
        job_id = await client.submit(wordcount.job())
        deadline = time.monotonic() + 30.0
        windows = 0
        # Keep sending (a batch per round, the stream never stops for a
        # drain) until the tasks have stored windows by time alone.
        for start in range(0, len(lines), 200):
            await client.send(job_id, lines[start:start + 200])
            sent.extend(lines[start:start + 200])
            progress = await client.progress(job_id)
            windows = sum(t.windows_persisted for t in progress.tasks)
            if windows >= 4 or time.monotonic() > deadline:
                break
            await asyncio.sleep(CADENCE_S / 10)  # a paced stream, not a readiness wait
        # Every task saw far fewer than W = 1,000,000 records: none closed by count.
        assert windows >= 4, (f"{windows} windows stored after {len(sent)} lines, far "
                              "below W: the flush timer closes no windows")
        await client.drain(job_id)
        assert await client.results(job_id) == wordcount.reference(sent)
