"""Operator chains: every stage kind, dead letters, state snapshots. Tests of
what a job computes run it with gridstream.testing.run_local, as users test
their flows; tests of the chain's own machinery (state, snapshots) use it
directly."""

from __future__ import annotations

from typing import Any

import pytest

from gridstream.jobspec import JobSpec, Stage
from gridstream.testing import TestSource, run_local
from services.worker.operators import OperatorChain, _DeadLetters, _reduce


def explode_on_three(value: int) -> int:
    if value == 3:
        raise ValueError("three is not allowed")
    return value * 10


def is_even(value: int) -> bool:
    return value % 2 == 0


def repeat(value: int) -> list[int]:
    return [value] * value


def double_batch(values: list[int]) -> list[int]:
    if 3 in values:
        raise RuntimeError("bad batch")
    return [v * 2 for v in values]


def running_max(state: int, value: int) -> tuple[int, list[Any]]:
    new = max(state, value)
    return new, ([new] if new != state else [])


HERE = "tests.unit.test_operators"


def chain(*stages: Stage) -> OperatorChain:
    return OperatorChain([*stages, Stage("sink", "sink")], "test")


def job(*stages: Stage, mode: str = "latest") -> JobSpec:
    return JobSpec("test", (*stages, Stage("sink", "sink", mode=mode)), partitions=1)


def test_map_isolates_a_failing_record_into_dead_letters() -> None:
    result = run_local(job(Stage("m", "map", f"{HERE}:explode_on_three")), [1, 2, 3, 4])
    assert sorted(result.results().values()) == [10, 20, 40]
    assert len(result.dead_letters) == 1
    dead = result.dead_letters[0]
    assert (dead.id, dead.stage, dead.record, dead.record_format) == (
        "t0/p0/src/local#1:m:2", "m", 3, "json")
    assert dead.error == "ValueError: three is not allowed"
    assert "explode_on_three" in dead.traceback


def test_filter_flat_map_and_map_batch() -> None:
    result = run_local(job(Stage("f", "filter", f"{HERE}:is_even"),
                           Stage("fm", "flat_map", f"{HERE}:repeat"),
                           Stage("mb", "map_batch", f"{HERE}:double_batch")), [1, 2, 4])
    assert sorted(result.results().values()) == [4, 4, 8, 8, 8, 8]


def test_map_batch_falls_back_to_single_records() -> None:
    c = chain(Stage("mb", "map_batch", f"{HERE}:double_batch"))
    result = c.process(None, [1, 3, 5], "b#1")
    assert sorted(result.sink_rows.values()) == [2, 10]
    assert [d[1] for d in result.dead_letters] == ["mb"]


def test_reduce_keeps_state_per_key_and_the_sink_keeps_the_latest() -> None:
    c = OperatorChain([Stage("count", "reduce", "gridstream.builtins:count",
                             key="gridstream.builtins:identity", initial=0),
                       Stage("sink", "sink")], "test")
    result = c.process(["a", "b", "a"], ["a", "b", "a"], "b#1")
    assert result.sink_rows == {"a": 2, "b": 1}
    result = c.process(["a"], ["a"], "b#2")
    assert result.sink_rows == {"a": 3}
    assert c.states["count"] == {"a": 3, "b": 1}


def test_stateful_emits_outputs_with_the_key() -> None:
    stage = Stage("mx", "stateful", f"{HERE}:running_max_pair",
                  key="gridstream.examples.taxi:device_of", initial=0)
    sent = TestSource([["x", 5], ["x", 3], ["x", 7], ["y", 1]])
    latest = run_local(job(stage), sent)
    assert latest.results() == {"x": ["x", 7], "y": ["y", 1]}  # the latest output per key
    every = run_local(job(stage, mode="append"), sent).sink()
    assert every.records == [["x", 5], ["x", 7], ["y", 1]]  # every output, in order


def running_max_pair(state: int, value: list[Any]) -> tuple[int, list[Any]]:
    new = max(state, value[1])
    return new, ([[value[0], new]] if new != state else [])


def test_snapshot_and_restore_round_trip() -> None:
    c = OperatorChain([Stage("count", "reduce", "gridstream.builtins:count", key="m:k",
                             initial=0), Stage("sink", "sink")], "test")
    c.process(["a", "b", 7], ["a", "b", 7], "b#1")
    saved = c.snapshot_state()
    c.process(["a"], ["a"], "b#2")
    c.restore_state(saved)
    assert c.states["count"] == {"a": 1, "b": 1, 7: 1}


def test_mutable_initial_values_are_not_shared_between_keys() -> None:
    c = OperatorChain([Stage("collect", "reduce", f"{HERE}:append_item", key="m:k", initial=[]),
                       Stage("sink", "sink")], "test")
    c.process(["a", "b"], [1, 2], "b#1")
    assert c.states["collect"] == {"a": [1], "b": [2]}


def append_item(acc: list[int], value: int) -> list[int]:
    return [*acc, value]


def test_keyed_stage_without_keys_is_a_bug_not_silence() -> None:
    c = OperatorChain([Stage("count", "reduce", "gridstream.builtins:count", key="m:k",
                             initial=0), Stage("sink", "sink")], "test")
    with pytest.raises(RuntimeError, match="received records without keys"):
        c.process(None, ["a"], "b#1")


def test_a_reduce_before_a_sink_whose_rows_come_from_state_builds_no_output() -> None:
    """Exactly once, a task's rows are read from its state: the reduce right
    before the sink then folds (state, touched keys, dead letters as always)
    without building the per-record output nobody reads."""
    stages = [Stage("collect", "reduce", f"{HERE}:append_item", key="m:k", initial=[]),
              Stage("sink", "sink")]
    wanted = OperatorChain(stages, "test")
    from_state = OperatorChain(stages, "test", rows_wanted=False)
    batches = [(["a", "b", "a"], [1, 2, 3]), (["b", "c"], [4, "x"])]
    for n, (keys, values) in enumerate(batches):
        rows = wanted.process(list(keys), list(values), f"b#{n}").sink_rows
        quiet = from_state.process(list(keys), list(values), f"b#{n}")
        assert rows == {k: wanted.states["collect"][k] for k in keys}
        assert quiet.sink_rows == {} and quiet.values == []
    assert from_state.states == wanted.states == {"collect": {"a": [1, 3], "b": [2, 4],
                                                              "c": ["x"]}}
    assert from_state.touched == wanted.touched


def test_a_chain_of_one_reduce_feeds_the_next_task() -> None:
    """A reduce alone in its task (its output shuffled to the next task) emits
    every accumulator."""
    c = OperatorChain([Stage("count", "reduce", "gridstream.builtins:count", key="m:k",
                             initial=0)], "test")
    result = c.process(["a", "b", "a"], ["a", "b", "a"], "b#1")
    assert (result.keys, result.values) == (["a", "b", "a"], [1, 1, 2])


def test_a_quiet_reduce_folds_without_output() -> None:
    stage = Stage("collect", "reduce", f"{HERE}:append_item", key="m:k", initial=[])
    state: dict[Any, Any] = {}
    touched: set[Any] = set()
    quiet = _reduce(stage, append_item, state, touched, emit=False)
    dead: list[Any] = []
    assert quiet(["a", "b", "a"], [1, 2, 3], _DeadLetters("b#1", dead)) == ([], [])
    assert state == {"a": [1, 3], "b": [2]} and touched == {"a", "b"} and not dead
