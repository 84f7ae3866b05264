"""Every service serves Prometheus metrics with the named series."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from gridstream.client import Client
from gridstream.examples import wordcount
from gridstream.local import LocalCluster

pytestmark = pytest.mark.integration


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def run_wordcount(cluster: LocalCluster, client: Client, lines: list[str],
                        delivery: str = "exactly_once") -> tuple[str, str]:
    """Runs wordcount over ``lines`` to the end, checks its results, and
    returns its job id and every worker's metrics text, scraped after."""
    job_id = await client.submit(wordcount.job(delivery=delivery))
    await client.send(job_id, lines)
    await client.drain(job_id)
    assert await client.results(job_id) == wordcount.reference(lines)
    worker_text = "\n".join([await asyncio.to_thread(scrape, m.metrics_address)
                             for m in cluster.members.values() if m.role == "worker"])
    return job_id, worker_text


async def test_metrics_endpoints_expose_the_named_series(cluster: LocalCluster,
                                                         client: Client) -> None:
    lines = wordcount.generate(20_000, seed=2)
    job_id, worker_text = await run_wordcount(cluster, client, lines)
    for series in ("gridstream_records_in_total", "gridstream_records_out_total",
                   "gridstream_records_processed_total", "gridstream_queue_depth_records",
                   "gridstream_snapshot_lag_batches", "gridstream_windows_persisted_total",
                   "gridstream_recoveries_total"):
        assert series in worker_text, series
    processed = sum(float(line.rsplit(" ", 1)[1]) for line in worker_text.splitlines()
                    if line.startswith("gridstream_records_processed_total{")
                    and f'job="{job_id}"' in line and 'task="0"' in line)
    assert processed == len(lines)  # every line split once, across the three workers

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in worker_text.splitlines()
                   if line.startswith(name))

    # Tuple tracking: every root of the drained job completed on some tracker,
    # and completed roots leave the trackers.
    assert total('gridstream_tracked_roots_outcomes_total{outcome="completed"}') >= 1
    assert "gridstream_tracker_bytes" in worker_text
    assert total("gridstream_tracked_roots ") == 0
    # exactly_once wordcount writes no result rows (the counts are read from
    # the stored state; the split task has no sink), so it shows no linger.
    assert not [line for line in worker_text.splitlines()
                if line.startswith("gridstream_results_linger_seconds{")
                and f'job="{job_id}"' in line]
    scheduler_text = await asyncio.to_thread(scrape, cluster.members["scheduler"].metrics_address)
    for series in ("gridstream_member_phi", "gridstream_member_state",
                   "gridstream_member_loop_lag_seconds",
                   "gridstream_detections_total", "gridstream_routing_epoch"):
        assert series in scheduler_text, series
    state_text = await asyncio.to_thread(scrape, cluster.members["state-1"].metrics_address)
    assert "gridstream_snapshots_stored" in state_text
    assert "gridstream_store_commits_total" in state_text


async def test_watch_view_shows_members_stages_and_warns_on_slow_persistence(
    cluster: LocalCluster, client: Client
) -> None:
    from gridstream.watch import Watcher

    job_id = await client.submit(wordcount.job())
    await client.send(job_id, wordcount.generate(5_000, seed=3))
    await client.drain(job_id)
    watcher = Watcher(client)
    screen = await watcher.render()
    assert "worker-1" in screen and "state-1" in screen and job_id in screen
    assert "no warnings" in screen
    # A stage whose queue and backlog grow at every refresh is flagged.
    from gridstream.watch import GROWTH_WINDOW, StageFigures, trend_alerts

    rising = [StageFigures(processed=i, queued=i * 10, persist_pending=i)
              for i in range(GROWTH_WINDOW + 1)]
    warned = [alert.text for alert in trend_alerts(job_id, 1, rising)]
    assert len(warned) == 2 and "queue growing" in warned[0] and "falling behind" in warned[1]
    steady = [*rising[:-1], StageFigures(queued=0, persist_pending=0)]
    assert trend_alerts(job_id, 1, steady) == []


async def test_only_tasks_that_write_result_rows_show_their_linger(
        cluster: LocalCluster, client: Client) -> None:
    # at_most_once: the count task writes its rows (nothing is read from
    # state), the split task has no sink and so no rows to hold back.
    lines = wordcount.generate(5_000, seed=4)
    job_id, worker_text = await run_wordcount(cluster, client, lines, "at_most_once")
    linger = [line for line in worker_text.splitlines()
              if line.startswith("gridstream_results_linger_seconds{")
              and f'job="{job_id}"' in line]
    assert linger and all('task="1"' in line for line in linger), linger
    partitions = {line.split('partition="', 1)[1].split('"', 1)[0] for line in linger}
    assert len(partitions) == len(linger) == cluster.config.cluster.partitions
    # At least the configured linger (it only stretches while writes are slow).
    floor = cluster.config.worker.results_linger_s
    assert all(float(line.rsplit(" ", 1)[1]) >= floor for line in linger), linger
