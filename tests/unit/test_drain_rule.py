"""The rule by which ``Client.drain`` decides a job is drained: two drained
reports in a row with the same counters, the second asked for at once.

A report can call a job drained while a batch is between two tasks: the
scheduler asked the receiver before the batch arrived and the sender after
it was acknowledged. Only the counters tell, in the next report; a drain that
returned on one drained report would hand back results missing that batch.
The reports here are scripted; the scheduler is not involved."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gridstream.control import ControlCalls
from gridstream.errors import DeadlineExceeded
from gridstream.v1 import common_pb2, scheduler_pb2, worker_pb2
from services.worker.server import WorkerServicer


def report(drained: bool, records_in: int) -> scheduler_pb2.JobProgress:
    """A one-task progress report of job ``j``."""
    task = common_pb2.TaskProgress(task=1, partition=0, records_in=records_in,
                                   records_processed=records_in)
    return scheduler_pb2.JobProgress(job_id="j", tasks=[task], drained=drained,
                                     holding="" if drained else "task 1 partition 0: busy")


class Scripted(ControlCalls):
    """Answers progress queries from a script, and counts them."""

    def __init__(self, reports: list[scheduler_pb2.JobProgress]) -> None:
        self.reports = reports
        self.asked = 0

    async def progress_message(self, job_id: str, flush: bool = False) -> Any:
        assert flush, "a drain asks the tasks to close their pending windows"
        self.asked += 1
        return self.reports[min(self.asked, len(self.reports)) - 1]


async def test_a_drained_report_whose_counters_then_change_is_not_the_end() -> None:
    # The first drained report missed a batch on its way to task 1: its
    # records_in grew by the next report, so the drain goes on.
    calls = Scripted([report(False, 10), report(True, 10), report(True, 15),
                      report(True, 15)])
    progress = await calls.drain("j", timeout_s=10, poll_s=0.01)
    assert calls.asked == 4
    assert progress.tasks[0].records_in == 15


async def test_a_drained_report_is_confirmed_without_waiting_a_poll() -> None:
    # A poll far longer than the test's deadline: only a confirmation asked
    # for at once lets the drain return in time.
    calls = Scripted([report(True, 10), report(True, 10)])
    progress = await asyncio.wait_for(calls.drain("j", timeout_s=60, poll_s=30), 5)
    assert calls.asked == 2 and progress.drained


async def test_a_drain_that_never_settles_names_what_holds_it() -> None:
    calls = Scripted([report(False, 10)])
    with pytest.raises(DeadlineExceeded, match="task 1 partition 0: busy"):
        await calls.drain("j", timeout_s=0.05, poll_s=0.01)


class Runner:
    """What a drain's poll asks of a task: is it idle, and close your window."""

    def __init__(self, idle: bool) -> None:
        self.idle = idle
        self.flushed = 0

    async def flush_soon(self) -> None:
        self.flushed += 1


async def test_trackers_hurry_only_once_the_jobs_tasks_here_are_idle() -> None:
    # Behind a backlog, announcing every completion as it comes would
    # multiply the broadcasts while the workers are busiest.
    hurried: list[bool] = []
    asked: list[str] = []
    runners = {(0, 0): Runner(idle=True), (1, 0): Runner(idle=False)}
    node = SimpleNamespace(
        jobs={"j": SimpleNamespace(runners=runners)},
        trackers=SimpleNamespace(hurry=lambda: hurried.append(True), drain_asked=asked.append),
        progress=lambda job_id: [], routing=SimpleNamespace(epoch=3))
    servicer = WorkerServicer(cast(Any, node), max_batch_bytes=1 << 20)
    request = worker_pb2.GetTaskProgressRequest(job_id="j", flush=True)
    await servicer.GetTaskProgress(request, cast(Any, None))
    assert [r.flushed for r in runners.values()] == [1, 1] and not hurried
    assert asked == ["j"], "a drain asked while tasks are busy is still told to the trackers"
    runners[(1, 0)].idle = True
    await servicer.GetTaskProgress(request, cast(Any, None))
    assert hurried == [True]
    await servicer.GetTaskProgress(worker_pb2.GetTaskProgressRequest(job_id="j"),
                                   cast(Any, None))
    assert hurried == [True], "a plain progress query hurries nothing"
    assert asked == ["j", "j"]
