"""Exactly once for a dataflow graph under kills, judged per key.

The graph history job (:mod:`gridstream.examples.history_graph`) fans the
history records out to an order-sensitive fold, an append sink and two
filters whose union is tallied per key: seven tasks, forward and keyed
edges, three sinks. Kills land while records are in flight on every edge;
the job must drain, the fold must pass the history checker, and the other
sinks must equal the fault-free reference key by key (the append sink:
every record once).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.config import ClusterConfig, Config
from gridstream.faultsteps import Step
from gridstream.scenarios import run_history

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]


async def test_a_graph_job_is_exact_under_kills_and_a_kill_during_a_restore(
    tmp_path: Path,
) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=8,
                                                     backup_count=1))
    steps = [Step("kill", 3.0), Step("kill", 4.5, again=True), Step("kill", 9.0),
             Step("kill", 14.0)]
    run = await run_history(steps, tmp_path, records=40_000, stream_s=17.0, config=config,
                            seed=11, tracking_timeout_s=5.0, graph=True)
    print(run.table())
    assert len(run.faults) == 4 and all(f.in_flight for f in run.faults), run.table()
    assert run.verdict.ok, run.table()
    assert not run.branches, run.table()
    assert not run.losses, run.table()
    assert not run.undrained, run.table()
