"""Stable identities and hashes shared by every process.

Python's ``hash()`` is salted per process, so every placement (key to
partition, partition to worker) goes through xxhash or blake2b here.
"""

from __future__ import annotations

import hashlib
from typing import Any

import xxhash


def stable_hash64(data: str | bytes) -> int:
    """A 64-bit hash that is the same in every process and on every host."""
    if isinstance(data, str):
        data = data.encode()
    return int(xxhash.xxh64_intdigest(data))


def key_text(key: Any) -> str:
    """The canonical text of a record key, so ``1`` and ``"1"`` land in one place
    only when the user means it (ints and strings are distinct keys)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return "b:" + key.hex()
    return "r:" + repr(key)


def partition_for_key(key: Any, partitions: int) -> int:
    """The partition a key belongs to; fixed for the job's life."""
    if isinstance(key, str):
        return int(xxhash.xxh64_intdigest(key.encode())) % partitions
    return int(xxhash.xxh64_intdigest(key_text(key).encode())) % partitions


def container_id(job_id: str, task: int, partition: int) -> str:
    """JobContainerID: names one task's input queue of one partition of a job."""
    return f"{job_id}/t{task}/p{partition}"


def operator_id(job_id: str, task: int, partition: int) -> str:
    """JobOperatorID: names the operator chain consuming a JobContainer."""
    return f"{job_id}/t{task}/p{partition}"


def task_channel(task: int, partition: int) -> str:
    """The channel name an upstream task uses when pushing to the next task."""
    return f"t{task}/p{partition}"


def batch_identity(task: int, partition: int, channel: str, sequence: int) -> str:
    """The deterministic identity of one batch in one JobContainer.

    A batch is named by where it entered (the task and partition of its
    container) and by its lineage (the channel of its producer, or of the
    upstream task that emitted it, and its sequence on that channel). The name
    is the same on every replay and unique across partitions and producers,
    so result rows, dead letters and tracking ids derived from it never
    collide: two partitions may both see sequence 1 of a producer.
    """
    return f"t{task}/p{partition}/{channel}#{sequence}"


def record_id(channel: str, sequence: int, index: int) -> int:
    """A well-mixed, never-zero 64-bit id of a record, stable across replays.

    A record is named by the batch that carried it into its container
    (channel, sequence) and its index in that batch; replays regenerate the
    same batches, so the id is the same every time.
    """
    digest = hashlib.blake2b(f"{channel}#{sequence}#{index}".encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "big")
    return value or 1


def checksum(payload: bytes) -> str:
    """blake2b-64 of a payload, hex; guards snapshots against corruption."""
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


def tuple_id(task: int, partition: int, channel: str, sequence: int) -> int:
    """The 64-bit tracking id of one batch in one container: the tuple of the
    XOR tracker, a well-mixed hash of :func:`batch_identity`. Stable across
    replays (a replayed batch has the same container, channel and sequence)
    and never zero nor :data:`UNTRACKED_ROOT`."""
    digest = hashlib.blake2b(batch_identity(task, partition, channel, sequence).encode(),
                             digest_size=8).digest()
    value = int.from_bytes(digest, "big")
    return value if 0 < value < UNTRACKED_ROOT else 1


UNTRACKED_ROOT = 2**64 - 1
"""The root of batches outside tuple tracking: a task's processing-time ticks
and every batch descending from one (services.worker.ticks). No batch id is
ever this value."""


# -- version spaces ----------------------------------------------------------
#
# Window numbers and result-row versions must grow across owners of a task: a
# late write of a previous owner (still in flight when it was fenced) must never
# replace a newer owner's. Both are built from the routing epoch at which the
# owner took the task over.

EPOCH_WINDOW_BITS = 20
"""An owner numbers its windows from ``epoch << 20``: 1,048,576 windows per
owner before its numbers reach the next epoch's range. At the default window
(10,000 records) that is 10 billion records under one owner; past it the
numbers still grow, and only a takeover at the very next epoch could collide."""

WINDOW_ROW_BITS = 24
"""Result-row versions are at least ``window << 24``: 16,777,216 row writes
per window before they reach the next window's range."""


MICRO_BATCH_SEQUENCE_BITS = 24
"""Restart-safe sends of a micro-batch (the Spark bridge): micro-batch b owns
the client sequences [(b + 1) << 24, (b + 2) << 24). With sequences below
2^62 (the cluster's reserved range starts there) that is 2^38 micro-batches."""

MICRO_BATCH_CHUNK_BITS = 10
"""Within a micro-batch, chunk c of a writer starts at ``c << 10``: at most
1,024 SDK batches per partition per chunk, at most 2^14 chunks per writer
(the bridge refuses a micro-batch that would need more)."""


def micro_batch_first_sequence(batch_id: int, chunk: int = 0) -> int:
    """The first client sequence of chunk ``chunk`` of micro-batch ``batch_id``."""
    return ((batch_id + 1) << MICRO_BATCH_SEQUENCE_BITS) + (chunk << MICRO_BATCH_CHUNK_BITS)


def first_window(epoch: int) -> int:
    """The lowest window number an owner that took over at ``epoch`` uses."""
    return epoch << EPOCH_WINDOW_BITS


def first_row_version(window: int) -> int:
    """The lowest result-row version written in ``window``."""
    return window << WINDOW_ROW_BITS
