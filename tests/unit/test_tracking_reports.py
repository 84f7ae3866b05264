"""A worker's tasks' tracking reports for one tracker host share a TrackMany
call (services/worker/trackers.py, TrackingReporter).

The host is a real gRPC server answering each report of a call on its own,
as the worker's servicer does.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest

from gridstream import rpc
from gridstream.routing import RoutingView
from gridstream.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc
from services.worker.tracker_layout import TrackerLayout
from services.worker.trackreports import TrackingReporter

JOB = "job-1"
WORKERS = ["worker-1", "worker-2"]
VIRTUAL_NODES = 16


class Host(worker_pb2_grpc.WorkerServicer):
    """Counts the reports of each TrackMany call and the roots reported."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.reporters: list[str] = []

    async def TrackMany(self, request: worker_pb2.TrackManyRequest,
                        context: grpc.aio.ServicerContext) -> worker_pb2.TrackManyResponse:
        self.calls.append(len(request.reports))
        self.reporters.extend(report.reporter for report in request.reports)
        return worker_pb2.TrackManyResponse(outcomes=[
            worker_pb2.TrackOutcome(roots_held=len(self.reporters)) for _ in request.reports])


@pytest.fixture
async def host() -> AsyncIterator[tuple[Host, str]]:
    server = grpc.aio.server()
    found = Host()
    worker_pb2_grpc.add_WorkerServicer_to_server(found, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    yield found, address
    await server.stop(None)


def routing_with_remote_tracker(address: str) -> tuple[RoutingView, str]:
    """A routing table whose one tracker is hosted on the worker at
    ``address``, and the other worker's name (the reporter, owning every
    partition)."""
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    table = scheduler_pb2.RoutingTable(epoch=1, tracker_count=1)
    for worker in WORKERS:
        table.members.append(scheduler_pb2.Member(
            node_id=worker, role=scheduler_pb2.MEMBER_ROLE_WORKER, address=address,
            state=scheduler_pb2.MEMBER_STATE_ALIVE))
    routing._apply(table)
    tracker_host = TrackerLayout.from_routing(routing).hosts[0]
    reporter = next(w for w in WORKERS if w != tracker_host)
    table.jobs.append(scheduler_pb2.JobRouting(job_id=JOB, partitions=4, owners=[reporter] * 4))
    routing._apply(table)
    return routing, reporter


async def test_reports_of_several_tasks_for_one_host_share_a_call(
        host: tuple[Host, str]) -> None:
    found, address = host
    routing, reporter_node = routing_with_remote_tracker(address)
    channels = rpc.ChannelPool()
    try:
        reporter = TrackingReporter(reporter_node, routing, channels, cast(Any, None))
        await asyncio.gather(*(
            reporter.report(JOB, partition, f"{JOB}/t1/p{partition}", 1, [100 + partition],
                            [7]) for partition in range(4)))
    finally:
        await channels.close()
    assert found.calls == [4]
    assert sorted(found.reporters) == [f"{JOB}/t1/p{p}" for p in range(4)]
    assert reporter.calls.calls == 1


def test_the_worker_loads_what_the_first_report_would_import_at_start_up() -> None:
    """The first ``np.unique`` of a process imports ``numpy.ma`` (about 8 ms
    of a busy event loop, in a job's first tracking report). Importing the
    reporter's module loads it, so a worker pays it before it serves jobs."""
    probe = ("import sys; import services.worker.trackers; "
             "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "True"
