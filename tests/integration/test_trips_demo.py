"""The trips demo on a local cluster: per-device trip summaries in 5-minute
event-time windows, every window fired once with the reference's value."""

from __future__ import annotations

from gridstream.demo import run_trips_on
from gridstream.local import LocalCluster


async def test_the_trips_demo_matches_its_event_time_reference(cluster: LocalCluster) -> None:
    report = await run_trips_on(cluster.scheduler_address, 20_000, batch_size=1_000,
                                security=cluster.config.security)
    print(report.summary())
    assert report.match, report.summary()
    assert report.results == report.expected > 3_000
