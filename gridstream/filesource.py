"""A files source: the records of a directory of JSON-lines, CSV or Parquet
files sent to a job exactly once, new files picked up as they arrive
(``gridstream send JOB DIR --follow``).

Exactly once across a kill of the reading process uses the mechanism of the
Spark bridge (docs/spark.md), not another: the reader is one producer with
a stable name (channel ``src/<producer>``), and it sends the files in
numbered *chunks*; chunk ``c`` is sent with ``first_sequence = (c + 1) <<
24``, so its n-th batch to a partition carries that plus n, above every
sequence of earlier chunks. Each container appends a (channel, sequence)
at most once (docs/recovery.md), so sending a chunk again, with the same
records in the same batches, adds nothing that already arrived.

What makes a re-send the same is the **cursor**, a small JSON file written
atomically (temporary file, fsync, rename): the producer name, the next
chunk number, the file being read and its read offset (bytes for JSON lines
and CSV, rows for Parquet), and the files already read. Before a chunk is
sent, the cursor records it as *in flight* (its file and exact offsets);
after every partition acknowledged it, the cursor moves past it. A reader
killed at any point starts again from its cursor: an in-flight chunk is read
again from the same offsets and sent with the same sequences (duplicates
are dropped by the containers), and reading goes on after it. Nothing is
skipped (the cursor only moves past acknowledged chunks) and nothing is
applied twice. Worker kills are the cluster's business: the client retries
a chunk's batches with their sequences until they are acknowledged.

Files are read in name order and must be complete when they appear in the
directory (write them elsewhere, or under a name starting with ``.``, and
rename them in): a file is taken as read once a read at its end finds
nothing more. Dot files and ``*.tmp`` files are ignored. CSV rows are
dicts of strings by the header and may not span lines.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gridstream.errors import GridstreamError
from gridstream.filesink import read_parquet
from gridstream.retry import Backoff

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "parquet")
CHUNK_RECORDS = 5_000
"""Records per chunk (one ``Client.send`` call, recorded in the cursor)."""
SEQUENCE_SHIFT = 24
"""A chunk's first sequence is ``(chunk + 1) << SEQUENCE_SHIFT``."""


class Sender(Protocol):
    """What the source needs of :class:`gridstream.Client`."""

    async def send(self, job_id: str, values: Any, keys: Any = None, *,
                   producer: str | None = None, first_sequence: int | None = None) -> int:
        """Sends records; see :meth:`gridstream.Client.send`."""
        ...


@dataclass
class Cursor:
    """Where a directory's reader is; see the module docstring."""

    producer: str
    next_chunk: int = 0
    file: str = ""
    offset: int = 0
    done: list[str] = field(default_factory=list)
    in_flight: dict[str, Any] | None = None
    """{"file", "start", "end", "chunk"} of a chunk being sent."""

    @classmethod
    def load(cls, path: Path) -> Cursor:
        """The cursor saved at ``path``, or a new one with a fresh producer."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(producer=f"files-{uuid.uuid4().hex[:16]}")
        return cls(**data)

    def save(self, path: Path) -> None:
        """Writes the cursor atomically and durably."""
        temp = path.with_name(f".{path.name}.tmp")
        with open(temp, "w") as handle:
            json.dump(asdict(self), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_format(name: str, fmt: str | None) -> str:
    """The format of a file: as given, else by its extension (JSON lines
    when it says nothing)."""
    if fmt:
        return fmt
    lower = name.lower()
    return "csv" if lower.endswith(".csv") else "parquet" if lower.endswith(
        ".parquet") else "jsonl"


def read_chunk(path: Path, fmt: str, start: int, limit: int,
               end: int | None = None) -> tuple[list[Any], int]:
    """(records, offset after them) from ``start``: at most ``limit`` records,
    or exactly those up to ``end`` when given (a chunk read again)."""
    if fmt == "parquet":
        table = read_parquet(path)
        stop = min(table.num_rows, start + limit) if end is None else end
        return table.slice(start, max(0, stop - start)).to_pylist(), stop
    with open(path, "rb") as handle:
        header = handle.readline() if fmt == "csv" else b""
        offset = max(start, handle.tell())
        handle.seek(offset)
        lines: list[bytes] = []
        while (end is None and len(lines) < limit) or (end is not None and offset < end):
            line = handle.readline()
            if not line:
                break
            offset += len(line)
            if line.strip():
                lines.append(line)
    if fmt == "csv":
        names = next(csv.reader([header.decode()]), [])
        text = io.StringIO(b"".join(lines).decode())
        return [dict(row) for row in csv.DictReader(text, fieldnames=names)], offset
    return [json.loads(line) for line in lines], offset


def keys_of(records: list[Any], key_field: str | None, where: str) -> list[Any] | None:
    """Each record's key (its ``key_field``), or None to send without keys."""
    if key_field is None:
        return None
    keys = []
    for record in records:
        if not isinstance(record, dict) or key_field not in record:
            raise ValueError(f"{where}: a record has no field {key_field!r} to key it by")
        keys.append(record[key_field])
    return keys


class DirectorySource:
    """Sends a directory's files to a job exactly once (module docstring)."""

    def __init__(self, client: Sender, job_id: str, directory: str | os.PathLike[str],
                 cursor: str | os.PathLike[str] | None = None, *,
                 key_field: str | None = None, fmt: str | None = None,
                 chunk_records: int = CHUNK_RECORDS) -> None:
        """``cursor`` defaults to ``<directory>/.gridstream-cursor-<job_id>.json``."""
        self.client = client
        self.job_id = job_id
        self.directory = Path(directory)
        self.cursor_path = (Path(cursor) if cursor is not None
                            else self.directory / f".gridstream-cursor-{job_id}.json")
        self.key_field = key_field
        self.fmt = fmt
        self.chunk_records = chunk_records
        self.cursor = Cursor.load(self.cursor_path)
        self.records_sent = 0

    def _next_file(self) -> str:
        done = set(self.cursor.done)
        for entry in sorted(os.listdir(self.directory)):
            if entry.startswith(".") or entry.endswith(".tmp") or entry in done:
                continue
            if (self.directory / entry).is_file():
                return entry
        return ""

    async def _send(self, flight: dict[str, Any]) -> None:
        """Sends an in-flight chunk (again) until every partition acknowledged it."""
        name = str(flight["file"])
        fmt = file_format(name, self.fmt)
        records, _ = await asyncio.to_thread(read_chunk, self.directory / name, fmt,
                                             int(flight["start"]), self.chunk_records,
                                             int(flight["end"]))
        keys = keys_of(records, self.key_field, name)
        backoff = Backoff(f"sending chunk {flight['chunk']} of {name}", first_s=0.2, max_s=5.0)
        while True:
            try:
                await self.client.send(self.job_id, records, keys,
                                       producer=self.cursor.producer,
                                       first_sequence=(int(flight["chunk"]) + 1)
                                       << SEQUENCE_SHIFT)
                break
            except GridstreamError as exc:  # restart-safe: the same chunk again
                log.warning("sending chunk %s of %s failed (%s); sending it again",
                            flight["chunk"], name, exc)
                await backoff.wait(exc)
        self.records_sent += len(records)
        self.cursor.file, self.cursor.offset = name, int(flight["end"])
        self.cursor.next_chunk = int(flight["chunk"]) + 1
        self.cursor.in_flight = None
        await asyncio.to_thread(self.cursor.save, self.cursor_path)

    async def step(self) -> bool:
        """Sends the next chunk (or the one in flight); False when every file
        present has been read to its end."""
        cursor = self.cursor
        if cursor.in_flight is not None:
            await self._send(cursor.in_flight)
            return True
        name = cursor.file if cursor.file and cursor.file not in cursor.done else ""
        if not name:
            name = await asyncio.to_thread(self._next_file)
            if not name:
                return False
            cursor.file, cursor.offset = name, 0
        fmt = file_format(name, self.fmt)
        records, end = await asyncio.to_thread(read_chunk, self.directory / name, fmt,
                                               cursor.offset, self.chunk_records)
        if not records:
            cursor.done.append(name)
            cursor.file, cursor.offset = "", 0
            await asyncio.to_thread(cursor.save, self.cursor_path)
            return True
        cursor.in_flight = {"file": name, "start": cursor.offset, "end": end,
                            "chunk": cursor.next_chunk}
        await asyncio.to_thread(cursor.save, self.cursor_path)  # written ahead
        await self._send(cursor.in_flight)
        return True

    async def run(self, follow: bool = False, poll_s: float = 0.5,
                  stop: asyncio.Event | None = None) -> int:
        """Sends every file; with ``follow``, keeps watching for new ones until
        ``stop`` is set. Returns the records sent by this run."""
        while stop is None or not stop.is_set():
            if not await self.step():
                if not follow:
                    break
                if stop is None:
                    await asyncio.sleep(poll_s)
                else:
                    try:
                        await asyncio.wait_for(stop.wait(), poll_s)
                    except TimeoutError:
                        pass
        return self.records_sent
