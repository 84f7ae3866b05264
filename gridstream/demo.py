"""The demos: a local cluster runs one of the seeds' workloads (or the
clickstream graph, with its files sink) and checks the result against an
in-process reference computation, record for record."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gridstream import filesink
from gridstream.client import DEFAULT_BATCH_SIZE, Client
from gridstream.config import Config, SecurityConfig
from gridstream.examples import clicks, taxi, trips, wordcount
from gridstream.local import LocalCluster

log = logging.getLogger(__name__)

DEFAULT_RECORDS = {"taxi": 200_000, "wordcount": 300_000, "clicks": 100_000, "trips": 100_000}


@dataclass
class DemoReport:
    """What a demo run measured."""

    name: str
    records: int
    units: str
    seconds: float
    results: int
    expected: int
    missing: int
    extra: int
    different: int
    problems: list[str] = field(default_factory=list)
    """What else differs from the reference (the clicks demo's files)."""
    detail: str = ""
    """What was checked, for the summary (the clicks demo's sinks and files)."""

    @property
    def match(self) -> bool:
        """True when the sink equals the reference exactly."""
        return self.missing == self.extra == self.different == 0 and not self.problems

    @property
    def rate(self) -> float:
        """Records per second, end to end."""
        return self.records / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        """A short human-readable summary."""
        verdict = "MATCH" if self.match else (
            f"MISMATCH ({self.missing} missing, {self.extra} unexpected, "
            f"{self.different} different{''.join('; ' + p for p in self.problems)})"
        )
        if self.detail:
            verdict += f" ({self.detail})"
        return (
            f"{self.name}: {self.records:,} {self.units} in {self.seconds:.2f} s = "
            f"{self.rate:,.0f} {self.units}/s; {self.results:,} result rows; "
            f"reference check: {verdict}"
        )


def compare(actual: dict[str, Any], expected: dict[str, Any]) -> tuple[int, int, int]:
    """(missing, unexpected, different) keys of ``actual`` against ``expected``."""
    missing = sum(1 for k in expected if k not in actual)
    extra = sum(1 for k in actual if k not in expected)
    different = sum(1 for k, v in expected.items() if k in actual and actual[k] != v)
    return missing, extra, different


def workload(
    name: str, records: int
) -> tuple[Any, list[str] | None, list[str], dict[str, Any], int, str]:
    """(job spec, keys, input records, expected results, measured units, unit name)."""
    if name == "taxi":  # sent keyed by device: the reduce needs no shuffle
        keys, data = taxi.keyed(records)
        return (taxi.job(prepartitioned=True), keys, data, taxi.reference(data), len(data),
                "records")
    if name == "wordcount":
        lines = wordcount.generate(records)
        return wordcount.job(), None, lines, wordcount.reference(lines), records, "words"
    raise ValueError(f"unknown demo {name!r}; choose taxi, wordcount, clicks or trips")


async def run_clicks_on(scheduler: str, records: int, files: Path,
                        batch_size: int = DEFAULT_BATCH_SIZE,
                        security: SecurityConfig | None = None) -> DemoReport:
    """Runs the clicks job (:mod:`gridstream.examples.clicks`) against a
    running cluster whose workers can write ``files``; checks the per-user
    and per-page sinks key by key and the files sink's files (every click
    exactly once) against the reference."""
    keys, lines = clicks.generate(records)
    expected = clicks.reference(lines)
    async with Client(scheduler, batch_size=batch_size, security=security) as client:
        job_id = await client.submit(clicks.flow(files).job())
        started = time.monotonic()
        await client.send(job_id, lines, keys)
        await client.drain(job_id)
        seconds = time.monotonic() - started
        users = await client.results(job_id, sink="users")
        pages = await client.results(job_id, sink="pages")
    found = await asyncio.to_thread(filesink.read_records, files, job_id, "clicks")
    missing, extra, different = (a + b for a, b in zip(
        compare(users, expected["users"]), compare(pages, expected["pages"]), strict=True))
    problem = clicks.check_files(found, lines)
    files_count = len(await asyncio.to_thread(filesink.committed_files, files, job_id, "clicks"))
    return DemoReport("clicks", records, "clicks", seconds, len(users) + len(pages),
                      len(expected["users"]) + len(expected["pages"]), missing, extra,
                      different, [problem] if problem else [],
                      f"{len(users)} users and {len(pages)} pages per key; {len(found):,} "
                      f"clicks in {files_count} files under {files / job_id}")


async def run_trips_on(scheduler: str, records: int, batch_size: int = DEFAULT_BATCH_SIZE,
                       security: SecurityConfig | None = None) -> DemoReport:
    """Runs the trips job (:mod:`gridstream.examples.trips`: per-device trip
    summaries in 5-minute event-time windows) against a running cluster and
    checks every fired window, once each, against the reference computed in
    event-time order in this process; no trip may be late."""
    keys, values = trips.generate(records)
    expected = trips.reference(values)
    spec = trips.flow().job()
    closing_keys, closing = trips.closing(spec.partitions)
    async with Client(scheduler, batch_size=batch_size, security=security) as client:
        job_id = await client.submit(spec)
        started = time.monotonic()
        await client.send(job_id, values + closing, keys + closing_keys)
        await client.drain(job_id)
        seconds = time.monotonic() - started
        rows = list((await client.results(job_id, sink="summaries")).values())
        late = await client.results(job_id, sink="late")
        joined = trips.driven(list((await client.results(job_id, sink="driven")).values()))
    problems = [f"{len(late)} trips late"] if late else []
    if joined != trips.reference_driven(values):
        problems.append("trips joined with drivers differ from the reference")
    try:
        fired = {f"{device}@{start}": value
                 for (device, start), value in trips.summaries(rows).items()}
    except AssertionError as exc:  # a window fired twice
        problems.append(str(exc))
        fired = {}
    missing, extra, different = compare(
        fired, {f"{device}@{start}": value for (device, start), value in expected.items()})
    return DemoReport("trips", records, "trips", seconds, len(rows), len(expected), missing,
                      extra, different, problems,
                      f"{len(rows):,} windows of 5 minutes, each fired once; {len(joined):,} "
                      "trips joined with their drivers as of their time")


async def run_on(scheduler: str, name: str, records: int, batch_size: int = DEFAULT_BATCH_SIZE,
                 delivery: str = "exactly_once",
                 security: SecurityConfig | None = None) -> DemoReport:
    """Runs a workload against a running cluster and checks it."""
    spec, keys, data, expected, units_count, units = workload(name, records)
    spec = replace(spec, delivery=delivery)
    async with Client(scheduler, batch_size=batch_size, security=security) as client:
        job_id = await client.submit(spec)
        started = time.monotonic()
        await client.send(job_id, data, keys)
        await client.drain(job_id)
        seconds = time.monotonic() - started
        actual = await client.results(job_id)
    missing, extra, different = compare(actual, expected)
    return DemoReport(name, units_count, units, seconds, len(actual), len(expected),
                      missing, extra, different)


async def run_demo(
    name: str,
    records: int | None = None,
    workers: int = 3,
    state_servers: int = 2,
    run_dir: str | None = None,
    config: Config | None = None,
) -> DemoReport:
    """Starts a local cluster, runs the workload, checks it, stops the cluster."""
    records = records or DEFAULT_RECORDS[name]
    directory = Path(run_dir or tempfile.mkdtemp(prefix=f"gridstream-{name}-"))
    files_dir = Path(await asyncio.to_thread(os.path.abspath, directory)) / "files"
    print(f"starting a local cluster: 1 scheduler, {workers} workers, {state_servers} state "
          f"servers (logs in {directory / 'logs'})", flush=True)
    async with LocalCluster(directory, config, workers, state_servers) as cluster:
        print(f"cluster ready; scheduler at {cluster.scheduler_address}; running {name} "
              f"on {records:,} input units", flush=True)
        if name == "clicks":
            return await run_clicks_on(cluster.scheduler_address, records,
                                       files_dir,
                                       security=cluster.config.security)
        if name == "trips":
            return await run_trips_on(cluster.scheduler_address, records,
                                      security=cluster.config.security)
        return await run_on(cluster.scheduler_address, name, records,
                            security=cluster.config.security)
