"""A gate that holds a state server's write on the write connection's thread.

A group commit runs its writes on that thread (services/stateserver/threadconn.py),
so a test that needs a write held mid-way (a long transaction, in miniature)
blocks it there and learns on its own loop when the write got there."""

from __future__ import annotations

import asyncio
import threading


class Gate:
    """Holds a write on the writer's thread until the test opens it, and
    tells the test's loop when a write has reached it."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.reached = asyncio.Event()
        self._open = threading.Event()

    def arrive(self) -> None:
        """On the writer's thread: the test's ``reached`` is set."""
        self._loop.call_soon_threadsafe(self.reached.set)

    def wait(self) -> None:
        """On the writer's thread: arrive, then wait until opened."""
        self.arrive()
        assert self._open.wait(10), "the test never opened the gate"

    def open(self) -> None:
        """Lets every write held at the gate go on."""
        self._open.set()
