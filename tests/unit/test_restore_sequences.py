"""A restored log's entries know the channel sequence before each, so the new
owner's window headers name every channel's input sequence below their offset
(a header that forgot a channel made the owner after the next failover report
its early batches as lost)."""

from __future__ import annotations

from services.worker.queues import Entry, JobContainer
from services.worker.restore import relink_sequences


async def test_window_headers_after_a_restore_match_the_first_owners() -> None:
    first = JobContainer("j/t1/p0", max_records=10_000)
    sent: dict[str, int] = {}
    for i in range(40):
        channel = f"t0/p{i % 3}"
        sequence = sent.get(channel, 0) + 1
        await first.append(channel, sequence, None, [i], previous_sequence=sent.get(channel, 0))
        sent[channel] = sequence
    snapshot_offset = 25
    # A log copy carries offsets, channels, sequences and previous sequences only.
    copied = [Entry(e.offset, e.channel, e.sequence, e.keys, e.values,
                    previous_sequence=e.previous_sequence) for e in first.entries(0, 40)]
    restored = JobContainer("j/t1/p0", max_records=10_000)
    restored.restore(0, first.sequences(), copied, snapshot_offset)
    relink_sequences(restored, snapshot_offset, first.sequences_below(snapshot_offset))
    for offset in range(snapshot_offset, 41):
        assert restored.sequences_below(offset) == first.sequences_below(offset), offset
    # A gap check from the restored header finds no loss where there is none.
    later = JobContainer("j/t1/p0", max_records=10_000)
    later.restore(0, {}, copied, 30)
    assert later.find_gaps(30, restored.sequences_below(30)) == []


async def test_a_channel_the_snapshot_does_not_name_falls_back_to_the_senders_word() -> None:
    restored = JobContainer("j/t1/p0", max_records=100)
    restored.restore(10, {"a": 7}, [Entry(10, "a", 7, None, [1], previous_sequence=6),
                                     Entry(11, "b", 3, None, [1], previous_sequence=2)], 10)
    relink_sequences(restored, 10, {})
    assert restored.sequences_below(10) == {"a": 6, "b": 2}
