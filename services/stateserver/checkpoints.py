"""WAL checkpoints on a connection of their own, so that no commit runs one.

SQLite in WAL mode appends every committed page to the write-ahead log and
copies the log back into the database file at a *checkpoint*. By default the
connection whose ``COMMIT`` takes the log past 1,000 pages runs that
checkpoint inside the ``COMMIT``: it copies every page and syncs the file
before the commit returns. A compaction fold into a base of millions of keys
dirties a page per key (about 17,000 pages, 70 MB, for 20,000 keys), so the
commit after each fold copied all of it back, and a takeover's claim, which
waits for the transaction in progress (``services/stateserver/groupcommit.py``),
waited for that copy too: 0.5 s of a 1.8 s kill -> processing at 10M keys.

The store's writer therefore turns automatic checkpoints off, and a
:class:`WalCheckpointer` runs a ``PASSIVE`` checkpoint every
``interval_s`` on a connection and thread of its own. A passive checkpoint
waits for no reader or writer: the writer goes on committing while it copies,
and what it could not copy yet (pages a reader still needs, pages committed
meanwhile) is copied by the next one. The log restarts from its beginning
once a checkpoint has copied all of it. Closing the store's last connection
checkpoints whatever is left, as SQLite always does.

A log that grows past ``warn_bytes`` anyway (checkpoints that cannot keep up,
or a reader holding a snapshot for minutes) is logged at WARNING with its
size, at most once a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import aiosqlite

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 0.5
"""How often the checkpointer copies the log back into the database file."""

WAL_WARN_BYTES = 1 << 30
"""A write-ahead log left this large after a checkpoint is logged at WARNING."""

_WARN_EVERY_S = 60.0


class WalCheckpointer:
    """Copies one database's write-ahead log into its file in the background.

    Owned by the store that opens it: :meth:`start` after the database is in
    WAL mode, :meth:`close` before the store's own connections close."""

    def __init__(self, path: Path, interval_s: float = CHECKPOINT_INTERVAL_S,
                 warn_bytes: int = WAL_WARN_BYTES) -> None:
        self.path = path
        self.interval_s = interval_s
        self.warn_bytes = warn_bytes
        self.checkpoints = 0
        """Checkpoints run so far."""
        self.pages_copied = 0
        """Log pages copied into the database file so far."""
        self._conn: aiosqlite.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._warned_at = 0.0

    async def start(self) -> None:
        """Opens the checkpointer's connection and starts its task."""
        if self._task is not None:
            raise RuntimeError("WalCheckpointer is already started")
        self._conn = await aiosqlite.connect(self.path, isolation_level=None)
        self._task = asyncio.create_task(self._run(), name=f"wal checkpoints of {self.path}")

    async def checkpoint(self) -> tuple[int, int]:
        """Runs one passive checkpoint now; returns (pages in the log, pages
        of it copied into the database file so far)."""
        if self._conn is None:
            raise RuntimeError("WalCheckpointer is not started")
        rows = list(await self._conn.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)"))
        _, logged, copied = (int(value) for value in rows[0])
        self.checkpoints += 1
        self.pages_copied += max(0, copied)
        return logged, copied

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                logged, copied = await self.checkpoint()
            except aiosqlite.Error as exc:
                log.warning("checkpointing %s failed (%s); trying again in %.1f s",
                            self.path, exc, self.interval_s)
                continue
            self._warn_if_large(logged, copied)

    def _warn_if_large(self, logged: int, copied: int) -> None:
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            size = wal.stat().st_size
        except OSError:
            return
        now = time.monotonic()
        if size >= self.warn_bytes and now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("the write-ahead log of %s is %.0f MB (%d of its %d pages copied "
                        "back by the last checkpoint): checkpoints are not keeping up with "
                        "the writes, or a long read holds old pages", self.path, size / 1e6,
                        copied, logged)

    async def close(self) -> None:
        """Stops the task and closes the connection; safe to call twice."""
        task, conn = self._task, self._conn
        self._task = self._conn = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if conn is not None:
            await conn.close()
