"""StateChunk messages to and from the store's windows of keyed state.

A window travels as chunks so that no state is too big to store (gRPC's
message limit applies to a chunk, not to the state) and each side handles a
bounded piece at a time. Every chunk carries the checksum of its header and
entries; a chunk that does not match, or a stream that ends before its
window does, stores nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gridstream.errors import InvalidArgument
from gridstream.v1 import stateserver_pb2 as pb
from services.stateserver.chains import StateChunkOut
from services.stateserver.layout import Entry, StateWindow
from services.stateserver.rows import decode_state_entries, state_entries_size
from services.stateserver.store import _checksum

_MAX_SQLITE_INT = 2**63 - 1


async def first_chunk(chunks: AsyncIterator[pb.StateChunk]) -> pb.StateChunk:
    """The first chunk of a PutState stream, its window's identity checked
    (entries are checked by :func:`receive_window`); InvalidArgument (nothing
    stored) for an empty stream or a chunk that names no operator."""
    chunk = await anext(chunks, None)
    if chunk is None:
        raise InvalidArgument("PutState stream ended before a chunk with window_end; nothing "
                              "stored")
    meta = chunk.meta
    if not meta.job_id or not meta.operator_id:
        raise InvalidArgument("the first chunk's meta.job_id and meta.operator_id must "
                              "be set; nothing stored")
    if meta.window > _MAX_SQLITE_INT or meta.epoch > _MAX_SQLITE_INT or (
            chunk.parent_window > _MAX_SQLITE_INT):
        raise InvalidArgument("window, epoch and parent_window must be below 2**63; "
                              "nothing stored")
    return chunk


async def receive_window(first: pb.StateChunk, rest: AsyncIterator[pb.StateChunk]
                         ) -> StateWindow:
    """The window a PutState stream carries (``first`` from :func:`first_chunk`,
    then the ``rest`` of the stream), every chunk checked; InvalidArgument
    (nothing stored) for a stream that is malformed, corrupt or cut short."""
    entries: list[Entry] = []
    packed: list[tuple[bytes, int]] = []
    delta = first.has_parent  # stored as its chunks came: checked, not decoded
    delta_size = 0
    chunk: pb.StateChunk | None = first
    ended = False
    while chunk is not None:
        meta = chunk.meta
        if ended:
            raise InvalidArgument("PutState carries one window: a chunk came after the chunk "
                                  "with window_end; nothing stored")
        if chunk is not first and (meta.job_id, meta.operator_id, meta.window) != (
                first.meta.job_id, first.meta.operator_id, first.meta.window):
            raise InvalidArgument(
                f"every chunk of a PutState must be of one window; got {meta.operator_id} "
                f"window {meta.window} after {first.meta.operator_id} window "
                f"{first.meta.window}; nothing stored")
        body = chunk.header + chunk.entries
        if len(body) != meta.size or await _checksum(body) != meta.checksum:
            raise InvalidArgument(
                f"chunk of {meta.operator_id} window {meta.window} does not match its "
                "meta.size/meta.checksum (of header + entries); it was corrupted on the way; "
                "nothing stored")
        if delta:
            delta_size += state_entries_size(chunk.entries, chunk.entry_count)
            if chunk.entry_count:  # checked: stored as it came
                packed.append((chunk.entries, chunk.entry_count))
        elif decoded := decode_state_entries(chunk.entries, chunk.entry_count):
            entries.extend(decoded)
            packed.append((chunk.entries, len(decoded)))
        ended = chunk.window_end
        chunk = await anext(rest, None)
    if not ended:
        raise InvalidArgument("PutState stream ended before a chunk with window_end; nothing "
                              "stored")
    return StateWindow(
        job_id=first.meta.job_id, operator_id=first.meta.operator_id,
        window=first.meta.window, epoch=first.meta.epoch,
        parent=first.parent_window if first.has_parent else None,
        header=first.header, entries=entries, chunks=packed,
        entries_size=delta_size if delta else None,
    )


async def send_chunk(job_id: str, operator_id: str, chunk: StateChunkOut) -> pb.StateChunk:
    """The message of one chunk of a read, with its checksum."""
    body = chunk.header + chunk.entries
    return pb.StateChunk(
        meta=pb.SnapshotMeta(job_id=job_id, operator_id=operator_id, window=chunk.window,
                             epoch=chunk.epoch, size=len(body),
                             checksum=await _checksum(body)),
        has_parent=chunk.parent is not None, parent_window=chunk.parent or 0,
        header=chunk.header, entries=chunk.entries, entry_count=chunk.count,
        window_end=chunk.window_end,
    )
