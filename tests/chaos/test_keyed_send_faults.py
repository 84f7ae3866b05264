"""A keyed send that pushes while it still packs loses nothing and counts
nothing twice when workers are killed under it.

One send of 240,000 taxi records (ASCII, so it streams) in batches of 2,048,
119 packing steps: a worker is killed when the send has made 30 steps and
another at 60, the second before the cluster has healed from the first, both
while pushes of the send are under way and batches are still to be packed
(with ``backup_count = 2``, which two kills close together stay within).
The client gives a push one second, so pushes to the dead workers end with
an unknown outcome: the partition's batch is held with its sequence and the
batches packed after it are kept unsent, and flushes push them once the
partitions have moved. Every device's track (an order-sensitive string)
must equal the fault-free reference.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridstream import client as client_module
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.errors import GridstreamError
from gridstream.examples import taxi
from gridstream.local import LocalCluster
from gridstream.sendbatches import packed_steps
from gridstream.v1 import worker_pb2

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]

RECORDS = 240_000
BATCH_SIZE = 2_048
KILLS = {30: "worker-1", 60: "worker-2"}
"""Packing steps made -> the worker killed right then."""


class KillingClient(Client):
    """Kills a worker (by its PID, through the cluster) when its send has
    packed a given number of steps, and notes what the send had done by then."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster.scheduler_address, batch_size=BATCH_SIZE,
                         send_timeout_s=1.0, security=cluster.config.security)
        self.cluster = cluster
        self.started = 0
        self.acked = 0
        self.steps_made = 0
        self.steps_at_first_push: int | None = None
        self.kills: list[tuple[str, int]] = []
        """(worker, pushes begun) at each kill."""

    async def _push(self, job_id: str, segment: worker_pb2.Segment) -> None:
        if self.steps_at_first_push is None:
            self.steps_at_first_push = self.steps_made
        self.started += 1
        await super()._push(job_id, segment)
        self.acked += 1

    def step_made(self) -> None:
        """Counts a packing step; kills the worker due at this step."""
        self.steps_made += 1
        victim = KILLS.get(self.steps_made)
        if victim is not None:
            self.cluster.kill(victim)
            self.kills.append((victim, self.started))


async def test_a_streamed_keyed_send_survives_two_kills_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two copies of every batch besides the owner's: the second kill comes
    # before the first worker is back, within what backup_count=2 survives.
    config = replace(Config(), cluster=ClusterConfig(window_size=4_000, partitions=12,
                                                     backup_count=2))
    keys, values = taxi.keyed(RECORDS, devices=2_000)
    total_steps = RECORDS // BATCH_SIZE + (1 if RECORDS % BATCH_SIZE else 0) + 1
    async with LocalCluster(tmp_path, config, workers=3, state_servers=2, supervise=True,
                            restart_delay_s=2.0) as cluster:
        sdk = KillingClient(cluster)

        def counting(*args: Any) -> Iterator[Any]:
            for step in packed_steps(*args):
                sdk.step_made()
                yield step

        monkeypatch.setattr(client_module, "packed_steps", counting)
        async with sdk:
            job_id = await sdk.submit(taxi.job(prepartitioned=True))
            failures = 0
            try:
                await sdk.send(job_id, values, keys)
            except GridstreamError:
                failures += 1  # held and unsent batches: flushed below, never sent again
            deadline = time.monotonic() + 120
            while True:
                try:
                    await sdk.flush(job_id)
                    break
                except GridstreamError:
                    failures += 1
                    assert time.monotonic() < deadline, "the flushes never got through"
            await sdk.drain(job_id, timeout_s=120)
            results = await sdk.results(job_id)

    assert sdk.steps_made == total_steps > max(KILLS)  # both kills came while packing
    assert sdk.steps_at_first_push is not None and sdk.steps_at_first_push < min(KILLS)
    assert [victim for victim, _ in sdk.kills] == ["worker-1", "worker-2"]
    # Pushes of the send were under way at the first kill (records in flight),
    # and batches were still to come for the partitions of the dead owners.
    assert 0 < sdk.kills[0][1] <= sdk.kills[1][1], sdk.kills
    assert failures >= 1, "no push met a dead worker: the faults had no teeth"
    assert results == taxi.reference(values)
