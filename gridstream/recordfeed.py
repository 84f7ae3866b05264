"""Records read by blocking code, handed to the event loop as they come.

``gridstream send JOB -`` reads a pipe (``tail -f app.log | gridstream send
JOB -``). Read in the event loop in chunks of 50,000 records, a slow pipe's
records waited until a chunk filled or the pipe closed: a line written at
noon could reach the cluster at midnight, and while the loop sat in a read
no acknowledgement was handled. Here a thread of its own runs the blocking
iterator (the file's lines parsed into records) and the loop takes whatever
the thread has read each time it asks: a record from a slow pipe goes on as
soon as it is read, and a fast file still goes in large pieces, because the
thread reads on while the loop is busy sending.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RecordFeed(Generic[T]):
    """Runs ``items`` (a blocking iterator) in a daemon thread and yields, in
    the event loop, lists of what it read since the last one, at most
    ``max_items`` each (the thread waits while that many are unread, so a
    fast file is never held whole). An error the iterator raises is raised
    by :meth:`batches` after every item read before it was yielded."""

    def __init__(self, items: Iterator[T], max_items: int, name: str = "record feed") -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self._items = items
        self._max_items = max_items
        self._name = name
        self._lock = threading.Condition()
        self._read: list[T] = []
        self._done = False
        self._error: BaseException | None = None
        self._stopped = False
        self._started = False

    async def batches(self) -> AsyncGenerator[list[T], None]:
        """The items as the thread reads them, in order; ends at the end of
        the iterator, raises its error. Leaving the loop early stops the
        thread at its next item (a thread blocked in a read stays blocked:
        it is a daemon and holds nothing). A feed is read once."""
        if self._started:
            raise RuntimeError(f"{self._name}: a RecordFeed is read once")
        self._started = True
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        thread = threading.Thread(target=self._read_all, args=(loop, ready),
                                  name=self._name, daemon=True)
        thread.start()
        try:
            while True:
                await ready.wait()
                ready.clear()
                with self._lock:
                    taken, self._read = self._read, []
                    done, error = self._done, self._error
                    self._lock.notify_all()  # room for the thread again
                if taken:
                    yield taken
                if done:  # taken under the same lock: the thread adds nothing more
                    if error is not None:
                        raise error
                    return
        finally:
            with self._lock:
                self._stopped = True
                self._lock.notify_all()

    def _read_all(self, loop: asyncio.AbstractEventLoop, ready: asyncio.Event) -> None:
        def wake() -> None:
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the loop is closed: nobody is reading any more
                pass

        try:
            for item in self._items:
                with self._lock:
                    while len(self._read) >= self._max_items and not self._stopped:
                        self._lock.wait()
                    if self._stopped:
                        return
                    self._read.append(item)
                    first = len(self._read) == 1
                if first:  # the loop is told once per batch, not once per item
                    wake()
        except BaseException as exc:  # handed to the reader in the loop
            with self._lock:
                self._error = exc
        with self._lock:
            self._done = True
        wake()
