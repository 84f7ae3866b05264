"""The keyed shuffle between tasks: key each output record, group by the
partition that owns the key, and deliver each group as one batch.

Sequences are per (this task's partition -> destination partition) channel
and advance deterministically with the input, so a replay after recovery
regenerates the same (channel, sequence) for the same records and the
destination drops what it already has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gridstream.builtins import identity
from gridstream.codec import PayloadError, encode_batch
from gridstream.combiners import Partials
from gridstream.deadletters import encode_message, encode_record
from services.worker.operators import (
    PLAIN_KEY_SET,
    DeadLetter,
    KeyPartitions,
    keyed_records,
    safe_text,
)
from services.worker.peers import OutSegment, PeerRouter


class Shuffle:
    """Routes one task's output to the next task's partitions."""

    def __init__(
        self,
        job_id: str,
        dest_task: int,
        dest_stage: str,
        partitions: int,
        key_fn: Callable[[Any], Any],
        channel: str,
        router: PeerRouter,
        batch_records: int,
        combine: Partials | None = None,
    ) -> None:
        self.job_id = job_id
        self.dest_task = dest_task
        self.dest_stage = dest_stage
        self.partitions = partitions
        self.key_fn = key_fn
        self.channel = channel
        self.router = router
        self.batch_records = batch_records
        self.combine = combine
        """Folds a batch into one partial per key (:mod:`gridstream.combiners`)."""
        self.sequences: dict[int, int] = {}
        self._placed = KeyPartitions(partitions)

    def _keys(
        self, values: list[Any], batch_id: str, dead: list[DeadLetter]
    ) -> tuple[list[Any], list[Any]]:
        """The records' keys by the destination's key function (a seam tests watch)."""
        return keyed_records(self.key_fn, values, self.dest_stage, batch_id, dead)

    def _combined_by_value(self, values: list[Any]) -> tuple[list[Any], list[Any]] | None:
        """Records keyed by themselves into a combined reduce (wordcount's
        words into ``count``): combined first, so the key types are checked
        once per distinct key rather than once per record. None when a key is
        not a plain str, int or bytes, or not hashable: the record-by-record
        path then dead-letters exactly those records, as it always did."""
        if self.combine is None or self.key_fn is not identity:
            return None
        try:
            keys, partials = self.combine(values, values)
        except Exception:  # an unhashable record, or a subclass's hashing failing
            return None
        if not PLAIN_KEY_SET.issuperset(map(type, keys)):
            return None
        return keys, partials

    def split(
        self, values: list[Any], batch_id: str, dead: list[DeadLetter]
    ) -> list[OutSegment]:
        """Keys the records and groups them into segments, one sequence each."""
        combined = self._combined_by_value(values)
        if combined is not None:
            keys, values = combined
        else:
            keys, values = self._keys(values, batch_id, dead)
            if self.combine is not None:
                keys, values = self.combine(keys, values)
        buckets = self._buckets(keys, values)
        segments: list[OutSegment] = []
        size = self.batch_records
        for p in sorted(buckets):
            bk, bv = buckets[p]
            for start in range(0, len(bv), size):
                seq = self.sequences.get(p, 0) + 1
                self.sequences[p] = seq
                segment = OutSegment(self.dest_task, p, self.channel, seq,
                                     bk[start:start + size], bv[start:start + size],
                                     previous_sequence=seq - 1)
                self._encode(segment, batch_id, dead)
                segments.append(segment)
        return segments

    def _buckets(self, keys: list[Any], values: list[Any]
                 ) -> dict[int, tuple[list[Any], list[Any]]]:
        """Keys and values per partition, in record order. The partitions of
        the batch's distinct keys come first: a batch whose keys all belong
        to one partition (a source keyed as the reduce after it, such as
        taxi's records sent by device) goes whole, with nothing done per
        record."""
        partition_of, distinct = self._placed.of(keys)
        parts = self.partitions
        if not keys:
            return {}
        first = partition_of[keys[0]]
        if all(partition_of[k] == first for k in distinct):
            return {first: (keys, values)}
        # One list per partition, found by index: no bucket lookup per record.
        bucket_keys: list[list[Any]] = [[] for _ in range(parts)]
        bucket_values: list[list[Any]] = [[] for _ in range(parts)]
        for k, v in zip(keys, values, strict=True):
            p = partition_of[k]
            bucket_keys[p].append(k)
            bucket_values[p].append(v)
        return {p: (bucket_keys[p], bucket_values[p]) for p in range(parts)
                if bucket_values[p]}

    def _encode(self, segment: OutSegment, batch_id: str, dead: list[DeadLetter]) -> None:
        """Encodes a segment now, inside the batch's error handling: every
        segment is encoded anyway (for the wire or for its backups), and a
        record msgpack cannot carry (a set, an int over 64 bits) must go to
        dead letters here, alone, rather than fail the delivery or the
        replication of its batch over and over. The segment keeps its
        sequence even if no record is left, so the channel has no gap."""
        try:
            segment.encode()
            return
        except PayloadError:
            pass
        keys = segment.keys or [None] * len(segment.values)
        good_keys: list[Any] = []
        good_values: list[Any] = []
        for i, (key, value) in enumerate(zip(keys, segment.values, strict=True)):
            try:
                encode_batch([value], [key])
            except PayloadError as exc:
                dead.append((f"{batch_id}:{self.dest_stage}.encode:{segment.partition}:{i}",
                             self.dest_stage, encode_record(None, value),
                             encode_message(safe_text(exc))))
                continue
            good_keys.append(key)
            good_values.append(value)
        segment.keys, segment.values = good_keys, good_values
        segment.encode()

    async def deliver(self, segments: list[OutSegment]) -> None:
        """Returns once every segment is acknowledged by its owner."""
        if segments:
            await self.router.deliver(self.job_id, segments)
