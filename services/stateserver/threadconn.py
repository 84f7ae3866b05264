"""A group's writes run in one hop to the write connection's thread.

aiosqlite runs every statement on the connection's own thread: each
``await conn.execute(...)`` queues the statement there, and the event loop
resumes the caller once the thread has answered. A group commit of 14
windows ran about 75 statements, so 150 hand-overs between the two threads,
each a wake-up of the other thread and a wait for the GIL. One process
writing 2,400 small windows (24 at a time) spent 1.10 to 1.25 CPU-seconds
so, 0.19 with the group in one hand-over. (Under a busy cluster's drain a
group still takes 5 to 27 ms: there the server waits for a core, not for
its writer thread; docs/benchmarks.md.)

The write ops stay written against aiosqlite's API (``execute``,
``executemany``, ``execute_fetchall``, a cursor's ``rowcount``), so they
read like every other query of the state server. :func:`run_ops` runs a
whole group on the connection's thread: BEGIN, each op, COMMIT. It hands each
op a :class:`ThreadConnection`, whose methods run the statement at once on
that thread and return an awaitable that is already done, so an op's
coroutine never suspends and is driven to its end by one ``send``. An op that
does suspend (it awaited something other than the database) is a bug: it
fails with :class:`OpSuspended` and its transaction is rolled back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from typing import Any, Generic, TypeVar

import aiosqlite

_T = TypeVar("_T")


class OpSuspended(RuntimeError):
    """A write op awaited something other than a statement of its connection."""


class _Done(Generic[_T]):
    """An awaitable (and async context manager) whose value is already there:
    awaiting it never suspends, so the op's coroutine runs straight through."""

    __slots__ = ("value",)

    def __init__(self, value: _T) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, _T]:
        return self.value
        yield  # unreached: makes this a generator that returns without yielding

    async def __aenter__(self) -> _T:
        return self.value

    async def __aexit__(self, *exc: object) -> None:
        return None


class ThreadCursor:
    """The part of aiosqlite's cursor the write ops use (``rowcount``; rows
    come from ``execute_fetchall``), over sqlite3's own."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        """Rows the statement changed."""
        return self._cursor.rowcount


class ThreadConnection:
    """The write connection as a write op sees it on the connection's thread:
    the same calls as aiosqlite's, each run at once."""

    __slots__ = ("_raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> _Done[ThreadCursor]:
        """Runs one statement to its end: rows it answers are read and
        dropped, so no statement of the write connection stays active (an
        interrupt landing between two statements would otherwise fail the
        statements after it; services/stateserver/groupcommit.py)."""
        cursor = self._raw.execute(sql, parameters)
        cursor.fetchall()
        return _Done(ThreadCursor(cursor))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]]
                    ) -> _Done[ThreadCursor]:
        """Runs one statement for each parameter row."""
        return _Done(ThreadCursor(self._raw.executemany(sql, parameters)))

    def execute_fetchall(self, sql: str, parameters: Sequence[Any] = ()) -> _Done[list[Any]]:
        """Runs one statement and returns all its rows."""
        return _Done(self._raw.execute(sql, parameters).fetchall())


WriteOp = Callable[[aiosqlite.Connection], Awaitable[_T]]
"""A write: runs statements on the write connection inside the group
committer's transaction and returns the caller's result. It must touch
nothing but the database, because a failed group is rolled back and each op
re-run alone, and it must await nothing but the connection's statements,
because the group runs on the connection's thread (see the module)."""


def run_to_end(op: WriteOp[_T], conn: ThreadConnection) -> _T:
    """Runs ``op`` on ``conn`` to its end without an event loop."""
    # A ThreadConnection answers every call aiosqlite's connection answers
    # that write ops use; typed as aiosqlite's so the ops keep one signature.
    coroutine = op(conn)  # type: ignore[arg-type]
    if not isinstance(coroutine, Coroutine):
        raise TypeError(f"write op {op!r} is not a coroutine function")
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise OpSuspended(f"write op {getattr(op, '__qualname__', op)!r} awaited something other "
                      "than its connection's statements; write ops may only touch the database")


def run_ops(raw: sqlite3.Connection, ops: Sequence[WriteOp[Any]],
            stop_early: Callable[[], bool]) -> list[Any]:
    """On the connection's thread: BEGIN IMMEDIATE, the ops in order, COMMIT;
    their results. Between two ops, ``stop_early()`` true commits those run so
    far (the caller runs the rest later). An exception leaves the
    transaction open for the caller to roll back."""
    conn = ThreadConnection(raw)
    raw.execute("BEGIN IMMEDIATE")
    results: list[Any] = []
    for index, op in enumerate(ops):
        results.append(run_to_end(op, conn))
        if index + 1 < len(ops) and stop_early():
            break
    raw.execute("COMMIT")
    return results


async def on_thread(conn: aiosqlite.Connection, fn: Callable[..., _T], *args: Any) -> _T:
    """Runs ``fn(raw sqlite3 connection, *args)`` on ``conn``'s own thread,
    in one hop (aiosqlite's queue of calls, which every statement of
    ``conn`` goes through in order). It reaches into aiosqlite's connection
    (``_execute``, ``_conn``), which aiosqlite offers no public call for:
    requirements.txt pins the version, and a version without them fails
    every write with a StorageError naming the AttributeError, and the
    group commit tests with it."""
    def call() -> _T:
        return fn(conn._conn, *args)

    return await conn._execute(call)  # type: ignore[no-any-return, no-untyped-call]
