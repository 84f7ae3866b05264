"""The warning rules (losses, stuck tuple trees, restarted tasks, partitions
not draining, roots timing out, dead letters rising, suspect members), their
episodes, and the recovery timeline, over hand-made samples."""

from __future__ import annotations

from gridstream.types import ClusterWarning
from gridstream.v1 import common_pb2, scheduler_pb2
from gridstream.watch import (
    Alert,
    Episodes,
    JobSample,
    WarningDetector,
    WarningRules,
    job_alerts,
    warning_lines,
)
from services.scheduler.recoveries import CoverageSample, RecoveryTimeline


def progress(**fields: object) -> scheduler_pb2.JobProgress:
    """One job's progress with a single task carrying ``fields``."""
    job_fields = {k: fields.pop(k) for k in ("losses", "holding", "drained", "moved")
                  if k in fields}
    return scheduler_pb2.JobProgress(
        job_id="j", tasks=[common_pb2.TaskProgress(task=0, partition=3, node_id="worker-2",
                                                    **fields)],  # type: ignore[arg-type]
        **job_fields)  # type: ignore[arg-type]


def lines(job: scheduler_pb2.JobProgress) -> list[str]:
    """What a progress report alone raises, one line each."""
    return [a.line() for a in job_alerts("j", job)]


def test_a_healthy_job_has_no_warnings() -> None:
    assert lines(progress(drained=True)) == []


def test_a_loss_is_a_warning_that_names_it() -> None:
    found = lines(progress(losses=["j/t1/p3: 2 batches lost on channel t0/p1"]))
    assert len(found) == 1 and "DATA LOSS j/t1/p3" in found[0]


def test_a_restarted_task_names_its_error() -> None:
    found = lines(progress(restarts=3, last_error="RecursionError: deep"))
    assert found == ["j task 0 partition 3 on worker-2: restarted 3 times from its snapshot "
                     "(last error: RecursionError: deep) — see that worker's log"]


def test_a_partition_moved_off_a_failing_worker_is_named() -> None:
    line = "j/t0/p3: moved off worker-2 after 3 restarts (OSError: disk full)"
    found = lines(progress(moved=[line], drained=True))
    assert found == [f"{line} — the task could not run there; see that worker's log"]


def test_status_lines_are_the_schedulers_warnings_of_a_job_and_the_cluster() -> None:
    """``gridstream status [--job]`` prints ClusterStatus.warnings, nothing of its own."""
    warnings = [
        ClusterWarning("dead_letters_rising", "a", 0, [1], "", "a: 3 records", "look", 100.0),
        ClusterWarning("dead_letters_rising", "b", 0, [1], "", "b: 2 records", "look", 100.0),
        ClusterWarning("member_suspect", "", -1, [], "worker-2", "worker-2 suspect", "host",
                       3000.0),
    ]
    assert warning_lines(warnings, now=3700.0) == [
        "a: 3 records — look (for 60m)", "b: 2 records — look (for 60m)",
        "worker-2 suspect — host (for 12m)"]
    assert warning_lines(warnings, "a", now=160.0)[0] == "a: 3 records — look (for 60s)"
    assert [w.split(" — ")[0] for w in warning_lines(warnings, "a", now=160.0)] == [
        "a: 3 records", "worker-2 suspect"]
    assert warning_lines([], "a") == []


# -- the rules that need history (gridstream.watch.WarningDetector) ----------------


ALIVE, SUSPECT, DEAD = (scheduler_pb2.MEMBER_STATE_ALIVE, scheduler_pb2.MEMBER_STATE_SUSPECT,
                        scheduler_pb2.MEMBER_STATE_DEAD)


def task(partition: int, **fields: object) -> common_pb2.TaskProgress:
    """Task 0 of a partition, on worker-1 unless said otherwise."""
    fields.setdefault("node_id", "worker-1")
    return common_pb2.TaskProgress(task=0, partition=partition, **fields)  # type: ignore[arg-type]


def sample(*tasks: common_pb2.TaskProgress, partitions: int = 2,
           submitted_at: float = 0.0) -> JobSample:
    return JobSample("j", 1, partitions, True, ("parse",),
                     scheduler_pb2.JobProgress(job_id="j", tasks=tasks), "", submitted_at)


def observe(detector: WarningDetector, now: float, *jobs: JobSample,
            status: scheduler_pb2.ClusterStatus | None = None) -> list[Alert]:
    return detector.observe(now, 1000.0 + now, status or scheduler_pb2.ClusterStatus(),
                            list(jobs))


def kinds(alerts: list[Alert]) -> list[str]:
    return sorted(a.kind for a in alerts)


def test_a_partition_holding_work_without_progress_is_not_draining_after_stall_s() -> None:
    detector = WarningDetector(WarningRules(stall_s=10))
    stuck = task(1, records_in=50, records_processed=20, queue_batches=3)
    fine = task(0, records_in=5, records_processed=5)
    assert observe(detector, 0, sample(fine, stuck)) == []
    assert observe(detector, 9, sample(fine, stuck)) == []
    alerts = observe(detector, 11, sample(fine, stuck))
    assert kinds(alerts) == ["partition_not_draining"]
    assert alerts[0].partitions == (1,) and alerts[0].node_id == "worker-1"
    assert "j task 0 (parse) partition 1 on worker-1: not draining for 11s" in alerts[0].text
    assert "3 batches queued" in alerts[0].text and "worker-1's log" in alerts[0].action
    # Progress (a counter moved) restarts the clock; an idle partition never warns.
    moving = task(1, records_in=50, records_processed=21, queue_batches=3)
    assert observe(detector, 12, sample(fine, moving)) == []


def test_a_partition_nobody_reports_is_not_draining() -> None:
    detector = WarningDetector(WarningRules(stall_s=5))
    observe(detector, 0, sample(task(0)))
    alerts = observe(detector, 6, sample(task(0)))
    assert kinds(alerts) == ["partition_not_draining"]
    assert "partition 1: not draining" in alerts[0].text and "no worker reports" in alerts[0].text


def test_roots_timing_out_warn_while_the_count_rises_then_clear() -> None:
    detector = WarningDetector(WarningRules(window_s=30))
    observe(detector, 0, sample(task(0, roots_failed=0), task(1)))
    alerts = observe(detector, 1, sample(task(0, roots_failed=4, roots_pending=2), task(1)))
    assert kinds(alerts) == ["roots_timing_out"]
    assert "4 tuple trees timed out in the last 30s on partitions 0 (2 pending)" in alerts[0].text
    assert kinds(observe(detector, 20, sample(task(0, roots_failed=4), task(1)))) == [
        "roots_timing_out"]
    assert observe(detector, 40, sample(task(0, roots_failed=4), task(1))) == []


def test_dead_letters_rising_names_the_job_task_and_partitions_and_what_to_do() -> None:
    detector = WarningDetector()
    observe(detector, 0, sample(task(0), task(1)))
    alerts = observe(detector, 1, sample(task(0, dead_letters=3), task(1, dead_letters=2)))
    assert kinds(alerts) == ["dead_letters_rising"]
    assert alerts[0].partitions == (0, 1) and alerts[0].job_id == "j" and alerts[0].task == 0
    assert "5 records went to the dead letters" in alerts[0].text
    assert "`gridstream dead-letters j`" in alerts[0].action


def test_counters_of_a_moved_task_restart_without_a_false_rise_or_fall() -> None:
    detector = WarningDetector()
    observe(detector, 0, sample(task(0, dead_letters=7), task(1), submitted_at=-1))
    # Seen first with dead letters (a job older than the detector): a baseline.
    assert observe(detector, 1, sample(task(0, dead_letters=7), task(1))) == []
    # The task moved to worker-2, whose counter starts at zero again.
    assert observe(detector, 2, sample(task(0, dead_letters=0, node_id="worker-2"),
                                       task(1))) == []


def test_a_member_suspect_now_or_lately_is_a_warning_unless_it_announced_its_stop() -> None:
    member = scheduler_pb2.MemberStatus(
        member=scheduler_pb2.Member(node_id="worker-3", state=SUSPECT), phi=5.2,
        last_heartbeat_age_s=1.4)
    status = scheduler_pb2.ClusterStatus(members=[member])
    alerts = observe(WarningDetector(), 0, status=status)
    assert kinds(alerts) == ["member_suspect"] and "worker-3 is suspect: phi 5.2" in alerts[0].text
    assert WarningDetector().observe(0, 1000, status, [], frozenset({"worker-3"})) == []
    back = scheduler_pb2.ClusterStatus(
        members=[scheduler_pb2.MemberStatus(member=scheduler_pb2.Member(node_id="worker-3",
                                                                        state=ALIVE))],
        events=[scheduler_pb2.MemberEvent(node_id="worker-3", old_state=ALIVE,
                                          new_state=SUSPECT, at=990),
                scheduler_pb2.MemberEvent(node_id="worker-3", old_state=SUSPECT,
                                          new_state=ALIVE, at=995)])
    assert kinds(observe(WarningDetector(), 0, status=back)) == ["member_suspect"]


def test_a_member_that_died_and_came_back_is_named_for_a_minute() -> None:
    alive = scheduler_pb2.MemberStatus(member=scheduler_pb2.Member(node_id="worker-2",
                                                                  state=ALIVE))

    def status(reason: str, at: float) -> scheduler_pb2.ClusterStatus:
        return scheduler_pb2.ClusterStatus(members=[alive], events=[
            scheduler_pb2.MemberEvent(node_id="worker-2", old_state=SUSPECT, new_state=DEAD,
                                      at=at, phi=9.4, reason=reason),
            scheduler_pb2.MemberEvent(node_id="worker-2", old_state=DEAD, new_state=ALIVE,
                                      at=at + 1, reason="registered")])

    crashed = observe(WarningDetector(), 0, status=status("detector", 990))
    assert kinds(crashed) == ["member_dead"]
    assert "worker-2 died 10s ago (declared dead at phi 9.4) and is back" in crashed[0].text
    restarted = observe(WarningDetector(), 0, status=status("restarted", 990))
    assert "restarted before it was declared dead" in restarted[0].text
    assert observe(WarningDetector(), 0, status=status("stopped", 990)) == []
    assert observe(WarningDetector(), 0, status=status("detector", 900)) == []  # long ago


def test_an_episode_is_new_once_and_clears_after_clear_s() -> None:
    episodes = Episodes(clear_s=10)
    alert = Alert("roots_timing_out", "t", "a", "roots/j", "j")
    assert episodes.update(0, [alert]) == ([alert], [])
    assert episodes.update(1, [alert]) == ([], [])
    assert episodes.update(5, []) == ([], [])  # absent briefly: the same episode
    assert episodes.update(6, [alert]) == ([], [])
    assert episodes.since(alert) == 0
    assert episodes.update(20, []) == ([], [alert])
    assert episodes.update(21, [alert]) == ([alert], [])


def test_a_recovery_goes_from_detected_to_resumed_to_healthy() -> None:
    timeline = RecoveryTimeline()
    died = scheduler_pb2.MemberEvent(node_id="worker-2", old_state=SUSPECT, new_state=DEAD,
                                     at=100.0, phi=8.4, epoch=7, reason="detector")
    holes = CoverageSample(100.5, covered=False, stalled=False, replicated_epoch=6,
                           has_tasks=True)
    timeline.observe([died], {"worker-2": DEAD}, holes)
    assert timeline.to_json()[0]["phase"] == "detected"
    covered = CoverageSample(101.5, covered=True, stalled=False, replicated_epoch=7,
                             has_tasks=True)
    timeline.observe([died], {"worker-2": DEAD}, covered)
    assert timeline.to_json()[0]["phase"] == "resumed"
    back = scheduler_pb2.MemberEvent(node_id="worker-2", old_state=DEAD, new_state=ALIVE,
                                     at=102.0, epoch=8, reason="registered")
    lagging = CoverageSample(102.5, covered=True, stalled=False, replicated_epoch=7,
                             has_tasks=True)
    timeline.observe([died, back], {"worker-2": ALIVE}, lagging)
    assert timeline.to_json()[0]["phase"] == "resumed"  # backups not caught up yet
    caught_up = CoverageSample(103.5, covered=True, stalled=False, replicated_epoch=8,
                               has_tasks=True)
    timeline.observe([died, back], {"worker-2": ALIVE}, caught_up)
    [recovery] = timeline.to_json()
    assert recovery["phase"] == "healthy" and recovery["resumed_after_s"] == 1.5
    assert recovery["rejoined_after_s"] == 2.0 and recovery["healthy_after_s"] == 3.5
