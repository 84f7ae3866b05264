"""Prometheus series of one worker, read from its live state at scrape time:
per-task counters (labelled with the job, the task, its stages and the
partition), ingest-to-sink latency, recoveries and restarts, standby state,
tracking, losses and stalled writes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gridstream.metrics import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Histogram,
    Metric,
    counter,
    gauge,
    histogram,
)

if TYPE_CHECKING:
    from gridstream.jobspec import Stage
    from services.worker.node import WorkerNode


def node_metrics(node: WorkerNode) -> list[Metric]:
    """Every series of ``node``."""
    labels = ["job", "task", "stage", "partition"]
    latency: dict[tuple[str, ...], Histogram] = {}
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        "in": counter("gridstream_records_in", "Records appended to the task's "
                      "JobContainer (since the task started here)", labels),
        "done": counter("gridstream_records_processed", "Records the task's operators "
                        "finished", labels),
        "out": counter("gridstream_records_out", "Records emitted to the next task",
                       labels),
        "queue": gauge("gridstream_queue_depth_records", "Records waiting in the "
                       "JobContainer", labels),
        "lag": gauge("gridstream_snapshot_lag_batches", "Batches processed since the "
                     "last durable window snapshot", labels),
        "windows": counter("gridstream_windows_persisted", "Window snapshots made durable",
                           labels),
        "dead": counter("gridstream_dead_letters", "Records sent to the dead-letter table",
                        labels),
        "linger": gauge("gridstream_results_linger_seconds", "How long the task's result "
                        "rows wait between writes now (worker.results_linger_s, stretched "
                        "while the state servers are slow to store them)", labels),
    }
    for runtime in node.jobs.values():
        for runner in runtime.runners.values():
            stages = runner.chain.stages
            values = [runtime.job_id, str(runner.task_index), stage_label(stages),
                      str(runner.partition)]
            families["in"].add_metric(values, runner.container.records_in)
            families["done"].add_metric(values, runner.records_processed)
            families["out"].add_metric(values, runner.records_out)
            families["queue"].add_metric(values, runner.container.pending_records)
            families["lag"].add_metric(values, runner.latest.offset - runner.durable_offset)
            families["windows"].add_metric(values, runner.persister.windows_persisted)
            families["dead"].add_metric(values, runner.dead_letters)
            # Only a task that writes result rows has a linger: not one without a
            # sink, nor one whose rows are read from its stored state.
            if runner.chain.has_sink and not runner.rows_from_state:
                families["linger"].add_metric(values, runner.persister.rows_linger_s)
            if runner.latency.count:
                sink = latency.setdefault((runtime.job_id, stages[-1].name), Histogram())
                sink.add(runner.latency)
    sink_latency = histogram(
        "gridstream_ingest_to_sink_seconds", "Seconds from a client sending a record "
        "to the sink task processing it (per batch, weighted by its records), "
        "summed over this worker's partitions", ["job", "stage"], latency)
    recoveries = counter("gridstream_recoveries", "Tasks started from a snapshot or a "
                         "log copy taken over from another worker", [])
    recoveries.add_metric([], node.recoveries)
    standby_keys = gauge("gridstream_standby_keys", "Keys of state this worker holds as "
                         "warm standbys of the tasks it backs up", [])
    standby_keys.add_metric([], node.standbys.keys_held)
    standby = counter("gridstream_standby_events", "Standby events here: takeovers that "
                      "adopted a standby (no whole-state read), and catch-ups read from "
                      "the state servers after a missed window", ["event"])
    standby.add_metric(["adopted"], node.standbys.taken)
    standby.add_metric(["catch_up"], node.standbys.catch_ups)
    roots = gauge("gridstream_tracked_roots", "In-flight roots held by the trackers this "
                  "worker hosts", [])
    roots.add_metric([], node.trackers.roots_held)
    table_bytes = gauge("gridstream_tracker_bytes", "Bytes of the tracking tables this "
                        "worker hosts", [])
    table_bytes.add_metric([], node.trackers.bytes_held)
    outcomes = counter("gridstream_tracked_roots_outcomes", "Roots whose tree completed, "
                       "timed out, or was rebuilt, on trackers hosted here", ["outcome"])
    outcomes.add_metric(["completed"], node.trackers.completed)
    outcomes.add_metric(["failed"], node.trackers.failed)
    outcomes.add_metric(["rebuilt"], node.trackers.rebuilt)
    outcomes.add_metric(["abandoned"], node.trackers.abandoned)
    lost = counter("gridstream_batches_lost", "Acknowledged batches found lost (more "
                   "failures than backup_count allows), per job", ["job"])
    for runtime in node.jobs.values():
        lost.add_metric([runtime.job_id], sum(
            lost_range.last - lost_range.first + 1
            for runner in runtime.runners.values()
            for lost_range in runner.container.losses))
    restarts = counter("gridstream_task_restarts", "Times a task's loop failed and was "
                       "started again from its snapshot", ["job"])
    for runtime in node.jobs.values():
        restarts.add_metric([runtime.job_id],
                            sum(r.restarts for r in runtime.runners.values()))
    failures = counter("gridstream_snapshot_write_failures", "Window snapshot and result "
                       "writes that failed and are being retried (trimming waits)",
                       ["job"])
    stalled = gauge("gridstream_snapshot_stalled_seconds", "Seconds a task's writes have "
                    "been failing without a success (0 when healthy)", labels)
    now = time.monotonic()
    for runtime in node.jobs.values():
        failures.add_metric([runtime.job_id], sum(
            r.persister.write_failures for r in runtime.runners.values()))
        for r in runtime.runners.values():
            since = r.persister.failing_since
            stalled.add_metric([runtime.job_id, str(r.task_index), stage_label(r.chain.stages),
                                str(r.partition)], 0.0 if since is None else now - since)
    return [*families.values(), sink_latency, recoveries, standby_keys, standby, roots,
            table_bytes, outcomes, lost, restarts, failures, stalled]


def stage_label(stages: Sequence[Stage]) -> str:
    """The ``stage`` label of a task's series: the names of the stages it
    chains, joined by ``+`` (``count+store``)."""
    return "+".join(stage.name for stage in stages)
