"""Result rows read from keyed state (a reduce into a latest sink writes no
rows): which tasks qualify, and the rows a state server reads from a base
and its deltas on a real SQLite file, as the worker would have written them,
in both forms a reader may ask for (values as JSON text, or as the stored
msgpack that the reader shows as that JSON would)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridstream.codec import as_row_value, pack, row_json, unpack
from gridstream.errors import FailedPrecondition, InvalidArgument
from gridstream.examples import taxi, wordcount
from gridstream.ids import first_row_version, key_text
from gridstream.jobspec import JobSpec, Stage
from gridstream.taskplan import results_from_state, state_result_sources
from services.stateserver.layout import StateWindow, VersionedRow
from services.stateserver.stateresults import (
    check_sources,
    read_packed_state_rows,
    read_state_rows,
)
from services.stateserver.store import SnapshotStore

JOB = "job-r"


def test_a_reduce_into_a_latest_sink_reads_its_rows_from_state() -> None:
    assert state_result_sources(taxi.job()) == [("track", "")]
    assert state_result_sources(wordcount.job()) == [("count", "")]
    # The other modes keep writing rows: their drains do not wait for every
    # window to be stored.
    assert state_result_sources(taxi.job(delivery="at_most_once")) == []
    assert state_result_sources(taxi.job(delivery="at_least_once")) == []


JOB_SPEC = JobSpec(name="j", stages=(), delivery="exactly_once")


def test_other_tasks_keep_writing_rows() -> None:
    reduce = Stage("sum", "reduce", "gridstream.builtins:count", key="m:k", initial=0)
    assert results_from_state(JOB_SPEC, [reduce, Stage("out", "sink")]) == "sum"
    # An append sink shows every running value, a files sink writes files.
    assert results_from_state(JOB_SPEC, [reduce, Stage("out", "sink",
                                                                mode="append")]) is None
    assert results_from_state(JOB_SPEC, [reduce, Stage("out", "sink",
                                                                mode="files")]) is None
    # A map after the reduce: the rows are not the state.
    assert results_from_state(JOB_SPEC, [reduce, Stage("f", "map", "m:f"),
                                                  Stage("out", "sink")]) is None
    # A stateful stage's state is not what it emits.
    stateful = replace(reduce, kind="stateful")
    assert results_from_state(JOB_SPEC, [stateful, Stage("out", "sink")]) is None


def test_a_job_with_several_sinks_names_each_reduce_with_its_prefix() -> None:
    spec = JobSpec(name="two", stages=(
        Stage("words", "map", "m:f"),
        Stage("a", "reduce", "gridstream.builtins:count", key="m:k", initial=0,
              inputs=("words",)),
        Stage("out_a", "sink", inputs=("a",)),
        Stage("b", "reduce", "gridstream.builtins:count", key="m:k", initial=0,
              inputs=("words",)),
        Stage("out_b", "sink", inputs=("b",)),
    ))
    assert sorted(state_result_sources(spec)) == [("a", "out_a/"), ("b", "out_b/")]


@pytest.mark.parametrize("sources", [
    [("", "")], [("count@timers", "")], [("x" * 600, "")], [("count", "p" * 600)],
    [("s", "")] * 65,
])
def test_malformed_sources_are_refused(sources: list[tuple[str, str]]) -> None:
    with pytest.raises(InvalidArgument, match=r"nothing read|from_state names"):
        check_sources(sources)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    async with SnapshotStore(tmp_path / "state.sqlite3", max_deltas=3) as opened:
        opened.states.auto_compact = False
        yield opened


def window(operator: str, number: int, parent: int | None,
           entries: list[tuple[str, Any, Any]]) -> StateWindow:
    """A window as PutState delivers it; a value of ``...`` deletes the key."""
    return StateWindow(JOB, operator, number, 1, parent, pack({"offset": number}), [
        (stage, pack(key), None if value is ... else pack(value))
        for stage, key, value in entries])


@pytest.fixture(params=[False, True], ids=["json", "packed"])
def packed(request: pytest.FixtureRequest) -> bool:
    """Whether the reader asks for the values as stored (msgpack)."""
    return bool(request.param)


async def rows_of(store: SnapshotStore, sources: list[tuple[str, str]], chunk_rows: int = 2,
                  chunk_bytes: int = 1 << 20, packed: bool = False
                  ) -> list[list[VersionedRow]]:
    """The rows read, values as JSON text; read ``packed``, each value is
    unpacked and shown as a reader shows it, then written as JSON again."""
    if not packed:
        return [chunk async for chunk in read_state_rows(store.path, JOB, sources, chunk_rows,
                                                         chunk_bytes)]
    chunks = []
    async for blob, count in read_packed_state_rows(store.path, JOB, sources, chunk_rows,
                                                    chunk_bytes):
        rows = [(key, row_json(as_row_value(value)), version)
                for key, value, version in unpack(blob)]
        assert len(rows) == count
        chunks.append(rows)
    return chunks


async def test_rows_are_the_newest_value_of_each_key_across_base_and_deltas(
        store: SnapshotStore, packed: bool) -> None:
    op = f"{JOB}/t1/p0"
    await store.states.put(window(op, 1, None, [("count", "a", 1), ("count", "b", 1),
                                                ("count", "gone", 5), ("other", "a", 99)]))
    await store.states.put(window(op, 2, 1, [("count", "a", 2), ("count", "gone", ...)]))
    await store.states.put(window(op, 3, 2, [("count", "c", [1, "x"]), ("count", 7, {"n": 1}),
                                             ("count", ("t", 1), "tuple key")]))
    chunks = await rows_of(store, [("count", "")], packed=packed)
    assert all(len(chunk) <= 2 for chunk in chunks)
    rows = {key: (value, version) for chunk in chunks for key, value, version in chunk}
    version = first_row_version(3)
    assert rows == {
        "a": ("2", version), "b": ("1", version), "c": (row_json([1, "x"]), version),
        key_text(7): ('{"n":1}', version), key_text(("t", 1)): ('"tuple key"', version),
    }  # the deleted key is gone; the other stage's state is not a row
    # Folding the deltas into the base changes nothing read.
    assert await store.states.compact(JOB, op, keep=0) == 2
    again = {key: value for chunk in await rows_of(store, [("count", "")], packed=packed)
             for key, value, _ in chunk}
    assert again == {key: value for key, (value, _) in rows.items()}


async def test_every_operator_of_the_job_is_read_under_the_sinks_prefix(
        store: SnapshotStore, packed: bool) -> None:
    for partition in range(3):
        await store.states.put(window(f"{JOB}/t1/p{partition}", 5 + partition, None,
                                      [("a", f"k{partition}", partition)]))
    await store.states.put(StateWindow("another-job", "another-job/t1/p0", 1, 1, None, b"\x80",
                                       [("a", pack("elsewhere"), pack(1))]))
    rows = [row for chunk in await rows_of(store, [("a", "out_a/")], packed=packed)
            for row in chunk]
    assert sorted(rows) == [(f"out_a/k{p}", json.dumps(p), first_row_version(5 + p))
                            for p in range(3)]
    assert await rows_of(store, [], packed=packed) == []


async def test_chunks_stay_under_the_byte_limit(store: SnapshotStore, packed: bool) -> None:
    op = f"{JOB}/t1/p0"
    await store.states.put(window(op, 1, None, [("s", f"k{i}", "v" * 1_000) for i in range(50)]))
    chunks = await rows_of(store, [("s", "")], chunk_rows=1_000, chunk_bytes=4_000,
                           packed=packed)
    assert len(chunks) >= 12 and sum(len(c) for c in chunks) == 50
    assert all(sum(len(value) for _, value, _ in chunk) <= 5_100 for chunk in chunks)


async def test_a_value_json_cannot_show_is_an_error_not_a_missing_row(
        store: SnapshotStore, packed: bool) -> None:
    op = f"{JOB}/t1/p0"
    await store.states.put(window(op, 1, None, [("s", "bad", {"k": {(1, 2): 3}}),
                                                ("s", "good", 1)]))
    with pytest.raises(FailedPrecondition, match="key 'bad' cannot be read"):
        await rows_of(store, [("s", "")], chunk_rows=10, packed=packed)
