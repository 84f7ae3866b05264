"""The two msgpack forms of a window's entries, and a stored delta's chunks.

An entry is (stage, key, value), key and value each msgpack-encoded on its
own (the value None for a deleted key). *Packed* form is a msgpack array of
[stage, key, value] / [stage, key] with key and value as bytes: what a
worker sends in PutState, what a delta is stored as (a row per chunk, layout
4, :mod:`services.stateserver.layout`) and what a peer copies. *Native* form
embeds the key's and value's encodings in the array itself, so a worker
restoring decodes a whole chunk into its objects in one C call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gridstream.codec import pack, unpack
from services.stateserver.layout import ChunkUnreadable, Entry


def array_header(n: int) -> bytes:
    """msgpack array header for ``n`` elements: a reader builds an array out
    of stored encodings by concatenation, without decoding them."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_rows(rows: list[Any], packed: bool) -> bytes:
    """A chunk's entries from rows of (stage, key bytes, value bytes or None).

    Native form (a worker restoring) is built by concatenating the stored
    msgpack encodings, so the reader decodes a whole chunk in one C call and
    the server never decodes a value."""
    if packed:
        return pack([[s, k] if v is None else [s, k, v] for s, k, v in rows])
    stages: dict[str, bytes] = {}
    parts = [array_header(len(rows))]
    append = parts.append
    for stage, key, value in rows:
        head = stages.get(stage)
        if head is None:
            head = stages[stage] = pack(stage)
        if value is None:
            append(b"\x92" + head + key)
        else:
            append(b"\x93" + head + key + value)
    return b"".join(parts)


DELTA_CHUNK_ENTRIES = 5_000
"""Entries per stored chunk of a delta that did not arrive packed (a peer's
copy during catch-up), as a worker packs its windows."""


def packed_chunks(entries: list[Entry]) -> list[tuple[bytes, int]]:
    """A delta's entries as stored chunks (msgpack entries, count): an array
    of [stage, key, value], or [stage, key] for a deleted key."""
    chunks = (entries[start:start + DELTA_CHUNK_ENTRIES]
              for start in range(0, len(entries), DELTA_CHUNK_ENTRIES))
    return [(encode_rows(chunk, packed=True), len(chunk)) for chunk in chunks]


def chunk_place(operator_id: str, window: int, number: int) -> str:
    """How errors name one stored chunk of a delta."""
    return f"{operator_id}: chunk {number} of stored window {window}"


def unpack_chunk(blob: bytes, where: str = "a stored delta chunk") -> list[Entry]:
    """The entries of a stored delta chunk, in order. Entries are checked
    before they are stored, so a chunk that no longer reads as entries was
    damaged on disk since: :class:`ChunkUnreadable` (DATA_LOSS) naming
    ``where``, so that a reader takes another replica's copy."""
    try:
        return [(e[0], e[1], e[2] if len(e) == 3 else None) for e in unpack(blob)]
    except Exception as exc:  # msgpack raises several unrelated types; so does a bad shape
        raise ChunkUnreadable(
            f"{where} no longer reads as state entries ({type(exc).__name__}: {exc}): the "
            "data file was damaged after the chunk was checked and stored; read this "
            "operator's state from another replica, or restore the file") from None


def newest_values(chunks: Iterable[tuple[int, int, bytes]], operator_id: str
                  ) -> dict[tuple[str, bytes], bytes | None]:
    """(stage, key) -> the value the last of the stored delta chunks gives
    it (None: deleted), ``chunks`` as (window, chunk number, entries),
    oldest first: what a fold writes into the base, and what a read puts in
    place of the base's value."""
    newest: dict[tuple[str, bytes], bytes | None] = {}
    for window, number, blob in chunks:
        for stage, key, value in unpack_chunk(blob, chunk_place(operator_id, window, number)):
            newest[(stage, key)] = value
    return newest
