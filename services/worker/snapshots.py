"""The seed's double buffer and its asynchronous persistence.

LatestSnapshot is the operator's position: os=false (a batch in flight) when
the operator takes a batch, os=true and offset+1 once the batch's output has
been emitted and acknowledged (what recovery needs of the seed's M is in the
window snapshot; see the class). WindowSnapshot collects
the batches of the current window; when W records have gone by, the window's
state (lv) and offsets are handed to the Persister, which writes them to the
state server in the background: processing never waits for it. Snapshots
carry state and offsets, never the records (those live in the JobContainers).

A window carries only the keys written or deleted in it (a delta on top of
the window before it), so the bytes written per window follow the keys the
window touched, not the size of the state; the state servers compact the
deltas into a base. Packing, checksumming and applying state go in chunks of
a few thousand keys with the event loop let through between them, so a big
state never holds up heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from gridstream import codec
from gridstream.errors import GridstreamError, StaleEpoch
from gridstream.peercalls import next_boundary
from gridstream.retry import Backoff
from services.worker.operators import DELETED, StateDelta
from services.worker.queues import OwnerFenced

if TYPE_CHECKING:
    from gridstream.statewindows import StoredState
    from services.worker.operators import OperatorChain

log = logging.getLogger(__name__)


@dataclass
class LatestSnapshot:
    """The operator's position in its JobContainer: the seed's LatestSnapshot
    reduced to what recovery can use.

    The seed's M = (r, lv, fun, os, offset) lives in memory and dies with the
    process, so after ``kill -9`` its ``r``, ``lv`` and ``os`` cannot be read.
    What stands in for them is the idempotence rule (docs/recovery.md): lv and
    the offset come back from the last durable window, every batch after it is
    processed again, and outputs already emitted (os=true) carry the same
    identities, which their receivers drop as duplicates.
    """

    offset: int = 0
    """Position in the container of the next batch to take (offset+1 once a
    batch is done: the seed's os=true and offset+1, as one step)."""

    def finish(self, next_offset: int) -> None:
        """os=true, offset+1: output emitted and acknowledged, as one step."""
        self.offset = next_offset


@dataclass
class WindowSnapshot:
    """The batches of the current window, and the window's number."""

    window: int = 0
    records: int = 0
    batches: list[tuple[str, int, int]] = field(default_factory=list)
    """(channel, sequence, offset) of every batch in the window."""

    def add(self, channel: str, sequence: int, offset: int, count: int) -> None:
        """Appends the M of a finished batch."""
        self.batches.append((channel, sequence, offset))
        self.records += count

    def close(self) -> int:
        """Ends the window; returns its number and starts the next."""
        number = self.window
        self.window += 1
        self.records = 0
        self.batches = []
        return number


PACK_CHUNK_ENTRIES = 5_000
"""Keys packed per chunk before the loop is let through (a few milliseconds)."""

PACK_CHUNK_BYTES = 1024 * 1024
"""Soft byte limit of one packed chunk (one StateChunk message)."""

ROOT_AFTER_S = 10.0
"""A delta refused for a missing parent for this long (catch-up between
state servers did not fill the gap) makes the next window a whole state."""

STALL_ERROR_S = 10.0
"""A write failing for this long is logged at ERROR (and again every
``STALL_ERROR_S``): persistence, and so trimming, has stalled."""

LINGER_STRETCH_MAX = 8
"""The rows linger stretches up to this many times ``worker.results_linger_s``
while the state servers are slow to store rows (:func:`stretched_linger`)."""

ROW_WRITE_SHARE_HIGH = 1 / 4
"""A row write that took more than this share of the linger doubles it."""

ROW_WRITE_SHARE_LOW = 1 / 16
"""A row write that took less than this share of the linger halves it (down to
``worker.results_linger_s``); between the two shares it stays."""


def stretched_linger(linger_s: float, write_s: float, floor_s: float) -> float:
    """The rows linger after a row write that took ``write_s`` under
    ``linger_s``: doubled while writes take more than a quarter of it, halved
    back towards ``floor_s`` once they take less than a sixteenth.

    Why: a task whose keys keep changing rewrites each of them once per
    linger, so its rows cost the state servers in proportion to time, not to
    records. A wordcount over 5,000 words at 150,000 words/s writes about
    27,000 rows a second to each state server at a 0.1 s linger, whose writes
    then take 35 to 47 ms (median); at a 1 s linger the cluster used 1.30 cores instead
    of 1.72. Under such load the rows become readable later (at most
    ``LINGER_STRETCH_MAX`` lingers); at a low rate, where a write takes a few
    milliseconds, the linger stays ``floor_s``. Doubling and halving keep it a
    power-of-two multiple of ``floor_s``, so the boundaries of a longer linger
    are boundaries of the shorter ones and the worker's operators still write
    together (:func:`gridstream.peercalls.next_boundary`)."""
    if floor_s <= 0:
        return 0.0
    if write_s > linger_s * ROW_WRITE_SHARE_HIGH:
        return min(linger_s * 2, floor_s * LINGER_STRETCH_MAX)
    if write_s < linger_s * ROW_WRITE_SHARE_LOW:
        return max(linger_s / 2, floor_s)
    return linger_s


@dataclass
class PendingSnapshot:
    """A window snapshot waiting to be written: its offsets and sequences
    (``header``, msgpack) and the keys it changed on top of ``parent`` (or
    every key, when ``parent`` is None)."""

    window: int
    offset: int
    header: bytes
    changes: StateDelta
    parent: int | None

    def absorb(self, older: PendingSnapshot) -> PendingSnapshot:
        """This window with an older one that was never written folded in: the
        older window's changes, overridden by this one's, on the older parent.
        A whole state needs nothing of the older window."""
        if self.parent is None:
            return self
        for stage, keys in self.changes.items():
            older.changes.setdefault(stage, {}).update(keys)
        return PendingSnapshot(self.window, self.offset, self.header, older.changes,
                               older.parent)

    @property
    def keys(self) -> int:
        """Keys the snapshot carries."""
        return sum(len(keys) for keys in self.changes.values())


async def pack_changes(changes: StateDelta, chunk_entries: int = PACK_CHUNK_ENTRIES,
                       chunk_bytes: int = PACK_CHUNK_BYTES) -> list[tuple[bytes, int]]:
    """PutState chunks (msgpack entries, count) of a window's changes: each
    entry [stage, key, value] or [stage, key] for a deleted key, key and
    value msgpack-encoded apart so the state server stores them without
    decoding them. Yields to the loop after every chunk."""
    packb = msgpack.Packer(use_bin_type=True).pack
    chunks: list[tuple[bytes, int]] = []
    current: list[list[Any]] = []
    size = 0
    for stage, keys in changes.items():
        for key, value in keys.items():
            packed_key = packb(key)
            if value is DELETED:
                current.append([stage, packed_key])
                size += len(packed_key)
            else:
                packed_value = packb(value)
                current.append([stage, packed_key, packed_value])
                size += len(packed_key) + len(packed_value)
            if len(current) >= chunk_entries or size >= chunk_bytes:
                chunks.append((codec.pack(current), len(current)))
                current, size = [], 0
                await asyncio.sleep(0)
    if current or not chunks:
        chunks.append((codec.pack(current), len(current)))
    return chunks


FREEZE_AFTER_ENTRIES = 50_000
"""A restore applying this many keys or more ends with ``gc.freeze()``."""


_grown_since_freeze = 0
"""Keys added to keyed state on this worker since the last ``gc.freeze()``."""


def freeze_grown_state(grown: int) -> bool:
    """Counts ``grown`` keys added to keyed state (by processing, not by a
    restore); once :data:`FREEZE_AFTER_ENTRIES` have been added since the
    last freeze, moves everything alive out of the cyclic collector's sight.

    Keyed state lives as long as its task. Left in sight, it is walked again
    by every full collection, and a state built up to millions of keys makes
    each of those hold the loop for a large part of a second. The young
    generations are collected first (cheap), so cycles that are already
    garbage are freed rather than frozen. Returns whether it froze."""
    global _grown_since_freeze
    _grown_since_freeze += max(0, grown)
    if _grown_since_freeze < FREEZE_AFTER_ENTRIES:
        return False
    _grown_since_freeze = 0
    gc.collect(1)
    gc.freeze()
    return True


_collector_pauses = 0
"""Restores applying state right now (the collector runs again at zero)."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keeps the cyclic garbage collector off while a restore applies state.

    Applying builds the state as fast as it can: the growing heap triggers
    full collections that walk it all again, each holding the loop (a tenth
    of a second and more at a few hundred thousand keys), in the middle of
    a chunk that is meant to be short. Restores on one worker may overlap:
    the collector is back on once the last of them ends."""
    global _collector_pauses
    if _collector_pauses == 0:
        gc.disable()
    _collector_pauses += 1
    try:
        yield
    finally:
        _collector_pauses -= 1
        if _collector_pauses == 0:
            gc.enable()


async def apply_stored(chain: OperatorChain, stored: StoredState) -> int:
    """Applies a stored state (a whole state, then deltas) to ``chain``, one
    chunk at a time with the loop let through between; returns the entries
    applied.

    A large restored state lives as long as the task, so it is moved out of
    the cyclic collector's sight (``gc.freeze()``): otherwise every full
    collection walks millions of objects again and holds the loop for up to
    a second, long enough to delay heartbeats. The collector stays off while
    the state is applied (:func:`collector_paused`)."""
    applied = 0
    with collector_paused():
        for window in stored.windows:
            if window.parent is None:
                chain.clear_state()
            for chunk in window.chunks:
                applied += chain.apply_entries(codec.unpack(chunk))
                await asyncio.sleep(0)
        for touched in chain.touched.values():
            touched.clear()
        if applied >= FREEZE_AFTER_ENTRIES:
            gc.freeze()
    return applied


WriteRows = Callable[[dict[Any, Any], list[tuple[str, str, str, str]]], Any]
WriteSnapshot = Callable[[PendingSnapshot, list[tuple[bytes, int]]], Awaitable[Any]]


class Persister:
    """Writes result rows, dead letters and window snapshots of one operator to
    the state server, in the background and in order: the rows produced
    before a snapshot are durable before the snapshot is.

    Pending rows are merged by key (a later value replaces an earlier one), and
    a newer snapshot absorbs an older one not yet started (their changes
    merged on the older parent), so a slow state server costs memory bounded
    by the operator's state, not by the stream. A snapshot being written is
    retried as it is, never re-cut, so the state servers' chain of windows
    stays whole. Rows handed over without a window wait until the first
    multiple of ``rows_linger_s`` on the process's clock after the previous
    row write (see ``worker.results_linger_s``): at most one write per
    linger, at the same moments for every operator of the worker, so their
    writes share calls. Failed writes are retried with backoff; nothing
    pending is dropped; a write failing for long is logged at ERROR
    and shown in :attr:`failing_since` and :attr:`last_error`.
    """

    def __init__(
        self,
        write_rows: WriteRows,
        write_snapshot: WriteSnapshot,
        on_durable: Callable[[int], None],
        name: str,
        rows_linger_s: float = 0.0,
    ) -> None:
        self._write_rows = write_rows
        self._write_snapshot = write_snapshot
        self._on_durable = on_durable
        self._name = name
        self._rows: dict[Any, Any] = {}
        self._dead: list[tuple[str, str, str, str]] = []
        self._snapshot: PendingSnapshot | None = None
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.windows_persisted = 0
        self.last_durable_window = -1
        self.head: int | None = None
        """The newest window handed over (restored or submitted): the parent of
        the next delta; None before the first, which is then a whole state."""
        self.needs_root = False
        """Set when deltas keep being refused for a missing parent: the next
        window must be a whole state."""
        self.snapshot_bytes = 0
        """Bytes of state written so far (packed keys and values)."""
        self.snapshot_keys = 0
        """Keys written so far."""
        self.write_failures = 0
        """Failed write attempts so far (rows and snapshots)."""
        self.failing_since: float | None = None
        """monotonic() of the first failure of the write now being retried."""
        self.last_error = ""
        """The latest failure, for status and logs; '' once a write succeeds."""
        self._last_error_log = 0.0
        self.rows_linger_floor_s = rows_linger_s
        self.rows_linger_s = rows_linger_s
        """Rows alone (no window queued) are written at most this often: rows
        a task hands over each time its queue runs empty (after every batch at
        a low rate) go in one write instead of one write per batch. It starts
        at ``rows_linger_floor_s`` and stretches while row writes are slow
        (:func:`stretched_linger`)."""
        self._rows_written_at = -rows_linger_s
        self._go_now = asyncio.Event()
        """Set when a window is queued, or a drain waits for the rows: it ends
        a linger at once."""

    def submit(
        self,
        rows: dict[Any, Any],
        dead_letters: list[tuple[str, str, str, str]],
        snapshot: PendingSnapshot | None = None,
    ) -> None:
        """Queues work without waiting."""
        if rows:
            self._rows.update(rows)
        if dead_letters:
            self._dead.extend(dead_letters)
        if snapshot is not None:
            self.head = snapshot.window
            if snapshot.parent is None:
                self.needs_root = False
            self._snapshot = (snapshot if self._snapshot is None
                              else snapshot.absorb(self._snapshot))
            self._go_now.set()
        if self._rows or self._dead or self._snapshot is not None:
            self._idle.clear()
            self._wake.set()

    @property
    def pending(self) -> int:
        """Rows, dead letters and snapshots not yet durable."""
        return (
            len(self._rows)
            + len(self._dead)
            + (1 if self._snapshot is not None else 0)
            + self._in_flight
        )

    def hurry(self) -> None:
        """Someone is draining the job: rows waiting for the linger go now.
        The linger only spares the state servers a write per batch at a low
        rate; a drain waits for every row to be durable, and would otherwise
        wait up to a whole linger after the last batch (0.05 to 0.1 s of an
        at-most-once wordcount's drain)."""
        if self._rows or self._dead:
            self._go_now.set()

    async def wait_idle(self) -> None:
        """Waits until everything submitted so far is durable."""
        await self._idle.wait()

    async def _linger(self) -> None:
        """Waits until rows may be written again (see :attr:`rows_linger_s`),
        or until a window is queued, which goes at once with the rows, or a
        drain hurries them (:meth:`hurry`)."""
        if self._snapshot is not None or self.rows_linger_s <= 0 or self._go_now.is_set():
            return
        # The next boundary of the process's clock in steps of the linger:
        # every operator of the worker lingers to the same boundaries, so
        # their writes to a state server leave together and share a call.
        remaining = next_boundary(self.rows_linger_s, self._rows_written_at) - time.monotonic()
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._go_now.wait()

    def _failed(self, what: str, exc: BaseException, delay: float) -> None:
        """Counts and reports a failed attempt: a warning at first, an ERROR
        once the write has failed for ``STALL_ERROR_S`` (and again as long as
        it keeps failing), naming the operator, what and why."""
        now = time.monotonic()
        self.write_failures += 1
        self.last_error = f"writing {what}: {type(exc).__name__}: {exc}"
        if self.failing_since is None:
            self.failing_since = now
        stalled = now - self.failing_since
        if stalled >= STALL_ERROR_S and now - self._last_error_log >= STALL_ERROR_S:
            self._last_error_log = now
            log.error("%s: persistence stalled for %.0fs (%d failed attempts): %s; the "
                      "container cannot be trimmed until it succeeds", self._name, stalled,
                      self.write_failures, self.last_error)
        elif isinstance(exc, (GridstreamError, OSError)):
            log.warning("%s: writing %s failed (%s); retrying in %.2fs", self._name, what,
                        exc, delay)
        else:
            log.error("%s: writing %s failed; retrying in %.2fs", self._name, what, delay,
                      exc_info=exc)

    def _succeeded(self) -> None:
        if self.failing_since is not None:
            log.info("%s: persistence resumed after %.1fs", self._name,
                     time.monotonic() - self.failing_since)
        self.failing_since = None
        self.last_error = ""

    def _fenced(self, what: str, exc: StaleEpoch) -> bool:
        """A newer owner claimed the operator: nothing of this owner's may be
        dropped in silence, and nothing more written. The task stops; its
        supervisor starts it again from the newest state if the partition is
        still this worker's (an ownership that went away and came back)."""
        log.warning("%s: writing %s refused, a newer owner claimed the operator (%s); "
                    "stopping this task", self._name, what, exc)
        raise OwnerFenced(f"{self._name}: {exc}") from None

    async def _retrying(self, what: str, call: Callable[[], Any]) -> bool:
        """Retries until done (True); False when the state servers fenced this
        operator: a newer owner writes its state now, so retrying is pointless."""
        backoff = Backoff(f"{self._name}: writing {what}", first_s=0.05, max_s=1.0)
        while True:
            try:
                await call()
                self._succeeded()
                return True
            except asyncio.CancelledError:
                raise
            except StaleEpoch as exc:
                return self._fenced(what, exc)
            except Exception as exc:
                self._failed(what, exc, backoff.delay_s)
            await backoff.wait()

    async def _persist_snapshot(self, snapshot: PendingSnapshot) -> bool:
        """Writes one window until it is durable (True). False when fenced, or
        when a whole state queued behind it makes it unnecessary (a delta that
        no replica can chain, see :data:`ROOT_AFTER_S`)."""
        what = f"window {snapshot.window}"
        backoff = Backoff(f"{self._name}: writing {what}", first_s=0.05, max_s=2.0)
        chunks: list[tuple[bytes, int]] | None = None
        missing_since: float | None = None
        while True:
            queued = self._snapshot
            if snapshot.parent is not None and queued is not None and queued.parent is None:
                log.warning("%s: dropping %s, a whole state follows it", self._name, what)
                return False
            try:
                if chunks is None:
                    chunks = await pack_changes(snapshot.changes)
                await self._write_snapshot(snapshot, chunks)
                self._succeeded()
                self.snapshot_bytes += sum(len(c) for c, _ in chunks) + len(snapshot.header)
                self.snapshot_keys += snapshot.keys
                return True
            except asyncio.CancelledError:
                raise
            except StaleEpoch as exc:
                return self._fenced(what, exc)
            except Exception as exc:
                self._failed(what, exc, backoff.delay_s)
                if "missing parent" in str(exc) and snapshot.parent is not None:
                    missing_since = missing_since or time.monotonic()
                    if time.monotonic() - missing_since >= ROOT_AFTER_S and not self.needs_root:
                        log.error("%s: the state servers cannot chain %s onto window %d; the "
                                  "next window will carry the whole state", self._name, what,
                                  snapshot.parent)
                        self.needs_root = True
            await backoff.wait()

    async def run(self) -> None:
        """The background loop; owned and cancelled by the task runner."""
        while True:
            await self._wake.wait()
            await self._linger()
            self._wake.clear()
            self._go_now.clear()
            rows, self._rows = self._rows, {}
            dead, self._dead = self._dead, []
            snapshot, self._snapshot = self._snapshot, None
            self._in_flight = len(rows) + len(dead) + (1 if snapshot else 0)
            if rows or dead:
                self._rows_written_at = started = time.monotonic()
                await self._retrying("result rows", functools.partial(self._write_rows, rows, dead))
                self.rows_linger_s = stretched_linger(
                    self.rows_linger_s, time.monotonic() - started, self.rows_linger_floor_s)
            if snapshot is not None and await self._persist_snapshot(snapshot):
                self.windows_persisted += 1
                self.last_durable_window = snapshot.window
                self._on_durable(snapshot.offset)
            self._in_flight = 0
            if not (self._rows or self._dead or self._snapshot is not None):
                self._idle.set()
