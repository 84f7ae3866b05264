"""A member whose event loop is busy is not declared dead; a stuck one is.

Heartbeats come from a thread of their own (gridstream/member.py). Against a
real scheduler process, a member agent in this process holds its event loop
(``time.sleep`` on the loop: what a long step of a busy member does):

* for twice the detection time (~1.2 s with the defaults), it stays alive and
  the scheduler hears how long its loop was held (``loop_lag_ms``); when
  heartbeats came from the loop itself, this member was declared dead;
* past ``loop_stall_limit_s``, its heartbeats stop, it is declared dead by the
  detector, and once its loop runs again it fences and registers anew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.config import Config
from gridstream.local import LocalCluster
from gridstream.member import MemberAgent
from gridstream.types import MemberState, MemberStatus
from gridstream.v1 import scheduler_pb2

pytestmark = pytest.mark.integration

STALL_LIMIT_S = 3.0
DETECTION_S = 1.2
"""About how long the defaults take to convict a silent member."""


@pytest_asyncio.fixture
async def scheduler_only(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """A scheduler process and nothing else."""
    config = replace(Config(), cluster=replace(Config().cluster,
                                               loop_stall_limit_s=STALL_LIMIT_S))
    async with LocalCluster(tmp_path, config, workers=0, state_servers=0) as local:
        yield local


def _hold_the_loop(seconds: float) -> None:
    """Blocks the calling thread: called on the event loop, this is what a
    long step of a busy member does to it."""
    time.sleep(seconds)


async def _member(client: Client, node_id: str) -> MemberStatus:
    status = await client.status()
    return next(m for m in status.members if m.member.node_id == node_id)


async def _until(within_s: float, check: Callable[[], Awaitable[bool]]) -> None:
    """Polls ``check`` until it answers true; fails after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_busy_loop_stays_alive_and_a_stuck_one_is_convicted(
    scheduler_only: LocalCluster,
) -> None:
    fences: list[float] = []

    async def on_fence() -> None:
        fences.append(time.monotonic())

    agent = MemberAgent(scheduler_only.scheduler_address, "busy-1",
                        scheduler_pb2.MEMBER_ROLE_WORKER, "127.0.0.1:9", on_fence=on_fence,
                        loop_stall_limit_s=STALL_LIMIT_S)
    async with Client(scheduler_only.scheduler_address) as client, asyncio.TaskGroup() as group:
        beating = group.create_task(agent.run())
        await asyncio.wait_for(agent.registered.wait(), 10)

        # Busy: the loop is held for twice the detection time.
        _hold_the_loop(2 * DETECTION_S)
        held = await _member(client, "busy-1")
        assert held.member.state == MemberState.ALIVE, held
        assert held.loop_lag_s >= 1.5, held  # the scheduler heard how busy it was
        status = await client.status()
        assert not [e for e in status.events if e.node_id == "busy-1"
                    and e.new_state == MemberState.DEAD], status.events
        assert not fences

        # Stuck: held past the stall limit plus the detection time.
        _hold_the_loop(STALL_LIMIT_S + 2 * DETECTION_S)
        await _until(10, lambda: _was_declared_dead(client))
        await _until(10, lambda: _alive(client))  # it fenced and registered again
        assert fences, "the member rejoined without fencing"
        beating.cancel()
    await agent.close()


async def _was_declared_dead(client: Client) -> bool:
    status = await client.status()
    return any(e.node_id == "busy-1" and e.new_state == MemberState.DEAD
               and e.reason == "detector" for e in status.events)


async def _alive(client: Client) -> bool:
    status = await client.status()
    return any(m.member.node_id == "busy-1" and m.member.state == MemberState.ALIVE
               for m in status.members)
