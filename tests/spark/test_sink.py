"""The Spark sink end to end: a file-source query feeds the taxi job from the
executors; results must equal the in-process reference, also when a worker is
SIGKILLed mid-run and when the query restarts from its checkpoint and re-runs
a micro-batch (the re-sent batches must be dropped as duplicates)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gridstream.chaos import wait_healthy
from gridstream.client import Client
from gridstream.demo import compare
from gridstream.examples import taxi
from gridstream.local import LocalCluster
from spark_bridge.demo import feed_taxi, split, start_taxi_query, write_drop

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

RECORDS = 20_000
DEVICES = 1_000


def data(seed: int = 0) -> list[str]:
    """The test input: 20,000 position records from 1,000 devices."""
    return list(taxi.generate(RECORDS, DEVICES, seed))


@pytest_asyncio.fixture(scope="module")
async def fed_job(spark: Any, cluster: LocalCluster,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A taxi job fed once from Spark in four drops; (job id, expected results)."""
    records = data()
    async with Client(cluster.scheduler_address) as client:
        job_id = await client.submit(taxi.job())
        seconds, rate = await feed_taxi(spark, cluster.scheduler_address, job_id, records,
                                        tmp_path_factory.mktemp("fed"), drops=4)
        print(f"spark -> cluster: {len(records):,} rows in {seconds:.1f} s, "
              f"{rate:,.0f} rows/s over micro-batch time")
        await client.drain(job_id)
    return job_id, taxi.reference(records)


async def test_file_source_to_cluster_matches_reference(
    cluster: LocalCluster, fed_job: tuple[str, dict[str, str]],
) -> None:
    job_id, expected = fed_job
    async with Client(cluster.scheduler_address) as client:
        results = await client.results(job_id)
    assert compare(results, expected) == (0, 0, 0)


async def test_read_back_through_the_data_source_equals_client_results(
    spark: Any, cluster: LocalCluster, fed_job: tuple[str, dict[str, str]],
) -> None:
    job_id, expected = fed_job
    frame = (spark.read.format("gridstream").option("scheduler", cluster.scheduler_address)
             .option("job", job_id).load())
    assert frame.columns == ["key", "value"]
    table = frame.toArrow()
    read = {k: json.loads(v) for k, v in zip(table.column("key").to_pylist(),
                                             table.column("value").to_pylist(), strict=True)}
    async with Client(cluster.scheduler_address) as client:
        assert read == await client.results(job_id)
    assert read == expected


async def test_worker_killed_during_a_spark_fed_run_still_matches(
    spark: Any, cluster: LocalCluster, tmp_path: Path,
) -> None:
    records = data(seed=1)
    async with Client(cluster.scheduler_address) as client:
        job_id = await client.submit(taxi.job())

        async def kill_on_second_drop(n: int) -> None:
            if n == 1:
                await asyncio.sleep(0.5)  # let Spark start sending the drop
                cluster.kill("worker-2", signal.SIGKILL)

        await feed_taxi(spark, cluster.scheduler_address, job_id, records, tmp_path,
                        drops=5, on_drop=kill_on_second_drop)
        await wait_healthy(client, job_id, workers=3)
        await client.drain(job_id)
        results = await client.results(job_id)
    assert any(name == "worker-2" for name, *_ in cluster.restart_log)
    assert compare(results, taxi.reference(records)) == (0, 0, 0)


async def test_restart_from_checkpoint_no_duplicates_no_gaps(
    spark: Any, cluster: LocalCluster, tmp_path: Path,
) -> None:
    records = data(seed=2)
    drops = split(records, 4)
    input_dir, checkpoint = tmp_path / "input", tmp_path / "checkpoint"
    scheduler = cluster.scheduler_address
    async with Client(scheduler) as client:
        job_id = await client.submit(taxi.job())
        write_drop(input_dir, "drop-0000.json", drops[0])
        write_drop(input_dir, "drop-0001.json", drops[1])
        query = await asyncio.to_thread(start_taxi_query, spark, scheduler, job_id,
                                        input_dir, checkpoint)
        await asyncio.to_thread(query.processAllAvailable)
        first_id = query.id
        await asyncio.to_thread(query.stop)
        # Forget that the last micro-batch committed: on restart Spark runs it
        # again from the offset log, re-sending records the cluster already holds.
        commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        assert len(commits) == 2
        rerun = int(commits[-1].name)
        commits[-1].unlink()
        (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
        write_drop(input_dir, "drop-0002.json", drops[2])
        query = await asyncio.to_thread(start_taxi_query, spark, scheduler, job_id,
                                        input_dir, checkpoint)
        assert query.id == first_id
        await asyncio.to_thread(query.processAllAvailable)
        write_drop(input_dir, "drop-0003.json", drops[3])
        await asyncio.to_thread(query.processAllAvailable)
        replayed = [p for p in query.recentProgress if p.batchId == rerun]
        await asyncio.to_thread(query.stop)
        assert replayed and replayed[0].numInputRows > 0, "the micro-batch was not re-run"
        await client.drain(job_id)
        results = await client.results(job_id)
    assert compare(results, taxi.reference(records)) == (0, 0, 0)


async def test_unknown_job_fails_the_query_clearly(
    spark: Any, cluster: LocalCluster, tmp_path: Path,
) -> None:
    write_drop(tmp_path / "input", "drop-0000.json", data()[:100])
    query = await asyncio.to_thread(start_taxi_query, spark, cluster.scheduler_address,
                                    "no-such-job", tmp_path / "input", tmp_path / "checkpoint")
    with pytest.raises(Exception) as caught:
        await asyncio.to_thread(query.processAllAvailable)
    await asyncio.to_thread(query.stop)
    message = str(caught.value)
    assert "no-such-job" in message
    assert "NotFound" in message or "not found" in message.lower()


async def test_foreach_batch_writer_matches_reference(
    spark: Any, cluster: LocalCluster, tmp_path: Path,
) -> None:
    from spark_bridge import foreach_batch_writer
    from spark_bridge.session import activate

    records = data(seed=3)[:5_000]
    write_drop(tmp_path / "input", "drop-0000.json", records)
    async with Client(cluster.scheduler_address) as client:
        job_id = await client.submit(taxi.job())

        def run() -> None:
            activate(spark)
            query = (spark.readStream.schema("device string, lat int, lon int, seq long")
                     .json(str(tmp_path / "input")).writeStream
                     .foreachBatch(foreach_batch_writer(
                         cluster.scheduler_address, job_id, key="device",
                         value_format="json", order_by="seq"))
                     .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
            query.processAllAvailable()
            query.stop()

        await asyncio.to_thread(run)
        await client.drain(job_id)
        results = await client.results(job_id)
    assert compare(results, taxi.reference(records)) == (0, 0, 0)
