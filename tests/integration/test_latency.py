"""Ingest-to-sink latency and stage names in the workers' metrics, against a
real local cluster: every record that reaches the sink is observed once (a
batch at a time), with a latency that is positive and bounded by the test's
own duration, and per-task series name their stages."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from gridstream.client import Client
from gridstream.examples import wordcount
from gridstream.local import LocalCluster
from tests.integration.conftest import small_config

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 2 workers (so batches cross the network to the sink), 1 state server."""
    async with LocalCluster(tmp_path_factory.mktemp("latency"), small_config(), workers=2,
                            state_servers=1) as local:
        yield local


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def worker_samples(cluster: LocalCluster) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample every worker serves."""
    samples = []
    for member in cluster.members.values():
        if member.role != "worker":
            continue
        text = await asyncio.to_thread(scrape, member.metrics_address)
        for family in text_string_to_metric_families(text):
            samples += [(s.name, dict(s.labels), s.value) for s in family.samples]
    return samples


async def test_the_sink_observes_every_record_once_with_a_sensible_latency(
        cluster: LocalCluster) -> None:
    lines = wordcount.generate(3_000, seed=5)
    words = wordcount.count_records(lines, batch_size=500)  # the count combines per batch
    started = time.time()
    async with Client(cluster.scheduler_address, batch_size=500) as client:
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, lines)
        await client.drain(job_id, timeout_s=120)
    elapsed = time.time() - started
    samples = [s for s in await worker_samples(cluster) if s[1].get("job") == job_id]

    latency = [s for s in samples if s[0].startswith("gridstream_ingest_to_sink_seconds")]
    assert {s[1]["stage"] for s in latency} == {"store"}, latency
    count = sum(v for name, _, v in latency if name.endswith("_count"))
    total = sum(v for name, _, v in latency if name.endswith("_sum"))
    assert count == words, (count, words)  # each count reaching the sink, once
    assert 0 < total / count <= elapsed, (total, count, elapsed)
    buckets: dict[float, float] = defaultdict(float)
    for name, labels, value in latency:
        if name.endswith("_bucket"):
            buckets[float(labels["le"])] += value
    assert buckets[float("inf")] == words
    above = [bound for bound in buckets if bound >= elapsed]
    assert all(buckets[bound] == words for bound in above), buckets  # none beyond the run

    processed = {(labels["task"], labels["stage"]) for name, labels, _ in samples
                 if name == "gridstream_records_processed_total"}
    assert processed == {("0", "split"), ("1", "count+store")}, processed


async def test_batches_without_an_ingest_time_are_not_observed(cluster: LocalCluster) -> None:
    # A sender that does not stamp its batches (an older SDK) is not counted
    # at 55 years of latency: unknown is not observed.
    async with Client(cluster.scheduler_address) as client:
        job_id = await client.submit(wordcount.job())
        original = client._segment

        def unstamped(*args: object, **kwargs: object) -> object:
            segment = original(*args, **kwargs)  # type: ignore[arg-type]
            if segment is not None:
                segment.batch.ingest_unix_s = 0.0
            return segment

        client._segment = unstamped  # type: ignore[method-assign,assignment]
        await client.send(job_id, ["a b c"])
        await client.drain(job_id, timeout_s=60)
        assert await client.results(job_id) == {"a": 1, "b": 1, "c": 1}
    text = "\n".join([await asyncio.to_thread(scrape, m.metrics_address)
                      for m in cluster.members.values() if m.role == "worker"])
    assert not re.search(rf'gridstream_ingest_to_sink_seconds_count{{job="{job_id}"', text)
