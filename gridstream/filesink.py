"""Files sinks: where a job's files live, how they are named and written, and
how to read them back.

A sink with ``mode = "files"`` (params ``path`` and ``format``) writes every
record that reaches it to files under ``<path>/<job id>/<sink>/``, one file
per window snapshot and partition that had records. A file is written under
a temporary name (a dot file ending in ``.tmp``), fsynced, and renamed into
place only once the window's snapshot is durable; its final name is
deterministic, ``p<partition>-<first offset>-<end offset>.<ext>``, the range
of the partition's container offsets whose records it holds. Those offsets
are the same on every replay (``docs/recovery.md``), and a new owner replays
only the batches after the newest durable window, so no committed file is
ever written again: the final files of a job, read together, hold every
record exactly once (:func:`read_records`). How a window's files survive a
kill between the durable snapshot and the rename is in
:mod:`services.worker.filesinks`.

The path must be a directory every worker can write: a shared filesystem
(NFS, a mounted volume) in a real deployment; a local run has every worker
on one machine, so any directory does.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gridstream.codec import row_json
from gridstream.errors import InvalidArgument
from gridstream.validation import short

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet"}
"""The formats a files sink writes, and each one's file extension."""

_FINAL = re.compile(r"^p(\d{5})-(\d{12})-(\d{12})\.(jsonl|parquet)$")
_LAYOUT_KEY = b"gridstream.layout"
"""Parquet schema metadata: ``columns`` (records were dicts, one column per
field) or ``json`` (one column ``value`` of each record as JSON)."""


def check_file_params(params: Mapping[str, Any], where: str) -> None:
    """A files sink's params (checked when the job is built): an absolute
    ``path`` every worker can write (a shared filesystem in a real
    deployment; a relative path would mean each worker's own working
    directory) and a ``format`` of :data:`EXTENSIONS`."""
    unknown = sorted(map(str, set(params) - {"path", "format"}))
    if unknown:
        raise InvalidArgument(f"{where}: a files sink takes params path and format, not "
                              f"{', '.join(unknown)}")
    path = params.get("path")
    if not (isinstance(path, str) and path.startswith("/") and "\0" not in path):
        raise InvalidArgument(f"{where}: a files sink needs params.path, an absolute "
                              f"directory every worker can write (a shared filesystem), not "
                              f"{short(str(path))}")
    fmt = params.get("format", "jsonl")
    if fmt not in EXTENSIONS:
        raise InvalidArgument(f"{where}: format {short(str(fmt))} is not one of "
                              f"{', '.join(EXTENSIONS)}")


def sink_dir(path: str | os.PathLike[str], job_id: str, sink: str) -> Path:
    """The directory of one sink's files."""
    return Path(path) / job_id / sink


def final_name(partition: int, start: int, end: int, fmt: str) -> str:
    """A committed file's name: the partition and the container offsets
    ``[start, end)`` whose records it holds (deterministic on replay)."""
    return f"p{partition:05d}-{start:012d}-{end:012d}.{EXTENSIONS[fmt]}"


def temp_name(final: str, epoch: int) -> str:
    """Where a file is written before it is committed: hidden, and per owner
    (its ownership epoch), so a superseded owner never writes a file a newer
    one writes or renames."""
    return f".{final}.e{epoch}.tmp"


def temp_prefix(partition: int) -> str:
    """What every temporary file of a partition's starts with."""
    return f".p{partition:05d}-"


def encode(records: list[Any], fmt: str) -> bytes:
    """The bytes of a file holding ``records`` in order: JSON lines (each
    value as the results table stores it), or Parquet through pyarrow (one
    column per field when every record is a dict of a shape Arrow takes,
    otherwise one column ``value`` of JSON texts)."""
    if fmt == "jsonl":
        return "".join(row_json(r) + "\n" for r in records).encode()
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = None
    if records and all(isinstance(r, dict) for r in records):
        try:
            table = pa.Table.from_pylist(records)
            table = table.replace_schema_metadata({_LAYOUT_KEY: b"columns"})
        except (pa.ArrowException, TypeError, ValueError):
            table = None
    if table is None:
        table = pa.table({"value": [row_json(r) for r in records]},
                         metadata={_LAYOUT_KEY: b"json"})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def decode(data: bytes, fmt: str) -> list[Any]:
    """The records of one file's bytes (:func:`encode` reversed)."""
    if fmt == "jsonl":
        return [json.loads(line) for line in data.decode().splitlines() if line]
    import io

    table = read_parquet(io.BytesIO(data))
    layout = (table.schema.metadata or {}).get(_LAYOUT_KEY, b"columns")
    if layout == b"json":
        return [json.loads(text) for text in table.column("value").to_pylist()]
    return list(table.to_pylist())


def read_parquet(source: Any) -> Any:
    """A whole Parquet file as a pyarrow Table, read on the calling thread.

    ``pq.read_table`` scans through Arrow's thread pools; a pool thread still
    busy when the interpreter exits makes the process abort ("terminate
    called without an active exception", exit -6) after its work is done.
    Files here are read whole and one at a time, so threads buy nothing."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, pre_buffer=False).read(use_threads=False)


def write_durably(directory: Path, name: str, data: bytes) -> None:
    """Writes ``data`` to ``directory/name`` and fsyncs it and the directory
    (blocking: workers call it in a thread)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    with open(target, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    """Makes the directory's entries (a new file, a rename) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(directory: Path, temp: str, final: str) -> bool:
    """Renames a temporary file into place; True when this call renamed it.
    Idempotent: a temporary file already renamed (by this owner earlier, or
    by the owner after it) leaves the committed one as it is."""
    try:
        os.replace(directory / temp, directory / final)
    except FileNotFoundError:
        return False
    fsync_dir(directory)
    return True


def committed_files(path: str | os.PathLike[str], job_id: str, sink: str) -> list[Path]:
    """The committed files of a sink, by partition and offset (temporary
    files, which are not committed, are left out)."""
    directory = sink_dir(path, job_id, sink)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _FINAL.match(entry.name)
        if match:
            found.append(((int(match[1]), int(match[2])), entry))
    return [entry for _, entry in sorted(found)]


def read_file(file: Path) -> list[Any]:
    """The records of one committed file."""
    return decode(file.read_bytes(), "parquet" if file.suffix == ".parquet" else "jsonl")


def iter_records(path: str | os.PathLike[str], job_id: str, sink: str) -> Iterator[Any]:
    """Every record of a files sink, partition by partition, in the order each
    partition processed them."""
    for file in committed_files(path, job_id, sink):
        yield from read_file(file)


def read_records(path: str | os.PathLike[str], job_id: str, sink: str) -> list[Any]:
    """Every record of a files sink, exactly once (see the module docstring).

    >>> read_records("/nonexistent", "job", "sink")
    []
    """
    return list(iter_records(path, job_id, sink))
