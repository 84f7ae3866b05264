"""The Python dataflow API: graphs built from streams, functions named by
path or given as module-level functions, params checked against the
function, and every mistake refused where it is made."""

from __future__ import annotations

import doctest
import functools
from typing import Any

import pytest

import gridstream.dataflow._flow
from gridstream.dataflow import Dataflow, function_path
from gridstream.errors import InvalidArgument
from gridstream.examples import taxi
from gridstream.jobspec import SOURCE, check_cluster_runnable, from_mapping, is_linear


def parse(text: str) -> dict[str, Any]:
    user, kind, amount = text.split(",")
    return {"user": user, "kind": kind, "amount": int(amount)}


def is_kind(click: dict[str, Any], kind: str) -> bool:
    return bool(click["kind"] == kind)


def user_of(click: dict[str, Any]) -> str:
    return str(click["user"])


def add_amount(total: int, click: dict[str, Any]) -> int:
    return total + int(click["amount"])


def shadowed(value: Any) -> Any:
    return value


FIRST_SHADOWED = shadowed


def shadowed(value: Any) -> Any:  # type: ignore[no-redef]
    return value + 1


class Holder:
    @staticmethod
    def method(value: Any) -> Any:
        return value


def test_a_linear_flow_is_the_same_job_as_a_hand_written_pipeline() -> None:
    flow = Dataflow("taxi")
    (flow.source().map("parse", taxi.parse_position)
         .key_by(taxi.device_of).reduce("track", taxi.append_position, initial="")
         .sink("store"))
    job = flow.job()
    assert job == taxi.job()
    assert is_linear(job)
    check_cluster_runnable(job)


def clicks_flow() -> Dataflow:
    flow = Dataflow("clicks", partitions=4)
    clicks = flow.source().map("parse", parse)
    clicks.sink("raw", mode="append")
    buys = clicks.filter("buys", is_kind, params={"kind": "buy"})
    views = clicks.filter("views", is_kind, params={"kind": "view"})
    (buys.union(views).key_by(user_of)
         .reduce("spent", add_amount, initial=0).sink("spent_sink"))
    return flow


def test_a_branching_flow_becomes_a_graph_with_inputs_params_and_modes() -> None:
    job = clicks_flow().job()
    stages = {s.name: s for s in job.stages}
    assert list(stages) == ["parse", "raw", "buys", "views", "spent", "spent_sink"]
    assert stages["parse"].function == "tests.unit.test_dataflow:parse"
    assert stages["raw"].mode == "append" and stages["raw"].inputs == ()
    assert stages["buys"].inputs == ("parse",)
    assert stages["buys"].params == {"kind": "buy"}
    assert stages["views"].inputs == ("parse",)
    assert stages["spent"].inputs == ("buys", "views")
    assert stages["spent"].key == "tests.unit.test_dataflow:user_of"
    assert stages["parse"].inputs == ()  # the first stage reads the source
    assert not is_linear(job)
    check_cluster_runnable(job)  # the cluster runs graphs


def test_the_same_graph_written_in_toml_is_the_same_job() -> None:
    here = "tests.unit.test_dataflow"
    document = {"job": {"name": "clicks", "partitions": 4}, "stages": [
        {"name": "parse", "kind": "map", "function": f"{here}:parse"},
        {"name": "raw", "kind": "sink", "mode": "append"},
        {"name": "buys", "kind": "filter", "function": f"{here}:is_kind",
         "params": {"kind": "buy"}, "inputs": ["parse"]},
        {"name": "views", "kind": "filter", "function": f"{here}:is_kind",
         "params": {"kind": "view"}, "inputs": ["parse"]},
        {"name": "spent", "kind": "reduce", "function": f"{here}:add_amount",
         "key": f"{here}:user_of", "initial": 0, "inputs": ["buys", "views"]},
        {"name": "spent_sink", "kind": "sink"},
    ]}
    flow = clicks_flow()
    job = flow.job()
    assert from_mapping(document) == job


@pytest.mark.parametrize(("fn", "message"), [
    (lambda v: v, "a lambda has no import path"),
    (functools.partial(is_kind, kind="buy"), "give its arguments as params"),
    (Holder.method, "is a method"),
    (Holder().method, "is a method"),
    (FIRST_SHADOWED, "is not this function"),
    (42, "neither an import path"),
])
def test_functions_a_worker_could_not_import_are_refused(fn: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Dataflow("f").source().map("m", fn)


def test_a_closure_and_a_script_function_are_refused() -> None:
    factor = 3

    def times(value: int) -> int:
        return value * factor

    with pytest.raises(InvalidArgument, match=r"defined inside a function.*params="):
        function_path(times, "op")
    scope: dict[str, Any] = {"__name__": "__main__"}
    exec("def main_fn(v):\n    return v\n", scope)
    with pytest.raises(InvalidArgument, match="__main__"):
        function_path(scope["main_fn"], "op")
    assert function_path(parse, "op") == "tests.unit.test_dataflow:parse"
    assert function_path("pkg.mod:fn", "op") == "pkg.mod:fn"


def test_mistakes_are_refused_where_the_operator_is_added() -> None:
    flow = Dataflow("m")
    source = flow.source()
    parsed = source.map("parse", parse)
    with pytest.raises(InvalidArgument, match="operator 'parse': the name is used"):
        source.map("parse", parse)
    with pytest.raises(InvalidArgument, match="add initial = 0"):
        parsed.key_by(user_of).reduce("total", add_amount)
    with pytest.raises(InvalidArgument, match="cannot be called with 1 value"):
        parsed.filter("f", is_kind, params={"knd": "buy"})
    with pytest.raises(InvalidArgument, match="cannot be called with 1 value"):
        parsed.filter("f", is_kind)  # kind is required: no params given
    with pytest.raises(InvalidArgument, match="must be JSON data"):
        parsed.filter("f", is_kind, params={"kind": {"buy"}})
    with pytest.raises(InvalidArgument, match="mode 'newest' is not one of"):
        parsed.sink("s", mode="newest")
    with pytest.raises(InvalidArgument, match="name must be 1-64"):
        parsed.map("bad name", parse)
    with pytest.raises(InvalidArgument, match="job name"):
        Dataflow("no spaces please")


def test_a_graph_is_checked_whole_when_built() -> None:
    flow = Dataflow("g")
    parsed = flow.source().map("parse", parse)
    parsed.filter("buys", is_kind, params={"kind": "buy"})  # a branch that ends nowhere
    parsed.sink("all")
    with pytest.raises(InvalidArgument, match=r"stage 1 \('buys'\): its output feeds no stage"):
        flow.job()
    with pytest.raises(InvalidArgument, match="has no operators"):
        Dataflow("empty").job()
    with pytest.raises(InvalidArgument, match="another dataflow"):
        flow.union(Dataflow("other").source())


def test_the_source_can_feed_several_branches() -> None:
    flow = Dataflow("fan")
    source = flow.source()
    source.sink("everything", mode="append")
    source.map("parse", parse).sink("parsed")
    job = flow.job()
    assert job.stages[1].inputs == (SOURCE,)


def test_the_documented_example_runs() -> None:
    assert doctest.testmod(gridstream.dataflow._flow).failed == 0
