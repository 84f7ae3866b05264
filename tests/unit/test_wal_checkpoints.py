"""The state store's write-ahead log is copied back by the checkpointer, never
inside a commit (services/stateserver/checkpoints.py), on a real SQLite file."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from gridstream.ids import checksum
from services.stateserver.layout import SnapshotMeta
from services.stateserver.store import SnapshotStore

JOB = "job-1"
PAGE_BYTES = 4096


def wal_progress(db: Path) -> tuple[int, int]:
    """(frames in the log, frames of them copied into the file), read from the
    WAL index SQLite shares between connections (``-shm``): ``mxFrame`` at
    byte 16 of its header and ``nBackfill`` at byte 96 of the checkpoint
    information after the header's two copies, in native byte order. Read
    this way, not with ``PRAGMA wal_checkpoint``, because that pragma
    would itself copy the log."""
    header = db.with_name(db.name + "-shm").read_bytes()[:100]
    (frames,) = struct.unpack_from("=I", header, 16)
    (copied,) = struct.unpack_from("=I", header, 96)
    return frames, copied


async def write_pages(store: SnapshotStore, pages: int, first: int = 1) -> None:
    """Commits snapshots spanning about ``pages`` database pages, from window
    ``first`` on."""
    for window in range(first, first + pages // 16):
        payload = bytes([window % 251]) * (16 * PAGE_BYTES)
        meta = SnapshotMeta(job_id=JOB, operator_id=f"{JOB}/t0/p{window}", window=window,
                            epoch=1, size=len(payload), checksum=checksum(payload))
        await store.put_snapshot(meta, payload)


async def test_a_commit_never_copies_the_log_back(tmp_path: Path) -> None:
    """Past SQLite's automatic threshold (1,000 pages) a commit would copy the
    whole log back before returning, and a takeover's claim would wait for
    it; here the log stays uncopied until the checkpointer runs."""
    db = tmp_path / "state.sqlite3"
    store = SnapshotStore(db)
    store.checkpointer.interval_s = 3600.0  # only the explicit checkpoint below
    async with store:
        await write_pages(store, 3_000)
        frames, copied = wal_progress(db)
        assert frames > 1_000, frames
        assert copied == 0, f"a commit copied {copied} of {frames} log frames back"
        logged, copied = await store.checkpointer.checkpoint()
        assert copied == logged and logged >= frames
        assert wal_progress(db) == (logged, logged)


async def test_the_checkpointer_copies_the_log_back_by_itself(tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite3"
    store = SnapshotStore(db)
    store.checkpointer.interval_s = 0.02
    async with store:
        await write_pages(store, 1_500)
        async with asyncio.timeout(10):
            while True:
                frames, copied = wal_progress(db)
                if frames and copied == frames:
                    break
                await asyncio.sleep(0.01)
        assert store.checkpointer.pages_copied >= frames
        # The store goes on writing while checkpoints run; the log is reused
        # from its start once it has been copied, so it does not grow.
        size = db.with_name(db.name + "-wal").stat().st_size
        await write_pages(store, 1_500, first=1_000)
        assert store.checkpointer.pages_copied > frames
        assert db.with_name(db.name + "-wal").stat().st_size <= size * 1.5
    assert not db.with_name(db.name + "-wal").exists() or (
        db.with_name(db.name + "-wal").stat().st_size == 0)
