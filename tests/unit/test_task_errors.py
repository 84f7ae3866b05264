"""A batch that gridstream itself cannot handle does not stop its partition."""

from __future__ import annotations

from typing import Any, cast

from gridstream.jobspec import JobSpec, Stage, plan_tasks
from gridstream.types import DeadLetter
from services.worker.operators import ChainResult
from services.worker.queues import Entry
from services.worker.tasks import TaskRunner

STATELESS = JobSpec(
    "t", (Stage("same", "map", "gridstream.builtins:identity"), Stage("store", "sink")),
    partitions=1, window_size=100)


def runner(spec: JobSpec) -> TaskRunner:
    """A runner of the job's last task (the one with the sink, no shuffle);
    nothing it is given here is called."""
    none = cast(Any, None)
    tasks = plan_tasks(spec)
    return TaskRunner("j", spec, tasks, len(tasks) - 1, 0, "worker-1", none, none, none,
                      max_records=1_000, batch_records=100, backup_count=0)


def failing_whole(runner: TaskRunner) -> None:
    """gridstream's own handling fails on a batch holding the record "poison"
    (as repr or hashing might on an odd record), whole or alone."""
    process = runner.chain.process

    def process_or_fail(keys: Any, values: list[Any], batch_id: str) -> ChainResult:
        if "poison" in values:
            raise RecursionError("maximum recursion depth exceeded")
        return process(keys, values, batch_id)

    runner.chain.process = process_or_fail  # type: ignore[method-assign]


def test_a_poison_record_goes_alone_to_dead_letters_in_a_stateless_chain() -> None:
    task = runner(STATELESS)
    failing_whole(task)
    entry = Entry(0, "src/a", 1, None, ["a", "poison", "b"])
    result, segments = task._run_batch(entry, "t0/p0/src/a#1")
    assert sorted(result.sink_rows.values()) == ["a", "b"]
    assert [DeadLetter.from_stored(*d).record for d in result.dead_letters] == ["poison"]
    assert "RecursionError" in result.dead_letters[0][3]
    assert segments == [] and task.internal_errors == 1


def test_in_a_stateful_chain_the_whole_batch_goes_to_dead_letters() -> None:
    spec = JobSpec("t", (Stage("count", "reduce", "gridstream.builtins:count",
                               key="gridstream.builtins:identity", initial=0),
                         Stage("store", "sink")), partitions=1, window_size=100)
    task = runner(spec)
    failing_whole(task)
    entry = Entry(0, "src/a", 1, ["a", "poison"], ["a", "poison"])
    result, _ = task._run_batch(entry, "t0/p0/src/a#1")
    assert len(result.dead_letters) == 2 and not result.sink_rows
