"""The replicated state servers, with real processes: a replica killed during a
job loses no acknowledged snapshot and worker recovery still works; a restarted
replica catches up; replicas added and retired during a job keep every
snapshot readable with R copies; cleanup keeps the latest windows and deletes
ended jobs; bad writes are refused."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from gridstream import rpc
from gridstream.chaos import stream, wait_healthy
from gridstream.client import Client
from gridstream.codec import unpack
from gridstream.config import ClusterConfig, Config, StateServerConfig
from gridstream.errors import Unavailable
from gridstream.examples import wordcount
from gridstream.ids import checksum, operator_id
from gridstream.local import LocalCluster
from gridstream.service import RETIRED_EXIT_CODE
from gridstream.v1 import stateserver_pb2, stateserver_pb2_grpc
from services.stateserver.chains import MAX_DELTAS

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 8
PROBE_EPOCH = 1 << 30
"""The test writes a probe job's snapshots as an owner newer than any worker:
the workers' tasks of that job claim its operators when they start (raising
the fence to their epoch), and must not fence the test's writer out."""


def replicated(state_servers_cleanup_s: float = 30.0) -> Config:
    """R=2 (W=2), small windows so snapshots are written all through a run."""
    return replace(
        Config(),
        cluster=ClusterConfig(window_size=3_000, partitions=PARTITIONS, replica_count=2),
        stateserver=StateServerConfig(sync_interval_s=0.5,
                                      cleanup_interval_s=state_servers_cleanup_s),
    )


async def digest(cluster: LocalCluster, name: str,
                 job_id: str) -> dict[str, stateserver_pb2.OperatorDigest]:
    """One replica's holdings of a job, by operator."""
    address = cluster.members[name].address
    async with rpc.open_channel(address) as channel:
        response = await stateserver_pb2_grpc.StateServerStub(channel).Digest(
            stateserver_pb2.DigestRequest(job_id=job_id), timeout=5)
    return {d.operator_id: d for d in response.operators}


async def wait_until(check: object, timeout_s: float = 60.0, what: str = "") -> None:
    """Polls an async predicate (no fixed sleeps standing in for readiness)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true after {timeout_s:.0f}s: {what}")
        await asyncio.sleep(0.1)


async def wait_restarted(cluster: LocalCluster, name: str) -> None:
    """Waits until the supervisor has restarted ``name`` and it is registered."""
    await wait_until(lambda: _restarted(cluster, name), 60, f"{name} restarted")
    await cluster.wait_registered()


async def _restarted(cluster: LocalCluster, name: str) -> bool:
    return any(entry[0] == name for entry in cluster.restart_log)


async def quietly(check: object) -> bool:
    """A predicate that counts a failed call (a member still restarting) as False."""
    try:
        return bool(await check())  # type: ignore[operator]
    except (grpc.aio.AioRpcError, KeyError):
        return False


async def operator_rows(cluster: LocalCluster, name: str, job_id: str,
                        op: str) -> list[list[Any]]:
    """One replica's result rows of one operator ([key, value, version]), as
    a catching-up peer reads them."""
    rows: list[list[Any]] = []
    async with rpc.open_channel(cluster.members[name].address) as channel:
        async for chunk in stateserver_pb2_grpc.StateServerStub(channel).ReadOperator(
                stateserver_pb2.ReadOperatorRequest(job_id=job_id, operator_id=op), timeout=5):
            rows.extend(unpack(chunk.rows) if chunk.row_count else [])
    return rows


def operators(job_id: str, tasks: int = 2) -> list[str]:
    return [operator_id(job_id, t, p) for t in range(tasks) for p in range(PARTITIONS)]


async def test_killed_replica_loses_no_acknowledged_snapshot_and_catches_up(
    tmp_path: Path,
) -> None:
    lines = wordcount.generate(150_000, seed=21)
    cluster = LocalCluster(tmp_path, replicated(), workers=3, state_servers=3,
                           supervise=True, restart_delay_s=0.5)
    async with cluster, Client(cluster.scheduler_address) as client, \
            cluster.state_client() as replicas:
        job_id = await client.submit(wordcount.job())
        # A job that gets no input: its operators are written by the test alone.
        probe_job = await client.submit(wordcount.job())
        probe_ops = operators(probe_job)
        acked: dict[str, int] = {}

        async def until_written(write: Callable[[], Awaitable[None]]) -> None:
            """As a worker's persister writes: a write that did not reach its
            quorum (a replica just died) is retried; only a returned one counts."""
            deadline = time.monotonic() + 30
            while True:
                try:
                    return await write()
                except Unavailable:
                    assert time.monotonic() < deadline, "writes stalled for 30 s"
                    await asyncio.sleep(0.05)

        async def write_windows(first: int, last: int) -> None:
            """Each probe operator's window, then its result row (the operator's
            own key, the window as value and version), every row of a job in
            one table: a catching-up replica picks out each operator's."""
            for window in range(first, last):
                for op in probe_ops:
                    payload = f"{op}@{window}".encode()
                    await until_written(functools.partial(
                        replicas.put_snapshot, probe_job, op, window, PROBE_EPOCH, payload))
                await asyncio.gather(*(until_written(functools.partial(
                    replicas.write_results, probe_job, op, [[op, str(window)]], [],
                    epoch=PROBE_EPOCH, version=window)) for op in probe_ops))
                for op in probe_ops:
                    acked[op] = window

        sender = asyncio.create_task(stream(client, job_id, None, lines, 6.0, chunk=2_000))
        await write_windows(1, 4)
        cluster.hold("state-2")
        cluster.kill("state-2", signal.SIGKILL)
        # Writes go on (the ring's next live server stands in), and so do the job
        # and a worker's recovery, which reads its snapshots from the survivors.
        await write_windows(4, 8)
        cluster.kill("worker-1", signal.SIGKILL)
        await sender
        await wait_healthy(client, job_id, workers=3)
        for op in probe_ops:
            latest = await replicas.get_latest_snapshot(probe_job, op)
            assert latest is not None and latest[0] == acked[op], (op, latest, acked[op])
            assert latest[1] == f"{op}@{acked[op]}".encode()
        # Bring it back: it copies what it missed for every operator it is a replica of.
        cluster.release("state-2")
        await wait_restarted(cluster, "state-2")
        await replicas.routing.refresh()
        mine = [op for op in probe_ops
                if "state-2" in replicas.routing.replica_set.placement(op)]
        assert mine, "state-2 is a replica of none of the probe operators"

        async def caught_up() -> bool:
            held = await digest(cluster, "state-2", probe_job)
            if not all(op in held and held[op].latest_window == acked[op] for op in mine):
                return False
            for op in mine:
                if await operator_rows(cluster, "state-2", probe_job, op) != [
                        [op, str(acked[op]), acked[op]]]:
                    return False
            return True

        await wait_until(lambda: quietly(caught_up), 30, "state-2 caught up with what it missed")
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)


async def test_add_and_retire_replicas_during_a_job(tmp_path: Path) -> None:
    lines = wordcount.generate(200_000, seed=22)
    cluster = LocalCluster(tmp_path, replicated(), workers=3, state_servers=2,
                           supervise=True, restart_delay_s=0.5)
    async with cluster, Client(cluster.scheduler_address) as client, \
            cluster.state_client() as replicas:
        job_id = await client.submit(wordcount.job())
        probe_job = await client.submit(wordcount.job())
        probe_ops = operators(probe_job)
        sender = asyncio.create_task(stream(client, job_id, None, lines, 8.0, chunk=2_000))
        too_few: list[str] = []
        acked: dict[str, int] = {}
        stop_watching = asyncio.Event()

        async def keep_writing() -> None:
            """Acknowledged snapshot writes all through the group's changes."""
            window = 0
            while not stop_watching.is_set():
                window += 1
                for op in probe_ops:
                    payload = f"{op}@{window}".encode()
                    while True:
                        try:
                            await replicas.put_snapshot(probe_job, op, window, PROBE_EPOCH, payload)
                            break
                        except Exception:  # too few replicas for a moment: retry
                            await asyncio.sleep(0.05)
                    acked[op] = window

        async def watch_copies() -> None:
            """Every acknowledged snapshot is on at least R=2 live servers."""
            while not stop_watching.is_set():
                wanted = dict(acked)
                await replicas.routing.refresh()
                names = list(replicas.routing.replica_set.readable)
                held = {}
                for name in names:
                    with contextlib.suppress(grpc.aio.AioRpcError, KeyError):
                        held[name] = await digest(cluster, name, probe_job)
                if len(held) == len(names):
                    for op, window in wanted.items():
                        copies = sum(1 for h in held.values() if op in h
                                     and h[op].has_snapshot and h[op].latest_window >= window)
                        if copies < 2:
                            too_few.append(f"{op}@{window}: {copies} copies on {sorted(held)}")
                await asyncio.sleep(0.05)

        writer = asyncio.create_task(keep_writing())
        watcher = asyncio.create_task(watch_copies())
        await asyncio.sleep(1.5)  # let windows be written before the group changes
        added = await cluster.add_state_server(join=True)
        assert added == "state-3"
        epoch = await client.retire_state_server("state-1")
        assert epoch > 0
        assert await cluster.wait_exit("state-1", timeout_s=60) == RETIRED_EXIT_CODE
        await sender
        await client.drain(job_id, timeout_s=120)
        stop_watching.set()
        await watcher
        await writer
        assert too_few == [], too_few[:5]
        assert min(acked.values()) > 3, "the probe writer made too little progress"
        assert await client.results(job_id) == wordcount.reference(lines)
        status = await client.status()
        assert "state-1" not in {m.member.node_id for m in status.members}
        # After the dust settles every operator's newest window is on both replicas.
        await replicas.routing.refresh()

        async def two_copies_each() -> bool:
            a = await digest(cluster, "state-2", probe_job)
            b = await digest(cluster, "state-3", probe_job)
            return set(a) == set(b) and all(
                a[op].latest_window == b[op].latest_window for op in a)

        await wait_until(lambda: quietly(two_copies_each), 30,
                         "both replicas hold every operator")


async def test_cleanup_and_refusals(tmp_path: Path) -> None:
    config = replace(replicated(state_servers_cleanup_s=1.0),
                     stateserver=StateServerConfig(sync_interval_s=0.5, cleanup_interval_s=1.0,
                                                   keep_windows=2))
    lines = wordcount.generate(60_000, seed=23)
    cluster = LocalCluster(tmp_path, config, workers=2, state_servers=3,
                           supervise=True, restart_delay_s=0.5)
    async with cluster, Client(cluster.scheduler_address) as client, \
            cluster.state_client() as replicas:
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, lines)
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
        # Deltas are compacted into a base: a restore reads one base and a
        # bounded number of deltas, and the newest window is what it restores.
        for name in ("state-1", "state-2", "state-3"):
            address = cluster.members[name].address
            async with rpc.open_channel(address) as channel:
                stub = stateserver_pb2_grpc.StateServerStub(channel)
                for op in operators(job_id):
                    head = await stub.StateHead(stateserver_pb2.StateHeadRequest(
                        job_id=job_id, operator_id=op), timeout=5)
                    assert head.deltas <= MAX_DELTAS + 1, (name, op, head)
        restored = 0
        for op in operators(job_id):
            state = await replicas.read_state(job_id, op, 0)
            if state is not None:
                restored += 1
                held = [d[op].state_window for d in
                        [await digest(cluster, n, job_id) for n in ("state-1", "state-2",
                                                                     "state-3")] if op in d]
                assert state.window == max(held)
        assert restored >= PARTITIONS  # every counting task has state (idle splitters may not)

        # Refusals: unknown job, unknown operator, malformed id, corrupt payload.
        stub = stateserver_pb2_grpc.StateServerStub(
            replicas.channels.get(cluster.members["state-1"].address))

        async def put(job: str, op: str, payload: bytes, digest_of: bytes) -> None:
            await stub.PutSnapshot(stateserver_pb2.PutSnapshotRequest(
                meta=stateserver_pb2.SnapshotMeta(job_id=job, operator_id=op, window=1,
                                                  epoch=1, size=len(payload),
                                                  checksum=checksum(digest_of)),
                payload=payload), timeout=5)

        for job, op, payload, digest_of, code, text in [
            ("no-such-job", "no-such-job/t0/p0", b"x", b"x", grpc.StatusCode.NOT_FOUND,
             "unknown job"),
            (job_id, f"{job_id}/t9/p0", b"x", b"x", grpc.StatusCode.NOT_FOUND,
             "unknown operator"),
            (job_id, "p0", b"x", b"x", grpc.StatusCode.INVALID_ARGUMENT, "is not of the form"),
            (job_id, f"{job_id}/t0/p0", b"x", b"y", grpc.StatusCode.INVALID_ARGUMENT,
             "checksum mismatch"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await put(job, op, payload, digest_of)
            assert info.value.code() == code and text in (info.value.details() or "")

        # A copy corrupted on one replica's disk is refused there; readers use another.
        op = operators(job_id)[0]
        fence = max(d[op].epoch for d in [await digest(cluster, n, job_id)
                                          for n in ("state-1", "state-2", "state-3")] if op in d)
        await replicas.put_snapshot(job_id, op, 7, fence, b"an opaque window")
        good = await replicas.get_latest_snapshot(job_id, op)
        assert good == (7, b"an opaque window")
        victim = ""
        for name in ("state-1", "state-2", "state-3"):
            held = (await digest(cluster, name, job_id)).get(op)
            if held is not None and held.has_snapshot and held.latest_window == good[0]:
                victim = name
                break
        with sqlite3.connect(tmp_path / victim / "state.sqlite3") as db:
            db.execute('UPDATE snapshots SET payload = ? WHERE operator_id = ? AND "window" = ?',
                       (b"garbage" * 10, op, good[0]))
        assert await replicas.get_latest_snapshot(job_id, op) == good

        # Cancel while one replica is down: when it comes back, cleanup deletes
        # its copy, and catch-up does not bring the job back anywhere.
        cluster.hold("state-3")
        cluster.kill("state-3", signal.SIGKILL)
        await client.cancel(job_id)
        cluster.release("state-3")
        await wait_restarted(cluster, "state-3")

        async def all_gone() -> bool:
            for name in ("state-1", "state-2", "state-3"):
                if await digest(cluster, name, job_id):
                    return False
            return True

        await wait_until(lambda: quietly(all_gone), 30,
                         "the cancelled job's state deleted on every replica")
