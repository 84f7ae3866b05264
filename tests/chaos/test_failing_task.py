"""A task that cannot run on one worker (every batch raises there, whatever the
record) is restarted a few times, then its partition moves to another worker,
where it resumes from its snapshot and log: the job drains with exactly the
reference result, and its progress names every move."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.examples import wordcount
from gridstream.local import LocalCluster

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


async def test_partitions_move_off_a_worker_whose_tasks_keep_failing(tmp_path: Path) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=6,
                                                     task_restarts_before_move=2))
    lines = wordcount.generate(20_000, seed=21)
    async with (
        LocalCluster(tmp_path, config, workers=3,
                     extra_env={"GRIDSTREAM_FAULT_TASK_FAIL": "worker-2"}) as cluster,
        Client(cluster.scheduler_address, batch_size=500,
               security=cluster.config.security) as client,
    ):
        job_id = await client.submit(wordcount.job())
        before = list((await client._routing(job_id, refresh=True)).owners)
        assert "worker-2" in before
        await client.send(job_id, lines)
        progress = await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
        # Every partition worker-2 owned was moved off it (a partition that
        # the load bound then pushed onto worker-2 moves off in its turn).
        moved = {int(line.split(":")[0].rsplit("/p", 1)[1]) for line in progress.moved}
        assert {p for p, owner in enumerate(before) if owner == "worker-2"} <= moved
        assert all("moved off worker-2 after 2 restarts" in line and
                   "fault injection: tasks cannot run on worker-2" in line
                   for line in progress.moved), progress.moved
        assert "moving the partition to another worker" in cluster.logs("scheduler", tail=400)
