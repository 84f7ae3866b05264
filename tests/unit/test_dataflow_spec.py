"""Job specs as graphs: stage kinds checked where a stage is written, inputs,
params and sink modes in TOML and on the wire, graph validation, the
cluster's refusal of graphs, and the worker's params and append sinks."""

from __future__ import annotations

import pytest

from gridstream.errors import InvalidArgument, PermissionDenied
from gridstream.examples import taxi
from gridstream.jobspec import (
    SOURCE,
    JobSpec,
    Stage,
    check_allowed,
    check_cluster_runnable,
    from_mapping,
    is_linear,
    validate,
)
from gridstream.v1 import common_pb2
from services.worker.operators import OperatorChain

HERE = "tests.unit.test_dataflow_spec"


def scale(value: int, factor: int = 1, offset: int = 0) -> int:
    return value * factor + offset


def above(value: int, threshold: int) -> bool:
    return value > threshold


def test_an_unknown_kind_fails_where_the_stage_is_written() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown kind 'mapp' \(did you mean 'map'\?\)"):
        Stage("a", "mapp", f"{HERE}:scale")
    with pytest.raises(InvalidArgument, match="use one of map, flat_map"):
        Stage("a", "explode")


def test_a_reduce_without_initial_is_refused_saying_what_to_add() -> None:
    job = JobSpec("j", (Stage("r", "reduce", "m:f", key="m:k"), Stage("s", "sink")))
    with pytest.raises(InvalidArgument, match="add initial = 0"):
        validate(job)
    with pytest.raises(InvalidArgument, match="needs an initial accumulator"):
        from_mapping({"stages": [{"name": "r", "kind": "reduce", "function": "m:f",
                                  "key": "m:k"}, {"name": "s", "kind": "sink"}]})
    validate(JobSpec("j", (Stage("r", "reduce", "m:f", key="m:k", initial=0),
                           Stage("s", "sink"))))


def graph_document() -> dict[str, object]:
    return {"job": {"name": "g"}, "stages": [
        {"name": "parse", "kind": "map", "function": f"{HERE}:scale", "params": {"factor": 2}},
        {"name": "big", "kind": "filter", "function": f"{HERE}:above",
         "params": {"threshold": 3}},
        {"name": "all", "kind": "sink", "mode": "append", "inputs": ["parse"]},
        {"name": "raw", "kind": "map", "function": f"{HERE}:scale", "inputs": [SOURCE]},
        {"name": "both", "kind": "sink", "inputs": ["big", "raw"]},
    ]}


def test_a_graph_from_toml_keeps_inputs_params_and_modes_on_the_wire() -> None:
    job = from_mapping(graph_document())
    stages = {s.name: s for s in job.stages}
    assert stages["parse"].params == {"factor": 2}
    assert stages["all"].mode == "append" and stages["both"].mode == "latest"
    assert stages["both"].inputs == ("big", "raw")
    assert stages["big"].inputs == ()  # the stage before it
    assert JobSpec.from_proto(job.to_proto()) == job
    wire = {s.name: s for s in job.to_proto().stages}
    assert wire["all"].sink_mode == common_pb2.SINK_MODE_APPEND
    assert wire["parse"].params_json == '{"factor": 2}'
    assert not is_linear(job)


def test_a_linear_job_has_the_same_wire_form_as_before() -> None:
    old = common_pb2.JobSpec(name="taxi", delivery=common_pb2.DELIVERY_MODE_EXACTLY_ONCE,
                             stages=[
        common_pb2.StageSpec(name="parse", kind=common_pb2.STAGE_KIND_MAP,
                             function="gridstream.examples.taxi:parse_position"),
        common_pb2.StageSpec(name="track", kind=common_pb2.STAGE_KIND_REDUCE,
                             function="gridstream.examples.taxi:append_position",
                             key="gridstream.examples.taxi:device_of", initial_json='""'),
        common_pb2.StageSpec(name="store", kind=common_pb2.STAGE_KIND_SINK)])
    assert taxi.job().to_proto().SerializeToString() == old.SerializeToString()
    assert is_linear(taxi.job())
    check_cluster_runnable(taxi.job())


def with_stages(*stages: dict[str, object]) -> dict[str, object]:
    return {"stages": list(stages)}


MAP = {"kind": "map", "function": "m:f"}


@pytest.mark.parametrize(("document", "message"), [
    (with_stages({"name": "a", **MAP}, {"name": "s", "kind": "sink", "inputs": ["nope"]},
                 {"name": "t", "kind": "sink", "inputs": ["a"]}), "'nope', which is not a stage"),
    (with_stages({"name": "a", **MAP, "inputs": ["b"]}, {"name": "b", **MAP},
                 {"name": "s", "kind": "sink"}), "(these two form one)"),
    (with_stages({"name": "a", **MAP}, {"name": "s", "kind": "sink"},
                 {"name": "t", "kind": "sink", "inputs": ["s"]}), "reads from sink 's'"),
    (with_stages({"name": "a", **MAP}, {"name": "b", **MAP, "inputs": [SOURCE]},
                 {"name": "s", "kind": "sink"}), "stage 0 ('a'): its output feeds no stage"),
    (with_stages({"name": "a", **MAP}, {"name": "s", "kind": "sink", "inputs": ["a", "a"]}),
     "inputs name a stage twice"),
    (with_stages({"name": "a", **MAP, "params": {"when": {1, 2}}}, {"name": "s", "kind": "sink"}),
     "params must be a table"),
    (with_stages({"name": "a", **MAP, "mode": "append"}, {"name": "s", "kind": "sink"}),
     "only a sink takes a mode"),
    (with_stages({"name": "a", **MAP}, {"name": "s", "kind": "sink", "mode": "newest"}),
     "mode 'newest' is not one of latest, append"),
    (with_stages({"name": "a", **MAP}, {"name": "s", "kind": "sink", "params": {"x": 1}}),
     "a sink takes no function, key or params"),
    (with_stages({"name": "a", **MAP, "inputs": "parse"}, {"name": "s", "kind": "sink"}),
     "inputs must be a list of stage names"),
])
def test_malformed_graphs_name_what_to_fix(document: dict[str, object], message: str) -> None:
    if message == "params must be a table":  # TOML cannot hold a set; code can
        job = JobSpec("j", (Stage("a", "map", "m:f", params={"when": {1, 2}}),
                            Stage("s", "sink")))
        with pytest.raises(InvalidArgument, match="params must be JSON data"):
            validate(job)
        return
    with pytest.raises(InvalidArgument) as info:
        from_mapping(document)
    assert message in str(info.value)


def test_params_that_do_not_survive_json_are_refused() -> None:
    for params, message in (({"pair": (1, 2)}, "tuples become lists"),
                            ({"bad-name": 1}, "not a Python identifier"),
                            ({"x": float("nan")}, "must be JSON data")):
        with pytest.raises(InvalidArgument, match=message):
            validate(JobSpec("j", (Stage("a", "map", "m:f", params=params),
                                   Stage("s", "sink"))))


def test_the_cluster_runs_a_graph() -> None:
    job = from_mapping(graph_document())
    check_cluster_runnable(job)  # nothing refused: the workers run the whole graph
    check_allowed(job, ("tests",))
    explicit = JobSpec("j", (Stage("a", "map", "m:f", inputs=(SOURCE,)),
                             Stage("s", "sink", inputs=("a",))))
    assert is_linear(explicit)
    with pytest.raises(PermissionDenied):
        check_allowed(job, ("gridstream.builtins",))


def test_the_worker_passes_params_as_keyword_arguments() -> None:
    chain = OperatorChain([Stage("m", "map", f"{HERE}:scale", params={"factor": 3, "offset": 1}),
                           Stage("f", "filter", f"{HERE}:above", params={"threshold": 5}),
                           Stage("s", "sink")], "test")
    result = chain.process(None, [1, 2, 3], "b#1")
    assert sorted(result.sink_rows.values()) == [7, 10]
    assert result.dead_letters == []


def test_an_append_sink_keeps_every_record_of_a_key() -> None:
    stages = [Stage("sum", "reduce", "gridstream.builtins:sum_values", key="m:k", initial=0)]
    latest = OperatorChain([*stages, Stage("s", "sink")], "test")
    append = OperatorChain([*stages, Stage("s", "sink", mode="append")], "test")
    assert latest.process(["a", "a", "b"], [1, 2, 5], "b#1").sink_rows == {"a": 3, "b": 5}
    rows = append.process(["a", "a", "b"], [1, 2, 5], "b#1").sink_rows
    assert rows == {"b#1:0": 1, "b#1:1": 3, "b#1:2": 5}
