"""The demos: a local cluster runs one of the seeds' workloads and checks the
result against an in-process reference computation, record for record."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gridstream.client import Client
from gridstream.config import Config, SecurityConfig
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster

log = logging.getLogger(__name__)

DEFAULT_RECORDS = {"taxi": 200_000, "wordcount": 300_000}


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

    @property
    def match(self) -> bool:
        """True when the sink equals the reference exactly."""
        return self.missing == self.extra == self.different == 0

    @property
    def rate(self) -> float:
        """Records per second, end to end."""
        return self.records / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        """A short human-readable summary."""
        verdict = "MATCH" if self.match else (
            f"MISMATCH ({self.missing} missing, {self.extra} unexpected, "
            f"{self.different} different)"
        )
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
    if name == "taxi":
        keys, data = taxi.keyed(records)
        return taxi.job(), keys, data, taxi.reference(data), len(data), "records"
    if name == "wordcount":
        lines = wordcount.generate(records)
        return wordcount.job(), None, lines, wordcount.reference(lines), records, "words"
    raise ValueError(f"unknown demo {name!r}; choose taxi or wordcount")


async def run_on(scheduler: str, name: str, records: int, batch_size: int = 5_000,
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
    print(f"starting a local cluster: 1 scheduler, {workers} workers, {state_servers} state "
          f"servers (logs in {directory / 'logs'})", flush=True)
    async with LocalCluster(directory, config, workers, state_servers) as cluster:
        print(f"cluster ready; scheduler at {cluster.scheduler_address}; running {name} "
              f"on {records:,} input units", flush=True)
        return await run_on(cluster.scheduler_address, name, records,
                            security=cluster.config.security)
