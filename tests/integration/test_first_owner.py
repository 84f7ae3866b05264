"""A new job's tasks start without recovery, and only they do.

The first table that lists a job carries its ``created_epoch``; a worker
that starts a task from a table of exactly that epoch, for the first time,
is its first owner ever and reads no state and fetches no log (the saving is
two state-server claims, two log fetches and two empty replications per task
of every job). Any later start recovers as before: after a scheduler restart
the epoch is never the created one again, and a worker killed then hands its
partitions to owners that restore, losing nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.examples import wordcount
from gridstream.local import LocalCluster

pytestmark = [pytest.mark.integration]

PARTITIONS = 6
TASKS = 2  # wordcount: split, then count and store


async def sources_took(client: Client, job_id: str) -> int:
    """Lines the job's first task has taken so far."""
    progress = await client.progress(job_id)
    return sum(task.records_in for task in progress.tasks if task.task == 0)


def worker_logs(cluster: LocalCluster) -> str:
    return "\n".join(member.log_path.read_text(errors="replace")
                     for name, member in cluster.members.items() if name.startswith("worker"))


async def test_a_new_jobs_tasks_skip_recovery_and_later_owners_recover(
        tmp_path: Path) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=PARTITIONS))
    lines = wordcount.generate(300_000, seed=8)
    half = len(lines) // 2
    async with (
        LocalCluster(tmp_path, config, workers=3, state_servers=2, supervise=True,
                     restart_delay_s=0.5) as cluster,
        Client(cluster.scheduler_address, batch_size=200,
               security=cluster.config.security) as client,
    ):
        job_id = await client.submit(wordcount.job())
        table = await client._fetch_table()
        routing = next(job for job in table.jobs if job.job_id == job_id)
        # Nothing else changed membership meanwhile: this is the job's first table.
        assert routing.created_epoch == table.epoch > 0

        await client.send(job_id, lines[:half])
        await client.drain(job_id, timeout_s=60)
        logs = worker_logs(cluster)
        first = [line for line in logs.splitlines()
                 if job_id in line and "started as the job's first owner" in line]
        assert len(first) == TASKS * PARTITIONS, first
        assert f"{job_id}/t0/p0 started: snapshot window" not in logs

        # A restarted scheduler never serves the created epoch again.
        cluster.kill("scheduler")
        await client.drain(job_id, timeout_s=60)  # asks until the scheduler is back
        table = await client._fetch_table()
        after = next(job for job in table.jobs if job.job_id == job_id)
        assert after.created_epoch == 0
        assert table.epoch > routing.created_epoch

        # Owners from now on recover: a worker killed while the second half
        # is on its way loses nothing.
        victim = after.owners[0]
        sending = asyncio.ensure_future(client.send(job_id, lines[half:]))
        for _ in range(1_000):  # polling the counters (at most 10 s), not a guess
            if await sources_took(client, job_id) >= half + 2_000 or sending.done():
                break
            await asyncio.sleep(0.01)
        assert not sending.done(), "the second half went through before the kill"
        cluster.kill(victim)
        await sending
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
        recovered = [line for line in worker_logs(cluster).splitlines()
                     if job_id in line and " started: snapshot window " in line]
        assert recovered, "no task of the killed worker was restored by another"
