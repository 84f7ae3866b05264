"""Window process functions (``window_process``, ``params.window.process``):
each window's records handed to ``fn(key, start, end, records)`` once when it
fires — tumbling, sliding and session — in an order that does not depend on
arrival or batching; a task restored from any snapshot neither fires again
nor loses a record, and a captured snapshot is never changed by the batches
after it; a function that raises sends the window to the dead letters."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from gridstream.dataflow import Dataflow
from gridstream.errors import InvalidArgument
from gridstream.jobspec import JobSpec, Stage, from_mapping, validate
from gridstream.testing import TestSource, run_local
from services.worker.operators import OperatorChain
from services.worker.watermarks import event_inputs
from tests.unit.test_eventtime import batches_into, key_in, key_of, outputs, stamp

HERE = "tests.unit.test_window_process"


def listed(key: str, start: float, end: float, records: list[dict[str, Any]],
           tag: str = "") -> list[Any]:
    """The window's records as [time, value] pairs, in the order given."""
    return [tag, key, start, end, [[r["t"], r["v"]] for r in records]]


def picky(key: str, start: float, end: float, records: list[dict[str, Any]]) -> int:
    if any(r["v"] < 0 for r in records):
        raise ValueError("a negative value")
    return len(records)


def rec(k: str, t: float, v: int = 1) -> dict[str, Any]:
    return {"k": k, "t": t, "v": v}


def flow(partitions: int = 1, *, max_delay: float = 0, fn: Any = listed,
         params: dict[str, Any] | None = None, **window: Any) -> Dataflow:
    f = Dataflow("wp", partitions=partitions)
    fired = (f.source().with_timestamps(stamp, max_delay=max_delay).key_by(key_of)
             .window_process("w", fn, params=params, **window))
    fired.sink("fired", mode="append")
    fired.late("late_w").sink("late", mode="append")
    return f


def run(f: Dataflow, records: list[dict[str, Any]], partitions: int = 1,
        batch_size: int = 1) -> Any:
    return run_local(f, TestSource(records, keys=[r["k"] for r in records],
                                   batch_size=batch_size), partitions=partitions)


def fired(result: Any) -> list[tuple[Any, ...]]:
    return sorted((r["key"], r["start"], r["end"], r["value"][4])
                  for r in result.sink("fired").records)


def test_tumbling_sliding_and_session_windows_see_all_their_records_in_time_order() -> None:
    data = [rec("a", 4, 1), rec("a", 1, 2), rec("b", 9, 3), rec("a", 12, 4), rec("a", 30)]
    result = run(flow(tumbling=10, max_delay=5, params={"tag": "x"}), data)
    assert fired(result) == [("a", 0, 10, [[1, 2], [4, 1]]), ("a", 10, 20, [[12, 4]]),
                             ("b", 0, 10, [[9, 3]])]
    assert {r["value"][0] for r in result.sink("fired").records} == {"x"}  # params
    assert set(result.sink("fired").records[0]) == {"key", "start", "end", "value"}
    data = [rec("a", 7, 1), rec("a", 12, 2), rec("a", 100)]
    assert fired(run(flow(sliding=(10, 5)), data)) == [
        ("a", 0, 10, [[7, 1]]), ("a", 5, 15, [[7, 1], [12, 2]]), ("a", 10, 20, [[12, 2]])]
    data = [rec("a", 5, 1), rec("a", 0, 2), rec("a", 30, 3), rec("b", 25), rec("a", 38, 4),
            rec("a", 34, 5), rec("b", 2), rec("a", 100)]
    sessions = run(flow(session=10, max_delay=5), data)
    assert fired(sessions) == [("a", 0, 15, [[0, 2], [5, 1]]),
                               ("a", 30, 48, [[30, 3], [34, 5], [38, 4]]),
                               ("b", 25, 35, [[25, 1]])]
    assert sessions.sink("late").records == [rec("b", 2)]


def test_the_records_order_does_not_depend_on_arrival_or_batching() -> None:
    keys = [key_in(p % 2, 2, p // 2) for p in range(4)]
    rng = random.Random(3)
    base = [rec(rng.choice(keys), t // 3 * 3, rng.randrange(5)) for t in range(0, 240)]
    closing = [rec(key_in(p, 2, 7), 10**6) for p in range(2)]
    for window in ({"tumbling": 30}, {"sliding": (30, 10)}, {"session": 2}):
        expected = None
        for seed in range(3):
            shuffled = list(base)
            random.Random(seed).shuffle(shuffled)  # all within max_delay of each other
            got = [r["value"] for r in run(flow(2, max_delay=300, **window),
                                           shuffled + closing, 2, 1 + seed * 7)
                   .sink("fired").records]
            # equal times come out by their encoding, whatever order they came in
            assert all(p == sorted(p) for p in (v[4] for v in got))
            assert expected is None or got == expected
            expected = got
        assert expected is not None and len(expected) > 5


def test_a_task_restored_from_any_snapshot_neither_fires_again_nor_loses_records() -> None:
    job = flow(2, tumbling=10, max_delay=3).job().with_defaults(2, 1)
    records = [rec(key_in(i % 2, 2, i % 3), t, i) for i, t in enumerate(range(0, 300, 2))]
    task, batches = batches_into(job, "w", records)
    inputs = event_inputs(job, task.index)
    assert inputs is not None
    whole = outputs(OperatorChain(list(task.stages), "test"), batches, inputs)
    windows = [row for rows in whole for row in rows if row.get("tag") == "window"]
    assert len(windows) > 20 and len({(r["key"], r["start"]) for r in windows}) == len(windows)
    for cut in range(len(batches)):
        before = OperatorChain(list(task.stages), "test")
        outputs(before, batches[:cut], inputs)
        saved = before.capture_full()
        kept = copy.deepcopy(saved)
        outputs(before, batches[cut:], inputs)  # the batches after it must not change it
        assert saved == kept, f"a captured snapshot changed after batch {cut}"
        after = OperatorChain(list(task.stages), "test")
        after.apply_entries([[stage, k, v] for stage, state in saved.items()
                             for k, v in state.items()])
        assert outputs(after, batches[cut:], inputs) == whole[cut:], f"restored at {cut}"


def test_a_function_that_raises_sends_its_window_to_the_dead_letters() -> None:
    data = [rec("a", 1), rec("a", 2, -1), rec("b", 3), rec("a", 15), rec("b", 40)]
    result = run(flow(tumbling=10, fn=picky), data)
    assert sorted((r["key"], r["start"], r["value"]) for r in result.sink("fired").records) == [
        ("a", 10, 1), ("b", 0, 1)]
    [dead] = result.dead_letters
    assert dead.stage == "w" and dead.key == "a" and "negative" in dead.error
    assert dead.record == {"start": 0, "end": 10, "records": [rec("a", 1), rec("a", 2, -1)]}


def test_process_windows_are_checked_and_run_in_toml_form() -> None:
    window = {"type": "tumbling", "size": 10, "timestamp": f"{HERE}:stamp_of",
              "process": True}
    document = {"job": {"name": "wp"}, "stages": [
        {"name": "w", "kind": "window", "function": f"{HERE}:listed",
         "key": "tests.unit.test_eventtime:key_of", "params": {"window": window}},
        {"name": "fired", "kind": "flat_map", "function": "gridstream.eventtime:fired_windows"},
        {"name": "out", "kind": "sink", "mode": "append"}]}
    job = from_mapping(document)
    assert JobSpec.from_proto(job.to_proto()) == job
    data = [rec("a", 3), rec("a", 1), rec("a", 20)]
    result = run_local(job, TestSource(data, keys=["a"] * 3, batch_size=1), partitions=1)
    assert [r["value"][4] for r in result.sink("out").records] == [[[1, 1], [3, 1]]]
    good = job.stages[0]
    for change, initial, message in (({"process": "yes"}, None, "process must be true or"),
                                     ({}, 0, "takes no initial"),
                                     ({"process": False}, None, "process = true for fn")):
        stage = Stage("w", "window", good.function, good.key, initial,
                      params={"window": {**window, **change}})
        with pytest.raises(InvalidArgument, match=message):
            validate(JobSpec("wp", (stage, Stage("out", "sink"))))
    join = {"type": "tumbling", "size": 10, "how": "left", "process": True,
            "timestamp": "gridstream.eventtime:tagged_time"}
    with pytest.raises(InvalidArgument, match="for a window stage"):
        validate(JobSpec("wp", (Stage("j", "join", "gridstream.eventtime:both",
                                      "gridstream.eventtime:tagged_key",
                                      params={"window": join}), Stage("out", "sink"))))
    with pytest.raises(InvalidArgument, match="cannot"):  # fn(acc, value) is no process fn
        flow(tumbling=10, fn=stamp)


def stamp_of(record: dict[str, Any]) -> float:
    return float(record["t"])
