"""Result writes of a worker's operators share WriteResultsMany calls to each
state server (gridstream/replicas.py over gridstream/peercalls.py), and each
write keeps its own outcome: stored, or refused with its own error."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from gridstream import codec
from gridstream.client import Client
from gridstream.config import Config
from gridstream.errors import InvalidArgument
from gridstream.examples import wordcount
from gridstream.ids import operator_id
from gridstream.local import LocalCluster
from gridstream.replicas import RESULT_WRITE_LINGER_S
from gridstream.v1 import stateserver_pb2, stateserver_pb2_grpc

pytestmark = pytest.mark.integration

WRITERS = 12
"""Operators writing at once, as a worker's sink tasks flushing together."""

PROBE_EPOCH = 1 << 30
"""Written as an owner newer than any worker, so a task of the job that
claims its operator never fences the test's writes out."""


async def test_concurrent_result_writes_share_calls_and_keep_their_own_outcomes(
        tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, Config(), workers=1, state_servers=2) as cluster, \
            Client(cluster.scheduler_address) as client, cluster.state_client() as replicas:
        job_id = await client.submit(wordcount.job())
        writes = [replicas.write_results(job_id, operator_id(job_id, 1, p),
                                         [[f"key-{p}", str(p)]], [], epoch=PROBE_EPOCH,
                                         version=1) for p in range(WRITERS)]
        refused = replicas.write_results(job_id, operator_id(job_id, 1, WRITERS),
                                         [["bad", 1]], [], epoch=PROBE_EPOCH, version=1)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*writes, refused, return_exceptions=True), 30)

        assert outcomes[:WRITERS] == [None] * WRITERS, outcomes
        assert isinstance(outcomes[WRITERS], InvalidArgument), outcomes[WRITERS]
        assert "rows[0] must be [key: str, json_value: str]" in str(outcomes[WRITERS])
        # 13 writes, each to both state servers: 26 calls of their own.
        assert replicas.result_write_calls <= 4, replicas.result_write_calls
        rows = await replicas.read_results(job_id)
        assert {key: rows[key] for key in rows if key.startswith("key-")} == {
            f"key-{p}": (p, 1) for p in range(WRITERS)}

        # Writers that reach the call a few event-loop steps apart (as a
        # worker's sink tasks do after their shared boundary) still share
        # one call per state server: the first waits RESULT_WRITE_LINGER_S.
        # (With one step of waiting: 4 to 6 calls.) An attempt counts only
        # if every writer got to the call within that wait: a machine that
        # stalled this process longer in between tests nothing.
        async def write_after(steps: int, version: int, started: list[float]) -> None:
            for _ in range(steps):
                await asyncio.sleep(0)
            started.append(time.monotonic())
            await replicas.write_results(job_id, operator_id(job_id, 1, steps),
                                         [[f"late-{steps}", str(version)]], [],
                                         epoch=PROBE_EPOCH, version=version)

        calls = []
        for version in range(2, 7):
            started: list[float] = []
            before = replicas.result_write_calls
            await asyncio.wait_for(asyncio.gather(
                *(write_after(p, version, started) for p in range(WRITERS))), 30)
            if max(started) - min(started) < RESULT_WRITE_LINGER_S / 2:
                calls.append(replicas.result_write_calls - before)
        assert calls, "every attempt was stalled past the wait; nothing was tested"
        assert set(calls) == {2}, calls
        await client.cancel(job_id)


async def test_results_are_read_from_one_replica_and_from_the_next_when_it_fails(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With two state servers every acknowledged row is on both (R = W = 2),
    so a read asks one; a server whose holdings of the job are ahead of the
    one read is read too; a server that cannot answer is replaced by the next."""
    async with LocalCluster(tmp_path, Config(), workers=1, state_servers=2) as cluster, \
            Client(cluster.scheduler_address) as client, cluster.state_client() as replicas:
        job_id = await client.submit(wordcount.job())
        await replicas.write_results(job_id, operator_id(job_id, 1, 0), [["both", "1"]], [],
                                     epoch=PROBE_EPOCH, version=1)
        # A row on each server alone (as a write no quorum acknowledged
        # leaves it): which of them a read returns tells which server it read.
        servers = dict(replicas.routing.replica_set.readable)
        assert sorted(servers) == ["state-1", "state-2"]

        async def write_to(name: str, key: str, version: int) -> None:
            """A row at ``version`` on the server ``name`` alone."""
            await stateserver_pb2_grpc.StateServerStub(
                replicas.channels.get(servers[name])).WriteResults(
                stateserver_pb2.WriteResultsRequest(
                    job_id=job_id, operator_id=operator_id(job_id, 1, 1),
                    rows=codec.pack([[key, str(version)]]), row_count=1,
                    dead_letters=codec.pack([]), dead_letter_count=0,
                    epoch=PROBE_EPOCH, version=version),
                timeout=10)

        for name in servers:
            await write_to(name, f"only-{name}", 2)

        rows = await replicas.read_results(job_id)
        read = [key.removeprefix("only-") for key in rows if key.startswith("only-")]
        assert len(read) == 1, f"one server read, not {read}"
        assert rows["both"] == (1, 1)
        assert await replicas.read_results(job_id) == rows  # the same server again

        # The server not read holds a newer row (as when the one read lost
        # its last commits in a machine crash): its holdings are ahead, so
        # it is read too.
        (other,) = set(servers) - {read[0]}
        caplog.set_level(logging.INFO, logger="gridstream.replicas")
        await write_to(other, "newer", 3)
        rows = await replicas.read_results(job_id)
        assert rows["newer"] == (3, 3)
        assert {key for key in rows if key.startswith("only-")} == {
            f"only-{name}" for name in servers}
        assert f"{other} held newer rows of the job than the replica read" in caplog.text
        # Once the server read holds it too, one server is read again.
        await write_to(read[0], "newer", 3)
        rows = await replicas.read_results(job_id)
        assert {key for key in rows if key.startswith("only-")} == {f"only-{read[0]}"}

        # The server read first dies; the routing table still lists it (no
        # refresh): the read fails there and goes on with the other one.
        cluster.hold(read[0])
        cluster.kill(read[0])
        await cluster.wait_exit(read[0])
        rows = await replicas.read_results(job_id)
        assert {key for key in rows if key.startswith("only-")} == {f"only-{other}"}
        assert rows["both"] == (1, 1)
        assert f"went on without {read[0]}" in caplog.text
