"""Where a history run's next fault lands (``gridstream.faultsteps.running_workers``).

History runs do not wait for the cluster to heal between faults, so faults
close together can leave every worker down at once. A fault then waits for
the first worker process back instead of signalling one that is down (which
failed the whole chaos run with ProcessLookupError), and says so when none
comes back. The members here are stand-ins with the two things the choice
reads: whether the process runs, and whether it wrote its ready file; the
cluster's stand-in refuses to signal a process that is down, as the real
one does.
"""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path
from typing import Any, cast

import pytest

from gridstream.faultsteps import Step, inject, running_workers
from gridstream.local import LocalCluster


class StandInMember:
    """A member's process state as the fault chooser sees it."""

    def __init__(self, ready_file: Path, running: bool) -> None:
        self.ready_file = ready_file
        self.running = running
        self.role = "worker"

    def alive(self) -> bool:
        return self.running


class StandInCluster:
    """The members and run directory a fault chooser reads."""

    def __init__(self, run_dir: Path, members: dict[str, StandInMember]) -> None:
        self.run_dir = run_dir
        self.members = members
        self.signals: list[tuple[str, int]] = []

    def kill(self, name: str, sig: int) -> int:
        """As LocalCluster.kill: a process that is gone cannot be signalled."""
        if not self.members[name].running:
            raise ProcessLookupError(f"{name} is not running")
        self.signals.append((name, sig))
        return 0


def cluster_of(tmp_path: Path, states: dict[str, tuple[bool, bool]]) -> Any:
    """A stand-in cluster; ``states`` maps a worker to (running, ready file written)."""
    members = {}
    for name, (running, ready) in states.items():
        ready_file = tmp_path / f"{name}.json"
        if ready:
            ready_file.write_text("{}")
        members[name] = StandInMember(ready_file, running)
    return cast(LocalCluster, StandInCluster(tmp_path, members))


async def test_only_running_ready_workers_take_a_fault(tmp_path: Path) -> None:
    # worker-1 was killed (its ready file is left over), worker-2 is
    # restarting (no ready file yet), worker-3 runs.
    cluster = cluster_of(tmp_path, {"worker-1": (False, True), "worker-2": (True, False),
                                    "worker-3": (True, True)})
    assert await running_workers(cluster, ["worker-1", "worker-2", "worker-3"]) == ["worker-3"]


async def test_with_every_worker_down_the_fault_waits_for_the_first_back(
        tmp_path: Path) -> None:
    cluster = cluster_of(tmp_path, {"worker-1": (False, True), "worker-2": (False, True)})

    async def restart_worker_2() -> None:
        await asyncio.sleep(0.2)
        cluster.members["worker-2"].running = True

    restart = asyncio.create_task(restart_worker_2())
    try:
        chosen = await running_workers(cluster, ["worker-1", "worker-2"], timeout_s=10.0)
    finally:
        await restart
    assert chosen == ["worker-2"]


async def test_no_worker_back_in_time_is_named(tmp_path: Path) -> None:
    cluster = cluster_of(tmp_path, {"worker-1": (False, True), "worker-2": (True, False)})
    with pytest.raises(TimeoutError, match=r"worker-1, worker-2.*restarts fail"):
        await running_workers(cluster, ["worker-1", "worker-2"], timeout_s=0.2)


class StandInSender:
    """A sender with records in flight (a pause step asks nothing else of it)."""

    client = None

    def in_flight(self) -> bool:
        return True


async def test_a_pause_with_every_worker_down_lands_on_the_first_back(
        tmp_path: Path) -> None:
    # Through the step itself: the former chooser fell back to any worker
    # and signalled a dead one (ProcessLookupError here, as in the real run).
    cluster = cluster_of(tmp_path, {"worker-1": (False, True), "worker-2": (False, True),
                                    "worker-3": (False, True)})

    async def restart_worker_3() -> None:
        await asyncio.sleep(0.2)
        cluster.members["worker-3"].running = True

    restart = asyncio.create_task(restart_worker_3())
    try:
        record = await inject(cluster, Step("pause", 0.0, pause_s=0.0), random.Random(1),
                              cast(Any, StandInSender()), None, [], False)
    finally:
        await restart
    assert record.victims == ["worker-3"] and record.in_flight
    assert cluster.signals == [("worker-3", signal.SIGSTOP), ("worker-3", signal.SIGCONT)]
