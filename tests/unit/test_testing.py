"""The local runner: a job's whole graph in one process with the cluster's
semantics (keys and per-key order, keyed state, params, sink modes, dead
letters with the workers' ids and texts)."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

import gridstream.testing._runner
from gridstream.dataflow import Dataflow
from gridstream.errors import PermissionDenied
from gridstream.examples import taxi, wordcount
from gridstream.jobspec import JobSpec, Stage
from gridstream.testing import TestSource, run_local


def parse(text: str) -> dict[str, Any]:
    user, kind, amount = text.split(",")
    if not amount.isdigit():
        raise ValueError(f"bad amount {amount!r}")
    return {"user": user, "kind": kind, "amount": int(amount)}


def is_kind(click: dict[str, Any], kind: str) -> bool:
    return bool(click["kind"] == kind)


def user_of(click: dict[str, Any]) -> Any:
    return click["user"] if click["user"] != "nobody" else None


def add_amount(total: int, click: dict[str, Any], factor: int = 1) -> int:
    return total + factor * int(click["amount"])


def pair_types(value: Any) -> str:
    return type(value).__name__


CLICKS = ["ann,buy,5", "bob,view,1", "ann,view,2", "bob,buy,x", "ann,buy,7", "nobody,buy,1"]


def clicks_flow() -> Dataflow:
    flow = Dataflow("clicks", partitions=3)
    clicks = flow.source().map("parse", parse)
    clicks.sink("raw", mode="append")
    buys = clicks.filter("buys", is_kind, params={"kind": "buy"})
    views = clicks.filter("views", is_kind, params={"kind": "view"})
    buys.key_by(user_of).reduce("spend", add_amount, initial=0, params={"factor": 10}) \
        .sink("spent")
    buys.union(views).key_by(user_of).reduce("touch", add_amount, initial=0).sink("touched")
    return flow


def test_a_graph_runs_whole_with_branches_unions_params_and_both_sinks() -> None:
    result = run_local(clicks_flow(), CLICKS)
    assert result.results("spent") == {"ann": 120}
    assert result.results("touched") == {"ann": 14, "bob": 1}
    raw = result.sink("raw")
    assert raw.mode == "append"
    assert sorted(r["user"] for r in raw.records) == ["ann", "ann", "ann", "bob", "nobody"]
    assert len(raw.rows) == 5  # one row per record, none merged
    letters = {(d.stage, d.error) for d in result.dead_letters}
    assert ("parse", "ValueError: bad amount 'x'") in letters
    assert ("spend", "TypeError: key function returned NoneType; keys must be str, int or "
            "bytes") in letters


def test_results_and_dead_letters_have_the_clusters_shape() -> None:
    result = run_local(clicks_flow(), CLICKS)
    bad = next(d for d in result.dead_letters if d.stage == "parse")
    assert bad.id == "t0/p0/src/local#1:parse:3"  # one batch to partition 0; 4th record
    assert bad.record == "bob,buy,x" and bad.record_format == "json"
    assert "in parse" in bad.traceback
    keyless = next(d for d in result.dead_letters if d.stage == "spend")
    assert ":spend.key:" in keyless.id and keyless.record["user"] == "nobody"


def test_per_key_order_needs_keys_as_on_the_cluster() -> None:
    keys, records = taxi.keyed(300, devices=20)
    expected = taxi.reference(records)
    keyed = run_local(taxi.job(partitions=4), TestSource(records, keys, batch_size=7))
    assert keyed.results() == expected
    unkeyed = run_local(taxi.job(partitions=4), TestSource(records, batch_size=7))
    assert unkeyed.results().keys() == expected.keys()
    assert unkeyed.results() != expected  # batches spread over partitions: reordered


def test_the_sent_key_stays_on_the_record_to_the_sink() -> None:
    job = JobSpec("keys", (Stage("t", "map", f"{__name__}:pair_types"), Stage("s", "sink")))
    result = run_local(job, TestSource([(1, 2), "x"], keys=["a", 7]))
    assert result.results() == {"a": "list", "r:7": "str"}  # tuples arrive as lists


def test_the_examples_give_their_reference_results() -> None:
    text = ["the cat and the hat", "The end"]
    assert run_local(wordcount.job(), text).results() == wordcount.reference(text)


def test_job_modules_limit_what_a_job_may_import() -> None:
    job = JobSpec("j", (Stage("m", "map", f"{__name__}:pair_types"), Stage("s", "sink")))
    with pytest.raises(PermissionDenied, match=r"cluster\.job_modules"):
        run_local(job, [1], job_modules=("gridstream.builtins",))
    assert run_local(job, [1], job_modules=("tests",)).results() != {}


def test_the_documented_example_runs() -> None:
    assert doctest.testmod(gridstream.testing._runner).failed == 0
