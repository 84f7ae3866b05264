"""Keyed state as window deltas compacted into a base, on a real SQLite file:
delta capture, compaction, restore from base + deltas, and crashes (SIGKILL of
a real process) between a delta and its compaction and in the middle of one."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridstream.codec import pack, row_json, unpack
from gridstream.errors import StaleEpoch
from gridstream.jobspec import Stage
from gridstream.statewindows import StateWindowRead, StoredState, state_messages
from gridstream.v1 import stateserver_pb2 as pb
from services.stateserver.entryforms import (
    DELTA_CHUNK_ENTRIES,
    newest_values,
    packed_chunks,
    unpack_chunk,
)
from services.stateserver.layout import ChunkUnreadable, Entry, MissingParent, StateWindow
from services.stateserver.rows import decode_state_entries
from services.stateserver.stateresults import read_state_rows
from services.stateserver.statewire import receive_window
from services.stateserver.store import SnapshotStore
from services.worker.operators import DELETED, OperatorChain
from services.worker.snapshots import apply_stored, pack_changes
from tests.unit.writer_gate import Gate

JOB = "job-1"
OP = "job-1/t0/p0"
ROOT = Path(__file__).resolve().parents[2]


def keep_or_drop(state: Any, value: Any) -> tuple[Any, list[Any]]:
    """A stateful stage: adds the value, or deletes the key on None."""
    if value is None:
        return None, []
    return (state or 0) + value, []


def chain() -> OperatorChain:
    return OperatorChain([Stage("sum", "stateful", f"{__name__}:keep_or_drop", key="m:k"),
                          Stage("sink", "sink")], "test")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    async with SnapshotStore(tmp_path / "state.sqlite3", max_deltas=3) as opened:
        yield opened


async def window_of(c: OperatorChain, window: int, parent: int | None) -> StateWindow:
    """What a worker sends for its current window, as the store receives it
    (its PutState messages through the server's own receive_window: a delta
    checked and kept as its chunks, a whole state decoded into entries)."""
    changes = c.capture_delta() if parent is not None else c.capture_full()
    chunks = await pack_changes(changes, chunk_entries=7)
    first, *rest = await state_messages(JOB, OP, window, 1, parent, pack({"offset": window}),
                                        chunks)

    async def stream() -> AsyncIterator[pb.StateChunk]:
        for message in rest:
            yield message

    received = await receive_window(first, stream())
    decoded = [e for data, count in chunks for e in decode_state_entries(data, count)]
    if parent is None:
        assert received.entries == decoded and received.entries_size is None
    else:
        assert received.entries == [] and received.chunks == [c for c in chunks if c[1]]
        assert received.entries_size == sum(len(k) + (0 if v is None else len(v))
                                            for _, k, v in decoded)
    return received


async def read(store: SnapshotStore, after: int | None = None,
               chunk_entries: int = 5) -> StoredState | None:
    """The store's state as a worker receives it (native entries), in chunks
    of ``chunk_entries`` (small, so the tests' few keys span several)."""
    windows: list[StateWindowRead] = []
    ended = True
    async for chunk in store.states.read(JOB, OP, after, chunk_entries=chunk_entries):
        if ended:
            windows.append(StateWindowRead(chunk.window, chunk.parent, chunk.header))
        windows[-1].chunks.append(chunk.entries)
        ended = chunk.window_end
    return StoredState(windows[-1].window, windows[-1].header, windows) if windows else None


async def restored(store: SnapshotStore, chunk_entries: int = 5) -> dict[Any, Any]:
    stored = await read(store, chunk_entries=chunk_entries)
    assert stored is not None
    c = chain()
    await apply_stored(c, stored)
    return c.states["sum"]


def test_a_window_captures_only_the_keys_it_touched() -> None:
    c = chain()
    c.process(["a", "b", "c"], [1, 2, 3], "b#1")
    assert c.capture_delta() == {"sum": {"a": 1, "b": 2, "c": 3}}
    c.process(["b", "c"], [5, None], "b#2")  # b written, c deleted
    assert c.capture_delta() == {"sum": {"b": 7, "c": DELETED}}
    assert c.capture_delta() == {}  # an idle window carries nothing
    assert c.capture_full() == {"sum": {"a": 1, "b": 7}}


async def test_deltas_chain_onto_a_base_and_restore_the_same_state(
        store: SnapshotStore) -> None:
    store.states.auto_compact = False
    c = chain()
    c.process([f"k{i}" for i in range(20)], list(range(20)), "b#1")
    assert await store.states.put(await window_of(c, 0, None))
    c.process(["k1", "k2", "new"], [100, None, 5], "b#2")
    assert await store.states.put(await window_of(c, 1, 0))
    c.process(["k1"], [None], "b#3")
    delta = await window_of(c, 2, 1)
    assert delta.chunks is not None
    assert sum(count for _, count in delta.chunks) == 1  # bytes follow the keys touched
    assert await store.states.put(delta)
    assert await store.states.put(delta) is False  # a retry is a no-op
    stored = await read(store)
    assert stored is not None and stored.window == 2 and unpack(stored.header) == {"offset": 2}
    assert [w.parent for w in stored.windows] == [None, 0, 1]
    assert await restored(store) == c.states["sum"]
    # A reader holding window 1 gets only what came after it.
    after = await read(store, after=1)
    assert after is not None and [w.window for w in after.windows] == [2]


async def test_compaction_folds_into_the_base_and_bounds_the_deltas(
        store: SnapshotStore) -> None:
    c = chain()
    c.process(["a", "b"], [1, 2], "b#0")
    await store.states.put(await window_of(c, 0, None))
    for window in range(1, 12):
        c.process([f"k{window}", "a", f"k{window - 1}"], [window, 1, None], f"b#{window}")
        await store.states.put(await window_of(c, window, window - 1))
    await asyncio.sleep(0.1)  # the compactor runs in the background
    await store.states.compact(JOB, OP)
    head = await store.states.head(JOB, OP)
    assert head is not None and head.head_window == 11 and head.deltas == 1
    assert head.base_window == 10 and store.states.folds == 10
    assert await restored(store) == c.states["sum"] == {"a": 12, "b": 2, "k11": 11}


async def test_a_delta_without_its_parent_is_refused_and_stores_nothing(
        store: SnapshotStore) -> None:
    c = chain()
    c.process(["a"], [1], "b#0")
    with pytest.raises(MissingParent, match="holds no state"):
        await store.states.put(await window_of(c, 5, 4))
    await store.states.put(await window_of(c, 0, None))
    c.process(["a"], [1], "b#1")
    with pytest.raises(MissingParent, match="missing parent window 4"):
        await store.states.put(await window_of(c, 5, 4))
    head = await store.states.head(JOB, OP)
    assert head is not None and head.head_window == 0


async def test_a_new_owner_claims_the_operator_and_its_history_wins(
        store: SnapshotStore) -> None:
    old = chain()
    old.process(["a"], [1], "b#0")
    await store.states.put(await window_of(old, 0, None))
    old.process(["a"], [1], "b#1")
    await store.states.put(await window_of(old, 1, 0))
    # The new owner (epoch 3) claims the operator and restores window 1 ...
    head = await store.states.head(JOB, OP, claim_epoch=3)
    assert head is not None and head.head_window == 1
    new = chain()
    stored = await read(store)
    assert stored is not None
    await apply_stored(new, stored)
    # ... after which the old owner can no longer write.
    old.process(["a"], [1], "b#2")
    with pytest.raises(StaleEpoch):
        await store.states.put(await window_of(old, 2, 1))
    # A window the old owner stored after the new one read is dropped by the
    # new owner's first delta, which continues from what it restored.
    await store.states.put(StateWindow(JOB, OP, 2, 1, 1, b"", [("sum", pack("zombie"),
                                                                  pack(1))]), fenced=False)
    new.process(["b"], [1], "b#2'")
    window = await window_of(new, 3 << 20, 1)
    assert await store.states.put(replace(window, epoch=3))
    assert await restored(store) == {"a": 2, "b": 1}
    with pytest.raises(StaleEpoch):
        await store.states.head(JOB, OP, claim_epoch=2)


async def test_a_copy_overtaken_by_the_owners_writes_puts_back_nothing(
        store: SnapshotStore) -> None:
    """Catch-up decides to copy from a digest, then reads the peer; the owner
    writes on meanwhile. A whole state copied once this replica's head has
    reached the copy's newest window must not put back the older head: that
    dropped an acknowledged window here, and the owner's next delta was
    refused for a missing parent."""
    store.states.auto_compact = False
    c = chain()
    c.process(["a", "b"], [1, 2], "b#0")
    base = await window_of(c, 0, None)
    assert await store.states.put(base)
    c.process(["a"], [10], "b#1")
    first = await window_of(c, 1, 0)
    assert await store.states.put(first)
    c.process(["b"], [20], "b#2")
    assert await store.states.put(await window_of(c, 2, 1))  # the owner's, acknowledged
    # The peer's copy as read before: a whole state at window 0 and the delta of window 1.
    assert await store.states.put_copy([base, first]) == 0
    head = await store.states.head(JOB, OP)
    assert head is not None and head.head_window == 2
    assert await restored(store) == c.states["sum"] == {"a": 11, "b": 22}
    c.process(["a"], [100], "b#3")
    assert await store.states.put(await window_of(c, 3, 2))  # chains on what it acknowledged
    # A copy newer than what is held is still taken whole.
    whole = StateWindow(JOB, OP, 4, 1, None, pack({"offset": 4}),
                        [("sum", pack("a"), pack(7))])
    assert await store.states.put_copy([whole]) == 1
    assert await restored(store) == {"a": 7}


async def test_holdings_and_cleanup_cover_the_state(store: SnapshotStore) -> None:
    c = chain()
    c.process(["a"], [1], "b#0")
    await store.states.put(await window_of(c, 0, None))
    assert [h.state_window for h in await store.holdings(JOB)] == [0]
    assert await store.job_ids() == [JOB]
    await store.drop_operator(JOB, OP)
    assert await store.holdings(JOB) == []
    assert await read(store) is None


BIG_READ_CHUNK = 5_000
"""Entries per chunk when reading back the crash test's 60,000 keys and three
deltas (in chunks of 5, each of its seven reads took 3.4 s)."""

_WRITER = textwrap.dedent("""
    import asyncio, os, signal, sys
    from gridstream.codec import pack
    from services.stateserver.layout import StateWindow
    from services.stateserver.store import SnapshotStore

    async def main(path: str, mode: str) -> None:
        store = await SnapshotStore(path, max_deltas=1).open()
        if mode == "write":
            store.states.auto_compact = False
            base = [("sum", pack(f"k{i}"), pack(i)) for i in range(60_000)]
            await store.states.put(StateWindow("job-1", "job-1/t0/p0", 0, 1, None, b"h0", base))
            for w in range(1, 4):
                delta = [("sum", pack(f"k{i}"), pack(i * w)) for i in range(0, 60_000, 2)]
                delta.append(("sum", pack(f"k{w}"), None))
                await store.states.put(StateWindow("job-1", "job-1/t0/p0", w, 1, w - 1,
                                                   f"h{w}".encode(), delta))
        else:
            print("folding", flush=True)
            await store.states.compact("job-1", "job-1/t0/p0")
            print("folded", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no close: a crash

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def expected_after_crash() -> dict[str, int]:
    state = {f"k{i}": i for i in range(60_000)}
    for w in range(1, 4):
        state.update({f"k{i}": i * w for i in range(0, 60_000, 2)})
        state.pop(f"k{w}", None)
    return state


def run_writer(path: Path, mode: str, kill_after_s: float | None = None) -> int:
    """Runs the writer in a real process; SIGKILLs it after ``kill_after_s``."""
    process = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), mode], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kill_after_s is not None:
        assert process.stdout is not None
        process.stdout.readline()  # "folding"
        try:
            process.wait(kill_after_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
    process.wait(60)
    return process.returncode


async def test_a_crash_between_deltas_and_their_compaction_restores_correctly(
        tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    assert run_writer(path, "write") == -signal.SIGKILL
    expected = expected_after_crash()
    async with SnapshotStore(path, max_deltas=1) as store:
        head = await store.states.head(JOB, OP)
        assert head is not None and (head.base_window, head.head_window) == (0, 3)
        assert await restored(store, BIG_READ_CHUNK) == expected
    # Killed in the middle of a fold (or just before or after it): the fold is
    # one transaction, so the state reads the same whatever the moment.
    for kill_after_s in (0.0, 0.02, 0.05, 0.1, 5.0):
        run_writer(path, "compact", kill_after_s)
        async with SnapshotStore(path, max_deltas=1) as store:
            store.states.auto_compact = False
            head = await store.states.head(JOB, OP)
            assert head is not None and head.head_window == 3
            assert await restored(store, BIG_READ_CHUNK) == expected, kill_after_s
    async with SnapshotStore(path, max_deltas=1) as store:
        await store.states.compact(JOB, OP)
        head = await store.states.head(JOB, OP)
        assert head is not None and (head.base_window, head.deltas) == (2, 1)
        assert await restored(store, BIG_READ_CHUNK) == expected


def put_window(window: int, entries: dict[str, int | None]) -> StateWindow:
    """A delta on top of ``window - 1`` (a whole state for window 0) setting
    each key to its value, or deleting it on None."""
    return StateWindow(JOB, OP, window, 1 + window, window - 1 if window else None,
                       pack({"offset": window}),
                       [("sum", pack(k), None if v is None else pack(v))
                        for k, v in entries.items()])


async def held(store: SnapshotStore) -> tuple[list[int], dict[str, int]]:
    """(windows read, base first; the state they add up to)."""
    windows: list[int] = []
    state: dict[str, int] = {}
    async for chunk in store.states.read(JOB, OP):
        if not windows or windows[-1] != chunk.window:
            windows.append(chunk.window)
        for entry in unpack(chunk.entries):
            if len(entry) == 3:
                state[entry[1]] = entry[2]
            else:
                state.pop(entry[1], None)
    return windows, state


async def fold_transactions(store: SnapshotStore, keep: int = 1) -> int:
    """Compacts the chain; how many transactions that took (the last one
    finds nothing left to fold)."""
    committer = store._commit()
    before = committer.commits
    await store.states.compact(JOB, OP, keep)
    return committer.commits - before


async def test_a_fold_writes_each_key_once_with_its_newest_value(
        store: SnapshotStore) -> None:
    store.states.auto_compact = False
    await store.states.put(put_window(0, {"a": 0, "b": 0, "c": 0, "gone": 0}))
    await store.states.put(put_window(1, {"a": 1, "b": 1, "c": None, "d": 1}))
    await store.states.put(put_window(2, {"b": None, "c": 2, "gone": None}))
    await store.states.put(put_window(3, {"a": 3, "d": None}))
    await store.states.put(put_window(4, {"e": 4}))
    expected = {"a": 3, "c": 2, "e": 4}
    assert (await held(store))[1] == expected
    # Windows 1..3 in one transaction (and one that finds nothing to fold).
    assert await fold_transactions(store) == 2
    assert store.states.folds == 3
    windows, state = await held(store)
    assert windows == [3, 4] and state == expected
    base = {unpack(e[1]): unpack(e[2]) async for e in base_rows(store)}
    # a: written in 1 and 3 -> 3's value; b: written then deleted -> absent;
    # c: deleted then written again -> the later value; d: new then deleted.
    assert base == {"a": 3, "c": 2}
    head = await store.states.head(JOB, OP)
    assert head is not None and (head.base_window, head.head_window, head.deltas) == (3, 4, 1)
    first = await anext(aiter(store.states.read(JOB, OP)))
    assert (first.window, first.epoch, unpack(first.header)) == (3, 4, {"offset": 3})


async def test_a_delta_is_stored_as_the_chunks_it_came_in_and_read_in_their_order(
        store: SnapshotStore) -> None:
    # A delta keeps the chunks of its PutState as they came (a row each,
    # nothing stored per key); readers apply them in order, so a key that
    # two chunks carry keeps the later chunk's value: in a restore, in the
    # results read from state and in a fold.
    store.states.auto_compact = False
    await store.states.put(put_window(0, {"a": 0, "b": 0, "c": 0}))
    first = [["sum", pack("a"), pack(1)], ["sum", pack("b")]]  # b deleted
    second = [["sum", pack("a"), pack(2)], ["sum", pack("b"), pack(5)],
              ["sum", pack("d"), pack(4)]]
    chunks = [(pack(first), 2), (pack(second), 3)]
    entries = [e for blob, count in chunks for e in decode_state_entries(blob, count)]
    assert await store.states.put(
        StateWindow(JOB, OP, 1, 2, 0, pack({"offset": 1}), entries, chunks))
    stored = await store._read().execute_fetchall(
        'SELECT chunk, entries, count FROM state_delta_chunks WHERE job_id = ? AND '
        "operator_id = ? ORDER BY chunk", (JOB, OP))
    assert [(n, bytes(blob), count) for n, blob, count in stored] == [
        (0, chunks[0][0], 2), (1, chunks[1][0], 3)]
    expected = {"a": 2, "b": 5, "c": 0, "d": 4}
    assert (await held(store))[1] == expected  # native form, as a worker restores
    read = [c async for c in store.states.read(JOB, OP, after=0, packed=True)]
    assert [c.entries for c in read] == [chunks[0][0], chunks[1][0]]  # as they came
    assert [(c.window, c.window_end, bool(c.header)) for c in read] == [
        (1, False, True), (1, True, False)]  # the header on the first, the end on the last
    rows = {key: value async for chunk in read_state_rows(store.path, JOB, [("sum", "")],
                                                          10, 1 << 20)
            for key, value, _ in chunk}
    assert rows == {key: row_json(value) for key, value in expected.items()}
    assert await store.states.compact(JOB, OP, keep=0) == 1
    assert {unpack(e[1]): unpack(e[2]) async for e in base_rows(store)} == expected
    assert not await store._read().execute_fetchall("SELECT 1 FROM state_delta_chunks")


async def test_a_delta_that_changed_no_key_reads_back_as_one_empty_ended_chunk(
        store: SnapshotStore) -> None:
    # A window in which no key changed still moves the offsets: its header
    # must come back, in one chunk that ends the window, in both forms.
    store.states.auto_compact = False
    await store.states.put(put_window(0, {"a": 0}))
    await store.states.put(put_window(1, {}))
    for packed in (True, False):
        read = [c async for c in store.states.read(JOB, OP, after=0, packed=packed)]
        assert [(c.window, c.count, c.window_end, unpack(c.header)) for c in read] == [
            (1, 0, True, {"offset": 1})]
        assert unpack(read[0].entries) == []


def test_a_delta_that_did_not_come_packed_is_cut_into_chunks_that_read_back_whole() -> None:
    # A peer's copy arrives decoded and is packed again, DELTA_CHUNK_ENTRIES
    # entries a chunk: every entry comes back, in order, a delete included.
    entries: list[Entry] = [("s", pack(i), pack(i * 2)) for i in range(DELTA_CHUNK_ENTRIES + 2)]
    entries[-1] = ("s", pack("gone"), None)
    chunks = packed_chunks(entries)
    assert [count for _, count in chunks] == [DELTA_CHUNK_ENTRIES, 2]
    assert [e for blob, _ in chunks for e in unpack_chunk(blob)] == entries
    assert newest_values(((7, n, blob) for n, (blob, _) in enumerate(chunks)),
                         OP)[("s", pack("gone"))] is None


async def test_a_stored_chunk_damaged_on_disk_is_refused_as_data_loss_naming_it(
        tmp_path: Path) -> None:
    # Entries are checked on arrival; a chunk that no longer reads as entries
    # was damaged on disk since. Every reader of it (a restore, results from
    # state, a fold) refuses it as DATA_LOSS naming the operator, window and
    # chunk, so a reader goes to another replica, and the fold keeps the chain.
    path = tmp_path / "state.sqlite3"
    async with SnapshotStore(path, max_deltas=3) as opened:
        opened.states.auto_compact = False
        await opened.states.put(put_window(0, {"a": 0}))
        await opened.states.put(put_window(1, {"a": 1, "b": 2}))
    with sqlite3.connect(path) as conn:  # damage the stored bytes behind the store's back
        changed = conn.execute('UPDATE state_delta_chunks SET entries = ? WHERE "window" = 1',
                               (b"\xc1not msgpack",)).rowcount
    assert changed == 1
    named = rf"{OP}: chunk 0 of stored window 1 no longer reads as state entries"
    async with SnapshotStore(path, max_deltas=3) as reopened:
        reopened.states.auto_compact = False
        with pytest.raises(ChunkUnreadable, match=named):
            await held(reopened)
        with pytest.raises(ChunkUnreadable, match=named):
            [chunk async for chunk in read_state_rows(path, JOB, [("sum", "")], 10, 1 << 20)]
        with pytest.raises(ChunkUnreadable, match=named):
            await reopened.states.compact(JOB, OP, keep=0)
        assert len(list(await reopened._read().execute_fetchall(
            "SELECT 1 FROM state_delta_chunks"))) == 1  # the fold left the chain as it was


async def base_rows(store: SnapshotStore) -> AsyncIterator[Any]:
    """The base's rows as stored (stage, key, value)."""
    rows = await store._read().execute_fetchall(
        "SELECT stage, key, value FROM state_entries WHERE job_id = ? AND operator_id = ?",
        (JOB, OP))
    for row in rows:
        yield row


async def test_the_fold_budget_splits_a_long_chain_into_a_few_transactions(
        store: SnapshotStore) -> None:
    store.states.auto_compact = False
    store.states.fold_entries = 6
    await store.states.put(put_window(0, {"a": 0}))
    expected: dict[str, int] = {"a": 0}
    for window in range(1, 9):
        entries: dict[str, int | None] = {"a": window, f"k{window}": window}
        if window > 1:
            entries[f"k{window - 1}"] = None
        await store.states.put(put_window(window, entries))
        expected = {k: v for k, v in {**expected, **entries}.items() if v is not None}
    # Deltas 1..7 (2, then 3 entries each) fold as [1, 2], [3, 4], [5, 6],
    # [7]: one transaction each, and one that finds nothing left; the newest
    # (8) stays apart.
    assert await fold_transactions(store) == 5
    assert store.states.folds == 7
    windows, state = await held(store)
    assert windows == [7, 8] and state == expected == {"a": 8, "k8": 8}
    # A delta over the budget on its own is still folded, alone.
    store.states.fold_entries = 1
    await store.states.put(put_window(9, {"a": 9, "b": 9}))
    await store.states.put(put_window(10, {"b": None}))
    assert await fold_transactions(store, keep=0) == 4
    assert store.states.folds == 10
    windows, state = await held(store)
    assert windows == [10] and state == {"a": 9, "k8": 8}


async def test_a_window_of_values_over_a_kilobyte_costs_no_overflow_page_per_key(
        tmp_path: Path) -> None:
    # A key whose value grows with every record (a track) is rewritten in
    # every window. Its delta entries must stay in the table's leaves, two
    # 2 kB values to a 4 kB page; an overflow page per value would double
    # the pages (and the bytes) every window writes.
    path = tmp_path / "state.sqlite3"
    keys, size = 400, 2_000
    async with SnapshotStore(path) as store:
        store.states.auto_compact = False
        await store.states.put(StateWindow("j", "j/1/0", 1, 1, None, b"h", []), fenced=False)
        before = await _pages(store)
        entries = [("track", pack(f"device-{k}"), b"x" * size) for k in range(keys)]
        await store.states.put(StateWindow("j", "j/1/0", 2, 1, 1, b"h", entries),
                               fenced=False)
        grown = await _pages(store) - before
    data_pages = keys * size / 4096
    assert grown <= 1.3 * data_pages, (grown, data_pages)


async def _pages(store: SnapshotStore) -> int:
    async def count(conn: Any) -> int:
        rows = list(await conn.execute_fetchall("PRAGMA page_count"))
        return int(rows[0][0])
    return await store._commit().submit(count)


async def test_a_retry_of_a_window_being_stored_joins_its_write(store: SnapshotStore) -> None:
    """A caller that gave up leaves its window queued; a retry arriving
    meanwhile gets that write's outcome instead of storing it a second time,
    and a retry of a stored window is answered without its entries."""
    await store.states.put(put_window(0, {"a": 1}))
    gate = Gate()

    async def hold(_conn: Any) -> None:
        gate.wait()

    committer = store._commit()
    holding = asyncio.create_task(committer.submit(hold))
    try:
        await gate.reached.wait()
        first = asyncio.create_task(store.states.put(put_window(1, {"b": 2})))
        await asyncio.sleep(0)  # the put runs up to its wait for the writer
        assert (JOB, OP, 1) in store.states._writing
        first.cancel()  # its caller gave up: the write stays queued
        with pytest.raises(asyncio.CancelledError):
            await first
        retry = asyncio.create_task(store.states.earlier_outcome(JOB, OP, 1, epoch=2))
        await asyncio.sleep(0.05)
        assert not retry.done()  # it waits for the queued write, it does not store again
        writes_before = committer.writes
    finally:
        gate.open()
        await holding
    assert await retry is True
    assert committer.writes - writes_before == 2  # the held write, and the window once
    assert await held(store) == ([0, 1], {"a": 1, "b": 2})
    assert await store.states.earlier_outcome(JOB, OP, 1, epoch=2) is False  # stored
    assert await store.states.earlier_outcome(JOB, OP, 2, epoch=2) is None  # still to send
    with pytest.raises(StaleEpoch):
        await store.states.earlier_outcome(JOB, OP, 2, epoch=1)


async def test_a_window_runs_no_statement_that_would_change_nothing(
        store: SnapshotStore) -> None:
    """Each statement of a write is SQLite work in the writer's transaction,
    and a job's first windows all come at its drain: an operator's
    first whole state deletes nothing (it holds no rows), an empty window
    inserts no entries; a later whole state still replaces what was held."""
    store.states.auto_compact = False
    statements: list[str] = []
    assert store._writer is not None
    await store._writer.set_trace_callback(statements.append)
    c = chain()
    c.process(["a", "b"], [1, 2], "b#1")
    assert await store.states.put(await window_of(c, 0, None))
    assert not [s for s in statements if s.startswith("DELETE")]
    statements.clear()
    assert await store.states.put(await window_of(c, 1, 0))  # nothing touched: empty
    assert not [s for s in statements if "state_delta_chunks" in s]
    assert await restored(store) == {"a": 1, "b": 2}
    other = chain()  # a whole state replacing the chain: what it held goes
    other.process(["z"], [9], "b#9")
    statements.clear()
    assert await store.states.put(await window_of(other, 2, None))
    assert [s for s in statements if s.startswith("DELETE")]
    assert await restored(store) == {"z": 9}
    stored = await read(store)
    assert stored is not None and [w.window for w in stored.windows] == [2]
