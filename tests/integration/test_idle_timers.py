"""Processing-time timers fire on a partition that receives nothing more: a
job emits each key's count QUIET_S after the key's last record; once its
input stops, every key's count appears in the results without more input
(the partitions' ticks, services/worker/ticks.py), and the job still drains
with no loss and no dead letter."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gridstream.client import Client
from tests.integration import timer_ops

pytestmark = [pytest.mark.integration]

WAIT_S = 10.0
"""Bound on the wait for the timers' outputs after the last record."""


async def test_processing_timers_fire_after_the_input_stops(client: Client) -> None:
    keys = [f"k{i}" for i in range(40)]
    records = [{"k": keys[i % len(keys)], "i": i} for i in range(2_000)]
    job_id = await client.submit(timer_ops.quiet_counts(partitions=4).job())
    try:
        for start in range(0, len(records), 500):
            await client.send(job_id, records[start:start + 500])
        sent = time.time()
        expected = {k: sum(r["k"] == k for r in records) for k in keys}
        deadline = time.monotonic() + WAIT_S
        rows: dict[str, Any] = {}
        while time.monotonic() < deadline:
            rows = await client.results(job_id, sink="quiet")
            if len(rows) == len(keys):
                break
            await asyncio.sleep(0.1)  # polling with a deadline, not waiting for readiness
        assert {k: v["count"] for k, v in rows.items()} == expected
        for row in rows.values():
            # Fired by a tick: at or after the timer's time, which is QUIET_S
            # after the key's last batch was sent, and before the poll ended.
            assert row["due"] <= row["fired_at"] <= time.time()
            assert row["due"] <= sent + timer_ops.QUIET_S + 0.05
        await client.drain(job_id, timeout_s=30.0)
        assert await client.dead_letters(job_id) == []
        assert await client.results(job_id, sink="quiet") == rows  # nothing fired twice
    finally:
        await client.cancel(job_id)
