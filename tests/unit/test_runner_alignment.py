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
import contextlib
from collections.abc import AsyncIterator
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


@contextlib.asynccontextmanager
async def synced_node(epoch: int, backup_count: int) -> AsyncIterator[WorkerNode]:
    """worker-1 aligned with the job's table at ``epoch`` (no peers, no
    scheduler: its table is set here), closed afterwards."""
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(epoch))
    config = Config()
    config = replace(config, cluster=replace(config.cluster, backup_count=backup_count))
    channels = rpc.ChannelPool()
    async with asyncio.TaskGroup() as group:
        node = WorkerNode(config, WORKERS[0], routing, channels, group)
        await node.sync()
        yield node
        await node.close()
    await channels.close()


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
    async with synced_node(3, backup_count=1) as node:
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
        node.routing._apply(table(4))  # a newer table, as a push's refresh brings it
        await node.sync()
        assert sorted(notified) == sorted(r.operator_id for r in runners)


async def test_an_alignment_that_fails_part_way_is_done_again() -> None:
    """A sync that fails part-way (here the first task it stops ends in
    error) leaves the epoch unaligned, so the next call that aligns does it
    again and starts the partitions the table gives this worker. When the
    epoch counted as aligned from the start, they were never started: a
    chaos run's pushes were refused for minutes as "owned here, but not
    running"."""
    node_id = WORKERS[0]
    async with synced_node(3, backup_count=0) as node:
        swapped = table(4)  # every partition moves to the other worker
        owners = list(swapped.jobs[0].owners)
        swapped.jobs[0].owners[:] = [WORKERS[1] if o == node_id else node_id for o in owners]
        mine = {(0, p) for p, owner in enumerate(swapped.jobs[0].owners) if owner == node_id}
        assert mine and not mine & set(node.jobs[JOB].runners)
        stop_task = node._stop_task
        failures = [RuntimeError("a task that ended in error as it was stopped")]

        async def failing_once(runtime: Any, key: tuple[int, int]) -> None:
            if failures:
                raise failures.pop()
            await stop_task(runtime, key)

        node._stop_task = failing_once  # type: ignore[method-assign]
        node.routing._apply(swapped)
        with pytest.raises(RuntimeError, match="ended in error"):
            await node.sync()
        # The next call that aligns (a push here, a heartbeat's catch_up
        # alike) aligns again instead of refusing the push as not running.
        task, partition = min(mine)
        runner = await asyncio.wait_for(node.runner_for(JOB, task, partition, 4), 10)
        assert runner.key == (JOB, task, partition)
        assert set(node.jobs[JOB].runners) == mine


async def test_a_task_that_ends_in_error_as_it_stops_still_hands_its_log_over() -> None:
    """Stopping a task whose handle ends in error raises that error, but only
    once its container is closed: nothing more is committed here, and the
    log stays readable for the new owner."""
    async with synced_node(3, backup_count=0) as node:
        runtime = node.jobs[JOB]
        key = min(runtime.runners)
        runner = runtime.runners[key]
        supervised = runtime.handles[key]

        async def ends_in_error() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("ended in error as it stopped") from None

        runtime.handles[key] = asyncio.create_task(ends_in_error())
        await asyncio.sleep(0)  # it is waiting
        with pytest.raises(RuntimeError, match="ended in error"):
            await node._stop_task(runtime, key)
        assert runner.container.closed
        assert key not in runtime.runners
        supervised.cancel()
        await asyncio.gather(supervised, return_exceptions=True)
