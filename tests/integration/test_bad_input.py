"""Bad input gets a clear status and loses nothing; no service crashes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from gridstream import codec
from gridstream.client import Client
from gridstream.errors import FailedPrecondition, InvalidArgument, NotFound
from gridstream.examples import wordcount
from gridstream.jobspec import JobSpec, Stage
from gridstream.local import LocalCluster
from gridstream.sync import SyncClient
from gridstream.v1 import common_pb2, worker_pb2, worker_pb2_grpc

pytestmark = pytest.mark.integration

SUM_BY_PARITY = JobSpec(
    name="parity",
    stages=(
        Stage("parse", "map", "tests.integration.faulty_ops:parse_int"),
        Stage("sum", "reduce", "tests.integration.faulty_ops:add",
              key="tests.integration.faulty_ops:parity", initial=0),
        Stage("store", "sink"),
    ),
)


def worker_address(cluster: LocalCluster) -> str:
    return cluster.members["worker-1"].address


async def test_malformed_job_file(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "x"\n[[stages]]\nname = "a"\nkind = "map"\n'
                    'function = "m:f"\n')
    with pytest.raises(InvalidArgument, match="the last stage must be a sink"):
        await client.submit(path)


async def test_import_path_that_does_not_resolve(client: Client) -> None:
    spec = JobSpec("broken", (Stage("a", "map", "tests.integration.no_such_mod:fn"),
                              Stage("s", "sink")))
    with pytest.raises(InvalidArgument,
                       match=r"cannot import module 'tests\.integration\.no_such_mod'"):
        await client.submit(spec)
    spec = JobSpec("broken", (Stage("a", "map", "gridstream.builtins:missing"), Stage("s", "sink")))
    with pytest.raises(InvalidArgument, match="has no attribute 'missing'"):
        await client.submit(spec)


async def test_unknown_job_id(client: Client) -> None:
    with pytest.raises(NotFound, match="unknown job id"):
        await client.send("no-such-job", ["a"])
    with pytest.raises(NotFound):
        await client.results("no-such-job")
    with pytest.raises(NotFound):
        await client.progress("no-such-job")


async def test_unknown_job_id_pushed_straight_to_a_worker(cluster: LocalCluster) -> None:
    async with grpc.aio.insecure_channel(worker_address(cluster)) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Push(worker_pb2.PushRequest(
                job_id="nope", epoch=0,
                segments=[worker_pb2.Segment(task=0, partition=0, channel="src/x", sequence=1,
                                             batch=codec.encode_batch(["a"]))]), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown job id 'nope'" in (info.value.details() or "")


async def test_oversized_and_malformed_batches(cluster: LocalCluster, client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    routing = await client._routing(job_id)
    owner = routing.owners[0]
    address = cluster.members[owner].address
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    ) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        huge = codec.encode_batch(["x" * 1024] * 10_000)  # ~10 MiB > 8 MiB limit
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Push(worker_pb2.PushRequest(
                job_id=job_id, epoch=routing_epoch(client),
                segments=[worker_pb2.Segment(task=0, partition=0, channel="src/t", sequence=1,
                                             batch=huge)]), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_batch_bytes" in (info.value.details() or "")
        garbage = common_pb2.RecordBatch(
            encoding=common_pb2.PAYLOAD_ENCODING_MSGPACK_V1, count=3, payload=b"\xc1not msgpack")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Push(worker_pb2.PushRequest(
                job_id=job_id, epoch=routing_epoch(client),
                segments=[worker_pb2.Segment(task=0, partition=0, channel="src/t", sequence=1,
                                             batch=garbage)]), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not valid msgpack" in (info.value.details() or "")
    # The refused batches left nothing behind, and the job still works.
    await client.send(job_id, ["still works"])
    await client.drain(job_id)
    assert await client.results(job_id) == {"still": 1, "works": 1}


def routing_epoch(client: Client) -> int:
    return int(client._table.epoch)


async def test_records_an_operator_raises_on_go_to_dead_letters(client: Client) -> None:
    job_id = await client.submit(SUM_BY_PARITY)
    values = [str(i) for i in range(1, 101)] + ["seven", "", "1.5"]
    await client.send(job_id, values)
    await client.drain(job_id)
    assert await client.results(job_id) == {"even": 2550, "odd": 2500}
    dead = await client.dead_letters(job_id)
    assert sorted(d.record for d in dead) == ["", "1.5", "seven"]
    assert all(d.stage == "parse" and d.error.startswith("ValueError") for d in dead)


async def test_no_service_crashed(cluster: LocalCluster) -> None:
    assert all(m.alive() for m in cluster.members.values()), {
        n: m.process.returncode for n, m in cluster.members.items() if m.process
    }


async def test_cancelled_job_refuses_records_and_forgets_its_results(client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    await client.send(job_id, ["one two"])
    await client.drain(job_id)
    assert await client.results(job_id) == {"one": 1, "two": 1}
    info = await client.cancel(job_id)
    assert info.state == common_pb2.JOB_STATE_CANCELLED
    assert any(j.job_id == job_id and j.state == common_pb2.JOB_STATE_CANCELLED
               for j in await client.jobs())
    with pytest.raises(FailedPrecondition, match="is cancelled; it accepts no records"):
        await client.send(job_id, ["three"])
    assert await client.results(job_id) == {}


async def test_sync_client_runs_a_job(cluster: LocalCluster) -> None:
    def use_sync_client() -> dict[str, object]:
        with SyncClient(cluster.scheduler_address) as sync:
            job_id = sync.submit(wordcount.job())
            sync.send(job_id, ["a b a"])
            sync.drain(job_id)
            return sync.results(job_id)

    assert await asyncio.to_thread(use_sync_client) == {"a": 2, "b": 1}


async def test_unkeyed_rows_and_dead_letters_of_every_partition_arrive(client: Client) -> None:
    # Every partition's first batch of a producer has sequence 1: row and
    # dead-letter ids must still differ across partitions, or partitions
    # overwrite each other's rows.
    spec = JobSpec("unkeyed", (Stage("parse", "map", "tests.integration.faulty_ops:parse_int"),
                               Stage("store", "sink")), partitions=8)
    records = [str(i) if i % 9 else f"bad-{i}" for i in range(18_000)]
    job_id = await client.submit(spec)
    await client.send(job_id, records)
    await client.drain(job_id, timeout_s=120)
    rows = await client.results(job_id)
    dead = await client.dead_letters(job_id)
    good = [r for r in records if not r.startswith("bad")]
    assert len(rows) == len(good)
    assert sorted(rows.values()) == sorted(int(r) for r in good)
    assert len(dead) == len(records) - len(good) == 2_000
