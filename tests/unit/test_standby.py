"""Warm standby state (services/worker/standby.py) and where it is kept.

- A partition's first backup holder is the worker the scheduler gives the
  partition when its owner dies, so the standby is where the takeover runs.
- Shipped windows apply in chain order; a window that does not chain makes
  the standby catch up from the state servers (deltas after its window, or a
  whole state), and windows that arrived meanwhile are applied after.
- A standby that is catching up is never handed to a takeover.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import msgpack
import pytest

from gridstream import codec
from gridstream import routing as routing_module
from gridstream.ids import partition_for_key
from gridstream.jobspec import JobSpec, Stage, plan_tasks
from gridstream.ring import HashRing, assign_partitions, ring_of
from gridstream.routing import RoutingView
from gridstream.statewindows import StateWindowRead, StoredState
from gridstream.v1 import scheduler_pb2, worker_pb2
from services.worker.standby import JobPlan, StandbyStore

JOB = "job-1"
PARTITIONS = 12
STAGE = "count"
VIRTUAL_NODES = 64


def table(workers: list[str], partitions: int = PARTITIONS) -> scheduler_pb2.RoutingTable:
    """A routing table as the scheduler builds it for these live workers."""
    owners = assign_partitions(HashRing(workers, VIRTUAL_NODES), JOB, partitions)
    result = scheduler_pb2.RoutingTable(epoch=1)
    for worker in workers:
        result.members.append(scheduler_pb2.Member(
            node_id=worker, role=scheduler_pb2.MEMBER_ROLE_WORKER, address=f"{worker}:1",
            state=scheduler_pb2.MEMBER_STATE_ALIVE))
    result.jobs.append(scheduler_pb2.JobRouting(job_id=JOB, partitions=partitions,
                                                owners=owners))
    return result


def view(workers: list[str], partitions: int = PARTITIONS) -> RoutingView:
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(workers, partitions))
    return routing


@pytest.mark.parametrize("count", [3, 4, 5, 7])
@pytest.mark.parametrize("partitions", [12, 31, 64])
def test_the_first_backup_holder_is_the_owner_after_the_owner_dies(count: int,
                                                                   partitions: int) -> None:
    workers = [f"worker-{i}" for i in range(count)]
    routing = view(workers, partitions)
    for dead in workers:
        after = assign_partitions(HashRing([w for w in workers if w != dead], VIRTUAL_NODES),
                                  JOB, partitions)
        for partition, owner in enumerate(routing.owners[JOB]):
            holders = routing.backups(JOB, partition, 2)
            assert owner not in holders and len(set(holders)) == 2
            if owner == dead:
                assert after[partition] == holders[0], (dead, partition)


@pytest.mark.parametrize(("count", "partitions"), [(3, 12), (4, 24), (5, 12), (6, 40), (7, 64)])
def test_whoever_takes_a_partition_after_any_single_death_keeps_its_standby(
        count: int, partitions: int) -> None:
    # A death moves the dead worker's partitions and, bounded load, a few
    # partitions between survivors: each new owner keeps a warm standby.
    workers = [f"worker-{i}" for i in range(count)]
    routing = view(workers, partitions)
    moved_between_survivors = 0
    for dead in workers:
        after = assign_partitions(HashRing([w for w in workers if w != dead], VIRTUAL_NODES),
                                  JOB, partitions)
        for partition, owner in enumerate(routing.owners[JOB]):
            holders = routing.standby_holders(JOB, partition, 1)
            assert owner not in holders
            assert holders[0] == routing.backups(JOB, partition, 1)[0]  # the log holder first
            if after[partition] != owner:
                assert after[partition] in holders, (dead, partition)
                moved_between_survivors += owner != dead
    assert moved_between_survivors > 0  # the case this covers happens


def packed(entries: dict[str, int | None]) -> bytes:
    """A shipped chunk: [stage, key, value] or [stage, key], key and value packed apart."""
    pack = msgpack.Packer(use_bin_type=True).pack
    return codec.pack([[STAGE, pack(k)] if v is None else [STAGE, pack(k), pack(v)]
                       for k, v in entries.items()])


def window(number: int, parent: int | None, entries: dict[str, int | None], *,
           epoch: int = 1, omitted: bool = False) -> worker_pb2.ShipStateRequest:
    return worker_pb2.ShipStateRequest(
        job_id=JOB, task=1, partition=PARTITION, epoch=epoch, primary="worker-0",
        window=number, has_parent=parent is not None, parent_window=parent or 0,
        header=codec.pack({"window": number}), chunks=[] if omitted else [packed(entries)],
        omitted=omitted)


def stored(windows: list[tuple[int, int | None, dict[str, int | None]]]) -> StoredState:
    """What the state servers hand out: windows of [stage, key, value] entries."""
    reads = [StateWindowRead(n, parent, codec.pack({"window": n}),
                             [codec.pack([[STAGE, k] if v is None else [STAGE, k, v]
                                          for k, v in entries.items()])])
             for n, parent, entries in windows]
    return StoredState(windows[-1][0], reads[-1].header, reads)


class FakeStateServers:
    """The state servers' reads, as a unit test needs them: answers queued in order."""

    def __init__(self) -> None:
        self.answers: list[StoredState | None] = []
        self.asked: list[int | None] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def read_state(self, job_id: str, operator_id: str, epoch: int,
                         after: int | None = None) -> StoredState | None:
        assert epoch == 0, "a standby reads without claiming the operator"
        self.asked.append(after)
        await self.gate.wait()
        return self.answers.pop(0)


WORKERS = ["worker-0", "worker-1", "worker-2"]
ROUTING = view(WORKERS)
PARTITION = next(p for p, owner in enumerate(ROUTING.owners[JOB]) if owner == "worker-0")
HOLDER = ROUTING.backups(JOB, PARTITION, 1)[0]
KEY = (JOB, 1, PARTITION)


def deployed(spec: JobSpec, tasks: list[list[Stage]]) -> Callable[[str], JobPlan | None]:
    """The worker's view of job ``JOB`` deployed with ``spec`` and ``tasks``."""
    plan = SimpleNamespace(spec=spec, tasks=tasks)
    return lambda job_id: cast(JobPlan, plan) if job_id == JOB else None


def store(servers: FakeStateServers) -> StandbyStore:
    from gridstream.examples import wordcount
    tasks = plan_tasks(wordcount.job(partitions=PARTITIONS))
    assert tasks[1][0].name == STAGE
    return StandbyStore(HOLDER, ROUTING, cast(Any, None), cast(Any, servers),
                        deployed(wordcount.job(partitions=PARTITIONS), tasks), 1)


def state_of(standbys: StandbyStore) -> dict[Any, Any]:
    return dict(standbys.standbys[KEY].chain.states[STAGE])


async def until(condition: Callable[[], bool]) -> None:
    """Lets the loop run until ``condition`` holds (at most two seconds)."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def behind(standbys: StandbyStore) -> bool:
    standby = standbys.standbys.get(KEY)
    return standby is None or standby.catching_up


async def caught_up(standbys: StandbyStore) -> None:
    """Runs the catch-up loop until the standby is no longer behind."""
    runner = asyncio.ensure_future(standbys.run())
    try:
        await until(lambda: not behind(standbys))
    finally:
        runner.cancel()


async def test_windows_that_chain_are_applied_in_order_and_handed_to_a_takeover() -> None:
    standbys = store(FakeStateServers())
    standbys.receive(window(10, None, {"a": 1, "b": 2}))
    response = standbys.receive(window(11, 10, {"a": 3, "c": 1, "b": None}))
    assert response.held_window == 11 and not response.catching_up
    assert state_of(standbys) == {"a": 3, "c": 1}
    taken = standbys.take(KEY)
    assert taken is not None and taken.window == 11
    assert codec.unpack(taken.header) == {"window": 11}
    assert KEY not in standbys.standbys and standbys.take(KEY) is None


async def test_a_missed_window_catches_up_with_the_deltas_after_the_standby() -> None:
    servers = FakeStateServers()
    standbys = store(servers)
    standbys.receive(window(10, None, {"a": 1}))
    servers.answers.append(stored([(11, 10, {"a": 2, "b": 5})]))
    response = standbys.receive(window(12, 11, {"b": 6}))  # 11 never arrived
    assert response.catching_up and not standbys.standbys[KEY].usable
    await caught_up(standbys)
    assert servers.asked[-1] == 10
    assert state_of(standbys) == {"a": 2, "b": 6}  # the read, then the window that waited
    assert standbys.standbys[KEY].window == 12


async def test_windows_arriving_during_a_catch_up_are_applied_after_it() -> None:
    servers = FakeStateServers()
    standbys = store(servers)
    servers.gate.clear()
    servers.answers.append(stored([(20, None, {"x": 1, "y": 1})]))  # a whole state
    standbys.receive(window(21, 20, {"x": 2}))  # first window heard: behind
    runner = asyncio.ensure_future(standbys.run())
    try:
        await until(lambda: bool(servers.asked))
        standbys.receive(window(22, 21, {"y": 3}))
        standbys.receive(window(23, 22, {"z": 1}))
        servers.gate.set()
        await until(lambda: not behind(standbys))
    finally:
        runner.cancel()
    assert servers.asked == [None]
    assert state_of(standbys) == {"x": 2, "y": 3, "z": 1}
    assert standbys.standbys[KEY].window == 23


async def test_an_omitted_window_is_read_from_the_state_servers() -> None:
    servers = FakeStateServers()
    standbys = store(servers)
    standbys.receive(window(30, None, {"a": 1}))
    servers.answers.append(stored([(31, None, {"a": 7, "q": 1})]))
    assert standbys.receive(window(31, None, {}, omitted=True)).catching_up
    await caught_up(standbys)
    assert state_of(standbys) == {"a": 7, "q": 1}


async def test_an_older_primary_is_ignored_and_other_workers_keep_no_standby() -> None:
    standbys = store(FakeStateServers())
    standbys.receive(window(40, None, {"a": 1}, epoch=5))
    standbys.receive(window(41, 40, {"a": 9}, epoch=4))
    assert state_of(standbys) == {"a": 1}
    other = next(p for p in range(PARTITIONS) if HOLDER not in ROUTING.backups(JOB, p, 1)
                 and ROUTING.owner(JOB, p) != HOLDER)
    request = window(1, None, {"a": 1})
    request.partition = other
    standbys.receive(request)
    assert (JOB, 1, other) not in standbys.standbys


async def test_a_taken_standby_runs_a_prepartitioned_stage_in_its_partition() -> None:
    # What a takeover adopts is what it runs: a prepartitioned stage checks
    # its keys against the partition, so the standby's operators carry it
    # (without it every batch after an adoption failed whole).
    job = JobSpec("j", (Stage("pass", "map", "gridstream.builtins:identity"),
                        Stage(STAGE, "reduce", "gridstream.builtins:count",
                              key="gridstream.builtins:identity", initial=0,
                              prepartitioned=True),
                        Stage("store", "sink")), partitions=PARTITIONS)
    tasks = plan_tasks(job)
    assert len(tasks) == 1
    standbys = StandbyStore(HOLDER, ROUTING, cast(Any, None), cast(Any, FakeStateServers()),
                            deployed(job, tasks), 1)
    request = window(10, None, {"a": 1})
    request.task = 0
    standbys.receive(request)
    taken = standbys.take((JOB, 0, PARTITION))
    assert taken is not None
    here = next(w for w in (f"w{i}" for i in range(10_000))
                if partition_for_key(w, PARTITIONS) == PARTITION)
    result = taken.chain.process(None, [here, here], "b1")
    assert result.dead_letters == []
    assert taken.chain.states[STAGE] == {"a": 1, here: 2}


@pytest.mark.parametrize(("delivery", "rows"), [("exactly_once", {}),
                                                ("at_most_once", {"x": 2})])
def test_a_taken_standby_makes_rows_only_where_its_task_writes_them(
        delivery: str, rows: dict[str, int]) -> None:
    # An exactly_once task ending in a reduce into a latest sink has its
    # rows read from the stored state: the task's own chain builds none, and
    # neither may the chain a takeover adopts (it built a row per key touched
    # by every batch, never written).
    job = JobSpec("j", (Stage(STAGE, "reduce", "gridstream.builtins:count",
                              key="gridstream.builtins:identity", initial=0),
                        Stage("store", "sink")), partitions=PARTITIONS, delivery=delivery)
    tasks = plan_tasks(job)
    standbys = StandbyStore(HOLDER, ROUTING, cast(Any, None), cast(Any, FakeStateServers()),
                            deployed(job, tasks), 1)
    request = window(10, None, {"a": 1})
    request.task = len(tasks) - 1
    standbys.receive(request)
    taken = standbys.take((JOB, len(tasks) - 1, PARTITION))
    assert taken is not None
    # The count's task takes the partial counts its input task combined.
    result = taken.chain.process(["x", "x"], [1, 1], "b1")
    assert result.dead_letters == []
    assert taken.chain.states[STAGE] == {"a": 1, "x": 2}
    assert result.sink_rows == rows


def test_a_new_table_of_the_same_workers_builds_no_ring_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Rings and the assignments without each worker depend on the workers
    # alone: a new epoch of the same membership (a job submitted, say) finds
    # them made, and a changed membership gets its own.
    workers = ["worker-a", "worker-b", "worker-c", "worker-d"]
    fewer = workers[:-1]
    first, same, smaller = table(workers), table(workers), table(fewer)
    expected = [view(fewer).standby_holders(JOB, p, 1) for p in range(PARTITIONS)]
    built: list[tuple[str, ...]] = []
    build = HashRing.__init__

    def counted(ring: HashRing, members: Any, virtual_nodes: int = 100) -> None:
        built.append(tuple(members))
        build(ring, members, virtual_nodes)

    assigned: list[str] = []

    def assign(ring: HashRing, job_id: str, partitions: int) -> list[str]:
        assigned.append(job_id)
        return assign_partitions(ring, job_id, partitions)

    monkeypatch.setattr(HashRing, "__init__", counted)
    monkeypatch.setattr(routing_module, "assign_partitions", assign)
    ring_of.cache_clear()
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(first)
    holders = [routing.standby_holders(JOB, p, 1) for p in range(PARTITIONS)]
    made, computed = len(built), len(assigned)
    assert made > len(workers)  # the worker ring, and the rings without each worker
    routing._apply(same)
    assert [routing.standby_holders(JOB, p, 1) for p in range(PARTITIONS)] == holders
    assert (len(built), len(assigned)) == (made, computed)
    routing._apply(smaller)
    assert [routing.standby_holders(JOB, p, 1) for p in range(PARTITIONS)] == expected
