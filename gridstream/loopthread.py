"""A private event loop in a thread of its own, for blocking callers.

:class:`gridstream.SyncClient` runs every call of the asyncio client here. A
blocking call made from code that already runs an event loop (a Jupyter
notebook, an async web handler) cannot run a second loop in the same
thread (``asyncio.run`` raises "cannot be called from a running event
loop"); a loop of our own in another thread has no such limit, so the same
blocking client works in scripts and notebooks alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

STOP_TIMEOUT_S = 10.0
"""How long :meth:`LoopThread.close` waits for the loop to finish its tasks."""


class LoopThread:
    """Owns an event loop running in a daemon thread; :meth:`run` blocks the
    caller until a coroutine finishes there. The thread is a daemon so that
    a forgotten ``close()`` never keeps an interpreter from exiting."""

    def __init__(self, name: str = "gridstream-sdk") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def _serve(self) -> None:
        """The thread's body: run the loop until stopped, then cancel and
        await whatever is left, and close the loop."""
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs ``coroutine`` on the private loop and returns its result (or
        raises its exception). An interruption of the caller (Ctrl-C in a
        notebook) cancels the coroutine before it propagates."""
        if self._closed:
            coroutine.close()
            raise RuntimeError("the client is closed")
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking call from the client's own loop would wait "
                               "for itself; use the async Client there")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Stops the loop (its remaining tasks are cancelled and awaited) and
        joins the thread; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"the client's loop did not stop within {STOP_TIMEOUT_S:.0f}s")
