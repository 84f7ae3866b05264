"""The web console's one JSON document: everything the page shows, built from
the scheduler's live state and its monitor's ring buffer at each request
(the page polls it about once a second)."""

from __future__ import annotations

import math
import time
from typing import Any

from gridstream.v1 import scheduler_pb2
from services.scheduler.monitor import Monitor

ROLES = {scheduler_pb2.MEMBER_ROLE_WORKER: "worker",
         scheduler_pb2.MEMBER_ROLE_STATE_SERVER: "stateserver"}
STATES = {0: "gone", 1: "alive", 2: "suspect", 3: "dead", 4: "leaving"}
DEFAULT_WINDOW_S = 300.0
"""Seconds of stage figures sent unless the page asks for another window."""


def finite(value: float) -> float | None:
    """JSON has no infinity (phi is infinite for a member long silent)."""
    return value if math.isfinite(value) else None


def console_state(monitor: Monitor, window_s: float = DEFAULT_WINDOW_S) -> dict[str, Any]:
    """The console's document (plain JSON types only)."""
    core = monitor.core
    status = core.status()
    table = core.table()
    now = time.time()
    threshold = core.config.cluster.phi_threshold
    members = [{
        "node_id": m.member.node_id,
        "role": ROLES.get(m.member.role, "?"),
        "address": m.member.address,
        "state": STATES.get(m.member.state, "?"),
        "phi": finite(round(m.phi, 2)),
        "heartbeat_age_s": round(m.last_heartbeat_age_s, 2),
        "loop_lag_s": round(m.loop_lag_ms / 1000, 2),
        "partitions": m.partitions_owned,
        "snapshots": m.snapshots,
    } for m in status.members]
    jobs = {j.job_id: j for j in status.jobs}
    running = monitor.snapshot_jobs(now - window_s)
    records = core.registry.jobs
    ring = [{"job_id": job.job_id, "partitions": job.partitions, "owners": list(job.owners),
             "delivery": records[job.job_id].spec.delivery if job.job_id in records else "?"}
            for job in table.jobs]
    return {
        "now": now,
        "sampled_at": monitor.sampled_at,
        "sample_s": monitor.sample_s,
        "window_s": window_s,
        "epoch": status.epoch,
        "phi_threshold": threshold,
        "suspect_at": threshold / 2,
        "members": members,
        "ring": ring,
        "trackers": table.tracker_count,
        "jobs": running,
        "all_jobs": [{"job_id": job_id, "state": int(j.state), "error": j.error,
                      "name": j.spec.name, "submitted_at": j.submitted_at}
                     for job_id, j in jobs.items()],
        "recoveries": monitor.recoveries.to_json(),
        "events": [{"node_id": e.node_id, "old": STATES.get(e.old_state, "new"),
                    "new": STATES.get(e.new_state, "?"), "phi": finite(round(e.phi, 2)),
                    "at": e.at, "epoch": e.epoch, "reason": e.reason or "detector"}
                   for e in list(status.events)[-30:]],
        "warnings": [{"kind": w.kind, "job_id": w.job_id, "task": w.task,
                      "partitions": list(w.partitions), "node_id": w.node_id, "text": w.text,
                      "action": w.action, "since": w.since} for w in status.warnings],
    }
