"""SnapshotStore on a real SQLite file: idempotency, retention, integrity, group commit."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gridstream.codec import pack
from gridstream.errors import InvalidArgument, Unavailable
from gridstream.ids import checksum
from services.stateserver.layout import SnapshotCorrupted, SnapshotMeta
from services.stateserver.rows import (
    _scanned_size,
    decode_dead_letters,
    decode_rows,
    decode_state_entries,
    encode_entries,
    state_entries_size,
)
from services.stateserver.store import SnapshotStore
from tests.unit.writer_gate import Gate

JOB = "job-1"
OP = "job-1/t0/p0"


def meta_for(payload: bytes, window: int, operator_id: str = OP, job_id: str = JOB,
             epoch: int = 1) -> SnapshotMeta:
    return SnapshotMeta(job_id=job_id, operator_id=operator_id, window=window, epoch=epoch,
                        size=len(payload), checksum=checksum(payload))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    async with SnapshotStore(tmp_path / "state.sqlite3") as opened:
        yield opened


async def test_put_is_idempotent_and_first_copy_wins(store: SnapshotStore) -> None:
    first = b"state-a"
    assert await store.put_snapshot(meta_for(first, 1), first) is True
    assert await store.put_snapshot(meta_for(first, 1), first) is False
    other = b"state-b"
    assert await store.put_snapshot(meta_for(other, 1), other) is False
    latest = await store.get_latest_snapshot(JOB, OP)
    assert latest is not None and latest.payload == first
    assert len(await store.list_snapshots(JOB)) == 1


async def test_latest_is_the_highest_window(store: SnapshotStore) -> None:
    assert await store.get_latest_snapshot(JOB, OP) is None
    for window in (3, 1, 2):  # arrival order must not matter
        payload = f"w{window}".encode()
        await store.put_snapshot(meta_for(payload, window), payload)
    latest = await store.get_latest_snapshot(JOB, OP)
    assert latest is not None
    assert latest.meta.window == 3 and latest.payload == b"w3"
    assert await store.get_latest_snapshot(JOB, "job-1/t0/p9") is None


async def test_retention_keeps_newest_two_per_operator(store: SnapshotStore) -> None:
    other = "job-1/t0/p1"
    for window in range(1, 6):
        payload = f"w{window}".encode()
        await store.put_snapshot(meta_for(payload, window), payload)
    await store.put_snapshot(meta_for(b"x", 1, operator_id=other), b"x")
    metas = await store.list_snapshots(JOB)
    assert [(m.operator_id, m.window) for m in metas] == [(OP, 4), (OP, 5), (other, 1)]
    stats = await store.stats()
    assert stats.snapshots == 3 and stats.snapshot_bytes == 5
    # A late copy of an old window does not disturb the newest ones.
    await store.put_snapshot(meta_for(b"w1", 1), b"w1")
    assert [m.window for m in await store.list_snapshots(JOB, OP)] == [4, 5]


async def test_bad_checksum_or_size_is_refused_and_nothing_stored(store: SnapshotStore) -> None:
    payload = b"payload"
    bad = SnapshotMeta(JOB, OP, 1, 1, len(payload), checksum(b"something else"))
    with pytest.raises(InvalidArgument, match="checksum mismatch"):
        await store.put_snapshot(bad, payload)
    wrong_size = SnapshotMeta(JOB, OP, 1, 1, 3, checksum(payload))
    with pytest.raises(InvalidArgument, match="size"):
        await store.put_snapshot(wrong_size, payload)
    assert await store.list_snapshots(JOB) == []


async def test_corruption_on_disk_is_detected_on_read(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    async with SnapshotStore(path) as store:
        payload = b"good state" * 100
        await store.put_snapshot(meta_for(payload, 7), payload)
    with sqlite3.connect(path) as conn:  # flip the stored bytes behind the store's back
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("UPDATE snapshots SET payload = ? WHERE window = 7",
                     (b"evil state" * 100,))
    async with SnapshotStore(path) as store:
        with pytest.raises(SnapshotCorrupted, match="corrupt"):
            await store.get_latest_snapshot(JOB, OP)


async def test_delete_snapshots_by_operator_and_window(store: SnapshotStore) -> None:
    for op_id in (OP, "job-1/t1/p0"):
        for window in (1, 2):
            await store.put_snapshot(meta_for(b"s", window, operator_id=op_id), b"s")
    assert await store.delete_snapshots(JOB, OP, below_window=2) == 1
    assert await store.delete_snapshots(JOB, "job-1/t1/p0") == 2
    assert [(m.operator_id, m.window) for m in await store.list_snapshots(JOB)] == [(OP, 2)]
    assert await store.delete_snapshots(JOB) == 1
    assert await store.delete_snapshots("no-such-job") == 0


async def read_all(store: SnapshotStore, job_id: str, chunk_rows: int = 5_000
                   ) -> list[list[tuple[str, str]]]:
    return [[(key, value) for key, value, _version in chunk]
            async for chunk in store.read_results(job_id, chunk_rows)]


async def test_results_upsert_overwrites(store: SnapshotStore) -> None:
    await store.write_results(JOB, [("a", "1"), ("b", "2"), ("a", "3")])
    await store.write_results(JOB, [("b", '{"n": 4}')])
    assert await read_all(store, JOB) == [[("a", "3"), ("b", '{"n": 4}')]]
    assert await read_all(store, "unknown") == []


async def test_an_interrupt_landing_between_writes_stops_no_later_write(
        store: SnapshotStore) -> None:
    """The group committer interrupts the write connection while a takeover's
    claim waits, and sends the interrupt again every few milliseconds until
    the group gives way, so one can land when no statement runs. SQLite
    forgets it at the next statement only if no statement of the connection
    is still active: a row-returning PRAGMA whose cursor the store left open
    made that one interrupt fail every later write of the state server, for
    good (a job then never drained: "1 writes not yet durable")."""
    await store.flush()  # the writer task has set the connection up
    assert store._writer is not None
    await store._writer.interrupt()
    await store.write_results(JOB, [("a", "1")])
    await store.write_results(JOB, [("b", "2")])
    assert await read_all(store, JOB) == [[("a", "1"), ("b", "2")]]


async def test_results_are_chunked_in_key_order(store: SnapshotStore) -> None:
    rows = [(f"k{i:04d}", str(i)) for i in range(25)]
    rows.append(("", "empty key"))  # the empty string is a valid key and sorts first
    await store.write_results(JOB, rows)
    chunks = await read_all(store, JOB, chunk_rows=10)
    assert [len(chunk) for chunk in chunks] == [10, 10, 6]
    assert [row for chunk in chunks for row in chunk] == sorted(rows)


async def test_dead_letters_and_delete_job(store: SnapshotStore) -> None:
    await store.write_results(JOB, [("k", "1")], [("d1", "map", "'x'", "ValueError: x")])
    await store.write_results(JOB, [], [("d1", "map", "'x'", "ValueError: y")])
    await store.write_results("job-2", [("k", "2")])
    await store.put_snapshot(meta_for(b"s", 1), b"s")
    letters = [c async for c in store.read_dead_letters(JOB)]
    assert letters == [[("d1", "map", "'x'", "ValueError: y")]]
    await store.delete_job(JOB)
    assert await read_all(store, JOB) == []
    assert [c async for c in store.read_dead_letters(JOB)] == []
    assert await store.list_snapshots(JOB) == []
    assert await read_all(store, "job-2") == [[("k", "2")]]


async def test_group_commit_of_200_concurrent_writes_is_durable(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    async with SnapshotStore(path) as store:
        writes = [store.write_results(JOB, [(f"k{i:03d}", str(i))]) for i in range(100)]
        snaps = [store.put_snapshot(meta_for(b"p%d" % i, 1, operator_id=f"{JOB}/t0/p{i}"),
                                    b"p%d" % i) for i in range(100)]
        results = await asyncio.gather(*writes, *snaps)
        assert results[100:] == [True] * 100
        stats = await store.stats()
        assert stats.writes == 200
        assert stats.commits < 20, f"200 writes took {stats.commits} transactions"
    async with SnapshotStore(path) as reopened:
        rows = [row for chunk in await read_all(reopened, JOB) for row in chunk]
        assert rows == [(f"k{i:03d}", str(i)) for i in range(100)]
        assert len(await reopened.list_snapshots(JOB)) == 100


async def test_a_failing_write_does_not_fail_its_group(store: SnapshotStore) -> None:
    async def boom(conn: object) -> None:
        raise sqlite3.OperationalError("simulated disk error")

    committer = store._commit()  # the group is formed by the committer
    good = [store.write_results(JOB, [(f"k{i}", "1")]) for i in range(5)]
    outcomes = await asyncio.gather(*good, committer.submit(boom), return_exceptions=True)
    assert outcomes[:5] == [None] * 5
    assert isinstance(outcomes[5], Unavailable) and "simulated" in str(outcomes[5])
    assert len((await read_all(store, JOB))[0]) == 5


async def test_close_commits_or_refuses_every_write_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = await SnapshotStore(path).open()
    first = [asyncio.ensure_future(store.write_results(JOB, [(f"a{i:03d}", "1")]))
             for i in range(100)]
    await asyncio.sleep(0)  # the first wave is queued
    late = [asyncio.ensure_future(store.write_results(JOB, [(f"b{i:03d}", "1")]))
            for i in range(100)]
    await store.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*first, *late, return_exceptions=True), 5)
    assert outcomes[:100] == [None] * 100  # queued before close: committed
    assert all(o is None or isinstance(o, Unavailable) for o in outcomes[100:]), outcomes
    acked = {f"a{i:03d}" for i in range(100)} | {
        f"b{i:03d}" for i, o in enumerate(outcomes[100:]) if o is None}
    async with SnapshotStore(path) as reopened:
        assert {row[0] for chunk in await read_all(reopened, JOB) for row in chunk} == acked


async def test_closed_store_refuses_writes(tmp_path: Path) -> None:
    store = await SnapshotStore(tmp_path / "s.sqlite3").open()
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(Unavailable):
        await store.write_results(JOB, [("k", "v")])


def test_rows_wire_format_round_trip_and_errors() -> None:
    rows = [("a", "1"), ("b", "[2]")]
    assert decode_rows(encode_entries(rows), 2) == rows
    assert decode_rows(b"", 0) == []
    letters = [("id", "stage", "rec", "err")]
    assert decode_dead_letters(encode_entries(letters), 1) == letters
    with pytest.raises(InvalidArgument, match="row_count is 3"):
        decode_rows(encode_entries(rows), 3)
    with pytest.raises(InvalidArgument, match=r"rows\[0\] must be \[key: str"):
        decode_rows(pack([(1, "x")]), 1)
    with pytest.raises(InvalidArgument, match="not valid msgpack"):
        decode_rows(b"\xc1", 1)
    with pytest.raises(InvalidArgument, match=r"dead_letters\[0\]"):
        decode_dead_letters(pack([("a", "b")]), 1)


async def test_holdings_copy_marks_and_drop(store: SnapshotStore) -> None:
    """What replicas compare and copy: windows, result versions and fences per operator."""
    op = f"{JOB}/t0/p1"
    await store.put_snapshot(meta_for(b"seven", 7, op, epoch=3), b"seven")
    await store.write_results(JOB, [("a", "1")], operator_id=op, epoch=3, version=11)
    # A catch-up copy in chunks: the version mark moves only when told.
    await store.write_versioned(JOB, op, [("b", "2", 15)], [], track_version=False)
    [held] = await store.holdings(JOB)
    assert (held.operator_id, held.latest_window, held.results_version, held.epoch) == (
        op, 7, 11, 3)
    await store.mark(JOB, op, epoch=4, version=15)
    [held] = await store.holdings(JOB)
    assert (held.results_version, held.epoch) == (15, 4)
    rows = [r async for chunk, _ in store.read_operator(JOB, op, after_version=11)
            for r in chunk]
    assert rows == [("b", "2", 15)]
    assert await store.job_ids() == [JOB]
    assert await store.drop_operator(JOB, op) is True
    assert await store.holdings(JOB) == [] and await read_all(store, JOB) == []


async def test_hand_back_never_drops_a_write_it_did_not_compare(store: SnapshotStore) -> None:
    """A replica compares its holdings with the others', then drops its copy.
    A window, a row or a state window stored in between (a writer with an
    older routing table still counts this replica in its quorum) keeps the
    copy: the drop is checked in the deleting transaction."""
    await store.put_snapshot(meta_for(b"one", 1), b"one")
    [compared] = await store.holdings(JOB)
    await store.put_snapshot(meta_for(b"two", 2), b"two")
    assert await store.drop_operator(JOB, OP, unless_changed_from=compared) is False
    latest = await store.get_latest_snapshot(JOB, OP)
    assert latest is not None and latest.meta.window == 2
    [compared] = await store.holdings(JOB)
    await store.write_results(JOB, [("k", "v")], operator_id=OP, epoch=1, version=5)
    assert await store.drop_operator(JOB, OP, unless_changed_from=compared) is False
    [compared] = await store.holdings(JOB)
    assert await store.drop_operator(JOB, OP, unless_changed_from=compared) is True
    assert await store.holdings(JOB) == []


async def test_a_write_run_again_after_giving_way_to_a_claim_is_stored_whole(
        store: SnapshotStore) -> None:
    """A group interrupted for a takeover's claim is rolled back and run
    again. A write in it had already raised the store's fence mirror; the
    mirror is read again after the rollback, so the second run stores the
    operator's result version instead of taking it for stored."""
    op, other = f"{JOB}/t0/p1", f"{JOB}/t0/p2"
    busy, in_long = Gate(), Gate()
    runs: list[int] = []

    async def held(conn: Any) -> None:  # keeps the writer busy while the group queues
        busy.wait()

    async def long_first_run(conn: Any) -> None:  # a window's slow statement
        runs.append(1)
        if len(runs) == 1:
            in_long.arrive()
            await conn.execute_fetchall(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                "WHERE i < 2000000000) SELECT count(*) FROM n")

    committer = store._commit()
    first = asyncio.ensure_future(committer.submit(held))
    await busy.reached.wait()
    write = asyncio.ensure_future(
        store.write_results(JOB, [("a", "1")], operator_id=op, epoch=3, version=11))
    await asyncio.sleep(0)  # the write is queued first (tasks start in order)
    slow = asyncio.ensure_future(committer.submit(long_first_run))
    await asyncio.sleep(0)
    busy.open()
    await asyncio.wait_for(in_long.reached.wait(), 10)
    head = await asyncio.wait_for(store.states.head(JOB, other, claim_epoch=5), 10)
    assert head is None
    await asyncio.wait_for(asyncio.gather(first, write, slow), 10)
    assert committer.preempted == 1 and runs == [1, 1]
    held_now = {h.operator_id: (h.results_version, h.epoch) for h in await store.holdings(JOB)}
    assert held_now == {op: (11, 3), other: (0, 5)}


async def test_a_file_of_an_older_layout_is_refused_with_the_fix(tmp_path: Path) -> None:
    # A state server upgraded in place must not misread a file laid out by an
    # older gridstream: it refuses it, naming what to do, and leaves it alone.
    path = tmp_path / "state.sqlite3"
    async with SnapshotStore(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version=2")
    with pytest.raises(RuntimeError, match=r"layout 2, this one needs 4\); move it aside"):
        await SnapshotStore(path).open()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def state_chunk_variants(rng: random.Random) -> list[tuple[bytes, int]]:
    """PutState chunks, well formed and not: every way an entry can be
    wrong, cut short, with bytes changed, with data after it, miscounted."""
    good = [["s", pack(f"k{i}"), pack("v" * rng.choice([0, 3, 300, 70_000]))]
            for i in range(rng.randrange(1, 6))]
    if rng.random() < 0.3:
        good.append(["s", pack("gone")])  # a deleted key
    variants = [(pack(good), len(good)), (pack(good), len(good) + 1),
                (pack(good) + b"\x00", len(good)), (pack(good)[:-1], len(good)),
                (b"", 0), (b"", 1), (pack([]), 0), (pack({"a": 1}), 1)]
    for bad in (["s", "text key", b"v"], [1, b"k", b"v"], ["s", b"k", "text value"],
                ["s", b"k", b"v", b"x"], ["s"], "entry", ["s", b"k", None],
                ["s", b"k", [1]], [b"s", b"k", b"v"]):
        entries = [*good, bad]
        variants.append((pack(entries), len(entries)))
    blob = bytearray(pack(good))
    for _ in range(20):
        flipped = bytearray(blob)
        flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        variants.append((bytes(flipped), len(good)))
    return variants


def test_a_state_chunk_is_checked_without_decoding_its_values_as_strictly_as_decoded() -> None:
    # A delta is stored as its chunks came, so only their size is needed:
    # state_entries_size skips over the values, and must accept exactly what
    # decode_state_entries accepts, refuse the rest with its message, and
    # count the same bytes.
    rng = random.Random(5)
    accepted = refused = 0
    for _ in range(60):
        for data, count in state_chunk_variants(rng):
            try:
                decoded = decode_state_entries(data, count)
            except InvalidArgument as exc:
                with pytest.raises(InvalidArgument) as info:
                    state_entries_size(data, count)
                assert str(info.value) == str(exc)
                refused += 1
                continue
            assert state_entries_size(data, count) == sum(
                len(k) + (0 if v is None else len(v)) for _, k, v in decoded)
            accepted += 1
    assert accepted > 500 and refused > 500, (accepted, refused)
    # The skipping path itself takes the well-formed chunks (not the fallback).
    data = pack([["s", pack("k"), pack("v" * 300)], ["s", pack("gone")]])
    assert _scanned_size(data, 2) == len(pack("k")) + len(pack("v" * 300)) + len(pack("gone"))
    for wrong, count in ((data + b"\x00", 2), (data[:-1], 2), (data, 3),
                         (pack([["s", "k", pack("v")]]), 1)):
        with pytest.raises(Exception):  # noqa: B017 - any error sends it to the full decode
            _scanned_size(wrong, count)
