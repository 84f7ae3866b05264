"""Files sinks: the spec, the commit protocol of services.worker.filesinks
(seal, prepare, commit after the snapshot is durable, recover after a kill
at every point) and the reader: every record in exactly one committed file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gridstream import filesink
from gridstream.dataflow import Dataflow
from gridstream.errors import InvalidArgument
from gridstream.jobspec import JobSpec, Stage, from_mapping
from gridstream.testing import run_local
from services.worker.filesinks import PENDING, FileSinkWriter
from services.worker.operators import OperatorChain


def files_stage(path: Path, fmt: str = "jsonl") -> Stage:
    return Stage("out", "sink", params={"path": str(path), "format": fmt}, mode="files")


def test_spec_is_checked_when_built(tmp_path: Path) -> None:
    job = JobSpec("j", (Stage("m", "map", "gridstream.builtins:identity"),
                        files_stage(tmp_path)))
    assert JobSpec.from_proto(job.to_proto()) == job
    with pytest.raises(InvalidArgument, match="absolute directory"):
        JobSpec.from_proto(JobSpec("j", (Stage("s", "sink", params={"path": "rel"},
                                                mode="files"),)).to_proto())
    with pytest.raises(InvalidArgument, match="format 'csv' is not one of"):
        from_mapping({"stages": [{"name": "s", "kind": "sink", "mode": "files",
                                  "params": {"path": "/x", "format": "csv"}}]})
    with pytest.raises(InvalidArgument, match="only a files sink"):
        from_mapping({"stages": [{"name": "s", "kind": "sink", "params": {"path": "/x"}}]})
    flow = Dataflow("f")
    flow.source().file_sink("out", "rel/dir", format="parquet")
    params = flow.job().stages[0].params
    assert params["path"].startswith("/") and params["format"] == "parquet"
    with pytest.raises(InvalidArgument, match="format"):
        Dataflow("g").source().file_sink("out", tmp_path, format="xml")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_encode_decode(fmt: str) -> None:
    for records in ([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}], [1, "two", [3], {"f": 4}]):
        assert filesink.decode(filesink.encode(records, fmt), fmt) == records


class Task:
    """A task's view of the writer: a chain, windows and an epoch."""

    def __init__(self, path: Path, epoch: int, fmt: str = "jsonl") -> None:
        self.chain = OperatorChain([files_stage(path, fmt)], "test")
        self.epoch = epoch
        self.writer = FileSinkWriter(self.chain.stages[0], "job", 3, lambda: self.chain,
                                     lambda: self.epoch, "job/t0/p3")
        self.offset = 0
        self.window = 0

    def batch(self, values: list[Any]) -> None:
        result = self.chain.process(None, values, f"b{self.offset}")
        self.writer.add(result.sink_rows)
        self.offset += 1

    def close(self) -> tuple[int, dict[str, Any]]:
        """Seals the window; returns its number and the state the snapshot
        would carry (the chain's delta)."""
        self.writer.seal(self.window, self.offset)
        delta = self.chain.capture_delta()
        self.window += 1
        return self.window - 1, delta

    def restore(self, delta: dict[str, Any]) -> None:
        self.chain.apply_entries([["out", k, v] for k, v in delta.get("out", {}).items()])


def test_window_files_commit_after_durable(tmp_path: Path) -> None:
    task = Task(tmp_path, epoch=1)
    task.batch([1, 2])
    task.batch([3])
    window, delta = task.close()
    assert delta["out"][PENDING] == [[filesink.temp_name("p00003-000000000000-000000000002"
                                                         ".jsonl", 1),
                                      "p00003-000000000000-000000000002.jsonl"]]
    asyncio.run(task.writer.prepare())
    assert filesink.read_records(tmp_path, "job", "out") == []  # written, not committed
    asyncio.run(task.writer.commit(window))
    assert filesink.read_records(tmp_path, "job", "out") == [1, 2, 3]
    assert task.chain.states["out"][PENDING] == []
    task.close()  # an empty window writes no file
    assert len(filesink.committed_files(tmp_path, "job", "out")) == 1


@pytest.mark.parametrize("kill_after", ["seal", "prepare", "durable", "commit"])
def test_a_kill_at_any_point_keeps_every_record_once(tmp_path: Path, kill_after: str) -> None:
    """The first owner processes two windows; the second is killed at
    ``kill_after``. A new owner restores the newest durable window (the
    first, or the second once its snapshot was durable), replays the
    batches after it and commits: the files hold every record once."""
    first = Task(tmp_path, epoch=1)
    first.batch([1, 2])
    window, durable = first.close()
    asyncio.run(first.writer.prepare())
    asyncio.run(first.writer.commit(window))
    first.batch([3])
    first.batch([4, 5])
    window, delta = first.close()
    restored, offset = durable, 1
    if kill_after != "seal":
        asyncio.run(first.writer.prepare())
    if kill_after in ("durable", "commit"):
        restored, offset = delta, 3  # the snapshot of the second window is durable
    if kill_after == "commit":
        asyncio.run(first.writer.commit(window))
    first.batch([6])  # processed by the old owner, never durable
    first.close()
    asyncio.run(first.writer.prepare())

    second = Task(tmp_path, epoch=2)
    second.restore(restored)
    second.offset = offset
    asyncio.run(second.writer.recover(offset))
    assert not [p for p in (tmp_path / "job" / "out").iterdir() if p.name.endswith(".tmp")]
    replay = {1: [[3], [4, 5], [6]], 3: [[6]]}[offset]
    for values in replay:
        second.batch(values)
    window, _ = second.close()
    asyncio.run(second.writer.prepare())
    asyncio.run(second.writer.commit(window))
    assert sorted(filesink.read_records(tmp_path, "job", "out")) == [1, 2, 3, 4, 5, 6]


def test_a_superseded_owner_commits_nothing_a_new_owner_wrote(tmp_path: Path) -> None:
    """A paused old owner wakes after the new owner's recovery and writes its
    window's temporary file: never named by a durable window, it is deleted
    by the next recovery and never read."""
    old = Task(tmp_path, epoch=1)
    old.batch([1])
    new = Task(tmp_path, epoch=2)
    asyncio.run(new.writer.recover(0))
    new.batch([1])
    window, durable = new.close()
    old.close()
    asyncio.run(old.writer.prepare())  # the zombie's file, under its own name
    asyncio.run(new.writer.prepare())
    asyncio.run(new.writer.commit(window))
    assert filesink.read_records(tmp_path, "job", "out") == [1]
    third = Task(tmp_path, epoch=3)
    third.restore(durable)
    asyncio.run(third.writer.recover(1))
    assert filesink.read_records(tmp_path, "job", "out") == [1]
    assert not [p for p in (tmp_path / "job" / "out").iterdir() if p.name.endswith(".tmp")]


def test_run_local_writes_files_the_reader_reads(tmp_path: Path) -> None:
    flow = Dataflow("files", partitions=3)
    words = flow.source().flat_map("split", "gridstream.builtins:split_words")
    words.file_sink("words", tmp_path, format="parquet")
    result = run_local(flow, ["a b c", "d e"], job_id="run1")
    assert sorted(filesink.read_records(tmp_path, "run1", "words")) == list("abcde")
    assert sorted(result.sink("words").records) == list("abcde")


def test_the_clicks_example_matches_its_reference_locally(tmp_path: Path) -> None:
    """The docs/dataflow.md clicks example, as written there."""
    from gridstream.examples import clicks
    from gridstream.testing import TestSource

    users, lines = clicks.generate(2_000)
    result = run_local(clicks.flow(tmp_path, partitions=4), TestSource(lines, keys=users))
    expected = clicks.reference(lines)
    assert result.results("users") == expected["users"]
    assert result.results("pages") == expected["pages"]
    assert clicks.check_files(filesink.read_records(tmp_path, "local", "clicks"), lines) == ""
    assert clicks.check_files(filesink.read_records(tmp_path, "local", "clicks")[1:], lines)
