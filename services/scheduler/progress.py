"""Whether a job has drained, decided from the workers' task counters.

Clients call ``drain`` before reading results: it must not say "done" while a
record is still queued, travelling between tasks or waiting to become durable.
Each worker reports its own (task, partition) counters at a slightly different
instant, so a record in flight between two workers could be invisible to a
single report: a sender counts a batch as in flight until the receiver has
committed it, and the SDK only believes two consecutive drained reports with
unchanged counters. (Counters restart when a task moves to another worker, so
"task t-1 emitted what task t accepted" cannot be checked across failures.)

The rule lives here, apart from the gRPC fan-out, so that it is plain
Python that unit tests can call with hand-made counters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gridstream.jobspec import JobSpec, plan_tasks
from gridstream.v1 import common_pb2


@dataclass(frozen=True)
class DrainVerdict:
    """The verdict and, when not drained, the first reason found (for logs and tests)."""

    drained: bool
    reason: str = ""


def drain_verdict(spec: JobSpec, entries: Iterable[common_pb2.TaskProgress]) -> DrainVerdict:
    """Decides whether every record accepted so far is fully processed and durable.

    Drained iff all of:

    (a) there is exactly one entry for every task index of the job
        (``len(plan_tasks(spec))`` tasks) and every partition; a missing entry
        (a worker that has not deployed yet, or a task being moved) or a
        duplicate one (two workers both claim it during a handoff) is not drained;
    (b) every entry has ``queue_batches == 0``, ``outbound_pending == 0``,
        ``persist_pending == 0`` and ``records_processed == records_in``;
    (c) in an exactly-once job, no source task holds a pending root
        (``roots_pending == 0``): every tracked tuple tree is complete. In an
        at-least-once job tracking only reports (nothing is replayed by it),
        so (a) and (b) decide.

    ``spec`` must have its defaults filled in (``partitions`` > 0).
    """
    tasks = len(plan_tasks(spec))
    seen: dict[tuple[int, int], common_pb2.TaskProgress] = {}
    for entry in entries:
        key = (entry.task, entry.partition)
        if key in seen:
            return DrainVerdict(False, f"task {entry.task} partition {entry.partition} is "
                                "reported twice (a handoff is in progress)")
        seen[key] = entry
    for task in range(tasks):
        for partition in range(spec.partitions):
            if (task, partition) not in seen:
                return DrainVerdict(False, f"task {task} partition {partition} has not "
                                    "reported (not deployed yet, or moving)")
    extra = sorted(k for k in seen if k[0] >= tasks or k[1] >= spec.partitions)
    if extra:
        return DrainVerdict(False, f"unexpected entry for task {extra[0][0]} partition "
                            f"{extra[0][1]}")
    for (task, partition), e in sorted(seen.items()):
        where = f"task {task} partition {partition}"
        if e.queue_batches:
            return DrainVerdict(False, f"{where}: {e.queue_batches} batches queued")
        if e.outbound_pending:
            return DrainVerdict(False, f"{where}: {e.outbound_pending} batches in flight")
        if e.persist_pending:
            return DrainVerdict(False, f"{where}: {e.persist_pending} writes not yet durable")
        if e.records_processed != e.records_in:
            return DrainVerdict(False, f"{where}: processed {e.records_processed} of "
                                f"{e.records_in} records")
        if e.roots_pending and spec.delivery == "exactly_once":
            return DrainVerdict(False, f"{where}: {e.roots_pending} tuple trees not complete")
    return DrainVerdict(True)
