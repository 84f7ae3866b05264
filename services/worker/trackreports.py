"""Tracking reports: a worker's tasks tell the trackers what they processed.

A task's report XORs values into roots; each root's tracker is on the worker
the tracker layout names (:mod:`services.worker.tracker_layout`). Reports are
split by tracker; those for one hosting worker share a ``TrackMany`` request
(:class:`gridstream.peercalls.CoalescedCalls`), sent as a message on this
worker's ``TrackStream`` to that host (:mod:`gridstream.callstreams`), and a report for a tracker
this worker hosts is applied here without a call. The trackers themselves
live in :mod:`services.worker.trackers`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from gridstream import rpc
from gridstream.callstreams import CallStreams, many_on_stream
from gridstream.errors import GridstreamError, StaleEpoch
from gridstream.peercalls import CoalescedCalls, Waiting
from gridstream.retry import Backoff
from gridstream.routing import RoutingView
from gridstream.v1 import worker_pb2, worker_pb2_grpc
from services.worker.tracker_layout import U64, TrackerLayout, pack

if TYPE_CHECKING:
    from services.worker.trackers import TrackerHost

log = logging.getLogger(__name__)

MAX_REPORTS_PER_CALL = 64
"""Tracking reports in one TrackMany call at most (the host refuses more)."""

MAX_REPORT_BYTES_PER_CALL = 4 * 1024 * 1024
"""A call takes no more reports once it carries this many bytes."""

REPORT_LINGER_S = 0.0
"""How long the first report for an idle host waits for others to join its
call (0: one step of the event loop)."""


class TrackingReporter:
    """Sends a worker's task reports to the trackers that hold their roots,
    splitting each report by tracker; a part refused by a worker that no
    longer hosts its tracker is routed again, and only that part is resent."""

    def __init__(self, node_id: str, routing: RoutingView, channels: rpc.ChannelPool,
                 host: TrackerHost) -> None:
        self.node_id = node_id
        self.routing = routing
        self.channels = channels
        self.host = host
        self.calls: CoalescedCalls[worker_pb2.TrackRequest, int] = CoalescedCalls(
            self._send_many, MAX_REPORTS_PER_CALL, MAX_REPORT_BYTES_PER_CALL, REPORT_LINGER_S)
        """Reports for one host go together (see :mod:`gridstream.peercalls`)."""
        self.streams: CallStreams[worker_pb2.TrackManyRequest,
                                  worker_pb2.TrackManyResponse] = CallStreams(
            channels, worker_pb2_grpc.WorkerStub, "TrackStream", "TrackMany")
        """A TrackStream per host (see :mod:`gridstream.callstreams`)."""

    async def report(self, job_id: str, partition: int, reporter: str, sequence: int,
                     roots: list[int], values: list[int]) -> None:
        """XORs ``values`` into ``roots`` for the task of ``partition`` here;
        returns once every tracker applied its part. Raises StaleEpoch once
        this worker no longer owns the partition (its successor reports)."""
        await self._send(job_id, np.asarray(roots, dtype=np.uint64),
                         np.asarray(values, dtype=np.uint64), reporter, sequence,
                         rebuild=False, partition=partition)

    async def rebuild(self, job_id: str, roots: list[int]) -> None:
        """Asks the roots' trackers to rebuild them from the tasks' contributions."""
        ids = np.asarray(roots, dtype=np.uint64)
        await self._send(job_id, ids, np.zeros_like(ids), "", 0, rebuild=True)

    async def _send(self, job_id: str, roots: U64, values: U64, reporter: str, sequence: int,
                    rebuild: bool, partition: int = 0) -> None:
        remaining = np.ones(roots.size, dtype=bool)
        backoff = Backoff(f"tracking {job_id}", first_s=0.02, max_s=0.5)
        while remaining.any():
            owners = self.routing.owners.get(job_id, [])
            if not rebuild and partition < len(owners) and owners[partition] != self.node_id:
                raise StaleEpoch(f"{self.node_id} no longer owns partition {partition} of job "
                                 f"{job_id}; its reports are its successor's to send",
                                 self.routing.epoch)
            layout = TrackerLayout.from_routing(self.routing)
            trackers = layout.trackers_of(roots)
            for tracker in np.unique(trackers[remaining]).tolist():
                part = remaining & (trackers == tracker)
                request = worker_pb2.TrackRequest(
                    job_id=job_id, tracker=tracker, epoch=self.routing.epoch,
                    roots=pack(roots[part]), values=pack(values[part]), rebuild=rebuild,
                    reporter=reporter, sequence=sequence, partition=partition,
                    node_id="" if rebuild else self.node_id)
                if await self._deliver(layout.hosts[tracker], request):
                    remaining &= ~part
            if remaining.any():
                await backoff.wait()
                await self.routing.refresh()

    async def _deliver(self, host: str, request: worker_pb2.TrackRequest) -> bool:
        """True once the hosting worker applied the request."""
        try:
            if host == self.node_id:
                await self.host.track(request)
                return True
            address = self.routing.addresses.get(host)
            if address is None:
                return False
            await self.calls.call(address, request, request.ByteSize(),
                                  f"tracking report to {host}")
            return True
        except GridstreamError as exc:  # routed again (stale epoch) or resent
            log.debug("tracking report to %s failed: %s", host, exc)
            return False

    async def _send_many(self, address: str,
                         batch: list[Waiting[worker_pb2.TrackRequest, int]]
                         ) -> list[int | Exception]:
        """One TrackMany request on the host's stream; an outcome per report."""
        request = worker_pb2.TrackManyRequest(reports=[w.request for w in batch])
        return await many_on_stream(self.streams, address, request, rpc.CONTROL_TIMEOUT_S,
                                    batch, lambda outcome: int(outcome.roots_held))
