"""Group commit: many concurrent writes share one SQLite transaction.

Committing each write on its own costs one transaction per RPC; with aiosqlite
that is about five times slower than committing whatever has queued up while
the previous transaction was being written. A single writer task owns the
write connection, drains a queue of pending writes, runs them in one
transaction and resolves every caller's future only after ``COMMIT`` returned,
so an acknowledged write is a durable write.

An *urgent* write (a new owner claiming an operator before it reads its
state) skips the queue: it is committed in a transaction of its own before
the next group, so a takeover waits for at most the write being run, not for
every write queued behind a busy store: a group in progress commits what it
has written when an urgent write arrives and runs the rest after it. Reordering is safe
because every fenced write checks the fence again inside its transaction.

A *preemptible* write (a compaction fold: background work whose every
outcome reads the same) runs in a transaction of its own, and an urgent write
arriving meanwhile interrupts it (``sqlite3_interrupt``): it is rolled back
and its caller gets :class:`Preempted`, to run it again later. A fold into a
large base can take seconds of random B-tree writes; a takeover's claim must
not wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import aiosqlite

from gridstream.errors import GridstreamError, Unavailable

log = logging.getLogger(__name__)

_T = TypeVar("_T")

PREEMPT_POLL_S = 0.005
"""How often a preemptible write in progress looks for an urgent one (an
interrupt that lands between two of its statements is lost, so it is sent
again until the write ends)."""

SLOW_TRANSACTION_S = 0.25
"""A transaction this long is logged: everything queued waited for it."""

WriteOp = Callable[[aiosqlite.Connection], Awaitable[_T]]
"""A write: runs statements on the write connection inside the writer's
transaction and returns the caller's result. It must touch nothing but the
database, because a failed group is rolled back and each op re-run alone."""


class StorageError(Unavailable):
    """SQLite refused a write (disk full, I/O error); nothing of it was stored."""


class Preempted(Unavailable):
    """A preemptible write was rolled back so that an urgent one (a takeover's
    claim) could go first; nothing of it was stored: run it again later."""


@dataclass(slots=True)
class _Pending:
    """A queued write and the future its caller awaits."""

    op: WriteOp[Any]
    future: asyncio.Future[Any]
    preemptible: bool = False


async def _noop(_conn: aiosqlite.Connection) -> None:
    """The op behind :meth:`GroupCommitter.flush`: commits nothing, waits its turn."""


def _storage_error(exc: BaseException) -> GridstreamError:
    """What a caller sees when SQLite failed: typed errors pass, the rest is wrapped."""
    if isinstance(exc, GridstreamError):
        return exc
    if isinstance(exc, sqlite3.Error):
        return StorageError(
            f"state store write failed ({type(exc).__name__}: {exc}); nothing of this "
            "request was stored; check the state server's disk and retry"
        )
    return StorageError(f"state store write failed unexpectedly ({type(exc).__name__}); "
                        "see the state server's log")


class GroupCommitter:
    """The single writer of a SQLite database, committing queued writes in groups.

    The owner calls :meth:`start` once the connection is open and :meth:`close`
    before closing the connection; ``close`` commits everything already queued,
    then cancels and awaits the writer task, so no write is left half-done and
    no task outlives its owner.
    """

    def __init__(
        self, conn: aiosqlite.Connection, max_group: int = 1000, max_queued: int = 10_000
    ) -> None:
        self._conn = conn
        self._max_group = max_group
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=max_queued)
        self._urgent: deque[_Pending] = deque()
        self._ready = asyncio.Event()
        """Set when the queue or the urgent lane has something for the writer."""
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._carried: deque[_Pending] = deque()
        """Writes of a group cut short for an urgent one: they go first next."""
        self._preempting = False
        """Set when the preemptible write in progress was interrupted."""
        self.preempted = 0
        """Preemptible writes rolled back for an urgent one so far."""
        self.commits = 0
        """Transactions committed; fewer than writes when grouping works."""
        self.longest_s = 0.0
        """The longest transaction so far (seconds)."""
        self.writes = 0
        """Writes committed."""

    def start(self) -> None:
        """Starts the writer task; the committer owns it until :meth:`close`."""
        if self._task is not None:
            raise RuntimeError("GroupCommitter.start called twice")
        self._task = asyncio.create_task(self._run(), name="stateserver-group-commit")

    async def submit(self, op: WriteOp[_T], urgent: bool = False,
                     preemptible: bool = False, even_if_abandoned: bool = False) -> _T:
        """Queues a write and returns its result once its transaction is
        committed; an ``urgent`` one goes ahead of the queue, a
        ``preemptible`` one gives way to an urgent one (see the module).

        A caller that gives up (an RPC past its deadline) leaves its write
        skipped, unless ``even_if_abandoned``: then it is committed anyway,
        for writes whose late commit is harmless and whose retry finds them
        stored (a window of keyed state: fenced, and stored once by its
        number). Without it, an overloaded store was a livelock: a window's
        every retry queued past its deadline again (a window retried for
        418 s at 10M keys)."""
        if self._closing or self._task is None or self._task.done():
            raise Unavailable("the state store is shutting down; retry on another state server "
                              "or after restart")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if urgent:
            self._urgent.append(_Pending(op, future))
        else:
            await self._queue.put(_Pending(op, future, preemptible))
        self._ready.set()
        if self._task.done():  # the writer stopped while we waited for queue space
            self._fail_queued()
        return cast(_T, await (asyncio.shield(future) if even_if_abandoned else future))

    async def flush(self) -> None:
        """Waits until every write queued before this call is committed."""
        await self.submit(_noop)

    async def close(self) -> None:
        """Commits what is queued, then cancels and awaits the writer task.

        Safe to call twice. Writes that slip in after the final flush fail with
        UNAVAILABLE instead of waiting forever.
        """
        if self._task is None:
            return
        if not self._closing and not self._task.done():
            with contextlib.suppress(GridstreamError):
                await self.flush()
        self._closing = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        """Writer loop: take everything queued (up to ``max_group``), commit it as one."""
        try:
            while True:
                if not self._urgent and not self._carried and self._queue.empty():
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                group = self._next_group()
                try:
                    await self._commit_group(group)
                except Exception:  # a bug here must not strand the callers or the loop
                    log.exception("group commit failed unexpectedly")
                    for pending in group:
                        if not pending.future.done():
                            pending.future.set_exception(_storage_error(RuntimeError()))
        finally:
            self._closing = True
            self._fail_queued()

    def _next_group(self) -> list[_Pending]:
        """The writes of the next transaction: every urgent one; otherwise the
        carried and queued ones in order, up to ``max_group``, a preemptible
        one always alone."""
        group: list[_Pending] = []
        if self._urgent:
            while self._urgent:
                group.append(self._urgent.popleft())
            return group
        while len(group) < self._max_group and (self._carried or not self._queue.empty()):
            pending = self._carried.popleft() if self._carried else self._queue.get_nowait()
            if pending.preemptible:
                if group:  # it goes first next time, in a transaction of its own
                    self._carried.appendleft(pending)
                else:
                    group.append(pending)
                break
            group.append(pending)
        return group

    def _fail_queued(self) -> None:
        """Fails writes still queued when the writer stops, so no caller waits forever."""
        while self._urgent or self._carried or not self._queue.empty():
            pending = (self._urgent.popleft() if self._urgent else
                       self._carried.popleft() if self._carried else self._queue.get_nowait())
            if not pending.future.done():
                pending.future.set_exception(
                    Unavailable("the state store shut down before this write was stored; "
                                "retry after restart")
                )

    async def _commit_group(self, group: list[_Pending]) -> None:
        """One transaction for the group; on any failure, each op again on its own."""
        live = [p for p in group if not p.future.done()]  # callers that gave up are skipped
        if all(pending.op is _noop for pending in live):  # only flushes: nothing to commit
            for pending in live:
                pending.future.set_result(None)
            return
        results: list[Any] = []
        began = time.monotonic()
        cut = len(live)
        try:
            await self._conn.execute("BEGIN IMMEDIATE")
            for i, pending in enumerate(live):
                results.append(await (self._run_preemptible(pending.op) if pending.preemptible
                                      else pending.op(self._conn)))
                if self._urgent and i + 1 < len(live):
                    # A takeover's claim arrived: commit what is written and
                    # run the rest after the claim, so the claim waits for one
                    # write, not for a whole group of them.
                    cut = i + 1
                    break
            await self._conn.execute("COMMIT")
            self._preempting = False  # an interrupt that came too late changed nothing
        except asyncio.CancelledError:
            await self._rollback()
            for pending in live:
                if not pending.future.done():
                    pending.future.set_exception(
                        Unavailable("the state store shut down during this write; its "
                                    "outcome is unknown, retry (writes are idempotent)")
                    )
            raise
        except Exception as exc:
            await self._rollback()
            if self._preempting and isinstance(exc, sqlite3.OperationalError):
                self._preempting = False
                self.preempted += 1
                live[0].future.set_exception(Preempted(
                    "rolled back to let a takeover's claim go first; run it again"))
                return
            self._preempting = False
            if len(live) > 1:
                for pending in live:
                    await self._commit_group([pending])
                return
            error = _storage_error(exc)
            if not isinstance(exc, GridstreamError):
                log.warning("write failed and was rolled back: %s", error)
            if not live[0].future.done():
                live[0].future.set_exception(error)
            return
        live, rest = live[:cut], live[cut:]
        self._carried.extendleft(reversed(rest))
        self.commits += 1
        self.writes += sum(pending.op is not _noop for pending in live)
        took = time.monotonic() - began
        self.longest_s = max(self.longest_s, took)
        if took >= SLOW_TRANSACTION_S:
            # Every write queued behind it waited as long, a takeover's claim too.
            kinds = Counter(getattr(p.op, "__qualname__", "?").split(".<locals>")[0]
                            for p in live)
            log.info("a transaction of %d writes took %.3fs (%s)", len(live), took,
                     ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()))
        for pending, result in zip(live, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    async def _run_preemptible(self, op: WriteOp[Any]) -> Any:
        """Runs ``op`` (alone in its transaction), interrupting its statements
        while an urgent write waits: it then fails with sqlite3's
        OperationalError, which :meth:`_commit_group` turns into Preempted."""
        task = asyncio.ensure_future(op(self._conn))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=PREEMPT_POLL_S)
                if done:
                    return task.result()
                if self._urgent:
                    self._preempting = True
                    await self._conn.interrupt()
        finally:
            if not task.done():  # the writer itself is being cancelled
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, sqlite3.Error):
                    await task

    async def _rollback(self) -> None:
        """Ends a failed transaction; a rollback that fails too is only logged."""
        try:
            if self._conn.in_transaction:
                await self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("rollback failed")

