"""The clicks example under kills: a branching job with a files sink.

Kills land while clicks are in flight (one of them on a worker while it
restores); the job must drain, every user's order-sensitive summary must
pass the history checker, every page's aggregate must equal the fault-free
reference, and the files sink's committed files, read together, must hold
every click exactly once (no partial file, none twice).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.config import ClusterConfig, Config
from gridstream.faultsteps import Step
from gridstream.scenarios import run_clicks

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
async def test_clicks_are_exact_and_in_files_once_under_kills(tmp_path: Path,
                                                              fmt: str) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=1_000, partitions=8,
                                                     backup_count=1))
    steps = [Step("kill", 3.0), Step("kill", 4.5, again=True), Step("kill", 9.0)]
    run = await run_clicks(steps, tmp_path, records=30_000, stream_s=13.0, config=config,
                           seed=5, tracking_timeout_s=5.0, fmt=fmt)
    print(run.table())
    assert len(run.faults) == 3 and all(f.in_flight for f in run.faults), run.table()
    assert run.verdict.ok, run.table()
    assert not run.problems, run.table()
    assert not run.losses and not run.undrained, run.table()
    assert run.files > 8, run.table()  # a file per window and partition, not one in all
