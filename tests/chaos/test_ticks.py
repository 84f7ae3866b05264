"""Processing-time timers on idle partitions across a kill -9: each key's
count is emitted once per quiet spell (a tick fires it), and a worker killed
just after its ticks fired, before their windows are all durable, neither
loses a firing nor repeats one (its partitions' new owners replay the ticks
from the replicated log, with the same times)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridstream.chaos import wait_healthy
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.local import LocalCluster
from tests.integration import timer_ops
from tests.integration.conftest import TEST_JOB_MODULES

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

WAIT_S = 15.0


async def firings(client: Client, job_id: str, keys: list[str], per_key: int) -> list[Any]:
    """The append sink's rows once every key fired ``per_key`` times (or the deadline)."""
    deadline = time.monotonic() + WAIT_S
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = list((await client.results(job_id, sink="quiet")).values())
        if len(rows) >= per_key * len(keys):
            break
        await asyncio.sleep(0.1)
    return rows


async def test_idle_timers_fire_once_each_across_a_kill(tmp_path: Path) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=6,
                                                     job_modules=TEST_JOB_MODULES))
    keys = [f"k{i}" for i in range(30)]
    records = [{"k": keys[i % len(keys)], "i": i} for i in range(1_500)]
    each = len(records) // len(keys)
    async with (LocalCluster(tmp_path, config, workers=3, state_servers=2) as cluster,
                Client(cluster.scheduler_address, batch_size=500) as client):
        job_id = await client.submit(timer_ops.quiet_counts(6, mode="append").job())
        await client.send(job_id, records)
        first = await firings(client, job_id, keys, 1)
        assert Counter(r["key"] for r in first) == dict.fromkeys(keys, 1)
        cluster.kill("worker-2")  # right after its ticks: windows not all durable
        await wait_healthy(client, job_id, workers=2, timeout_s=30)
        await client.send(job_id, records)
        rows = await firings(client, job_id, keys, 2)
        await client.drain(job_id, timeout_s=60.0)
        rows = list((await client.results(job_id, sink="quiet")).values())
        assert sorted((r["key"], r["count"]) for r in rows) == sorted(
            [(k, each) for k in keys] + [(k, 2 * each) for k in keys])
        assert all(r["due"] <= r["fired_at"] for r in rows)
        assert await client.dead_letters(job_id) == []
        await client.cancel(job_id)
