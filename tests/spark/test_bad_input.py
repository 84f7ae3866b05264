"""Bad input to the sink fails with a message that says what to fix, or goes to
the dead-letter directory; misconfigurations fail before anything is sent."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gridstream.client import Client
from gridstream.local import LocalCluster

pytestmark = [pytest.mark.spark, pytest.mark.integration]

# Batch reads and writes are called on the test's own thread: a Python data
# source is looked up through the JVM thread's active session, which a thread
# started by asyncio.to_thread does not have.


def frame(spark: Any) -> Any:
    """Three rows, one with a null key."""
    return spark.createDataFrame(
        [("a", 1), (None, 2), ("b", 3)], "device string, n int").coalesce(1)


def write(df: Any, scheduler: str, job: str, **options: str) -> None:
    """A batch write through format("gridstream")."""
    writer = df.write.format("gridstream").mode("append").option("scheduler", scheduler) \
        .option("job", job)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


async def _taxi_job(client: Client) -> str:
    from gridstream.examples import taxi
    return await client.submit(taxi.job())


async def test_null_key_fails_with_the_fix(spark: Any, cluster: LocalCluster) -> None:
    async with Client(cluster.scheduler_address) as client:
        job_id = await _taxi_job(client)
    with pytest.raises(Exception, match="null key column 'device'"):
        write(frame(spark), cluster.scheduler_address, job_id, key="device")


async def test_null_key_goes_to_the_dead_letter_dir(spark: Any, cluster: LocalCluster,
                                                    tmp_path: Path) -> None:
    async with Client(cluster.scheduler_address) as client:
        job_id = await _taxi_job(client)
        write(frame(spark), cluster.scheduler_address, job_id, key="device",
              dead_letter_dir=str(tmp_path), value="n")
    lines = [json.loads(line) for f in sorted(os.listdir(tmp_path)) if f.endswith(".jsonl")
             for line in (tmp_path / f).read_text(encoding="utf-8").splitlines()]
    assert lines == [{"error": "null key column 'device'", "row": {"device": None, "n": 2}}]


async def test_missing_key_column_and_wrong_type_are_explained(spark: Any,
                                                               cluster: LocalCluster) -> None:
    df = spark.createDataFrame([(1.5, "x")], "device double, n string")
    with pytest.raises(Exception, match="not in the query's columns"):
        write(df, cluster.scheduler_address, "j", key="missing")
    with pytest.raises(Exception, match="keys must be string or integer"):
        write(df, cluster.scheduler_address, "j", key="device")


async def test_unreachable_cluster_fails_clearly(spark: Any) -> None:
    df = spark.createDataFrame([("a", 1)], "device string, n int")
    with pytest.raises(Exception, match=r"(?i)unavailable|connect"):
        write(df, "127.0.0.1:9", "j", key="device")
