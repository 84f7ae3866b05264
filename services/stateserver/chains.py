"""Operators' keyed state as window deltas compacted into a base.

A window of an operator carries only the keys written or deleted in it (a
delta on top of its parent window), so the bytes a window writes follow the
keys it touched, not the size of the state. The store keeps, per operator,
a *base* (one row per key, the state as of the newest compacted window) and
the deltas after it; a background compactor folds the oldest deltas into the
base once more than ``max_deltas`` have piled up, several deltas per
transaction (each key written once, with its newest value), in as many
transactions as a budget of entries needs. A read
returns the base and at most about ``max_deltas`` deltas, which the reader
applies in order.

Why the chain stays correct through failures:

- Each window is stored in one transaction, and each fold too: a crash
  between storing a delta and folding it leaves base + deltas, which read as
  the same state; a fold that did not commit is simply done again.
- A delta is stored only on top of its parent. A replica that missed the
  parent refuses it (:class:`MissingParent`, nothing stored) rather than
  holding a chain it cannot read back; catch-up copies the gap from a peer.
- A new owner claims the operator (raises its fence) before reading, so the
  previous owner's writes stop at every replica it read from; the new
  owner's first delta may therefore find at most one window of the old
  owner after its parent. That window is dropped (a fork: the new owner's
  history wins), which is why the newest delta is never folded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiosqlite

from services.stateserver.entryforms import (
    chunk_place,
    encode_rows,
    newest_values,
    packed_chunks,
    unpack_chunk,
)
from services.stateserver.groupcommit import Preempted
from services.stateserver.layout import ChunkUnreadable, MissingParent, StateHead, StateWindow

if TYPE_CHECKING:
    from services.stateserver.store import SnapshotStore

log = logging.getLogger(__name__)

MAX_DELTAS = 8
"""Deltas an operator may hold after its base before the compactor folds all
but the newest into it: a restore reads one base and at most this many."""

READ_CHUNK_ENTRIES = 20_000
"""Entries per chunk of a read: unpacking one costs the reader a few
milliseconds, so applying a big state never holds its event loop for long."""

READ_CHUNK_BYTES = 1024 * 1024
"""Soft byte limit of a chunk of a read."""

FOLD_ENTRIES = 20_000
"""Delta entries one fold may cover (always at least one delta): a fold is
one transaction, and a takeover's claim waits for the transaction in
progress, so a fold must stay short however long the chain (measured on a
loaded 2-core machine with ~400-byte values: 0.17 s for 50,000 entries,
0.05 s for 10,000; 20,000 keeps a claim's wait under the 0.1 s at which it
is logged as slow while still folding two windows of 10,000 keys at once)."""

FOLD_BYTES = 16 * 1024 * 1024
"""Delta bytes (their ``size``) one fold may cover: with big values the
bytes, not the entries, bound how long a fold takes."""

_UPSERT_BASE = (
    "INSERT INTO state_entries (job_id, operator_id, stage, key, value) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id, operator_id, stage, key) DO UPDATE SET value = excluded.value")
"""Writes one key's value into the base (a fold)."""

SLOW_CLAIM_S = 0.1
"""A takeover's claim this slow is logged (it delays the takeover)."""

OperatorKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class StateChunkOut:
    """One chunk of a read: part of one window, in order."""

    window: int
    epoch: int
    parent: int | None
    header: bytes
    """The window's header, on its first chunk only."""
    entries: bytes
    """msgpack array of [stage, key, value] / [stage, key] (deleted)."""
    count: int
    window_end: bool


async def _head(conn: aiosqlite.Connection, job_id: str, operator_id: str
                ) -> tuple[int, int] | None:
    """(base window, head window) of an operator, None when it has no state."""
    rows = list(await conn.execute_fetchall(
        "SELECT base_window, head_window FROM state_heads WHERE job_id = ? AND operator_id = ?",
        (job_id, operator_id)))
    return (int(rows[0][0]), int(rows[0][1])) if rows else None


async def _head_of(conn: aiosqlite.Connection, job_id: str, operator_id: str
                   ) -> StateHead | None:
    """An operator's :class:`StateHead` read on ``conn``; None without state."""
    found = await _head(conn, job_id, operator_id)
    if found is None:
        return None
    rows = list(await conn.execute_fetchall(
        "SELECT COUNT(*) FROM state_deltas WHERE job_id = ? AND operator_id = ?",
        (job_id, operator_id)))
    return StateHead(base_window=found[0], head_window=found[1], deltas=int(rows[0][0]))


class StateChains:
    """Keyed state of every operator of one :class:`SnapshotStore`, written
    through its group committer and fenced like its snapshots.

    Owns the compactor task: :meth:`start` after the store opened,
    :meth:`close` before it closes.
    """

    def __init__(self, store: SnapshotStore, max_deltas: int = MAX_DELTAS) -> None:
        if max_deltas < 1:
            raise ValueError("max_deltas must be >= 1")
        self._store = store
        self.max_deltas = max_deltas
        self.auto_compact = True
        """Tests turn this off to look at a chain before its compaction."""
        self.folds = 0
        """Deltas folded into a base so far."""
        self.fold_entries = FOLD_ENTRIES
        self.fold_bytes = FOLD_BYTES
        """The budget of one fold (see :data:`FOLD_ENTRIES`); tests shrink it."""
        self._due: set[OperatorKey] = set()
        self._writing: dict[tuple[str, str, int], asyncio.Future[tuple[bool, int]]] = {}
        """Windows being stored by :meth:`put` right now, by (job, operator,
        window): a retry of one of them waits for it instead of storing it again."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts the compactor."""
        self._task = asyncio.create_task(self._compactor(), name="stateserver-compactor")

    async def close(self) -> None:
        """Stops the compactor; a fold in progress is rolled back (and redone
        after restart, when the operator writes its next window)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        writes = list(self._writing.values())
        for write in writes:  # queued writes stay queued: the committer's close commits them
            write.cancel()
        await asyncio.gather(*writes, return_exceptions=True)

    # -- writes ----------------------------------------------------------

    async def put(self, window: StateWindow, fenced: bool = True) -> bool:
        """Stores one window; False when it was already stored or is older than
        the head. Raises MissingParent (nothing stored) when the delta's parent
        is not held, StaleEpoch when ``fenced`` and a newer owner wrote."""
        store = self._store
        job_id, operator_id = window.job_id, window.operator_id
        if fenced:
            store._check_fence(job_id, operator_id, window.epoch)

        async def op(conn: aiosqlite.Connection) -> tuple[bool, int]:
            if fenced:
                store._check_fence(job_id, operator_id, window.epoch)
            result = await self._apply(conn, window)
            await store._advance(conn, job_id, operator_id, window.epoch, 0)
            return result

        writing = (job_id, operator_id, window.window)
        write = self._writing.get(writing)
        if write is None:
            # The write lives in a task of its own, so that a caller that gave
            # up (an RPC past its deadline) neither skips it nor leaves a retry
            # of it to store the window a second time: the retry joins it.
            write = asyncio.ensure_future(store._commit().submit(op, even_if_abandoned=True))
            self._writing[writing] = write
            write.add_done_callback(functools.partial(self._written, writing))
        created, _ = await asyncio.shield(write)
        return created

    async def earlier_outcome(self, job_id: str, operator_id: str, window: int,
                              epoch: int) -> bool | None:
        """What storing ``window`` would answer when that is known before its
        entries arrive: the outcome of a put of it in progress (a retry of a
        write its caller gave up on, still queued here), or False when the
        operator's head is at or past it (a retry of a stored window). None
        when the window must be received and stored.

        Receiving a window costs the server's loop time in proportion to its
        bytes; under a backlog, callers time out and retry, and each retry
        of a big window costing as much again was what kept an overloaded
        state server overloaded. Raises StaleEpoch like :meth:`put`."""
        store = self._store
        store._check_fence(job_id, operator_id, epoch)
        running = self._writing.get((job_id, operator_id, window))
        if running is not None:
            created, _ = await asyncio.shield(running)
            return created
        head = await _head(store._read(), job_id, operator_id)
        if head is not None and window <= head[1]:
            return False
        return None

    def _written(self, writing: tuple[str, str, int],
                 write: asyncio.Future[tuple[bool, int]]) -> None:
        """A put's write ended: retries of its window are received again, and
        a chain grown past ``max_deltas`` is due for compaction."""
        del self._writing[writing]
        if write.cancelled() or write.exception() is not None:
            return  # its callers got the error
        created, deltas = write.result()
        if created and deltas > self.max_deltas and self.auto_compact:
            self._due.add(writing[:2])
            self._wake.set()

    async def put_copy(self, windows: list[StateWindow]) -> int:
        """Stores a peer's copy (catch-up): its windows in order, in one
        transaction, a whole state first replacing whatever is held. Not
        fenced; returns how many windows were stored.

        Nothing is stored when this replica's head has meanwhile reached the
        copy's newest window: catch-up decides to copy from digests taken
        before it reads the peer, and the owner's writes go on in between. A
        whole state copied then would put back an older head and drop windows
        this replica acknowledged (one copy fewer of each than W promised),
        and the owner's next delta would be refused for a missing parent.
        Window numbers only grow, across owners too (from ``epoch << 20``),
        so a head at or past the copy's holds at least as much."""
        if not windows:
            return 0
        store = self._store
        newest = windows[-1].window

        async def op(conn: aiosqlite.Connection) -> tuple[int, int]:
            held = await _head(conn, windows[0].job_id, windows[0].operator_id)
            if held is not None and held[1] >= newest:
                return 0, 0  # overtaken by the owner's own writes
            stored, deltas = 0, 0
            for index, window in enumerate(windows):
                if index == 0 and window.parent is None:
                    await self._replace(conn, window)
                    created = True
                else:
                    created, deltas = await self._apply(conn, window)
                stored += created
                await store._advance(conn, window.job_id, window.operator_id, window.epoch, 0)
            return stored, deltas

        stored, deltas = await store._commit().submit(op)
        if deltas > self.max_deltas and self.auto_compact:
            self._due.add((windows[0].job_id, windows[0].operator_id))
            self._wake.set()
        return stored

    async def _apply(self, conn: aiosqlite.Connection, w: StateWindow) -> tuple[bool, int]:
        """Stores ``w`` on the chain; (created, deltas now held)."""
        key = (w.job_id, w.operator_id)
        head = await _head(conn, *key)
        if head is not None and w.window <= head[1]:
            return False, 0  # a retry, or older than what we hold
        if w.parent is None:
            await self._replace(conn, w, held=head is not None)
            return True, 0
        if head is None:
            raise MissingParent(
                f"missing parent window {w.parent} of {w.operator_id} window {w.window}: this "
                "replica holds no state of the operator; catch-up will copy it (nothing stored)")
        base, newest = head
        if w.parent != newest:
            held = w.parent == base or bool(list(await conn.execute_fetchall(
                'SELECT 1 FROM state_deltas WHERE job_id = ? AND operator_id = ? '
                'AND "window" = ?', (*key, w.parent))))
            if not held:
                raise MissingParent(
                    f"missing parent window {w.parent} of {w.operator_id} window {w.window}: "
                    f"this replica holds windows {base}..{newest}; catch-up will fill the gap "
                    "(nothing stored)")
            # A new owner continues from an earlier window: drop what came after it.
            log.info("%s: window %d continues from %d; dropping the windows after it",
                     w.operator_id, w.window, w.parent)
            for table in ("state_delta_chunks", "state_deltas"):
                await conn.execute(
                    f'DELETE FROM {table} WHERE job_id = ? AND operator_id = ? AND "window" > ?',
                    (*key, w.parent))
        size = (w.entries_size if w.entries_size is not None
                else sum(len(k) + (len(v) if v is not None else 0) for _, k, v in w.entries))
        await conn.execute(
            'INSERT INTO state_deltas (job_id, operator_id, "window", parent, epoch, header, size)'
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*key, w.window, w.parent, w.epoch, w.header, size + len(w.header)))
        chunks = w.chunks if w.chunks is not None else packed_chunks(w.entries)
        if chunks:
            await conn.executemany(
                'INSERT OR REPLACE INTO state_delta_chunks (job_id, operator_id, "window", '
                "chunk, entries, count) VALUES (?, ?, ?, ?, ?, ?)",
                [(*key, w.window, index, blob, count)
                 for index, (blob, count) in enumerate(chunks)])
        # One statement, not two: the deltas held come back with the new head.
        rows = list(await conn.execute_fetchall(
            "UPDATE state_heads SET head_window = ? WHERE job_id = ? AND operator_id = ? "
            "RETURNING (SELECT COUNT(*) FROM state_deltas WHERE state_deltas.job_id = "
            "state_heads.job_id AND state_deltas.operator_id = state_heads.operator_id)",
            (w.window, *key)))
        return True, int(rows[0][0])

    async def _replace(self, conn: aiosqlite.Connection, w: StateWindow,
                       held: bool = True) -> None:
        """A whole state: becomes the base, replacing everything held.
        ``held`` False: the operator has no head, so it has no rows at all
        (every write of a head writes or deletes the rest with it, in one
        transaction), and there is nothing to delete. Statements are skipped
        where they would do nothing: a job's first windows (every operator's
        first window is a whole state, a stateless one's empty) come all at
        once at its drain, in a state server's busiest moment."""
        key = (w.job_id, w.operator_id)
        if held:
            for table in STATE_TABLES_BY_OPERATOR:
                await conn.execute(f"DELETE FROM {table} WHERE job_id = ? AND operator_id = ?",
                                   key)
        if w.entries:
            await conn.executemany(
                "INSERT OR REPLACE INTO state_entries (job_id, operator_id, stage, key, value) "
                "VALUES (?, ?, ?, ?, ?)",
                ((*key, stage, k, v) for stage, k, v in w.entries if v is not None))
        await conn.execute(
            "INSERT INTO state_heads (job_id, operator_id, base_window, base_epoch, base_header, "
            "head_window) VALUES (?, ?, ?, ?, ?, ?)",
            (*key, w.window, w.epoch, w.header, w.window))

    # -- compaction --------------------------------------------------------

    async def compact(self, job_id: str, operator_id: str, keep: int = 1) -> int:
        """Folds all but the newest ``keep`` deltas into the base, oldest
        first; returns how many were folded (0 when nothing to do).

        A fold covers as many of the oldest deltas as fit in
        ``fold_entries``/``fold_bytes`` (at least one) and writes each key
        to the base once, with its newest value among them: a key rewritten
        in every window costs one base write per fold, not one per delta.
        The budget keeps each fold's transaction short, so a fold that
        gives way to a takeover's claim (see groupcommit) loses little work.

        The newest delta stays apart so that a new owner continuing from its
        parent (see the module) can still drop it."""
        key = (job_id, operator_id)

        async def fold_oldest(conn: aiosqlite.Connection) -> int:
            last = await self._fold_range(conn, key, keep)
            if last is None:
                return 0
            upto, count, epoch, header = last
            # Each key's newest value among the folded deltas (None: deleted),
            # written to the base once, in (stage, key) order, the base's.
            newest = newest_values(
                ((int(row[0]), int(row[1]), bytes(row[2])) for row in await conn.execute_fetchall(
                    'SELECT "window", chunk, entries FROM state_delta_chunks WHERE job_id = ? '
                    'AND operator_id = ? AND "window" <= ? ORDER BY "window", chunk',
                    (*key, upto))), operator_id)
            gone = sorted(entry for entry, v in newest.items() if v is None)
            if gone:
                await conn.executemany(
                    "DELETE FROM state_entries WHERE job_id = ? AND operator_id = ? AND stage = ? "
                    "AND key = ?", [(*key, stage, k) for stage, k in gone])
            kept = sorted((entry, v) for entry, v in newest.items() if v is not None)
            if kept:
                await conn.executemany(_UPSERT_BASE,
                                       [(*key, stage, k, v) for (stage, k), v in kept])
            for table in ("state_delta_chunks", "state_deltas"):
                await conn.execute(
                    f'DELETE FROM {table} WHERE job_id = ? AND operator_id = ? '
                    'AND "window" <= ?', (*key, upto))
            await conn.execute(
                "UPDATE state_heads SET base_window = ?, base_epoch = ?, base_header = ? "
                "WHERE job_id = ? AND operator_id = ?", (upto, epoch, header, *key))
            return count

        folded = 0
        while count := await self._store._commit().submit(fold_oldest, preemptible=True):
            folded += count
            self.folds += count
        return folded

    async def _fold_range(self, conn: aiosqlite.Connection, key: OperatorKey, keep: int
                          ) -> tuple[int, int, int, bytes] | None:
        """The oldest deltas the next fold covers, within the budget and never
        the newest ``keep``: (newest window folded, how many deltas, its epoch,
        its header); None when nothing is to be folded."""
        deltas = list(await conn.execute_fetchall(
            'SELECT "window", size FROM state_deltas WHERE job_id = ? AND operator_id = ? '
            'ORDER BY "window"', key))
        chosen, entries, size = 0, 0, 0
        for window, delta_size in deltas[:max(len(deltas) - keep, 0)]:
            rows = list(await conn.execute_fetchall(
                'SELECT COALESCE(SUM(count), 0) FROM state_delta_chunks WHERE job_id = ? AND '
                'operator_id = ? AND "window" = ?', (*key, window)))
            entries += int(rows[0][0])
            size += int(delta_size)
            if chosen and (entries > self.fold_entries or size > self.fold_bytes):
                break
            chosen += 1
        if not chosen:
            return None
        upto = int(deltas[chosen - 1][0])
        rows = list(await conn.execute_fetchall(
            'SELECT epoch, header FROM state_deltas WHERE job_id = ? AND operator_id = ? '
            'AND "window" = ?', (*key, upto)))
        return upto, chosen, int(rows[0][0]), bytes(rows[0][1])

    async def _compactor(self) -> None:
        """Folds the chains that grew past ``max_deltas``; a fold that gave way
        to a takeover's claim is run again right after it, a failed one is
        logged and left for the operator's next window."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            due, self._due = self._due, set()
            for job_id, operator_id in sorted(due):
                try:
                    await self.compact(job_id, operator_id)
                except asyncio.CancelledError:
                    raise
                except Preempted:  # the claims are committed first: fold again after
                    log.info("compacting the state of %s gave way to a takeover's claim",
                             operator_id)
                    self._due.add((job_id, operator_id))
                    self._wake.set()
                except ChunkUnreadable as exc:  # named in full; no traceback to add
                    log.error("compacting the state of %s failed (%s); will retry after its "
                              "next window", operator_id, exc)
                except Exception:
                    log.exception("compacting the state of %s failed; will retry after its "
                                  "next window", operator_id)

    # -- reads -------------------------------------------------------------

    async def head(self, job_id: str, operator_id: str, claim_epoch: int = 0
                   ) -> StateHead | None:
        """Which windows are held. With ``claim_epoch``, first raises the
        operator's fence to it (StaleEpoch when a newer owner claimed it),
        committed before the answer: the previous owner is fenced here from
        then on."""
        store = self._store
        if claim_epoch:
            store._check_fence(job_id, operator_id, claim_epoch)

            async def claim(conn: aiosqlite.Connection) -> StateHead | None:
                store._check_fence(job_id, operator_id, claim_epoch)
                await store._advance(conn, job_id, operator_id, claim_epoch, 0)
                # The head is read in the claim's own transaction: the shared
                # reader may be queued behind long reads (a replica's catch-up).
                return await _head_of(conn, job_id, operator_id)

            began = time.monotonic()
            head: StateHead | None = await store._commit().submit(claim, urgent=True)
            took = time.monotonic() - began
            if took >= SLOW_CLAIM_S:
                log.info("claiming %s for epoch %d took %.3fs", operator_id, claim_epoch, took)
            return head
        return await _head_of(store._read(), job_id, operator_id)

    async def read(
        self, job_id: str, operator_id: str, after: int | None = None, packed: bool = False,
        chunk_entries: int = READ_CHUNK_ENTRIES, chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> AsyncIterator[StateChunkOut]:
        """The operator's state, oldest window first: the base as a whole state,
        then every delta; only the deltas after ``after`` when that window is in
        the chain. Nothing when no state is held.

        Reads on a connection of its own inside one read transaction, so the
        base and the deltas are of one moment even if a fold commits meanwhile,
        and a long read delays no other reader."""
        key = (job_id, operator_id)
        conn = await aiosqlite.connect(self._store.path, isolation_level=None)
        try:
            await conn.execute("PRAGMA query_only=ON")
            await conn.execute("BEGIN")
            heads = list(await conn.execute_fetchall(
                "SELECT base_window, base_epoch, base_header FROM state_heads "
                "WHERE job_id = ? AND operator_id = ?", key))
            if not heads:
                return
            base_window, base_epoch, base_header = int(heads[0][0]), int(heads[0][1]), heads[0][2]
            deltas = [(int(r[0]), int(r[1]), int(r[2]), bytes(r[3])) for r in
                      await conn.execute_fetchall(
                          'SELECT "window", parent, epoch, header FROM state_deltas WHERE '
                          'job_id = ? AND operator_id = ? ORDER BY "window"', key)]
            held = {base_window} | {d[0] for d in deltas}
            if after is None or after not in held:
                async for chunk in self._window_chunks(
                    conn, "SELECT stage, key, value FROM state_entries WHERE job_id = ? AND "
                    "operator_id = ? ORDER BY stage, key", key, base_window, base_epoch, None,
                    bytes(base_header), packed, chunk_entries, chunk_bytes,
                ):
                    yield chunk
                after = base_window
            for window, parent, epoch, header in deltas:
                if window <= after:
                    continue
                async for chunk in self._delta_chunks(conn, key, window, epoch, parent, header,
                                                      packed):
                    yield chunk
        finally:
            await conn.close()

    async def _delta_chunks(
        self, conn: aiosqlite.Connection, key: OperatorKey, window: int, epoch: int,
        parent: int | None, header: bytes, packed: bool,
    ) -> AsyncIterator[StateChunkOut]:
        """One delta's stored chunks, in order (each as big as its writer
        packed it); the header rides on the first. Native form is built
        from each chunk's entries as :func:`encode_rows` builds it. A chunk
        goes out once the next is read, so the last one is marked without
        counting them first; at most two are held."""

        def out(index: int, blob: bytes, count: int, last: bool) -> StateChunkOut:
            entries = blob if packed else encode_rows(
                unpack_chunk(blob, chunk_place(key[1], window, index)), False)
            return StateChunkOut(window, epoch, parent, header if index == 0 else b"",
                                 entries, count, last)

        held: tuple[int, bytes, int] | None = None
        async with conn.execute(
            'SELECT entries, count FROM state_delta_chunks WHERE job_id = ? AND operator_id = ? '
            'AND "window" = ? ORDER BY chunk', (*key, window),
        ) as cursor:
            while row := await cursor.fetchone():
                if held is not None:
                    yield out(*held, last=False)
                held = (0 if held is None else held[0] + 1, bytes(row[0]), int(row[1]))
        if held is None:  # a delta that changed no key
            yield StateChunkOut(window, epoch, parent, header, encode_rows([], packed), 0, True)
        else:
            yield out(*held, last=True)

    async def _window_chunks(
        self, conn: aiosqlite.Connection, sql: str, params: tuple[Any, ...], window: int,
        epoch: int, parent: int | None, header: bytes, packed: bool, chunk_entries: int,
        chunk_bytes: int,
    ) -> AsyncIterator[StateChunkOut]:
        """One window's entries in chunks; the header rides on the first."""
        first = True
        pending: list[Any] = []
        size = 0
        async with conn.execute(sql, params) as cursor:
            while True:
                rows = list(await cursor.fetchmany(chunk_entries))
                for row in rows:
                    pending.append(row)
                    size += len(row[1]) + (len(row[2]) if row[2] is not None else 0) + 8
                    if len(pending) >= chunk_entries or size >= chunk_bytes:
                        yield StateChunkOut(window, epoch, parent, header if first else b"",
                                            encode_rows(pending, packed), len(pending), False)
                        first, pending, size = False, [], 0
                if len(rows) < chunk_entries:
                    break
        yield StateChunkOut(window, epoch, parent, header if first else b"",
                            encode_rows(pending, packed), len(pending), True)


STATE_TABLES_BY_OPERATOR = ("state_delta_chunks", "state_deltas", "state_entries", "state_heads")
"""Every state table, children first (what dropping an operator's state deletes)."""
