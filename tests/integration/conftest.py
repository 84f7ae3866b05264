"""A shared local cluster of real processes for the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.jobspec import DEFAULT_JOB_MODULES
from gridstream.local import LocalCluster

TEST_JOB_MODULES = (*DEFAULT_JOB_MODULES, "tests.integration")
"""The test clusters also let jobs name the operators under tests/integration."""


def small_config() -> Config:
    """Small windows and partitions so a short test crosses many windows."""
    return replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=8,
                                                   job_modules=TEST_JOB_MODULES))


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 3 workers, 2 state servers, each its own process."""
    run_dir: Path = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(run_dir, small_config(), workers=3, state_servers=2)
    async with local:
        yield local


@pytest_asyncio.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    """An SDK client connected to the shared cluster."""
    async with Client(cluster.scheduler_address, batch_size=1_000) as sdk:
        yield sdk
