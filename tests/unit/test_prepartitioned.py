"""A prepartitioned keyed stage: records sent keyed by the stage's own key run
through it in the task that receives them, with no shuffle before it
(gridstream.taskplan, services.worker.operators); a record outside its key's
partition goes to dead letters, never folded in the wrong partition."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridstream.dataflow import Dataflow
from gridstream.errors import InvalidArgument
from gridstream.examples import history, taxi
from gridstream.ids import partition_for_key
from gridstream.jobspec import JobSpec, Stage, load_job_file, validate
from gridstream.taskplan import plan_graph, results_from_state
from gridstream.testing import TestSource, run_local
from services.worker.operators import OperatorChain

PARTITIONS = 4
REPO = Path(__file__).resolve().parents[2]


def test_a_prepartitioned_reduce_joins_the_task_of_its_input() -> None:
    shuffled = plan_graph(taxi.job(partitions=PARTITIONS))
    fused = plan_graph(taxi.job(partitions=PARTITIONS, prepartitioned=True))
    assert [[s.name for s in t.stages] for t in shuffled.tasks] == [["parse"], ["track", "store"]]
    assert [[s.name for s in t.stages] for t in fused.tasks] == [["parse", "track", "store"]]
    assert fused.tasks[0].edges == ()
    # Its rows are still the reduce's stored state (exactly once), as before.
    job = taxi.job(partitions=PARTITIONS, prepartitioned=True)
    assert results_from_state(job, fused.tasks[0].stages) == "track"


def test_keyed_records_give_the_shuffled_results() -> None:
    keys, records = taxi.keyed(3_000, devices=40, seed=5)
    fused = run_local(taxi.job(partitions=PARTITIONS, prepartitioned=True),
                      TestSource(records, keys, batch_size=9))
    assert fused.dead_letters == []
    assert fused.results() == taxi.reference(records)


def test_a_record_outside_its_keys_partition_goes_to_dead_letters_not_to_state() -> None:
    _, records = taxi.keyed(2_000, devices=40, seed=6)
    unkeyed = run_local(taxi.job(partitions=PARTITIONS, prepartitioned=True),
                        TestSource(records, batch_size=9))  # round robin, not by device
    misrouted = [d for d in unkeyed.dead_letters if "MisroutedRecord" in d.error]
    assert misrouted and len(misrouted) == len(unkeyed.dead_letters)
    first = misrouted[0]
    assert first.stage == "track" and ".partition:" in first.id
    assert f"belongs to partition {partition_for_key(first.key, PARTITIONS)}" in first.error
    assert "send the records keyed by the stage's key" in first.error
    # Every record is either folded where its key lives or named: none is lost.
    folded = sum(track.count(";") for track in unkeyed.results().values())
    assert folded + len(misrouted) == len(records)


def test_a_prepartitioned_first_stage_keys_the_sent_records_itself() -> None:
    # It runs in task 0, which the client feeds: the keys sent are not trusted.
    job = JobSpec("first", (Stage("fold", "reduce", "gridstream.examples.history:fold",
                                  key="gridstream.examples.history:key_of",
                                  initial=list(history.EMPTY), prepartitioned=True),
                            Stage("store", "sink")), partitions=PARTITIONS)
    assert [[s.name for s in t.stages] for t in plan_graph(job).tasks] == [["fold", "store"]]
    keys, values = history.generate(2_000, keys=30, seed=3)
    keyed = run_local(job, TestSource(values, keys, batch_size=11))
    assert keyed.dead_letters == []
    assert keyed.results() == run_local(history.job(partitions=PARTITIONS),
                                        TestSource(values, keys, batch_size=11)).results()
    wrong = run_local(job, TestSource(values, ["k"] * len(values), batch_size=11))
    assert wrong.dead_letters and all("MisroutedRecord" in d.error for d in wrong.dead_letters)
    assert set(wrong.results()) <= set(keys)  # folded by key_of, never by the sent key


def test_a_prepartitioned_stage_that_must_start_a_task_is_shuffled_to() -> None:
    # A union into a counting reduce: it cannot join either input's task, so
    # it is shuffled to by key like any keyed stage (and its edges combine).
    def job(prepartitioned: bool) -> JobSpec:
        return JobSpec("u", (
            Stage("split", "flat_map", "gridstream.builtins:split_words"),
            Stage("copy", "map", "gridstream.builtins:identity", inputs=("split",)),
            Stage("count", "reduce", "gridstream.builtins:count",
                  key="gridstream.builtins:identity", initial=0, inputs=("split", "copy"),
                  prepartitioned=prepartitioned),
            Stage("store", "sink")), partitions=PARTITIONS)
    plan = plan_graph(job(True))
    counting = plan.tasks[plan.task_of("count")]
    assert counting.index > 0 and not counting.stages[0].prepartitioned
    assert all(e.combine for t in plan.tasks for e in t.edges if e.task == counting.index)
    lines = ["a b a", "c a", "b"] * 50
    fused = run_local(job(True), lines)
    assert fused.dead_letters == []
    assert fused.results() == run_local(job(False), lines).results() == {"a": 300, "b": 200,
                                                                          "c": 100}


def test_a_key_function_that_fails_dead_letters_only_its_record() -> None:
    stages = [Stage("parse", "map", "gridstream.examples.taxi:parse_position"),
              Stage("track", "reduce", "gridstream.examples.taxi:append_position",
                    key="gridstream.examples.taxi:device_of", initial="", prepartitioned=True),
              Stage("store", "sink")]
    chain = OperatorChain(stages, "test", placement=(0, 1))
    good = '{"device": "7", "lat": 1, "lon": 2, "seq": 0}'
    result = chain.process(None, [good, '{"lat": 1}'], "b1")
    assert result.sink_rows == {"7": "1,2;"}
    assert [d[1] for d in result.dead_letters] == ["parse"]  # KeyError in the map
    keyless = [Stage("pass", "map", "gridstream.builtins:identity"),
               Stage("count", "reduce", "gridstream.builtins:count",
                     key="gridstream.examples.history:key_of", initial=0, prepartitioned=True),
               Stage("store", "sink")]
    chain = OperatorChain(keyless, "test", placement=(0, 1))
    result = chain.process(None, [["a", 1], [], ["b", 2]], "b2")
    assert result.sink_rows == {"a": 1, "b": 1}
    assert [(d[0], d[1]) for d in result.dead_letters] == [("b2:count.key:1", "count")]


def test_a_chain_without_its_partition_refuses_a_prepartitioned_stage_when_built() -> None:
    job = history.job(prepartitioned=True)
    with pytest.raises(ValueError, match="needs its placement"):
        OperatorChain(list(job.stages), "test")


def test_only_reduce_and_untimed_stateful_stages_can_be_prepartitioned() -> None:
    with pytest.raises(InvalidArgument, match="only a reduce, or a stateful"):
        validate(JobSpec("j", (Stage("m", "map", "gridstream.builtins:identity",
                                     prepartitioned=True), Stage("s", "sink"))))
    timed = Stage("t", "stateful", "gridstream.examples.history:fold",
                  key="gridstream.examples.history:key_of",
                  params={"timers": {"on_timer": "gridstream.examples.history:fold"}},
                  prepartitioned=True)
    with pytest.raises(InvalidArgument, match="only a reduce, or a stateful"):
        validate(JobSpec("j", (timed, Stage("s", "sink"))))


def test_the_flag_survives_the_wire_toml_and_the_dataflow_api(tmp_path: Path) -> None:
    job = taxi.job(prepartitioned=True)
    assert JobSpec.from_proto(job.to_proto()).stages == job.stages
    assert JobSpec.from_proto(taxi.job().to_proto()).stages[1].prepartitioned is False
    path = tmp_path / "taxi.toml"  # the example job file, with the flag added
    example = (REPO / "examples" / "taxi.toml").read_text()
    assert example.count('initial = ""\n') == 1
    path.write_text(example.replace('initial = ""\n', 'initial = ""\nprepartitioned = true\n'))
    assert load_job_file(path).stages == job.stages
    path.write_text(path.read_text().replace("prepartitioned = true", 'prepartitioned = "yes"'))
    with pytest.raises(InvalidArgument, match="prepartitioned must be true or false"):
        load_job_file(path)
    flow = Dataflow("taxi")
    (flow.source().map("parse", taxi.parse_position)
     .key_by(taxi.device_of, prepartitioned=True)
     .reduce("track", taxi.append_position, initial="").sink("store"))
    assert flow.job().stages == job.stages
    windowed = Dataflow("w").source().key_by(taxi.device_of, prepartitioned=True)
    with pytest.raises(InvalidArgument, match="only reduce and stateful run prepartitioned"):
        windowed.window("w", taxi.append_position, initial="", tumbling=1.0)
