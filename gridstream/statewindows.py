"""Windows of an operator's keyed state on the wire: the PutState chunks a
writer sends (each with the checksum of its header and entries) and a
replica's windows read back and checked, chunk by chunk, before anything is
applied. :class:`gridstream.replicas.ReplicaClient` writes and reads them on
the replicas; workers apply what it reads (:mod:`services.worker.snapshots`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gridstream import codec, rpc
from gridstream.errors import DataLoss
from gridstream.ids import checksum
from gridstream.v1 import stateserver_pb2, stateserver_pb2_grpc

SLOWEST_BYTES_PER_S = 2 * 1024 * 1024
"""A PutState's deadline grows with its size at this rate, so a big state is
not cut off by the deadline of a small write."""


def state_timeout_s(size: int) -> float:
    """The deadline of a call carrying ``size`` bytes of state."""
    return max(rpc.DATA_TIMEOUT_S, size / SLOWEST_BYTES_PER_S)


STATE_CHUNK_BYTES = 1024 * 1024
"""About how many bytes of entries a worker puts in one StateChunk."""


@dataclass(slots=True)
class StateWindowRead:
    """One window of a read: its entries arrive as msgpack chunks to apply in order."""

    window: int
    parent: int | None
    header: bytes
    chunks: list[bytes] = field(default_factory=list)


class StoredState(NamedTuple):
    """An operator's state as read: ``window`` is the newest, ``header`` its
    offsets and sequences (msgpack), ``windows`` what to apply, in order."""

    window: int
    header: bytes
    windows: list[StateWindowRead]

    @property
    def entries(self) -> int:
        """Chunks to apply (for logs)."""
        return sum(len(w.chunks) for w in self.windows)


async def state_messages(
    job_id: str, operator_id: str, window: int, epoch: int, parent: int | None, header: bytes,
    chunks: Sequence[tuple[bytes, int]],
) -> list[stateserver_pb2.StateChunk]:
    """The PutState messages of one window, each with the checksum of its header
    and entries; yields to the event loop between chunks (hashing a big state
    at once would hold it)."""
    parts = list(chunks) or [(codec.pack([]), 0)]
    messages = []
    for index, (entries, count) in enumerate(parts):
        head = header if index == 0 else b""
        body = head + entries
        messages.append(stateserver_pb2.StateChunk(
            meta=stateserver_pb2.SnapshotMeta(job_id=job_id, operator_id=operator_id,
                                              window=window, epoch=epoch, size=len(body),
                                              checksum=checksum(body)),
            has_parent=parent is not None, parent_window=parent or 0, header=head,
            entries=entries, entry_count=count, window_end=index == len(parts) - 1))
        if index % 8 == 7:
            await asyncio.sleep(0)
    return messages


async def read_state(
    stub: stateserver_pb2_grpc.StateServerStub, job_id: str, operator_id: str,
    after: int | None = None,
) -> StoredState | None:
    """One replica's whole state, or the deltas after ``after`` when it holds
    that window; DataLoss when a chunk fails its checksum or the windows do
    not chain."""
    windows: list[StateWindowRead] = []
    open_window: StateWindowRead | None = None
    received = 0
    request = stateserver_pb2.ReadStateRequest(
        job_id=job_id, operator_id=operator_id, has_after=after is not None,
        after_window=after or 0)
    async for chunk in rpc.idle_stream(stub.ReadState(request),
                                       f"reading the state of {operator_id}"):
        meta = chunk.meta
        body = chunk.header + chunk.entries
        if len(body) != meta.size or checksum(body) != meta.checksum:
            raise DataLoss(f"a chunk of {operator_id} window {meta.window} failed its checksum")
        if open_window is None:
            parent = int(chunk.parent_window) if chunk.has_parent else None
            if windows and parent != windows[-1].window:
                raise DataLoss(f"{operator_id}: window {meta.window} applies on {parent}, not "
                               f"on the window before it ({windows[-1].window})")
            if not windows and parent is not None and parent != after:
                raise DataLoss(f"{operator_id}: the read starts with a delta (window "
                               f"{meta.window}), not a whole state")
            open_window = StateWindowRead(int(meta.window), parent, chunk.header)
        elif meta.window != open_window.window:
            raise DataLoss(f"{operator_id}: window {meta.window} began before window "
                           f"{open_window.window} ended")
        open_window.chunks.append(chunk.entries)
        if chunk.window_end:
            windows.append(open_window)
            open_window = None
        received += len(body)
        if received >= 4 * STATE_CHUNK_BYTES:  # let the loop breathe on a long read
            received = 0
            await asyncio.sleep(0)
    if open_window is not None:
        raise DataLoss(f"{operator_id}: the read ended inside window {open_window.window}")
    if not windows:
        return None
    return StoredState(windows[-1].window, windows[-1].header, windows)


__all__ = ["StateWindowRead", "StoredState", "read_state", "state_messages",
           "state_timeout_s"]
