"""The state server's single writer (services/stateserver/groupcommit.py), on a
real SQLite file: queued writes share transactions, and an urgent write (a
new owner's claim) is committed before the writes queued ahead of it.

A group's writes run on the write connection's own thread, so a write that
must be held mid-way (a long transaction, in miniature) waits on a
:class:`Gate` there, not on an asyncio event."""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import aiosqlite
import pytest
import pytest_asyncio

from gridstream.errors import Unavailable
from services.stateserver import groupcommit
from services.stateserver.groupcommit import GroupCommitter, Preempted
from tests.unit.writer_gate import Gate


@pytest_asyncio.fixture
async def committer(tmp_path: Path) -> AsyncIterator[GroupCommitter]:
    conn = await aiosqlite.connect(tmp_path / "db.sqlite3", isolation_level=None)
    await conn.execute("CREATE TABLE t (name TEXT)")
    writer = GroupCommitter(conn)
    writer.start()
    try:
        yield writer
    finally:
        await writer.close()
        await conn.close()


def insert(name: str, order: list[str]) -> Callable[[aiosqlite.Connection], Awaitable[None]]:
    """A write that notes when it ran."""
    async def op(conn: aiosqlite.Connection) -> None:
        order.append(name)
        await conn.execute("INSERT INTO t VALUES (?)", (name,))
    return op


async def test_queued_writes_share_transactions(committer: GroupCommitter) -> None:
    order: list[str] = []
    await asyncio.gather(*(committer.submit(insert(f"w{i}", order)) for i in range(200)))
    assert sorted(order) == sorted(f"w{i}" for i in range(200))
    assert committer.writes == 200 and committer.commits < 20


async def test_a_group_runs_on_the_connections_thread_in_one_hop(
        committer: GroupCommitter, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group of fifty writes is one call to the connection's thread (BEGIN,
    the writes, COMMIT), not a hand-over per statement; the writes run on
    that thread, off the event loop."""
    conn = committer._conn
    hops: list[str] = []
    real_execute = conn._execute

    async def counted(fn: Callable[..., object], *args: object) -> object:
        hops.append(getattr(fn, "__name__", "?"))
        return await real_execute(fn, *args)

    monkeypatch.setattr(conn, "_execute", counted)
    gate = Gate()
    threads: set[int] = set()

    async def held(conn: aiosqlite.Connection) -> None:
        gate.wait()

    def noting(name: str) -> Callable[[aiosqlite.Connection], Awaitable[None]]:
        async def op(conn: aiosqlite.Connection) -> None:
            threads.add(threading.get_ident())
            await insert(name, [])(conn)
        return op

    first = asyncio.ensure_future(committer.submit(held))
    await gate.reached.wait()
    group = [asyncio.ensure_future(committer.submit(noting(f"w{i}"))) for i in range(50)]
    await asyncio.sleep(0)
    hops.clear()
    gate.open()
    await asyncio.gather(first, *group)
    assert len(hops) == 1, hops  # 50 writes, each two statements: one hop
    assert len(threads) == 1 and threading.get_ident() not in threads
    rows = await conn.execute_fetchall("SELECT COUNT(*) FROM t")
    assert list(rows) == [(50,)]


async def test_a_statement_answering_rows_leaves_nothing_active_in_a_write(
        committer: GroupCommitter) -> None:
    """A write op's statement that answers rows is run to its end, so an
    interrupt landing after it (the committer sends one again and again
    while a claim waits) is forgotten at the next statement instead of
    failing it: SQLite keeps an interrupt while any statement of the
    connection is active."""
    async def op(conn: aiosqlite.Connection) -> int:
        cursor = await conn.execute("SELECT name FROM t")  # rows never read here
        conn._raw.interrupt()  # type: ignore[attr-defined]  # lands between two statements
        await conn.execute("INSERT INTO t VALUES ('after')")
        return cursor.rowcount

    await committer.submit(insert("before", []))
    await committer.submit(op)
    rows = await committer._conn.execute_fetchall("SELECT name FROM t ORDER BY name")
    assert [r[0] for r in rows] == ["after", "before"]


async def test_a_write_that_awaits_anything_but_the_database_fails_alone(
        committer: GroupCommitter) -> None:
    """A write op may only await its connection's statements; one that awaits
    anything else (a bug) fails with an error that says so, nothing of it is
    stored, and the writes grouped with it are committed."""
    gate = Gate()

    async def held(conn: aiosqlite.Connection) -> None:
        gate.wait()

    async def sleeps(conn: aiosqlite.Connection) -> None:
        await conn.execute("INSERT INTO t VALUES ('sleeper')")
        await asyncio.sleep(0)

    first = asyncio.ensure_future(committer.submit(held))
    await gate.reached.wait()
    before = asyncio.ensure_future(committer.submit(insert("before", [])))
    bad = asyncio.ensure_future(committer.submit(sleeps))
    after = asyncio.ensure_future(committer.submit(insert("after", [])))
    await asyncio.sleep(0)
    gate.open()
    await asyncio.gather(first, before, after)
    with pytest.raises(Unavailable, match="awaited something other than"):
        await bad
    rows = await committer._conn.execute_fetchall("SELECT name FROM t ORDER BY name")
    assert [row[0] for row in rows] == ["after", "before"]


async def test_an_urgent_write_goes_ahead_of_the_queue(committer: GroupCommitter) -> None:
    order: list[str] = []
    gate = Gate()

    async def slow(conn: aiosqlite.Connection) -> None:  # a big transaction in progress
        gate.wait()
        order.append("slow")

    busy = asyncio.ensure_future(committer.submit(slow))
    await gate.reached.wait()
    queued = [asyncio.ensure_future(committer.submit(insert(f"w{i}", order)))
              for i in range(50)]
    claim = asyncio.ensure_future(committer.submit(insert("claim", order), urgent=True))
    await asyncio.sleep(0)  # every write is queued behind the slow one
    gate.open()
    await asyncio.gather(busy, claim, *queued)
    assert order[:2] == ["slow", "claim"]  # waited for the transaction in progress only
    assert sorted(order[2:]) == sorted(f"w{i}" for i in range(50))


async def test_a_group_in_progress_yields_to_an_urgent_write(committer: GroupCommitter) -> None:
    # Writes w0..w9 share a transaction; the claim arrives while w2 runs: it is
    # committed after w2 (what was written commits first), before w3..w9, which
    # still commit, in order.
    order: list[str] = []
    busy, in_w2 = Gate(), Gate()

    async def held(conn: aiosqlite.Connection) -> None:  # keeps the writer busy
        busy.wait()

    def write(i: int) -> Callable[[aiosqlite.Connection], Awaitable[None]]:
        async def op(conn: aiosqlite.Connection) -> None:
            if i == 2:
                in_w2.wait()
            await insert(f"w{i}", order)(conn)
        return op

    first = asyncio.ensure_future(committer.submit(held))
    await busy.reached.wait()
    group = [asyncio.ensure_future(committer.submit(write(i))) for i in range(10)]
    await asyncio.sleep(0)
    busy.open()
    await in_w2.reached.wait()  # the group of ten is in progress
    claim = asyncio.ensure_future(committer.submit(insert("claim", order), urgent=True))
    await asyncio.sleep(0)
    in_w2.open()
    await asyncio.gather(first, claim, *group)
    assert order == ["w0", "w1", "w2", "claim", *(f"w{i}" for i in range(3, 10))]
    async with committer._conn.execute("SELECT COUNT(*) FROM t") as cursor:
        assert (await cursor.fetchone()) == (11,)


async def test_an_urgent_write_preempts_a_long_preemptible_one(
        committer: GroupCommitter, tmp_path: Path) -> None:
    """A compaction fold gives way to a takeover's claim: its statement is
    interrupted, its transaction rolled back, and the claim commits at once."""
    started = Gate()

    async def fold(conn: aiosqlite.Connection) -> int:
        await conn.execute("INSERT INTO t VALUES ('fold')")
        started.arrive()
        # A statement of many seconds (a fold into a big base, in miniature).
        rows = await conn.execute_fetchall(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
            "WHERE i < 2000000000) SELECT count(*) FROM n")
        return int(next(iter(rows))[0])

    queued = asyncio.ensure_future(committer.submit(insert("queued", [])))
    folding = asyncio.ensure_future(committer.submit(fold, preemptible=True))
    await started.reached.wait()
    claim = await asyncio.wait_for(committer.submit(insert("claim", []), urgent=True), 10)
    assert claim is None
    with pytest.raises(Preempted):
        await folding
    await queued
    assert committer.preempted == 1
    async with aiosqlite.connect(tmp_path / "db.sqlite3") as reader:
        names = sorted(row[0] for row in await reader.execute_fetchall("SELECT name FROM t"))
    assert names == ["claim", "queued"]  # nothing of the fold was stored


async def test_a_preemptible_write_runs_alone_and_commits_when_not_preempted(
        committer: GroupCommitter, tmp_path: Path) -> None:
    order: list[str] = []
    writes = [asyncio.ensure_future(committer.submit(insert(f"w{i}", order),
                                                     preemptible=i == 5)) for i in range(10)]
    await asyncio.gather(*writes)
    assert order == [f"w{i}" for i in range(10)]  # in order, the preemptible one alone
    assert committer.commits >= 3 and committer.preempted == 0


async def test_a_write_whose_caller_gave_up_is_still_committed(
        committer: GroupCommitter, tmp_path: Path) -> None:
    """An RPC past its deadline leaves its window of state queued: it is
    committed, so the caller's retry finds it stored instead of queueing past
    its deadline again; other writes of callers that gave up are skipped."""
    gate = Gate()

    async def slow(conn: aiosqlite.Connection) -> None:  # a long transaction in progress
        gate.wait()

    busy = asyncio.ensure_future(committer.submit(slow))
    await gate.reached.wait()
    with pytest.raises(TimeoutError):  # the caller's deadline passes while it is queued
        await asyncio.wait_for(committer.submit(insert("given up", []),
                                                even_if_abandoned=True), 0.05)
    with pytest.raises(TimeoutError):  # any other write of a caller that gave up is skipped
        await asyncio.wait_for(committer.submit(insert("skipped", [])), 0.05)
    gate.open()
    await busy
    await committer.flush()
    async with aiosqlite.connect(tmp_path / "db.sqlite3") as reader:
        names = [row[0] for row in await reader.execute_fetchall("SELECT name FROM t")]
    assert names == ["given up"]


def long_statement(ran: list[str], name: str, started: Gate
                   ) -> Callable[[aiosqlite.Connection], Awaitable[None]]:
    """A write that holds the writer in one statement of many seconds the
    first time it runs (random writes into a big base, in miniature), and is
    quick when run again."""
    async def op(conn: aiosqlite.Connection) -> None:
        await conn.execute("INSERT INTO t VALUES (?)", (name,))
        ran.append(name)
        if ran.count(name) == 1:
            started.arrive()
            await conn.execute_fetchall(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                "WHERE i < 2000000000) SELECT count(*) FROM n")
    return op


async def test_an_urgent_write_interrupts_a_group_mid_write_and_the_group_runs_again(
        committer: GroupCommitter, tmp_path: Path) -> None:
    """A takeover's claim waits for no write in progress: the group's
    statement is interrupted, the group rolled back, the claim committed, and
    then every write of the group stored once, none lost."""
    ran: list[str] = []
    busy, in_w1 = Gate(), Gate()

    async def held(conn: aiosqlite.Connection) -> None:  # keeps the writer busy
        busy.wait()

    first = asyncio.ensure_future(committer.submit(held))
    await busy.reached.wait()
    group = [asyncio.ensure_future(committer.submit(insert("w0", ran))),
             asyncio.ensure_future(committer.submit(long_statement(ran, "w1", in_w1))),
             asyncio.ensure_future(committer.submit(insert("w2", ran)))]
    await asyncio.sleep(0)
    busy.open()
    await asyncio.wait_for(in_w1.reached.wait(), 10)  # the group is in w1's long statement
    claim = committer.submit(insert("claim", ran), urgent=True)
    await asyncio.wait_for(claim, 10)  # the statement alone would take minutes
    await asyncio.wait_for(asyncio.gather(first, *group), 10)
    assert ran == ["w0", "w1", "claim", "w0", "w1", "w2"]
    assert committer.preempted == 1
    async with aiosqlite.connect(tmp_path / "db.sqlite3") as reader:
        names = sorted(row[0] for row in await reader.execute_fetchall("SELECT name FROM t"))
    assert names == ["claim", "w0", "w1", "w2"]  # the interrupted run left nothing


async def test_the_owner_rereads_its_mirrors_after_a_rollback(tmp_path: Path) -> None:
    conn = await aiosqlite.connect(tmp_path / "db.sqlite3", isolation_level=None)
    await conn.execute("CREATE TABLE t (name TEXT UNIQUE)")
    reread: list[int] = []

    async def reread_mirror(c: aiosqlite.Connection) -> None:
        reread.append(len(await c.execute_fetchall("SELECT name FROM t")))

    committer = GroupCommitter(conn, after_rollback=reread_mirror)
    committer.start()
    try:
        await committer.submit(insert("a", []))
        assert reread == []
        with pytest.raises(Unavailable):
            await committer.submit(insert("a", []))  # violates UNIQUE: rolled back
        assert reread == [1]  # read after the rollback: the committed row only
    finally:
        await committer.close()
        await conn.close()


def wal_progress(db: Path) -> tuple[int, int]:
    """(frames in the write-ahead log, frames of them copied back into the
    file), from the WAL index SQLite shares between connections (``-shm``):
    ``mxFrame`` at byte 16 of its header, ``nBackfill`` at byte 96 (after the
    header's two copies), native byte order. Read from the file because
    ``PRAGMA wal_checkpoint`` would itself copy the log back."""
    header = db.with_name(db.name + "-shm").read_bytes()[:100]
    (frames,) = struct.unpack_from("=I", header, 16)
    (copied,) = struct.unpack_from("=I", header, 96)
    return frames, copied


def fill(pages: int) -> Callable[[aiosqlite.Connection], Awaitable[None]]:
    """A write of about ``pages`` new database pages."""
    async def op(conn: aiosqlite.Connection) -> None:
        await conn.executemany("INSERT INTO t VALUES (?)",
                               ((f"{i:08d}" + "x" * 4000,) for i in range(pages)))
    return op


async def test_the_log_is_copied_back_between_groups_not_inside_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite would copy the write-ahead log back inside the COMMIT that takes
    it past 1,000 pages; the committer turns that off and copies it itself,
    between groups, on its own connection."""
    monkeypatch.setattr(groupcommit, "CHECKPOINT_EVERY_S", 3600.0)
    path = tmp_path / "db.sqlite3"
    conn = await aiosqlite.connect(path, isolation_level=None)
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("CREATE TABLE t (name TEXT)")
    checkpoints = await aiosqlite.connect(path, isolation_level=None)
    committer = GroupCommitter(conn, checkpoint_conn=checkpoints)
    committer.start()
    try:
        await committer.submit(fill(1_500))
        frames, copied = wal_progress(path)
        assert frames > 1_000 and copied == 0, (frames, copied)  # not inside the COMMIT
        monkeypatch.setattr(groupcommit, "CHECKPOINT_EVERY_S", 0.0)
        await committer.submit(insert("window", []))
        await committer.flush()  # the copy runs after the group, before the next one
        frames, copied = wal_progress(path)
        assert frames > 1_000 and copied == frames, (frames, copied)
        assert committer.checkpoints >= 1
    finally:
        await committer.close()
        await checkpoints.close()
        await conn.close()


class HeldCopy:
    """A checkpoint connection whose copy lasts until released: a long copy
    of the log (its file sync cannot be interrupted), in miniature."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def execute_fetchall(self, sql: str) -> list[tuple[int, int, int]]:
        assert sql == "PRAGMA wal_checkpoint(PASSIVE)"
        self.started.set()
        await self.release.wait()
        return [(0, 0, 0)]


async def test_an_urgent_write_goes_ahead_beside_a_copy_of_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover's claim does not wait for the log being copied back; an
    ordinary write does (the copy runs between groups)."""
    monkeypatch.setattr(groupcommit, "CHECKPOINT_EVERY_S", 0.0)
    conn = await aiosqlite.connect(tmp_path / "db.sqlite3", isolation_level=None)
    await conn.execute("CREATE TABLE t (name TEXT)")
    copy = HeldCopy()
    committer = GroupCommitter(conn, checkpoint_conn=cast(aiosqlite.Connection, copy))
    committer.start()
    try:
        order: list[str] = []
        first = asyncio.ensure_future(committer.submit(insert("first", order)))
        await asyncio.wait_for(copy.started.wait(), 10)  # the copy after the first group
        queued = asyncio.ensure_future(committer.submit(insert("queued", order)))
        await asyncio.wait_for(committer.submit(insert("claim", order), urgent=True), 10)
        assert order == ["first", "claim"] and not queued.done()
        copy.release.set()
        await asyncio.wait_for(asyncio.gather(first, queued), 10)
        assert order == ["first", "claim", "queued"]
    finally:
        copy.release.set()
        await committer.close()
        await conn.close()
