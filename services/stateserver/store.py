"""SnapshotStore: the state server's durable storage, one SQLite file in WAL mode.

It holds what a job needs to survive failures: window snapshots of operators
(opaque payloads, :meth:`SnapshotStore.put_snapshot`), operators' keyed state
as window deltas compacted into a base (:attr:`SnapshotStore.states`, see
:mod:`services.stateserver.chains`), result rows (the SQLite sink) and dead
letters.
Writes go through a :class:`~services.stateserver.groupcommit.GroupCommitter`
on the write connection; reads use a second connection, so a reader sees only
committed (acknowledged) data and a long read never holds up writes.

Every write is idempotent, because a caller that timed out does not know the
outcome and retries: a snapshot is keyed by (job, operator, window) and the
first copy wins; result rows and dead letters are upserts by key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite

from gridstream.errors import InvalidArgument, StaleEpoch, Unavailable
from gridstream.ids import checksum
from services.stateserver.chains import MAX_DELTAS, STATE_TABLES_BY_OPERATOR, StateChains
from services.stateserver.groupcommit import GroupCommitter
from services.stateserver.layout import (
    META_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    DeadLetter,
    OlderLayout,
    OperatorHoldings,
    ResultRow,
    Snapshot,
    SnapshotCorrupted,
    SnapshotMeta,
    StoreStats,
    VersionedDeadLetter,
    VersionedRow,
    meta_from_row,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 5_000
"""Rows per chunk of :meth:`SnapshotStore.read_results`; also the most a
ReadResults message carries."""

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
"""Soft byte limit of a chunk, so a chunk of large rows stays far below gRPC's
message limit."""

BUSY_TIMEOUT_MS = 5_000
"""How long a connection waits for a lock held by the other one."""

_THREAD_CHECKSUM_BYTES = 256 * 1024
"""Payloads at least this big are hashed in a thread (hashlib releases the GIL),
so a 48 MiB snapshot does not stall the event loop for ~50 ms."""

async def _checksum(payload: bytes) -> str:
    """:func:`gridstream.ids.checksum`, off the event loop for big payloads."""
    if len(payload) >= _THREAD_CHECKSUM_BYTES:
        return await asyncio.to_thread(checksum, payload)
    return checksum(payload)


def _byte_chunks(rows: list[Any], max_bytes: int) -> list[list[Any]]:
    """Splits rows of text fields into runs of at most about ``max_bytes``."""
    chunks: list[list[Any]] = []
    current: list[Any] = []
    size = 0
    for row in rows:
        row_size = sum(len(f) if isinstance(f, (str, bytes)) else 8 for f in row)
        if current and size + row_size > max_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append(tuple(row))
        size += row_size
    if current:
        chunks.append(current)
    return chunks


class SnapshotStore:
    """Durable snapshots, result rows and dead letters of every job on this server.

    Use as ``async with SnapshotStore(path) as store:`` or call :meth:`open`
    and :meth:`close`. ``keep_windows`` is the retention: after window w of an
    operator is stored, only its newest ``keep_windows`` windows are kept.
    """

    def __init__(self, path: str | Path, keep_windows: int = 2,
                 max_deltas: int = MAX_DELTAS) -> None:
        if keep_windows < 1:
            raise ValueError("keep_windows must be >= 1")
        self.path = Path(path)
        self.keep_windows = keep_windows
        self.states = StateChains(self, max_deltas)
        """Operators' keyed state: window deltas compacted into a base."""
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._checkpoints: aiosqlite.Connection | None = None
        """Copies the write-ahead log back for the committer (see groupcommit)."""
        self._committer: GroupCommitter | None = None
        self._fences: dict[tuple[str, str], tuple[int, int]] = {}
        """(job, operator) -> (fence epoch, highest result version), mirrored
        from the operators table: changed by writes, read again after a rollback."""

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> SnapshotStore:
        """Opens (creating if needed) the database and starts the writer task."""
        if self._committer is not None:
            raise RuntimeError("SnapshotStore is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            # Read to their end: no statement of the write connection may stay
            # active (services/stateserver/groupcommit.py says why).
            await writer.execute_fetchall("PRAGMA journal_mode=WAL")
            await writer.execute_fetchall("PRAGMA synchronous=NORMAL")
            await writer.execute_fetchall(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            await self._check_schema(writer)
            await writer.executescript(SCHEMA)
            await writer.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            await self._load_fences(writer)
            reader = await aiosqlite.connect(self.path, isolation_level=None)
        except BaseException:
            await writer.close()
            raise
        try:
            await reader.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            await reader.execute("PRAGMA query_only=ON")
            checkpoints = await aiosqlite.connect(self.path, isolation_level=None)
        except BaseException:
            await reader.close()
            await writer.close()
            raise
        self._writer, self._reader, self._checkpoints = writer, reader, checkpoints
        self._committer = GroupCommitter(writer, after_rollback=self._load_fences,
                                         checkpoint_conn=checkpoints)
        self._committer.start()
        self.states.start()
        log.info("state store open at %s (keep %d windows per operator)", self.path,
                 self.keep_windows)
        return self

    async def _load_fences(self, conn: aiosqlite.Connection) -> None:
        """Reads the fence mirror from the database: at open, and after a
        rollback (writes raise the mirror before they commit)."""
        self._fences = {
            (row[0], row[1]): (int(row[2]), int(row[3]))
            for row in await conn.execute_fetchall(
                "SELECT job_id, operator_id, epoch, results_version FROM operators")
        }

    async def _check_schema(self, conn: aiosqlite.Connection) -> None:
        """Refuses a database written by an older layout, naming the fix."""
        rows = list(await conn.execute_fetchall("PRAGMA user_version"))
        version = int(rows[0][0]) if rows else 0
        tables = list(await conn.execute_fetchall(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'results'"))
        if tables and version < SCHEMA_VERSION:
            raise OlderLayout(
                f"{self.path} was written by an older gridstream (layout {version}, this one "
                f"needs {SCHEMA_VERSION}); move it aside or point stateserver.data_dir at an "
                "empty directory: the replica will catch up from its peers"
            )

    async def close(self) -> None:
        """Commits queued writes, stops the writer task and closes the database.

        Safe to call twice; afterwards every call fails with UNAVAILABLE.
        """
        committer = self._committer
        connections = (self._checkpoints, self._reader, self._writer)  # the writer last
        if committer is None:
            return
        try:
            await self.states.close()
            await committer.close()
        finally:
            self._committer = self._writer = self._reader = self._checkpoints = None
            for conn in connections:
                if conn is not None:
                    await conn.close()
        log.info("state store at %s closed", self.path)

    async def __aenter__(self) -> SnapshotStore:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def flush(self) -> None:
        """Waits until every write submitted so far is committed."""
        await self._commit().flush()

    def _commit(self) -> GroupCommitter:
        if self._committer is None:
            raise Unavailable("the state store is not open")
        return self._committer

    def _read(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise Unavailable("the state store is not open")
        return self._reader

    # -- snapshots ---------------------------------------------------------

    def _check_fence(self, job_id: str, operator_id: str, epoch: int) -> None:
        """StaleEpoch when a newer owner of the operator has already written."""
        fence = self._fences.get((job_id, operator_id), (0, 0))[0]
        if epoch < fence:
            raise StaleEpoch(
                f"stale epoch {epoch}: {operator_id} has been written by an owner at epoch "
                f"{fence}; the writer was fenced and must stop (nothing stored)", fence)

    async def _advance(self, conn: aiosqlite.Connection, job_id: str, operator_id: str,
                       epoch: int, version: int) -> None:
        """Raises the operator's fence and result version (never lowers them)."""
        old_epoch, old_version = self._fences.get((job_id, operator_id), (0, 0))
        new = (max(old_epoch, epoch), max(old_version, version))
        if new != (old_epoch, old_version) or (job_id, operator_id) not in self._fences:
            await conn.execute(
                "INSERT INTO operators (job_id, operator_id, epoch, results_version) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (job_id, operator_id) DO UPDATE SET "
                "epoch = MAX(epoch, excluded.epoch), "
                "results_version = MAX(results_version, excluded.results_version)",
                (job_id, operator_id, *new),
            )
            self._fences[(job_id, operator_id)] = new

    async def put_snapshot(self, meta: SnapshotMeta, payload: bytes, fenced: bool = True) -> bool:
        """Stores a window snapshot; False when (job, operator, window) was already stored.

        The payload must match ``meta.size`` and ``meta.checksum``; a mismatch
        raises InvalidArgument and stores nothing. The first copy of a window
        wins, so a retried or late duplicate never replaces it. With
        ``fenced`` (writes from workers), a writer epoch below the operator's
        fence raises StaleEpoch; copies from another replica are not fenced.
        """
        if len(payload) != meta.size:
            raise InvalidArgument(
                f"snapshot {meta.operator_id} window {meta.window}: meta.size is {meta.size} "
                f"but the payload has {len(payload)} bytes; set size to len(payload); "
                "nothing stored"
            )
        actual = await _checksum(payload)
        if actual != meta.checksum:
            raise InvalidArgument(
                f"checksum mismatch for snapshot {meta.operator_id} window {meta.window}: "
                f"meta.checksum is {meta.checksum!r}, the payload hashes to {actual!r}; the "
                "payload was corrupted; nothing stored (compute gridstream.ids.checksum(payload) "
                "and resend)"
            )
        keep = self.keep_windows
        if fenced:
            self._check_fence(meta.job_id, meta.operator_id, meta.epoch)

        async def op(conn: aiosqlite.Connection) -> bool:
            if fenced:
                self._check_fence(meta.job_id, meta.operator_id, meta.epoch)
            await self._advance(conn, meta.job_id, meta.operator_id, meta.epoch, 0)
            async with conn.execute(
                f"INSERT OR IGNORE INTO snapshots ({META_COLUMNS}, payload) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (meta.job_id, meta.operator_id, meta.window, meta.epoch, meta.size,
                 meta.checksum, payload),
            ) as cursor:
                created = cursor.rowcount == 1
            if not created:
                return False
            # Retention: keep the newest `keep` windows of this operator.
            await conn.execute(
                'DELETE FROM snapshots WHERE job_id = ? AND operator_id = ? AND "window" < ('
                'SELECT "window" FROM snapshots WHERE job_id = ? AND operator_id = ? '
                'ORDER BY "window" DESC LIMIT 1 OFFSET ?)',
                (meta.job_id, meta.operator_id, meta.job_id, meta.operator_id, keep - 1),
            )
            return True

        return await self._commit().submit(op)

    async def get_latest_snapshot(self, job_id: str, operator_id: str) -> Snapshot | None:
        """The operator's newest snapshot, checked against its checksum; None if none.

        Raises SnapshotCorrupted (DATA_LOSS) instead of returning bytes that no
        longer match what was written.
        """
        rows = list(await self._read().execute_fetchall(
            f'SELECT {META_COLUMNS}, payload FROM snapshots WHERE job_id = ? '
            'AND operator_id = ? ORDER BY "window" DESC LIMIT 1',
            (job_id, operator_id),
        ))
        if not rows:
            return None
        meta, payload = meta_from_row(rows[0]), bytes(rows[0][6])
        actual = await _checksum(payload)
        if actual != meta.checksum or len(payload) != meta.size:
            log.error("snapshot %s window %d is corrupt on disk (checksum %s, stored %s)",
                      operator_id, meta.window, actual, meta.checksum)
            raise SnapshotCorrupted(
                f"snapshot {operator_id} window {meta.window} is corrupt on disk: stored "
                f"checksum {meta.checksum}, payload hashes to {actual} ({len(payload)} of "
                f"{meta.size} bytes); restore it from another state server replica"
            )
        return Snapshot(meta, payload)

    async def list_snapshots(self, job_id: str, operator_id: str = "") -> list[SnapshotMeta]:
        """Metadata of a job's snapshots (of one operator if given), by operator and window."""
        if operator_id:
            rows = await self._read().execute_fetchall(
                f'SELECT {META_COLUMNS} FROM snapshots WHERE job_id = ? AND operator_id = ? '
                'ORDER BY "window"',
                (job_id, operator_id),
            )
        else:
            rows = await self._read().execute_fetchall(
                f'SELECT {META_COLUMNS} FROM snapshots WHERE job_id = ? '
                'ORDER BY operator_id, "window"',
                (job_id,),
            )
        return [meta_from_row(row) for row in rows]

    async def delete_snapshots(
        self, job_id: str, operator_id: str = "", below_window: int = 0
    ) -> int:
        """Deletes a job's snapshots; ``operator_id`` "" means every operator and
        ``below_window`` 0 every window (else only windows strictly below it).
        Returns how many were deleted."""
        sql = "DELETE FROM snapshots WHERE job_id = ?"
        params: list[Any] = [job_id]
        if operator_id:
            sql += " AND operator_id = ?"
            params.append(operator_id)
        if below_window:
            sql += ' AND "window" < ?'
            params.append(below_window)

        async def op(conn: aiosqlite.Connection) -> int:
            async with conn.execute(sql, params) as cursor:
                return int(cursor.rowcount)

        return await self._commit().submit(op)

    # -- results and dead letters -----------------------------------------

    async def write_results(
        self,
        job_id: str,
        rows: Sequence[ResultRow],
        dead_letters: Sequence[DeadLetter] = (),
        operator_id: str = "",
        epoch: int = 0,
        version: int = 0,
        fenced: bool = True,
    ) -> None:
        """Upserts result rows and dead letters in one transaction; durable on return.

        A row replaces the stored one for its key unless the stored one has a
        higher ``version``, so replicas that saw writes in another order (or a
        replica catching up) converge, and a replayed window overwrites
        instead of adding. With ``fenced``, a writer epoch below the
        operator's fence raises StaleEpoch and stores nothing.
        """
        await self.write_versioned(
            job_id, operator_id, [(key, value, version) for key, value in rows],
            [(*entry, version) for entry in dead_letters], epoch, fenced,
        )

    async def write_versioned(
        self,
        job_id: str,
        operator_id: str,
        rows: Sequence[VersionedRow],
        dead_letters: Sequence[VersionedDeadLetter],
        epoch: int = 0,
        fenced: bool = False,
        track_version: bool = True,
    ) -> None:
        """Stores rows and dead letters that each carry their own version (a
        replica's catch-up copy); see :meth:`write_results`. Without
        ``track_version`` the operator's result version is left alone (a copy
        in chunks moves it with :meth:`mark` once complete)."""
        if not rows and not dead_letters:
            return
        if fenced:
            self._check_fence(job_id, operator_id, epoch)
        top = max([r[2] for r in rows] + [d[4] for d in dead_letters])

        async def op(conn: aiosqlite.Connection) -> None:
            if fenced:
                self._check_fence(job_id, operator_id, epoch)
            await self._advance(conn, job_id, operator_id, epoch, top if track_version else 0)
            if rows:
                await conn.executemany(
                    "INSERT INTO results (job_id, key, value, operator_id, version) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (job_id, key) DO UPDATE SET "
                    "value = excluded.value, operator_id = excluded.operator_id, "
                    "version = excluded.version WHERE excluded.version >= results.version",
                    [(job_id, key, value, operator_id, version) for key, value, version in rows],
                )
            if dead_letters:
                await conn.executemany(
                    "INSERT INTO dead_letters (job_id, id, stage, record, error, operator_id, "
                    "version) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, id) DO UPDATE "
                    "SET stage = excluded.stage, record = excluded.record, "
                    "error = excluded.error, version = excluded.version "
                    "WHERE excluded.version >= dead_letters.version",
                    [(job_id, *entry[:4], operator_id, entry[4]) for entry in dead_letters],
                )

        await self._commit().submit(op)

    async def read_results(
        self,
        job_id: str,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> AsyncIterator[list[VersionedRow]]:
        """A job's result rows (key, value, version) in key order, in chunks of
        at most ``chunk_rows``.

        Pages by key (no cursor is held open between chunks), so a slow reader
        blocks neither writers nor WAL checkpoints. An unknown job yields nothing.
        """
        async for chunk in self._paged(
            "SELECT key, value, version FROM results WHERE job_id = ?", "key", (job_id,),
            chunk_rows, chunk_bytes,
        ):
            yield [(row[0], row[1], int(row[2])) for row in chunk]

    async def read_dead_letters(
        self,
        job_id: str,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> AsyncIterator[list[DeadLetter]]:
        """A job's dead letters in id order, chunked like :meth:`read_results`."""
        async for chunk in self._paged(
            "SELECT id, stage, record, error FROM dead_letters WHERE job_id = ?", "id",
            (job_id,), chunk_rows, chunk_bytes,
        ):
            yield [(row[0], row[1], row[2], row[3]) for row in chunk]

    async def read_operator(
        self, job_id: str, operator_id: str, after_version: int,
        chunk_rows: int = DEFAULT_CHUNK_ROWS, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> AsyncIterator[tuple[list[VersionedRow], list[VersionedDeadLetter]]]:
        """One operator's rows and dead letters of a version above
        ``after_version``, chunked: what a catching-up replica lacks."""
        params = (job_id, operator_id, after_version)
        async for chunk in self._paged(
            "SELECT key, value, version FROM results WHERE job_id = ? AND operator_id = ? "
            "AND version > ?", "key", params, chunk_rows, chunk_bytes,
        ):
            yield [(row[0], row[1], int(row[2])) for row in chunk], []
        async for chunk in self._paged(
            "SELECT id, stage, record, error, version FROM dead_letters WHERE job_id = ? "
            "AND operator_id = ? AND version > ?", "id", params, chunk_rows, chunk_bytes,
        ):
            yield [], [(row[0], row[1], row[2], row[3], int(row[4])) for row in chunk]

    async def holdings(self, job_id: str = "") -> list[OperatorHoldings]:
        """Per operator: newest window, highest result version and fence."""
        where, params = ("WHERE job_id = ?", (job_id,)) if job_id else ("", ())
        return await _holdings(self._read(), where, params)

    async def mark(self, job_id: str, operator_id: str, epoch: int, version: int) -> None:
        """Raises an operator's fence and result version to at least these
        (a replica's copy of the operator is complete up to ``version``)."""

        async def op(conn: aiosqlite.Connection) -> None:
            await self._advance(conn, job_id, operator_id, epoch, version)

        await self._commit().submit(op)

    async def drop_operator(self, job_id: str, operator_id: str,
                            unless_changed_from: OperatorHoldings | None = None) -> bool:
        """Deletes everything of one operator (a copy handed over to its
        replicas); True when it did. With ``unless_changed_from``, the copy is
        dropped only if it still holds exactly that, checked in the deleting
        transaction: a write stored after the caller compared its holdings
        with the replicas' (a writer with an older routing table still counts
        this server in its quorum) is never dropped unseen."""

        async def op(conn: aiosqlite.Connection) -> bool:
            if unless_changed_from is not None:
                now = await _holdings(conn, "WHERE job_id = ? AND operator_id = ?",
                                      (job_id, operator_id))
                if now != [unless_changed_from]:
                    return False
            for table in ("results", "dead_letters", "snapshots", *STATE_TABLES_BY_OPERATOR,
                          "operators"):
                await conn.execute(
                    f"DELETE FROM {table} WHERE job_id = ? AND operator_id = ?",
                    (job_id, operator_id))
            self._fences.pop((job_id, operator_id), None)
            return True

        return await self._commit().submit(op)

    async def job_ids(self) -> list[str]:
        """Every job this store holds anything of."""
        rows = await self._read().execute_fetchall(
            "SELECT job_id FROM operators UNION SELECT job_id FROM snapshots "
            "UNION SELECT job_id FROM results UNION SELECT job_id FROM state_heads")
        return sorted(row[0] for row in rows)

    async def _paged(
        self, select: str, key: str, params: tuple[Any, ...], chunk_rows: int, chunk_bytes: int
    ) -> AsyncIterator[list[Any]]:
        """Keyset pagination over ``select`` ordered by ``key`` (its first column)."""
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be >= 1")
        first = f"{select} ORDER BY {key} LIMIT ?"
        after = f"{select} AND {key} > ? ORDER BY {key} LIMIT ?"
        last: str | None = None
        while True:
            if last is None:
                rows = list(await self._read().execute_fetchall(first, (*params, chunk_rows)))
            else:
                rows = list(
                    await self._read().execute_fetchall(after, (*params, last, chunk_rows))
                )
            for chunk in _byte_chunks(rows, chunk_bytes):
                yield chunk
            if len(rows) < chunk_rows:
                return
            last = rows[-1][0]

    async def delete_job(self, job_id: str) -> None:
        """Deletes every result, dead letter and snapshot of a job, in one transaction."""

        async def op(conn: aiosqlite.Connection) -> None:
            for table in ("results", "dead_letters", "snapshots", *STATE_TABLES_BY_OPERATOR,
                          "operators"):
                await conn.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
            for key in [k for k in self._fences if k[0] == job_id]:
                del self._fences[key]

        await self._commit().submit(op)

    # -- status ------------------------------------------------------------

    async def stats(self) -> StoreStats:
        """Snapshot count and bytes, and how well group commit is grouping."""
        committer = self._commit()
        rows = list(await self._read().execute_fetchall(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM snapshots"
        ))
        # Deltas only: summing the base's rows would scan the whole state.
        deltas = list(await self._read().execute_fetchall(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM state_deltas"))
        return StoreStats(
            snapshots=int(rows[0][0]) + int(deltas[0][0]),
            snapshot_bytes=int(rows[0][1]) + int(deltas[0][1]),
            commits=committer.commits, writes=committer.writes,
        )


async def _holdings(conn: aiosqlite.Connection, where: str,
                    params: tuple[str, ...]) -> list[OperatorHoldings]:
    """What ``conn`` sees of the operators selected by ``where``."""
    windows = {
        (row[0], row[1]): int(row[2])
        for row in await conn.execute_fetchall(
            f'SELECT job_id, operator_id, MAX("window") FROM snapshots {where} '
            "GROUP BY job_id, operator_id", params)
    }
    fences = {
        (row[0], row[1]): (int(row[2]), int(row[3]))
        for row in await conn.execute_fetchall(
            f"SELECT job_id, operator_id, epoch, results_version FROM operators {where}",
            params)
    }
    states = {
        (row[0], row[1]): int(row[2])
        for row in await conn.execute_fetchall(
            f"SELECT job_id, operator_id, head_window FROM state_heads {where}", params)
    }
    return [
        OperatorHoldings(job, operator, windows.get((job, operator)),
                         fences.get((job, operator), (0, 0))[1],
                         fences.get((job, operator), (0, 0))[0],
                         states.get((job, operator)))
        for job, operator in sorted(set(windows) | set(fences) | set(states))
    ]
