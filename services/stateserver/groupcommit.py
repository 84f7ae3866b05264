"""Group commit: many concurrent writes share one SQLite transaction.

Committing each write on its own costs one transaction per RPC; with aiosqlite
that is about five times slower than committing whatever has queued up while
the previous transaction was being written. A single writer task owns the
write connection, drains a queue of pending writes, runs them in one
transaction and resolves every caller's future only after ``COMMIT`` returned,
so an acknowledged write is a durable write.

An *urgent* write (a new owner claiming an operator before it reads its
state) waits for no other write. It is committed in a transaction of its own
before the next group; a group in progress when it arrives gives way: between
two writes the group commits what it has and runs the rest after it, and in
the middle of a write its statement is interrupted (``sqlite3_interrupt``),
the whole group rolled back and run again after the urgent write. Reordering
and re-running are safe because every write is idempotent and every fenced
write checks the fence again inside its transaction. At 10M keys one window's
random B-tree writes can take a second; a takeover's claim must not wait for
them.

A *preemptible* write (a compaction fold: background work whose every
outcome reads the same) runs in a transaction of its own; interrupted, its
caller gets :class:`Preempted`, to run it again later, instead of having it
run again at once.

Given a connection of its own for it, the committer copies the write-ahead
log back into the database (a checkpoint) itself, between groups, instead of
SQLite inside a ``COMMIT`` (at millions of keys the copy took four times as
long as the commit, and a claim waited for both). The copy runs on that other
connection while the writer starts no group, so it finishes and the log
restarts from its beginning (a checkpoint beside a writer that never pauses
never catches up, and the log grows without end); an urgent write arriving
meanwhile is committed at once, beside the copy, which SQLite allows.

No statement of the write connection may be left active (a cursor of a
statement that answers rows, read only in part or not at all): the
interrupt is sent again until the group gives way, so one can land between
two statements, and SQLite forgets it at the next statement only when none
of the connection's statements is active. aiosqlite keeps the cursor of the
last call it ran until the next call succeeds, so one such cursor made that
interrupt fail every later write, for good. Statements that answer rows go
through ``execute_fetchall``, and a write op's ``execute`` runs its
statement to its end (:mod:`services.stateserver.threadconn`).
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
from services.stateserver import threadconn
from services.stateserver.threadconn import WriteOp

log = logging.getLogger(__name__)

_T = TypeVar("_T")

PREEMPT_POLL_S = 0.005
"""How often a group or a copy of the log in progress looks for an urgent
write (an interrupt that lands between two statements is lost, so it is sent
again until the group gives way or ends)."""

CHECKPOINT_EVERY_S = 1.0
"""How often the committer copies the write-ahead log back into the database
when given a connection for it (SQLite's own automatic checkpoint, inside a
commit, is then turned off)."""

SLOW_TRANSACTION_S = 0.25
"""A transaction this long is logged: everything queued waited for it."""

SLOW_URGENT_WAIT_S = 0.1
"""An urgent write that waited this long for the writer is logged, with what
the writer was doing when it arrived."""


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
    queued_at: float = 0.0
    """When it was submitted (``time.monotonic``)."""
    writer_was: str = ""
    """What the writer was doing when it was submitted (urgent writes)."""


def _never() -> bool:
    """An urgent group runs to its end."""
    return False


async def _noop(_conn: aiosqlite.Connection) -> None:
    """The op behind :meth:`GroupCommitter.flush`: commits nothing, waits its turn."""


def _kinds(group: list[_Pending]) -> str:
    """The kinds of write in a group, most frequent first, for the log."""
    kinds = Counter(getattr(p.op, "__qualname__", "?").split(".<locals>")[0] for p in group)
    return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


def _log_slow_urgent(group: list[_Pending], began: float) -> None:
    """Logs an urgent group whose first write waited long for the writer:
    a takeover waits as long, so the log says what the writer was busy with."""
    first = min(group, key=lambda pending: pending.queued_at)
    waited = began - first.queued_at
    if waited >= SLOW_URGENT_WAIT_S:
        log.info("%d urgent writes (%s) waited %.3fs for the writer, which was busy with %s "
                 "when the first arrived", len(group), _kinds(group), waited, first.writer_was)


def _is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's answer to ``sqlite3_interrupt``."""
    return isinstance(exc, sqlite3.OperationalError) and "interrupt" in str(exc)


def _storage_error(exc: BaseException) -> GridstreamError:
    """What a caller sees when SQLite failed: typed errors pass, the rest is wrapped."""
    if isinstance(exc, GridstreamError):
        return exc
    if isinstance(exc, sqlite3.Error):
        return StorageError(
            f"state store write failed ({type(exc).__name__}: {exc}); nothing of this "
            "request was stored; check the state server's disk and retry"
        )
    return StorageError(f"state store write failed unexpectedly ({type(exc).__name__}: "
                        f"{exc}); see the state server's log")


class GroupCommitter:
    """The single writer of a SQLite database, committing queued writes in groups.

    The owner calls :meth:`start` once the connection is open and :meth:`close`
    before closing the connection; ``close`` commits everything already queued,
    then cancels and awaits the writer task, so no write is left half-done and
    no task outlives its owner.
    """

    def __init__(
        self, conn: aiosqlite.Connection, max_group: int = 1000, max_queued: int = 10_000,
        after_rollback: Callable[[aiosqlite.Connection], Awaitable[None]] | None = None,
        checkpoint_conn: aiosqlite.Connection | None = None,
    ) -> None:
        self._conn = conn
        self._checkpoint_conn = checkpoint_conn
        """Copies the write-ahead log back (see the module); without it SQLite
        does so itself inside a COMMIT."""
        self._after_rollback = after_rollback
        """Run after every rollback: the owner's mirrors of committed rows
        (the store's fences) read them again, since a write changed them
        before its transaction was rolled back."""
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
        """Set when the group in progress was interrupted for an urgent write."""
        self._busy_with = "nothing"
        """What the writer is doing, for the log line of a slow urgent write."""
        self.preempted = 0
        """Groups rolled back mid-write for an urgent write so far."""
        self.checkpoints = 0
        """Copies of the write-ahead log into the database finished so far."""
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
            self._urgent.append(_Pending(op, future, queued_at=time.monotonic(),
                                         writer_was=self._busy_with))
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
        """Writer loop: take everything queued (up to ``max_group``), commit it
        as one, and copy the write-ahead log back now and then."""
        try:
            if self._checkpoint_conn is not None:  # checkpoints between groups, not in COMMIT
                # Read to its end (see the module): this PRAGMA answers a row.
                await self._conn.execute_fetchall("PRAGMA wal_autocheckpoint=0")
            last_checkpoint = time.monotonic()
            while True:
                if not self._urgent and not self._carried and self._queue.empty():
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                group, urgent = self._next_group()
                self._busy_with = f"a transaction of {len(group)} writes ({_kinds(group)})"
                await self._commit_safely(group, urgent)
                if (self._checkpoint_conn is not None
                        and time.monotonic() - last_checkpoint >= CHECKPOINT_EVERY_S):
                    self._busy_with = "copying the write-ahead log back"
                    await self._checkpoint(self._checkpoint_conn)
                    last_checkpoint = time.monotonic()
                self._busy_with = "nothing"
        finally:
            self._closing = True
            self._fail_queued()

    async def _commit_safely(self, group: list[_Pending], urgent: bool) -> None:
        """:meth:`_commit_group`, where a bug fails the group's callers
        instead of stranding them or stopping the writer."""
        try:
            await self._commit_group(group, urgent)
        except Exception:
            log.exception("group commit failed unexpectedly")
            for pending in group:
                if not pending.future.done():
                    pending.future.set_exception(_storage_error(RuntimeError()))

    def _next_group(self) -> tuple[list[_Pending], bool]:
        """The writes of the next transaction and whether they are urgent:
        every urgent one; otherwise the carried and queued ones in order, up
        to ``max_group``, a preemptible one always alone."""
        group: list[_Pending] = []
        if self._urgent:
            while self._urgent:
                group.append(self._urgent.popleft())
            return group, True
        while len(group) < self._max_group and (self._carried or not self._queue.empty()):
            pending = self._carried.popleft() if self._carried else self._queue.get_nowait()
            if pending.preemptible:
                if group:  # it goes first next time, in a transaction of its own
                    self._carried.appendleft(pending)
                else:
                    group.append(pending)
                break
            group.append(pending)
        return group, False

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

    async def _commit_group(self, group: list[_Pending], urgent: bool = False) -> None:
        """One transaction for the group; on any failure, each op again on its
        own; a group that is not ``urgent`` gives way to an urgent write."""
        live = [p for p in group if not p.future.done()]  # callers that gave up are skipped
        if all(pending.op is _noop for pending in live):  # only flushes: nothing to commit
            for pending in live:
                pending.future.set_result(None)
            return
        results: list[Any] = []
        began = time.monotonic()
        ops = [pending.op for pending in live]
        try:
            if urgent:
                _log_slow_urgent(live, began)
                results = await threadconn.on_thread(self._conn, threadconn.run_ops, ops,
                                                     _never)
            else:
                # Between two writes the group stops for an urgent write (the
                # rest is carried), inside one it is interrupted (below).
                results = await self._giving_way(threadconn.on_thread(
                    self._conn, threadconn.run_ops, ops, lambda: bool(self._urgent)))
        except asyncio.CancelledError:
            # The group's hand-over to the connection's thread runs on and may
            # commit; the rollback, queued behind it, then finds nothing open.
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
            if self._preempting and _is_interrupt(exc):
                self._preempting = False
                self._give_way(live, time.monotonic() - began)
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
        self._preempting = False  # an interrupt that came too late changed nothing
        live, rest = live[:len(results)], live[len(results):]
        self._carried.extendleft(reversed(rest))
        self.commits += 1
        self.writes += sum(pending.op is not _noop for pending in live)
        took = time.monotonic() - began
        self.longest_s = max(self.longest_s, took)
        if took >= SLOW_TRANSACTION_S:
            # Every write queued behind it waited as long.
            log.info("a transaction of %d writes took %.3fs (%s)", len(live), took,
                     _kinds(live))
        for pending, result in zip(live, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    def _give_way(self, live: list[_Pending], ran_s: float) -> None:
        """After a group was interrupted and rolled back for an urgent write
        (``ran_s`` into it): a preemptible write's caller hears so, the
        others run again after it."""
        self.preempted += 1
        again = []
        for pending in live:
            if pending.preemptible:
                pending.future.set_exception(Preempted(
                    "rolled back to let a takeover's claim go first; run it again"))
            else:
                again.append(pending)
        self._carried.extendleft(reversed(again))
        if again:
            log.info("a transaction of %d writes gave way to a takeover's claim after %.3fs; "
                     "they run again after it", len(again), ran_s)

    async def _giving_way(self, work: Awaitable[_T]) -> _T:
        """Runs ``work`` (statements on the write connection), interrupting
        them while an urgent write waits: the statement in progress then fails
        with sqlite3's OperationalError, which the caller reads as having
        given way (``_preempting`` is set)."""
        async def interrupt() -> None:
            self._preempting = True
            await self._conn.interrupt()

        return await self._watching_urgent(work, interrupt)

    async def _checkpoint(self, conn: aiosqlite.Connection) -> None:
        """Copies the write-ahead log back into the database on ``conn``,
        committing urgent writes that arrive meanwhile beside it; a failure is
        logged and the copy tried again next time."""
        async def commit_urgent() -> None:
            group, _ = self._next_group()
            await self._commit_safely(group, urgent=True)

        began = time.monotonic()
        try:
            await self._watching_urgent(
                conn.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)"), commit_urgent)
        except sqlite3.Error as exc:
            log.warning("copying the write-ahead log into the database failed (%s); "
                        "retrying later", exc)
            return
        self.checkpoints += 1
        took = time.monotonic() - began
        if took >= SLOW_TRANSACTION_S:
            log.info("copying the write-ahead log back took %.3fs (urgent writes went "
                     "ahead meanwhile, the rest waited)", took)

    async def _watching_urgent(self, work: Awaitable[_T],
                               on_urgent: Callable[[], Awaitable[None]]) -> _T:
        """Runs ``work`` as a task and, every ``PREEMPT_POLL_S`` while it runs
        and an urgent write waits, calls ``on_urgent``; cancelled, it cancels
        and awaits the task."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=PREEMPT_POLL_S)
                if done:
                    return task.result()
                if self._urgent:
                    await on_urgent()
        finally:
            if not task.done():  # the writer itself is being cancelled
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, sqlite3.Error):
                    await task

    async def _rollback(self) -> None:
        """Ends a failed transaction (SQLite may have rolled it back already)
        and lets the owner re-read its mirrors; a failure here is only logged."""
        try:
            if self._conn.in_transaction:
                await self._conn.execute("ROLLBACK")
            if self._after_rollback is not None:
                await self._after_rollback(self._conn)
        except sqlite3.Error:
            log.exception("rollback failed")

