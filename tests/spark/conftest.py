"""One SparkSession per test session (it takes 6-24 s and ~1 GB to start) and
one supervised local cluster per module."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gridstream.config import ClusterConfig, Config
from gridstream.local import LocalCluster

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """local[2], no UI, loopback only, format("gridstream") registered."""
    pytest.importorskip("pyspark")
    from spark_bridge.session import build_session

    session = build_session("local[2]", "gridstream-tests")
    yield session
    session.stop()


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 3 workers, 2 state servers; killed members come back
    (supervise=True), as under systemd."""
    config = replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=8))
    run_dir: Path = tmp_path_factory.mktemp("spark-cluster")
    async with LocalCluster(run_dir, config, workers=3, state_servers=2, supervise=True,
                            restart_delay_s=0.3) as local:
        yield local
