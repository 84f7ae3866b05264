"""Result rows read from operators' keyed state instead of the results table.

A task that is a reduce into a ``latest`` sink writes no result rows
(:func:`gridstream.taskplan.results_from_state`): its rows are the reduce's
accumulators, which every window already stores as keyed state (a base plus
deltas, :mod:`services.stateserver.chains`). Writing them again as rows
was a second copy of every changed value per window, the largest cost of a
state server on a job whose values grow (the taxi job's position strings),
and the row writes were what a takeover's claim queued behind.

The reader of a job's results names those reduces (it knows the job's plan);
this module turns their stored state into rows as the worker would have
written them: the key's text under the sink's prefix, the value's JSON, and
the version of the operator's newest stored window, so that merging the
replicas keeps the newest window's rows. A reader that asks for
``state_values_packed`` gets each value as the state stores it (msgpack)
instead of its JSON: for long values (a taxi job's tracks) writing JSON here
and parsing it again in the reader was most of the read's CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from gridstream.codec import pack, row_json, unpack
from gridstream.errors import FailedPrecondition, InvalidArgument
from gridstream.ids import first_row_version, key_text
from gridstream.validation import short
from services.stateserver.entryforms import array_header, newest_values
from services.stateserver.layout import VersionedRow

MAX_SOURCES = 64
"""Most reduces one ReadResults may name (a job has at most this many tasks
worth asking for; more is a malformed request)."""

MAX_NAME = 512
"""Longest stage name or key prefix accepted."""


def check_sources(sources: Sequence[tuple[str, str]]) -> None:
    """Refuses a ``from_state`` list a well-formed reader never sends: too
    many entries, an empty or oversized name, or internal state (``@``)."""
    if len(sources) > MAX_SOURCES:
        raise InvalidArgument(f"from_state names {len(sources)} stages, more than "
                              f"{MAX_SOURCES}; name the job's reduce-into-latest stages only")
    for index, (stage, prefix) in enumerate(sources):
        if not stage or len(stage) > MAX_NAME or "@" in stage:
            raise InvalidArgument(
                f"from_state[{index}].stage {short(stage)} must be a reduce stage's name "
                f"(1 to {MAX_NAME} characters, no '@'); nothing read")
        if len(prefix) > MAX_NAME:
            raise InvalidArgument(f"from_state[{index}].key_prefix is longer than {MAX_NAME} "
                                  "characters; nothing read")


def _hashable(key: Any) -> Any:
    """A key as the worker held it: msgpack gives tuples back as lists."""
    if isinstance(key, list):
        return tuple(_hashable(part) for part in key)
    return key


def _decoded(key: bytes, value: bytes, operator_id: str) -> tuple[Any, Any]:
    """One entry decoded, or an error naming its key."""
    try:
        return unpack(b"\x92" + key + value)  # type: ignore[no-any-return]
    except Exception as exc:  # msgpack raises several unrelated types
        try:
            name = key_text(_hashable(unpack(key)))
        except Exception:  # the key itself is unreadable
            name = repr(key)
        raise FailedPrecondition(
            f"{operator_id}: the stored state of key {short(name)} cannot be read "
            f"({type(exc).__name__}: {exc}); the sink cannot show it") from None


def _decoded_pairs(pairs: list[tuple[bytes, bytes]], operator_id: str) -> list[Any]:
    """(key, value) of each stored pair, decoded in one C call (which also
    checks them); a pair that does not decode is named by its key."""
    blob = array_header(len(pairs)) + b"".join(b"\x92" + k + v for k, v in pairs)
    try:
        return unpack(blob)  # type: ignore[no-any-return]
    except Exception:  # msgpack raises several unrelated types; find the entry
        return [_decoded(key, value, operator_id) for key, value in pairs]


def _row_key(key: Any, prefix: str) -> str:
    """A row's key: the state key's text under the sink's prefix."""
    return prefix + (key if type(key) is str else key_text(_hashable(key)))


def _rows_of(pairs: list[tuple[bytes, bytes]], prefix: str, version: int,
             operator_id: str) -> list[VersionedRow]:
    """Rows of (msgpack key, msgpack value) pairs, values as JSON text."""
    rows: list[VersionedRow] = []
    append = rows.append
    for key, value in _decoded_pairs(pairs, operator_id):
        text = _row_key(key, prefix)
        try:
            append((text, row_json(value), version))
        except (TypeError, ValueError, RecursionError) as exc:
            raise FailedPrecondition(
                f"{operator_id}: the stored value of key {short(text)} cannot be written as "
                f"JSON ({type(exc).__name__}: {exc}); the sink cannot show it") from None
    return rows


def _packed_rows_of(pairs: list[tuple[bytes, bytes]], prefix: str, version: int,
                    operator_id: str) -> bytes:
    """A ReadResultsChunk.rows array of [key, value, version] with each
    value's stored msgpack spliced in as it is (``values_packed``): no
    value is turned into JSON here nor parsed from JSON by the reader. The
    pairs are still decoded (one C call) to check them and read the keys;
    a text key without a prefix is spliced in as stored too."""
    decoded = _decoded_pairs(pairs, operator_id)
    tail = pack(version)
    parts = [array_header(len(pairs))]
    append = parts.append
    for (key, _value), (stored_key, stored_value) in zip(decoded, pairs, strict=True):
        packed_key = (stored_key if type(key) is str and not prefix
                      else pack(_row_key(key, prefix)))
        append(b"\x93" + packed_key + stored_value + tail)
    return b"".join(parts)


async def _current_pages(conn: aiosqlite.Connection, params: tuple[str, str, str],
                         page_rows: int) -> AsyncIterator[list[tuple[bytes, bytes]]]:
    """Every live (key, value) of one operator's stage, a page at a time:
    the base with each key's newest delta value in its place (a key deleted
    since the base left out), then the keys only the deltas hold."""
    newer = {key: value for (stage, key), value in newest_values(
        ((int(row[0]), int(row[1]), bytes(row[2])) for row in await conn.execute_fetchall(
            'SELECT "window", chunk, entries FROM state_delta_chunks WHERE job_id = ? '
            'AND operator_id = ? ORDER BY "window", chunk', params[:2])),
        params[1]).items() if stage == params[2]}
    async with conn.execute(
        "SELECT key, value FROM state_entries WHERE job_id = ? AND operator_id = ? "
        "AND stage = ?", params,
    ) as cursor:
        while base := list(await cursor.fetchmany(page_rows)):
            page = []
            for key, value in base:
                key = bytes(key)
                current = newer.pop(key, value) if newer else value
                if current is not None:
                    page.append((key, bytes(current)))
            yield page
    yield [(key, value) for key, value in newer.items() if value is not None]


async def _state_pages(
    path: str | Path, job_id: str, sources: Sequence[tuple[str, str]], chunk_rows: int,
    chunk_bytes: int,
) -> AsyncIterator[tuple[list[tuple[bytes, bytes]], str, int, str]]:
    """(pairs, key prefix, row version, operator) chunks of :func:`read_state_rows`.

    Each operator is read as of one moment: one read transaction on a
    connection of its own (a fold committing meanwhile changes nothing
    read), deltas first (each key's newest value, a NULL for a key deleted
    since), then the base in pages, each key's newest delta value taking
    its place. The loop is let through after every chunk."""
    if not sources:
        return
    conn = await aiosqlite.connect(path, isolation_level=None)
    try:
        await conn.execute("PRAGMA query_only=ON")
        await conn.execute("BEGIN")
        heads = list(await conn.execute_fetchall(
            "SELECT operator_id, head_window FROM state_heads WHERE job_id = ? "
            "ORDER BY operator_id", (job_id,)))
        pending: list[tuple[bytes, bytes]] = []
        size = 0
        for operator_id, head_window in heads:
            version = first_row_version(int(head_window))
            for stage, prefix in sources:
                async for page in _current_pages(conn, (job_id, operator_id, stage), chunk_rows):
                    for key, value in page:
                        pending.append((key, value))
                        size += len(key) + len(value)
                        if len(pending) >= chunk_rows or size >= chunk_bytes:
                            yield pending, prefix, version, operator_id
                            pending, size = [], 0
                            await asyncio.sleep(0)
                if pending:
                    yield pending, prefix, version, operator_id
                    pending, size = [], 0
    finally:
        await conn.close()


async def read_state_rows(
    path: str | Path, job_id: str, sources: Sequence[tuple[str, str]], chunk_rows: int,
    chunk_bytes: int,
) -> AsyncIterator[list[VersionedRow]]:
    """The rows of ``sources`` ((reduce stage, key prefix) pairs) in every
    operator of ``job_id`` holding state, in chunks of at most ``chunk_rows``
    rows and about ``chunk_bytes``, values as JSON text (each operator as of
    one moment: :func:`_state_pages`)."""
    async for pairs, prefix, version, operator_id in _state_pages(
            path, job_id, sources, chunk_rows, chunk_bytes):
        yield _rows_of(pairs, prefix, version, operator_id)


async def read_packed_state_rows(
    path: str | Path, job_id: str, sources: Sequence[tuple[str, str]], chunk_rows: int,
    chunk_bytes: int,
) -> AsyncIterator[tuple[bytes, int]]:
    """The chunks of :func:`read_state_rows` with the values as the state
    stores them (msgpack): (ReadResultsChunk.rows, row count) for a reader
    that asked for ``state_values_packed``."""
    async for pairs, prefix, version, operator_id in _state_pages(
            path, job_id, sources, chunk_rows, chunk_bytes):
        yield _packed_rows_of(pairs, prefix, version, operator_id), len(pairs)
