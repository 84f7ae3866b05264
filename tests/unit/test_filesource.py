"""The files source: a reader killed at any point (before, during or after a
chunk's send, before its cursor moved) and started again from its cursor
delivers every record exactly once to containers that dedupe by (channel,
sequence), as the cluster's do; files arriving later are picked up."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from gridstream.filesource import Cursor, DirectorySource


class Killed(Exception):
    """The reading process dies here."""


class Containers:
    """Partitions that append a (channel, sequence) at most once."""

    def __init__(self, partitions: int = 3, batch_size: int = 4) -> None:
        self.partitions = partitions
        self.batch_size = batch_size
        self.highest: dict[tuple[int, str], int] = {}
        self.records: list[Any] = []
        self.kill_at: int | None = None
        self.pushes = 0
        self.grew = asyncio.Condition()

    async def holding(self, count: int) -> None:
        """Returns once the containers hold ``count`` records."""
        async with self.grew:
            await self.grew.wait_for(lambda: len(self.records) >= count)

    async def send(self, job_id: str, values: Any, keys: Any = None, *,
                   producer: str | None = None, first_sequence: int | None = None) -> int:
        assert producer is not None and first_sequence is not None
        grouped: dict[int, list[Any]] = {}
        for key, value in zip(keys, values, strict=True):
            grouped.setdefault(zlib.crc32(str(key).encode()) % self.partitions, []).append(value)
        for p in sorted(grouped):
            part = grouped[p]
            for n, start in enumerate(range(0, len(part), self.batch_size)):
                self.pushes += 1
                if self.pushes == self.kill_at:
                    raise Killed(f"killed at push {self.pushes}")
                sequence = first_sequence + n
                if sequence > self.highest.get((p, producer), 0):
                    self.highest[(p, producer)] = sequence
                    self.records.extend(part[start:start + self.batch_size])
        async with self.grew:
            self.grew.notify_all()
        return len(values)


def write_files(directory: Path, first: int, files: int, per_file: int) -> list[Any]:
    records = []
    for f in range(first, first + files):
        lines = []
        for i in range(per_file):
            record = {"user": f"u{(f * 7 + i) % 5}", "n": f * 1000 + i}
            records.append(record)
            lines.append(json.dumps(record))
        (directory / f"clicks-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
    return records


async def drain_with_kills(directory: Path, containers: Containers, kills: list[int]) -> None:
    for kill in [*kills, None]:
        containers.kill_at = kill
        source = DirectorySource(containers, "job", directory, key_field="user",
                                 chunk_records=10)
        try:
            await source.run()
            return
        except Killed:
            continue


@pytest.mark.parametrize("kills", [[], [1], [3, 9], [5, 6, 7, 20], list(range(2, 60, 4))])
def test_a_killed_reader_neither_skips_nor_repeats(tmp_path: Path, kills: list[int]) -> None:
    expected = write_files(tmp_path, 0, 3, 25)
    containers = Containers()
    asyncio.run(drain_with_kills(tmp_path, containers, kills))
    key = json.dumps
    assert sorted(map(key, containers.records)) == sorted(map(key, expected))
    cursor = Cursor.load(tmp_path / ".gridstream-cursor-job.json")
    assert cursor.done == ["clicks-000.jsonl", "clicks-001.jsonl", "clicks-002.jsonl"]
    assert cursor.in_flight is None


def test_files_that_arrive_later_are_picked_up(tmp_path: Path) -> None:
    containers = Containers()
    expected = write_files(tmp_path, 0, 1, 12)

    async def follow() -> None:
        stop = asyncio.Event()
        source = DirectorySource(containers, "job", tmp_path, key_field="user",
                                 chunk_records=5)
        running = asyncio.create_task(source.run(follow=True, poll_s=0.01, stop=stop))
        await containers.holding(12)
        expected.extend(write_files(tmp_path, 1, 2, 7))  # new files, named after the first
        await containers.holding(26)
        stop.set()
        await running

    asyncio.run(asyncio.wait_for(follow(), 10))
    assert sorted(map(json.dumps, containers.records)) == sorted(map(json.dumps, expected))


def test_csv_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.csv").write_text("user,n\nann,1\nbob,2\nann,3\n")
    pq.write_table(pa.Table.from_pylist([{"user": "cy", "n": 4}, {"user": "dee", "n": 5}]),
                   tmp_path / "b.parquet")
    containers = Containers()
    asyncio.run(drain_with_kills(tmp_path, containers, [2]))
    assert sorted((r["user"], int(r["n"])) for r in containers.records) == [
        ("ann", 1), ("ann", 3), ("bob", 2), ("cy", 4), ("dee", 5)]
