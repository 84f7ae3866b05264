"""Recovery of one task when it starts on a worker: the seed's "restore lv,
restore the queue by its JobContainerID, replay".

1. Read the task's newest durable window snapshot (a base and its deltas) from
   the state servers: the keyed state (lv), the container offset it covers,
   the output sequence per downstream partition and the input sequence per
   channel below that offset. When this worker held a standby of the task
   (:mod:`services.worker.standby`), only the deltas after the standby's
   window are read, usually none, and the standby's operators are adopted.
2. Fetch the fullest committed copy of the container's log from the other
   workers (fencing every copy as it is read), or this worker's own.
3. Resume at the snapshot's offset: every batch after it is processed again,
   under the idempotence rule (docs/recovery.md), so outputs already emitted
   carry the same identities and their receivers drop them.

A log that starts after the snapshot's offset means every copy of those
batches is gone: the range is named as data loss. Tuple tracking takes back
the contributions the snapshot holds and asks the roots' trackers to rebuild.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gridstream import codec
from gridstream.errors import GridstreamError
from gridstream.ids import first_window
from gridstream.retry import retry
from services.worker.queues import JobContainer, LostRange
from services.worker.snapshots import apply_stored

if TYPE_CHECKING:
    from services.worker.tasks import TaskRunner

log = logging.getLogger(__name__)


def _warn(operator_id: str) -> Callable[[BaseException, int], None]:
    def warn(exc: BaseException, attempt: int) -> None:
        log.warning("%s: reading the latest snapshot failed (%s, attempt %d); retrying",
                    operator_id, exc, attempt)
    return warn


def relink_sequences(container: JobContainer, offset: int,
                     in_sequences: dict[str, int]) -> None:
    """Gives the restored entries from ``offset`` on the channel sequence
    before each (a log copy does not carry it), walking forward from the
    snapshot's ``in_sequences``; a channel the snapshot does not name falls
    back to what the sender said it sent before (``previous_sequence``).

    The next window's header computes its input sequences from these
    (:meth:`JobContainer.sequences_below`): without them it forgot every
    channel with a batch after its offset, and the owner after the next
    failover took the batches below for lost (a false DATA LOSS that made
    ``drain()`` fail)."""
    last = dict(in_sequences)
    for entry in container.entries(offset, container.next_offset):
        entry.channel_sequence_before = last.get(entry.channel) or entry.previous_sequence
        last[entry.channel] = max(last.get(entry.channel, 0), entry.sequence)


async def restore_task(runner: TaskRunner) -> bool:
    """Restores ``runner`` before its loop starts; True when it resumed from
    earlier state (a snapshot or a log copy) rather than starting fresh."""
    started = time.monotonic()
    steps: dict[str, float] = {}
    if runner.first_owner:
        # The job's first owner of the partition (node.py decides): no
        # snapshot, log copy or standby of it exists, so there is nothing to
        # read, claim or fence. Its first window is numbered from its epoch.
        runner.window.window = first_window(runner.epoch)
        runner.recovery_seconds = time.monotonic() - started
        log.info("%s started as the job's first owner: nothing to restore", runner.operator_id)
        return False
    standby = runner.take_standby(runner.key)
    adopted: int | None = None
    after = standby.window if standby is not None else None
    snapshot = await retry(
        f"{runner.operator_id}: reading the latest snapshot",
        lambda: runner.state_client.read_state(runner.job_id, runner.operator_id, runner.epoch,
                                               after=after),
        (GridstreamError,), on_error=_warn(runner.operator_id))
    steps["read"] = time.monotonic() - started
    fetched = await runner.fetch_log(runner.key, runner.epoch)
    steps["log"] = time.monotonic() - started - steps["read"]
    offset = 0
    in_sequences: dict[str, int] = {}
    saved: dict[str, Any] = {}
    if snapshot is not None:
        # The newest window's offsets and sequences, and the keyed state
        # rebuilt from a base and its deltas a chunk at a time.
        window = snapshot.window
        header = snapshot.header
        if standby is not None and (not snapshot.windows
                                    or snapshot.windows[0].parent is not None):
            # The read continues the standby: adopt its operators, apply the rest.
            runner.chain = standby.chain
            header = header or standby.header
            adopted = standby.window
        saved = codec.unpack(header)
        applying = time.monotonic()
        await apply_stored(runner.chain, snapshot)
        steps["apply"] = time.monotonic() - applying
        runner.persister.head = window
        runner.outbound.restore(saved)  # every edge's sequences
        runner.window.window = window + 1
        offset = int(saved["offset"])
        in_sequences = dict(saved["in_sequences"])
        runner.durable_offset = offset
    # Window numbers are unique per owner: an owner that took over at epoch e
    # numbers from e << 20, so a late write from the previous owner (still in
    # flight when it handed over) can never take the place of one of ours.
    runner.window.window = max(runner.window.window, first_window(runner.epoch))
    if fetched is not None and fetched[0] + len(fetched[2]) >= offset:
        base, sequences, entries = fetched
        merged = {**in_sequences}
        for channel, seq in sequences.items():
            merged[channel] = max(seq, merged.get(channel, 0))
        gap = (offset, base - 1) if base > offset else None
        if gap is not None:
            offset = base
        # Committed again only once this owner's holders hold the copy (its
        # replicator's first round): until then no sender is acknowledged on it.
        runner.container.restore(base, merged, entries, offset,
                                 committed=runner.replicator is None)
        relink_sequences(runner.container, offset, in_sequences)
        if gap is not None:
            # Every copy that held these offsets is gone: name them.
            lost = LostRange("<log>", gap[0], gap[1], "offsets")
            runner.container.losses.append(lost)
            log.error("DATA LOSS %s", lost.describe(runner.container.container_id))
            runner.record_losses([lost])
    elif snapshot is not None:
        if fetched is not None:
            log.warning("%s: the fullest log copy ends at %d, before the snapshot's offset "
                        "%d; resuming at the snapshot", runner.operator_id,
                        fetched[0] + len(fetched[2]), offset)
        runner.container.restore(offset, in_sequences, [], offset)
    # Losses named before: those in the snapshot, and gaps in the log after
    # it that a previous owner may have seen and died with.
    for channel, first, last, what in saved.get("losses") or []:
        known = LostRange(str(channel), int(first), int(last), str(what))
        if known not in runner.container.losses:
            runner.container.losses.append(known)
    found = runner.container.find_gaps(offset, in_sequences)
    for lost in found:
        log.error("DATA LOSS %s", lost.describe(runner.container.container_id))
    if found:
        runner.record_losses(found)
    if runner.spec.delivery == "at_most_once":
        offset = max(offset, runner.container.next_offset)
        runner.container.skip_to(offset)
    tracking = runner.tracking
    if tracking is not None:
        # Below the snapshot's offset, only batches of roots still pending
        # when it was taken are tracked again: the snapshot holds a row for
        # every processed batch of a pending root and none for a completed
        # root's (dropped when it completed), whose batches may still sit
        # in the log until trimmed. Taking those for pending would leave
        # roots that no contribution can ever complete. A row whose batch
        # no log copy holds any more still counts (TaskTracking.restore).
        rows = saved.get("tracking") or []
        pending_below = {int(row[0]) for row in rows}
        for entry in runner.container.retained():
            if entry.offset >= offset or entry.offset in pending_below:
                tracking.retain(entry.offset, entry.root or runner.tuple_id_of(entry))
        tracking.restore(rows, offset)
        # Whether the restored contributions reached their trackers before the
        # crash is unknown: their trackers rebuild those roots from the tasks.
        runner.request_rebuild(tracking.reported_roots())
    runner.latest.offset = offset
    runner.recovered_batches = runner.container.next_offset - offset
    runner.recovered_records = sum(
        e.count for e in runner.container.entries(offset, runner.container.next_offset))
    runner.recovery_seconds = time.monotonic() - started
    log.info("%s started: snapshot window %s, offset %d; log copy %s; standby %s; %d batches "
             "to replay (%.3fs: %s)", runner.operator_id, snapshot.window if snapshot else None,
             offset, None if fetched is None else
             f"{fetched[0]}..{fetched[0] + len(fetched[2])}",
             "none" if standby is None else f"window {standby.window}"
             + (" adopted" if adopted is not None else " not continued by the state servers"),
             runner.recovered_batches, runner.recovery_seconds,
             ", ".join(f"{step} {seconds:.3f}s" for step, seconds in steps.items()))
    return snapshot is not None or bool(fetched and (fetched[2] or fetched[1]))
