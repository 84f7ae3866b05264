"""A replication round calls a holder only when it has news for it.

A replicator is woken by appends, by durable windows and by routing changes.
A window that becomes durable while its roots are still pending moves no trim
bound, and at a drain such rounds were a third of a job's replication calls,
each carrying nothing. They are skipped. What must still happen: new entries
and a moved trim bound reach the holder, and after any membership change
every holder is called again, so a holder that restarted and lost its copy
is sent a full one.

The holders are real gRPC servers holding real backup stores.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gridstream import rpc
from gridstream.routing import RoutingView
from services.worker.queues import JobContainer
from services.worker.replicacalls import ReplicationCalls
from services.worker.replication import Replicator
from tests.unit.test_replication_handback import (
    JOB,
    WORKERS,
    Holder,
    holders,  # noqa: F401  (the fixture)
    table,
    until,
)


async def test_a_round_without_news_calls_no_holder_but_a_membership_change_calls_them_all(
        holders: tuple[dict[str, Holder], dict[str, str]]) -> None:  # noqa: F811
    stores, addresses = holders
    routing = RoutingView(cast(Any, None), 64)
    routing._apply(table(2, WORKERS, addresses))
    partition = 0
    primary = routing.owner(JOB, partition)
    assert primary is not None
    [holder] = routing.backups(JOB, partition, 1)
    store = stores[holder]

    key = (JOB, 0, partition)
    container = JobContainer(f"{JOB}/t0/p{partition}", max_records=1_000)
    trim = [0]
    channels = rpc.ChannelPool()
    replicator = Replicator(key, container, primary, routing, ReplicationCalls(channels), 1,
                            lambda: trim[0], lambda: 2)
    running = asyncio.create_task(replicator.run())
    try:
        for sequence in (1, 2):
            await container.append("src/a", sequence, None, [sequence])
            replicator.notify()
            await container.wait_committed(sequence - 1, timeout_s=10)
        assert store.store.logs[key].next_offset == 2
        calls = store.replications

        # Woken with nothing appended and the trim bound where it was (a
        # window durable while its roots are pending): no call.
        for _ in range(5):
            replicator.notify()
            await until(lambda: not replicator._wake.is_set(), "the round did not run")
            await asyncio.sleep(0.02)
        assert store.replications == calls, "a round with nothing new called the holder"

        # The trim bound moves: the holder hears of it, once.
        trim[0] = 1
        replicator.notify()
        await until(lambda: store.store.logs[key].base == 1, "the trim did not reach the holder")
        assert store.replications == calls + 1
        replicator.notify()
        await asyncio.sleep(0.05)
        assert store.replications == calls + 1

        # The holder restarts and loses its copy; the membership change
        # advances the epoch and wakes the replicator, which finds the loss
        # and sends a full copy although nothing new was appended.
        del store.store.logs[key]
        routing._apply(table(3, WORKERS, addresses))
        replicator.notify()
        await until(lambda: key in store.store.logs and store.store.logs[key].next_offset == 2,
                    "the holder that lost its copy was not sent a full one")
        # The holder applies the copy before its answer reaches the replicator.
        await until(lambda: replicator.synced_epoch == 3,
                    "the round that sent the full copy did not end at the new epoch")
    finally:
        running.cancel()
        try:
            await running
        except asyncio.CancelledError:
            pass
        await channels.close()
