"""A drain asks the tasks to close their pending windows at once.

Windows of an exactly-once job close every W records, or
``cluster.tracking_flush_s`` after processed batches began waiting for a
durable window. A caller that drains is waiting for exactly that window, so
``Client.drain`` asks for it now. Here the timer is 25 s: a drain that ends
within 12 s (with every count right) can only have ended by that request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.config import Config
from gridstream.examples import wordcount
from gridstream.local import LocalCluster

pytestmark = pytest.mark.integration

FLUSH_TIMER_S = 25.0


@pytest_asyncio.fixture
async def slow_timer_cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Windows of 100,000 records and a 25 s flush timer: a small job's last
    window closes only when asked."""
    base = Config()
    config = replace(base, cluster=replace(base.cluster, window_size=100_000,
                                           tracking_flush_s=FLUSH_TIMER_S))
    async with LocalCluster(tmp_path, config, workers=2, state_servers=2) as local:
        yield local


async def test_drain_closes_pending_windows_without_waiting_for_the_timer(
    slow_timer_cluster: LocalCluster,
) -> None:
    lines = wordcount.generate(5_000, seed=11)
    async with Client(slow_timer_cluster.scheduler_address) as client:
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, lines)
        progress = await client.drain(job_id, timeout_s=FLUSH_TIMER_S / 2)
        assert sum(t.windows_persisted for t in progress.tasks) >= 1
        assert await client.results(job_id) == wordcount.reference(lines)
