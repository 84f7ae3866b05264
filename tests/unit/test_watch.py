"""The live view names losses, stuck tuple trees and restarted tasks."""

from __future__ import annotations

from gridstream.v1 import common_pb2, scheduler_pb2
from gridstream.watch import job_warnings


def progress(**fields: object) -> scheduler_pb2.JobProgress:
    """One job's progress with a single task carrying ``fields``."""
    job_fields = {k: fields.pop(k) for k in ("losses", "holding", "drained", "moved")
                  if k in fields}
    return scheduler_pb2.JobProgress(
        job_id="j", tasks=[common_pb2.TaskProgress(task=0, partition=3, node_id="worker-2",
                                                    **fields)],  # type: ignore[arg-type]
        **job_fields)  # type: ignore[arg-type]


def test_a_healthy_job_has_no_warnings() -> None:
    assert job_warnings("j", progress(drained=True)) == []


def test_a_loss_is_a_warning_that_names_it() -> None:
    warnings = job_warnings("j", progress(losses=["j/t1/p3: 2 batches lost on channel t0/p1"]))
    assert len(warnings) == 1 and "DATA LOSS j/t1/p3" in warnings[0]


def test_pending_and_failed_roots_and_what_holds_the_drain_are_shown() -> None:
    warnings = job_warnings("j", progress(roots_pending=2, roots_failed=2, drained=False,
                                          holding="task 0 partition 3: 2 tuple trees not "
                                          "complete"))
    assert any("2 tuple trees timed out" in w and "2 pending" in w for w in warnings)
    assert any("not drained: task 0 partition 3" in w for w in warnings)


def test_a_restarted_task_names_its_error() -> None:
    warnings = job_warnings("j", progress(restarts=3, last_error="RecursionError: deep"))
    assert warnings == ["j task 0 partition 3 on worker-2: restarted 3 times from its snapshot "
                        "(last error: RecursionError: deep) — see that worker's log"]


def test_a_partition_moved_off_a_failing_worker_is_named() -> None:
    line = "j/t0/p3: moved off worker-2 after 3 restarts (OSError: disk full)"
    warnings = job_warnings("j", progress(moved=[line], drained=True))
    assert warnings == [f"{line} — the task could not run there; see that worker's log"]
