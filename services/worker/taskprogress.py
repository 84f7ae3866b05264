"""A task's counters, as the scheduler's drain check and status displays read
them (:class:`~gridstream.v1.common_pb2.TaskProgress`, every field documented
in the proto)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gridstream.v1 import common_pb2

if TYPE_CHECKING:
    from services.worker.tasks import TaskRunner


def task_progress(runner: TaskRunner, node_id: str) -> common_pb2.TaskProgress:
    """``runner``'s counters now, reported as hosted by ``node_id``."""
    return common_pb2.TaskProgress(
        task=runner.task_index,
        partition=runner.partition,
        records_in=runner.container.records_in,
        records_processed=runner.records_processed,
        records_out=runner.records_out,
        queue_batches=runner.container.pending_batches + (0 if runner.ready.is_set() else 1),
        queue_records=runner.container.pending_records,
        outbound_pending=runner.delivery.pending_segments,
        windows_persisted=runner.persister.windows_persisted,
        persist_pending=runner.persister.pending + len(runner._rows) + len(runner._dead),
        dead_letters=runner.dead_letters,
        node_id=node_id,
        replicated_epoch=(runner.replicator.synced_epoch if runner.replicator is not None
                          else runner.epoch_now()),
        invocations=runner.invocations,
        batches_replayed=runner.recovered_batches,
        records_replayed=runner.recovered_records,
        batches_lost=sum(lost.last - lost.first + 1 for lost in runner.container.losses),
        losses=[lost.describe(runner.container.container_id)
                for lost in runner.container.losses],
        restarts=runner.restarts,
        last_error=runner.last_error or (runner.persister.last_error
                                       if runner.persister.failing_since is not None else ""),
        **_tracking_progress(runner),
    )


def _tracking_progress(runner: TaskRunner) -> dict[str, int]:
    tracking = runner.tracking
    if tracking is None:
        return {}
    return {
        "roots_pending": tracking.roots_pending if tracking.is_source else 0,
        "roots_finished": tracking.figures.roots_finished,
        "roots_failed": tracking.figures.roots_failed,
        "roots_abandoned": tracking.figures.roots_abandoned if tracking.is_source else 0,
    }
