"""One task's side of tuple tracking: registration, contributions, what a
rebuild collects, lost batches and the retained-input bound."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest

from gridstream import rpc
from gridstream.routing import RoutingView
from gridstream.v1 import worker_pb2
from services.worker import trackers
from services.worker.tracker_layout import _layout, pack, unpack
from services.worker.trackers import RebuildRound, TrackerHost
from services.worker.tracking import TaskTracking

ROOT = 0xA1
CHILD_1, CHILD_2 = 0xB1, 0xB2


def tree_total(*tasks: TaskTracking) -> dict[int, int]:
    """What a rebuild computes: the XOR of every task's contributions."""
    out: dict[int, int] = {}
    for task in tasks:
        for root, value in task.contributions({ROOT}).items():
            out[root] = out.get(root, 0) ^ value
    return out


def test_a_source_registers_each_root_once() -> None:
    source = TaskTracking(is_source=True)
    source.retain(0, ROOT)
    source.retain(5, ROOT)  # a replay of the same root's batch
    assert source.registrations() == [ROOT]
    source.mark_registered([ROOT])
    assert source.registrations() == []
    assert source.contributions({ROOT}) == {ROOT: ROOT}


def test_downstream_tasks_do_not_register() -> None:
    sink = TaskTracking(is_source=False)
    sink.retain(0, ROOT)
    assert sink.registrations() == []


def test_contributions_of_a_whole_tree_cancel_out() -> None:
    source, sink = TaskTracking(is_source=True), TaskTracking(is_source=False)
    source.retain(0, ROOT)
    source.mark_registered([ROOT])
    source.processed(0, ROOT, [CHILD_1, CHILD_2])
    sink.retain(0, ROOT)
    sink.retain(1, ROOT)
    sink.processed(0, CHILD_1, [])
    sink.processed(1, CHILD_2, [])
    for task in (source, sink):
        task.mark_reported([o for o, _, _ in task.reportable(durable_offset=10)])
    assert tree_total(source, sink) == {ROOT: 0}
    # Without one child's report the tree is not complete.
    sink.reported.pop(1)
    assert tree_total(source, sink) == {ROOT: CHILD_2}


def test_only_batches_below_the_durable_offset_are_reported() -> None:
    task = TaskTracking(is_source=False)
    for offset in range(3):
        task.retain(offset, ROOT)
        task.processed(offset, 100 + offset, [])
    assert [o for o, _, _ in task.reportable(durable_offset=2)] == [0, 1]
    task.mark_reported([0, 1])
    # A rebuild counts reported contributions only: unreported ones come later.
    assert task.contributions({ROOT}) == {ROOT: 100 ^ 101}


def test_a_duplicate_batch_is_processed_but_reported_once() -> None:
    # at_least_once: after a recovery a container may hold a batch twice.
    sink = TaskTracking(is_source=False)
    sink.retain(0, ROOT)
    sink.retain(1, ROOT)
    sink.processed(0, CHILD_1, [])
    sink.processed(1, CHILD_1, [])
    assert [v for _, _, v in sink.reportable(durable_offset=2)] == [CHILD_1, 0]


def test_completed_roots_release_their_retained_batches() -> None:
    task = TaskTracking(is_source=True)
    task.retain(0, ROOT)
    task.retain(1, 0xA2)
    assert task.keep_from() == 0
    assert task.finished([ROOT]) == 1
    assert task.keep_from() == 1
    assert task.figures.roots_finished == 1
    assert task.roots_pending == 1


def test_a_report_acknowledged_after_completion_is_not_kept() -> None:
    task = TaskTracking(is_source=False)
    task.retain(0, ROOT)
    task.processed(0, 7, [])
    task.finished([ROOT])
    task.mark_reported([0])
    assert task.reported == {}


def test_restore_counts_snapshot_contributions_as_reported_and_asks_a_rebuild() -> None:
    before = TaskTracking(is_source=True)
    for offset in range(3):
        before.retain(offset, ROOT)
        before.processed(offset, 10 + offset, [20 + offset])
    saved = before.snapshot()
    after = TaskTracking(is_source=True)
    for offset in range(3):
        after.retain(offset, ROOT)
    after.restore(saved, snapshot_offset=2)
    assert sorted(after.reported) == [0, 1]  # offset 2 runs again after the restart
    assert after.contributed == {ROOT: {10, 11}}
    # Whether registrations reached the tracker is unknown: they count as sent,
    # and the restarted task asks for a rebuild, which counts them.
    assert after.registrations() == []
    assert after.reported_roots() == {ROOT}


def test_overdue_roots_are_asked_for_once_per_period() -> None:
    task = TaskTracking(is_source=True)
    task.retain(0, ROOT)
    start = task.since[ROOT]
    assert task.overdue(start + 1.0, timeout_s=1.0) == set()
    assert task.overdue(start + 2.5, timeout_s=1.0) == {ROOT}
    assert task.overdue(start + 3.0, timeout_s=1.0) == set()
    assert TaskTracking(is_source=False).overdue(start + 99, timeout_s=1.0) == set()



def test_a_source_restored_from_before_a_completion_still_completes_its_root() -> None:
    # The source's snapshot was taken while ROOT was pending; the tree then
    # completed (on a tracker host that has died since) and every task let
    # go of it. The restored source tracks ROOT again, and its new tracker
    # rebuilds it: the tasks' sum can never reach zero again, but a worker
    # that heard the completion says so, and the root finishes.
    source, sink = TaskTracking(is_source=True), TaskTracking(is_source=False)
    source.retain(0, ROOT)
    source.mark_registered([ROOT])
    source.processed(0, ROOT, [CHILD_1])
    source.mark_reported([0])
    saved = source.snapshot()
    sink.retain(0, ROOT)
    sink.processed(0, CHILD_1, [])
    sink.mark_reported([0])
    assert tree_total(source, sink) == {ROOT: 0}
    sink.finished([ROOT])
    restored = TaskTracking(is_source=True)
    restored.retain(0, ROOT)
    restored.restore(saved, snapshot_offset=1)
    assert tree_total(restored, sink) != {ROOT: 0}

    def answer(task: TaskTracking, known: list[int]) -> worker_pb2.TrackingEventsResponse:
        pairs = [x for r, v in task.contributions({ROOT}).items() for x in (r, v)]
        pending = [r for r in task.pending if task.is_source]
        return worker_pb2.TrackingEventsResponse(
            contributions=pack(pairs), complete=True, source_pending=pack(pending),
            known_completed=pack(known))

    roots = np.asarray([ROOT], dtype=np.uint64)
    unheard = RebuildRound.of(roots, [answer(restored, []), answer(sink, [])])
    assert unheard.values[ROOT] != 0 and unheard.finished() == []
    heard = RebuildRound.of(roots, [answer(restored, []), answer(sink, [ROOT])])
    assert heard.finished() == [ROOT]


def test_a_worker_remembers_the_completions_it_heard() -> None:
    # Nothing here reaches the routing view or a channel: no stub needed.
    host = TrackerHost("worker-1", RoutingView(cast(Any, None), 64), rpc.ChannelPool())
    host.heard_completed("job", np.asarray([ROOT, CHILD_1], dtype=np.uint64))
    assert host.known_completed("job", [ROOT, CHILD_2]).tolist() == [ROOT]
    assert host.known_completed("other-job", [ROOT]).size == 0
    assert host.known_completed("job", []).size == 0

def test_a_tracker_host_that_restarted_moves_its_roots() -> None:
    # Same node names, one host in a new process: its roots must be rebuilt.
    before = _layout(2, 16, ("worker-1", "worker-2"))
    before = replace(before, host_incarnations=("a", "b"))
    same = replace(before, host_incarnations=("a", "b"))
    restarted = replace(before, host_incarnations=("a2", "b"))
    roots = {int(r) for r in np.random.default_rng(5).integers(1, 2**63, 200)}
    assert before.same_hosts(same) and not before.moved(same, roots)
    assert not before.same_hosts(restarted)
    ids = np.fromiter(roots, dtype=np.uint64)
    on_tracker_0 = {int(r) for r in ids[before.trackers_of(ids) == 0]}
    assert on_tracker_0 and on_tracker_0 != roots
    assert before.moved(restarted, roots) == on_tracker_0


def test_a_task_whose_log_copies_died_keeps_its_snapshot_contributions() -> None:
    # Every copy of the sink's log died (more failures than backup_count), but
    # its snapshot covers the processed batch: the contribution is still owed
    # to the root's rebuild, or a complete tree would look lost.
    sink = TaskTracking(is_source=False)
    sink.retain(0, ROOT)
    sink.processed(0, CHILD_1, [])
    sink.mark_reported([0])
    restored = TaskTracking(is_source=False)
    restored.restore(sink.snapshot(), snapshot_offset=1)  # an empty container
    assert restored.contributions({ROOT}) == {ROOT: CHILD_1}
    assert restored.reported_roots() == {ROOT}
    assert restored.snapshot() == sink.snapshot()  # carried into its next window
    assert restored.keep_from() is None  # nothing to keep in the container for it
    assert restored.finished([ROOT]) == 1 and restored.contributions({ROOT}) == {}
    # A source that no longer holds its batch lets the root go: a rebuild
    # then finds no source holding it and finishes it.
    source = TaskTracking(is_source=True)
    source.retain(0, ROOT)
    source.mark_registered([ROOT])
    source.processed(0, ROOT, [CHILD_1])
    source.mark_reported([0])
    again = TaskTracking(is_source=True)
    again.restore(source.snapshot(), snapshot_offset=1)
    assert again.pending == {} and again.contributions({ROOT}) == {}


def test_a_table_made_before_the_job_timeout_was_known_is_rebuilt_with_it() -> None:
    # A rebuild asked of a worker that had just restarted made the job's table
    # with the cluster default (30 s). Sources ask again for an overdue root at
    # twice the job's own timeout (4 s here), and each request rebuilt the
    # root before it could time out: never abandoned, never drained.
    host = TrackerHost("worker-1", RoutingView(cast(Any, None), 64), rpc.ChannelPool())
    early = host._table("job", 0)
    assert early.timeout_s == 30.0
    early.xor(np.asarray([ROOT], dtype=np.uint64), np.asarray([CHILD_1], dtype=np.uint64))
    host.set_timeout("job", 2.0)
    assert ("job", 0) not in host.tables
    assert host._rebuilds[("job", 0)].roots == {ROOT}  # rebuilt into the right table
    assert host._table("job", 0).timeout_s == 2.0
    host.set_timeout("job", 2.0)  # known already: nothing more
    assert host._table("job", 0).timeout_s == 2.0


def test_a_batch_still_on_its_way_keeps_its_root_in_progress() -> None:
    task = TaskTracking(is_source=False)
    task.retain(0, ROOT)
    assert task.in_progress({ROOT, CHILD_1}) == {ROOT}  # queued
    task.processed(0, CHILD_1, [])
    assert task.in_progress({ROOT}) == {ROOT}  # processed, window not yet durable
    task.mark_reported([0])
    assert task.in_progress({ROOT}) == set()  # its part is with the tracker


async def test_a_slow_root_is_not_abandoned_but_a_broken_one_is() -> None:
    # A root whose batch waits behind a backlog (or a window not yet durable)
    # times out like a broken one; its rebuild says a task still holds a
    # batch of it, so its timeouts do not count toward abandoning it.
    host = TrackerHost("worker-1", RoutingView(cast(Any, None), 64), rpc.ChannelPool())
    roots = np.asarray([ROOT], dtype=np.uint64)

    async def rebuild(in_progress: list[int]) -> None:
        async def broadcast(request: Any) -> dict[str, worker_pb2.TrackingEventsResponse]:
            return {"worker-2": worker_pb2.TrackingEventsResponse(
                contributions=pack([ROOT, CHILD_1]), complete=True, source_pending=pack([ROOT]),
                in_progress=pack(in_progress))}

        host._broadcast = broadcast  # type: ignore[method-assign]
        host._start_rebuild(("job", 0), {ROOT}, failed=True)
        await host._rebuild(("job", 0))

    for _ in range(5):  # slow: every timeout is forgiven
        retry, give_up = host._count_failures("job", roots)
        assert retry == [ROOT] and give_up == []
        await rebuild(in_progress=[ROOT])
    for _ in range(2):  # nothing of it on its way any more: it counts
        retry, give_up = host._count_failures("job", roots)
        assert retry == [ROOT]
        await rebuild(in_progress=[])
    assert host._count_failures("job", roots) == ([], [ROOT])


@contextlib.asynccontextmanager
async def announcing(monkeypatch: pytest.MonkeyPatch, slow: list[int] | None = None,
                     release: asyncio.Event | None = None
                     ) -> AsyncIterator[tuple[TrackerHost, asyncio.Queue[list[int]]]]:
    """A running tracker host whose tick never comes in a test, and the
    queue of the roots it broadcasts, one list per broadcast; a broadcast of
    exactly ``slow`` is answered only once ``release`` is set."""
    monkeypatch.setattr(trackers, "TICK_S", 30.0)
    host = TrackerHost("worker-1", RoutingView(cast(Any, None), 64), rpc.ChannelPool())
    announced: asyncio.Queue[list[int]] = asyncio.Queue()

    async def broadcast(request: Any) -> dict[str, worker_pb2.TrackingEventsResponse]:
        roots = unpack(request.completed).tolist()
        announced.put_nowait(roots)
        if roots == slow and release is not None:
            await release.wait()
        return {"worker-1": worker_pb2.TrackingEventsResponse()}

    host._broadcast = broadcast  # type: ignore[method-assign]
    running = asyncio.create_task(host.run())
    try:
        yield host, announced
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


async def nothing_announced(announced: asyncio.Queue[list[int]]) -> bool:
    """Whether nothing was broadcast after the loop had twenty chances to."""
    for _ in range(20):
        await asyncio.sleep(0)
    return announced.empty()


async def test_a_drain_has_completions_announced_as_they_come(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # While a job streams, completions go out once a tick, many per broadcast.
    # Someone draining (hurry) must not wait for the tick: it would add up to
    # TICK_S to every drain.
    async with announcing(monkeypatch) as (host, announced):
        host._completed("job", np.asarray([ROOT], dtype=np.uint64))
        assert await nothing_announced(announced)  # not hurried: it waits for the tick
        host.hurry()  # what was waiting goes out at once ...
        assert await asyncio.wait_for(announced.get(), 10) == [ROOT]
        host._completed("job", np.asarray([CHILD_1], dtype=np.uint64))
        assert await asyncio.wait_for(announced.get(), 10) == [CHILD_1]  # ... and what comes


async def test_the_last_tree_of_a_draining_job_is_announced_once_complete(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A drain asked while the workers were still busy does not hurry the
    # trackers (their broadcasts would multiply behind a backlog), but the
    # completion that leaves a tracker holding no tree of the job can be
    # batched with nothing: it goes at once instead of at the next tick.
    root, other = np.asarray([ROOT], dtype=np.uint64), np.asarray([CHILD_1], dtype=np.uint64)
    value = np.asarray([0x5EED], dtype=np.uint64)
    async with announcing(monkeypatch) as (host, announced):
        # Not draining: a tree completing waits for the tick.
        host._apply(("job", 0), other, value)
        host._apply(("job", 0), other, value)
        assert await nothing_announced(announced)

        host.drain_asked("job")
        host._apply(("job", 0), root, value)  # registered, not complete: nothing to say
        assert await nothing_announced(announced)
        host._apply(("job", 0), root, value)  # complete, and the table is empty
        assert sorted(await asyncio.wait_for(announced.get(), 10)) == [ROOT, CHILD_1]


async def test_completions_between_ticks_do_not_wait_for_an_earlier_broadcast(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # At the end of a drain reports come a millisecond or two apart and a
    # broadcast takes several: the last completion must not queue behind the
    # broadcasts of the earlier ones.
    release = asyncio.Event()
    async with announcing(monkeypatch, slow=[ROOT], release=release) as (host, announced):
        host.hurry()
        host._completed("job", np.asarray([ROOT], dtype=np.uint64))
        assert await asyncio.wait_for(announced.get(), 10) == [ROOT]
        host._completed("job", np.asarray([CHILD_1], dtype=np.uint64))
        assert await asyncio.wait_for(announced.get(), 10) == [CHILD_1]
        assert not release.is_set()  # the first broadcast is still on its way
        release.set()
    assert not host._announcing, "the announcements on their way were not awaited"
