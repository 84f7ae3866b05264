"""What a worker answers a tracker: the tracker's events (completed, failed
and abandoned roots) handed to this worker's tasks of the job and, for a
rebuild, their contributions summed, with which roots a source here still
holds, which this worker knows completed, and which a task here still holds
an unreported batch of (in progress: slow, not lost)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gridstream.v1 import worker_pb2
from services.worker.tracker_layout import pack, unpack

if TYPE_CHECKING:
    from services.worker.node import WorkerNode


async def answer_tracking_events(
    node: WorkerNode, request: worker_pb2.TrackingEventsRequest
) -> worker_pb2.TrackingEventsResponse:
    """Hands a tracker's events to this worker's tasks of the job and, for a
    rebuild, sums their contributions."""
    await node.routing.reach(request.epoch, f"tracking events of job {request.job_id}")
    node.trackers.heard_completed(request.job_id, unpack(request.completed))
    known = pack(node.trackers.known_completed(request.job_id, unpack(request.collect)))
    runtime = node.jobs.get(request.job_id)
    if runtime is None:
        return worker_pb2.TrackingEventsResponse(complete=True, known_completed=known)
    completed = unpack(request.completed).tolist()
    failed = unpack(request.failed).tolist()
    abandoned = unpack(request.abandoned).tolist()
    collect = {int(r) for r in unpack(request.collect)}
    owners = node.routing.owners.get(request.job_id, [])
    epoch = node.routing.epoch
    owned = [(task, partition) for partition, owner in enumerate(owners)
             if owner == node.node_id for task in range(len(runtime.tasks))]
    complete = all(k in runtime.runners and runtime.runners[k].ready.is_set() for k in owned)
    contributions: dict[int, int] = {}
    through: dict[str, int] = {}
    sources: set[int] = set()
    alive: set[int] = set()
    for (_, partition), runner in list(runtime.runners.items()):
        if partition >= len(owners) or owners[partition] != node.node_id:
            continue  # a task about to stop: its successor answers for it
        if not runner.ready.is_set():
            complete = False
            continue
        mine, sequence, pending, busy = await runner.tracking_events(
            completed, failed, collect, abandoned)
        alive |= busy
        for root, value in mine.items():
            contributions[root] = contributions.get(root, 0) ^ value
        through[runner.reporter_id] = sequence
        sources |= pending
    pairs = [x for root, value in contributions.items() for x in (root, value)]
    return worker_pb2.TrackingEventsResponse(
        contributions=pack(pairs), complete=complete, reported_through=through,
        source_pending=pack(sorted(sources)), epoch=epoch, known_completed=known,
        in_progress=pack(sorted(alive)))
