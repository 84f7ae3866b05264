"""The taxi pipeline fed by Spark Structured Streaming from a directory of JSON files.

Why: it shows (and the tests check) the whole bridge on real processes:
devices drop JSON files into a directory, a file-source query keyed by device
sends each row from the executors to the taxi job, and the job's results must
equal ``taxi.reference`` of the same records. Order within a device follows
``seq``: the query repartitions by device (one device, one Spark partition per
micro-batch) and the sink sorts each task's rows by ``seq`` before sending;
micro-batches are sent one after another.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridstream.client import Client
from gridstream.demo import compare
from gridstream.examples import taxi
from gridstream.local import LocalCluster

TAXI_SCHEMA = "device string, lat int, lon int, seq long"


@dataclass
class SparkTaxiReport:
    """What a Spark-fed taxi run did and whether it matched the reference."""

    records: int
    devices: int
    drops: int
    seconds: float
    """Wall time from the query's start until Spark had sent every drop."""
    spark_rows_per_s: float
    """Rows over the summed micro-batch execution times (Spark -> cluster)."""
    missing: int = 0
    unexpected: int = 0
    different: int = 0
    results: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def match(self) -> bool:
        """True when the results equal the in-process reference."""
        return self.missing == self.unexpected == self.different == 0

    def table(self) -> str:
        """A short human-readable summary."""
        verdict = "results match the reference" if self.match else (
            f"results DIFFER: {self.missing} missing, {self.unexpected} unexpected, "
            f"{self.different} different")
        return (f"spark-taxi: {self.records:,} records from {self.devices:,} devices in "
                f"{self.drops} file drops; {self.seconds:.1f} s; Spark -> cluster "
                f"{self.spark_rows_per_s:,.0f} rows/s; {verdict}")


def write_drop(directory: Path, name: str, records: list[str]) -> Path:
    """One device drop: a JSON-lines file, renamed into place so the file
    source never sees it half written."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}-staging"
    staging.mkdir(parents=True, exist_ok=True)
    tmp = staging / name
    tmp.write_text("\n".join(records) + "\n", encoding="utf-8")
    target = directory / name
    tmp.replace(target)
    return target


def split(records: list[str], drops: int) -> list[list[str]]:
    """Consecutive slices, so each device's records keep ``seq`` order across drops."""
    size = -(-len(records) // drops)
    return [records[i:i + size] for i in range(0, len(records), size)]


def start_taxi_query(spark: Any, scheduler: str, job_id: str, input_dir: Path,
                     checkpoint: Path, *, files_per_trigger: int = 1,
                     partitions: int = 2, batch_size: int = 2_000) -> Any:
    """The file-source query into the taxi job: rows keyed by device, each sent
    as the JSON text the job's ``parse`` stage expects, in ``seq`` order."""
    from spark_bridge.session import activate

    activate(spark)
    stream = (spark.readStream.schema(TAXI_SCHEMA)
              .option("maxFilesPerTrigger", files_per_trigger).json(str(input_dir))
              .repartition(partitions, "device"))
    return (stream.writeStream.format("gridstream")
            .option("scheduler", scheduler).option("job", job_id)
            .option("key", "device").option("value_format", "json")
            .option("order_by", "seq").option("batch_size", batch_size)
            .option("checkpointLocation", str(checkpoint))
            .queryName(f"taxi-{job_id}").start())


def spark_rate(query: Any) -> tuple[int, float]:
    """(rows, rows/s over the summed micro-batch times) from the query's progress."""
    rows = 0
    millis = 0
    for progress in query.recentProgress:
        if progress.numInputRows:
            rows += progress.numInputRows
            millis += progress.durationMs.get("triggerExecution", 0)
    return rows, rows / (millis / 1000) if millis else 0.0


async def feed_taxi(spark: Any, scheduler: str, job_id: str, data: list[str], work_dir: Path,
                    drops: int = 4,
                    on_drop: Callable[[int], Awaitable[None]] | None = None) -> tuple[float, float]:
    """Drops ``data`` as files while the query runs, waits until Spark has sent
    them all; returns (seconds, Spark rows/s). Blocking Spark calls run in a
    thread so the event loop (and a supervising LocalCluster) keeps going."""
    input_dir = work_dir / "input"
    input_dir.mkdir(parents=True, exist_ok=True)
    slices = split(data, drops)
    write_drop(input_dir, "drop-0000.json", slices[0])
    started = time.monotonic()
    query = await asyncio.to_thread(start_taxi_query, spark, scheduler, job_id, input_dir,
                                    work_dir / "checkpoint")
    try:
        for n, chunk in enumerate(slices[1:], start=1):
            await asyncio.sleep(0.3)
            write_drop(input_dir, f"drop-{n:04d}.json", chunk)
            if on_drop is not None:
                await on_drop(n)
        await asyncio.to_thread(query.processAllAvailable)
        seconds = time.monotonic() - started
        if query.exception() is not None:
            raise RuntimeError(f"the Spark query failed: {query.exception()}")
    finally:
        await asyncio.to_thread(query.stop)
    return seconds, spark_rate(query)[1]


async def run_spark_taxi(records: int = 20_000, devices: int = 1_000, drops: int = 4,
                         run_dir: str | Path | None = None, spark: Any = None,
                         scheduler: str | None = None) -> SparkTaxiReport:
    """Starts a LocalCluster (unless ``scheduler`` is given), feeds the taxi job
    from Spark in ``drops`` file drops, drains it and checks the results."""
    if spark is None:
        from spark_bridge.session import build_session

        spark = await asyncio.to_thread(build_session)
    base = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="spark-taxi-"))
    data = list(taxi.generate(records, devices))
    if scheduler is None:
        async with LocalCluster(base / "cluster", workers=3, state_servers=2) as cluster:
            return await _run(spark, cluster.scheduler_address, data, devices, drops, base)
    return await _run(spark, scheduler, data, devices, drops, base)


async def _run(spark: Any, scheduler: str, data: list[str], devices: int, drops: int,
               base: Path) -> SparkTaxiReport:
    async with Client(scheduler) as client:
        job_id = await client.submit(taxi.job())
        seconds, rate = await feed_taxi(spark, scheduler, job_id, data, base / job_id, drops)
        await client.drain(job_id)
        results = await client.results(job_id)
    missing, unexpected, different = compare(results, taxi.reference(data))
    return SparkTaxiReport(len(data), devices, drops, seconds, rate, missing, unexpected,
                           different, results)


def main() -> int:
    """``python -m spark_bridge.demo``: the demo with its defaults; exit code 0 on a match."""
    report = asyncio.run(run_spark_taxi())
    print(report.table())
    print(json.dumps({"records": report.records,
                      "spark_rows_per_s": round(report.spark_rows_per_s)}))
    return 0 if report.match else 1


if __name__ == "__main__":
    raise SystemExit(main())
