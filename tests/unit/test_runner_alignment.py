"""A batch for a partition the worker's table gives it is taken at once, even
when the table came before the worker aligned its tasks with it.

A worker can hold a new table before its tasks are aligned with it: the
table came with another call (a push for another partition, a replicator)
whose alignment is still under way, or not begun (heartbeats start it). A
push for a partition of that table used to be refused as "stale" (naming
this very worker as the owner), and its sender backed off until a heartbeat
brought the alignment: up to a few hundred milliseconds at every new job.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, cast

import pytest

from gridstream import rpc
from gridstream.config import Config
from gridstream.errors import StaleEpoch
from gridstream.jobspec import JobSpec, Stage
from gridstream.ring import HashRing, assign_partitions
from gridstream.routing import RoutingView
from gridstream.v1 import scheduler_pb2
from services.worker.node import WorkerNode

JOB = "job-aligned"
PARTITIONS = 6
VIRTUAL_NODES = 64
WORKERS = ["worker-1", "worker-2"]
SPEC = JobSpec("t", (Stage("same", "map", "gridstream.builtins:identity"),
                     Stage("store", "sink")), partitions=PARTITIONS, window_size=100)


def table(epoch: int, with_job: bool = True) -> scheduler_pb2.RoutingTable:
    """The table the scheduler makes when the job is submitted (or before)."""
    owners = assign_partitions(HashRing(WORKERS, VIRTUAL_NODES), JOB, PARTITIONS)
    result = scheduler_pb2.RoutingTable(epoch=epoch)
    for worker in WORKERS:
        result.members.append(scheduler_pb2.Member(
            node_id=worker, role=scheduler_pb2.MEMBER_ROLE_WORKER, address=f"{worker}:1",
            state=scheduler_pb2.MEMBER_STATE_ALIVE))
    if not with_job:
        return result
    result.jobs.append(scheduler_pb2.JobRouting(job_id=JOB, partitions=PARTITIONS,
                                                owners=owners, spec=SPEC.to_proto(),
                                                created_epoch=epoch))
    return result


async def test_a_push_is_taken_by_a_task_the_table_here_gives_this_worker() -> None:
    node_id = WORKERS[0]
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(2, with_job=False))
    owners = list(table(3).jobs[0].owners)
    mine, theirs = owners.index(node_id), owners.index(WORKERS[1])
    config = Config()
    config = replace(config, cluster=replace(config.cluster, backup_count=0))
    channels = rpc.ChannelPool()
    async with asyncio.TaskGroup() as group:
        node = WorkerNode(config, node_id, routing, channels, group)
        await node.sync()  # aligned with the table before the job's
        routing._apply(table(3))  # the job's table is here; nothing aligned the tasks with it
        node.deploy(JOB, SPEC.to_proto())  # as the scheduler's DeployJob does at submit
        assert not node.jobs[JOB].runners
        # The alignment is the heartbeat's own routine (catch_up), so a push
        # aligns exactly as a heartbeat would (the holder check that goes
        # with a newer epoch is the next test's).
        caught_up: list[int] = []
        catch_up = node.catch_up

        async def recorded(epoch: int) -> None:
            caught_up.append(epoch)
            await catch_up(epoch)

        node.catch_up = recorded  # type: ignore[method-assign]
        runner = await asyncio.wait_for(node.runner_for(JOB, 0, mine, 3), 10)
        assert caught_up == [3]
        assert runner.key == (JOB, 0, mine)
        # Every partition the table gives this worker is running now.
        assert set(node.jobs[JOB].runners) == {
            (0, p) for p, owner in enumerate(owners) if owner == node_id}
        # Another worker's partition is still refused, naming its owner.
        with pytest.raises(StaleEpoch, match=f"owned by {WORKERS[1]}, not {node_id}"):
            await node.runner_for(JOB, 0, theirs, 3)
        # A fenced worker (declared dead) starts nothing on the table it has:
        # it waits for a newer one, as its alignment does.
        await node.fence()
        # Read as stale (the prefix) by every sender, so they retry it.
        with pytest.raises(StaleEpoch, match=r"^stale epoch 3: .* is not running"):
            await node.runner_for(JOB, 0, mine, 3)
        assert not node.jobs[JOB].runners
        await node.close()
    await channels.close()


async def test_every_alignment_with_a_newer_epoch_has_the_primaries_check_their_holders(
        ) -> None:
    """Whichever call aligns the tasks with a newer table (a heartbeat's
    catch_up, or a push naming an epoch the worker had not seen, which syncs
    at once), every primary checks its backup holders: the new table may
    have replaced one, or one restarted empty. The alignment counts for the
    epoch, so the heartbeat does not align again; when only the heartbeat's
    path made the check, a push's alignment skipped it and a chaos run lost
    acknowledged records. The same epoch again checks nothing."""
    node_id = WORKERS[0]
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(3))
    config = Config()
    config = replace(config, cluster=replace(config.cluster, backup_count=1))
    channels = rpc.ChannelPool()
    async with asyncio.TaskGroup() as group:
        node = WorkerNode(config, node_id, routing, channels, group)
        await node.sync()
        runners = list(node.jobs[JOB].runners.values())
        assert runners and all(r.replicator is not None for r in runners)
        notified: list[str] = []
        for runner in runners:
            replicator = runner.replicator
            assert replicator is not None
            notify = replicator.notify

            def counted(notify: Any = notify, name: str = runner.operator_id) -> None:
                notified.append(name)
                notify()

            replicator.notify = counted  # type: ignore[method-assign]
        await node.sync()  # the same epoch: nothing changed
        assert notified == []
        routing._apply(table(4))  # a newer table, as a push's refresh brings it
        await node.sync()
        assert sorted(notified) == sorted(r.operator_id for r in runners)
        await node.close()
    await channels.close()
