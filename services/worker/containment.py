"""What becomes of a batch that gridstream itself could not process whole.

User errors are dead-lettered record by record inside the operator chain.
An error outside user code (gridstream's own handling of an odd record:
hashing, encoding, nesting depth) must not stop the partition either. A
chain without keyed state is run again record by record, so that only the
records that fail alone go to dead letters; a chain with keyed state cannot
be (the state may hold part of the batch), so the whole batch goes. Either
way the outcome is a function of the batch: a replay meets the same error at
the same point and comes to the same result.
"""

from __future__ import annotations

from typing import Any

from gridstream.deadletters import encode_error, encode_record
from services.worker.edges import Outbound
from services.worker.operators import TRACEBACKS_PER_BATCH, ChainResult, OperatorChain
from services.worker.peers import OutSegment
from services.worker.queues import Entry


def dead_batch(entry: Entry, batch_id: str, error: str) -> ChainResult:
    """Every record of ``entry`` as a dead letter with ``error``."""
    keys = entry.keys or [None] * entry.count
    dead = [(f"{batch_id}:<task>:{i}", "<task>", encode_record(k, v), error)
            for i, (k, v) in enumerate(zip(keys, entry.values, strict=True))]
    return ChainResult(None, [], dead_letters=dead)


def run_records(chain: OperatorChain, outbound: Outbound, entry: Entry, batch_id: str
                ) -> tuple[ChainResult, list[OutSegment]]:
    """A stateless chain, record by record: a record that still fails goes
    to dead letters with its error (deterministic on replay)."""
    keys = entry.keys or [None] * entry.count
    out = ChainResult(None, [], dead_letters=[])
    keys_out: list[list[Any] | None] = []  # a forward edge keeps the records' keys
    for i, (key, value) in enumerate(zip(keys, entry.values, strict=True)):
        one = Entry(entry.offset, entry.channel, entry.sequence,
                    None if entry.keys is None else [key], [value])
        try:
            part = chain.process(one.keys, one.values, f"{batch_id}~{i}")
        except Exception as exc:
            out.dead_letters.append((f"{batch_id}:<task>:{i}", "<task>", encode_record(
                key, value), encode_error(exc, len(out.dead_letters) < TRACEBACKS_PER_BATCH)))
            continue
        if part.values:
            keys_out.append(part.keys)
        out.values.extend(part.values)
        out.sink_rows.update(part.sink_rows)
        out.dead_letters.extend(part.dead_letters)
    if entry.keys is not None and all(k is not None for k in keys_out):
        out.keys = [k for part_keys in keys_out for k in part_keys or ()]
    segments: list[OutSegment] = []
    if out.values:
        try:  # keys are checked record by record inside split
            segments = outbound.split(out.keys, out.values, batch_id, out.dead_letters)
        except Exception as exc:
            return dead_batch(entry, batch_id, encode_error(exc)), []
    return out, segments
