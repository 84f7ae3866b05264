"""The seed's double buffer and its asynchronous persistence.

LatestSnapshot is M = (r, lv, fun, os, offset) for the batch in hand: set with
os=false when the operator takes a batch, and with os=true and offset+1 once
the batch's output has been emitted and acknowledged. WindowSnapshot collects
the batches of the current window; when W records have gone by, the window's
state (lv) and offsets are packed and handed to the Persister, which writes
them to the state server in the background: processing never waits for it.
Snapshots carry state and offsets, never the records (those live in the
JobContainers).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gridstream.errors import GridstreamError, StaleEpoch

log = logging.getLogger(__name__)


@dataclass
class LatestSnapshot:
    """M = (r, lv, fun, os, offset) of the batch the operator holds now."""

    record: tuple[str, int] | None = None
    """r: the batch's (channel, sequence)."""
    state: dict[str, dict[Any, Any]] = field(default_factory=dict)
    """lv: the operator's keyed state (a live reference)."""
    functions: tuple[str, ...] = ()
    """fun: import paths of the chained stages."""
    done: bool = True
    """os: whether the operator has finished with r (output emitted)."""
    offset: int = 0
    """Position in the container of the next batch to take."""

    def begin(self, channel: str, sequence: int, offset: int) -> None:
        """os=false: the batch at ``offset`` is being processed."""
        self.record = (channel, sequence)
        self.done = False
        self.offset = offset

    def finish(self, next_offset: int) -> None:
        """os=true, offset+1: output emitted and acknowledged, as one step."""
        self.done = True
        self.offset = next_offset


@dataclass
class WindowSnapshot:
    """The batches of the current window, and the window's number."""

    window: int = 0
    records: int = 0
    batches: list[tuple[str, int, int]] = field(default_factory=list)
    """(channel, sequence, offset) of every batch in the window."""

    def add(self, channel: str, sequence: int, offset: int, count: int) -> None:
        """Appends the M of a finished batch."""
        self.batches.append((channel, sequence, offset))
        self.records += count

    def close(self) -> int:
        """Ends the window; returns its number and starts the next."""
        number = self.window
        self.window += 1
        self.records = 0
        self.batches = []
        return number


@dataclass(frozen=True)
class PendingSnapshot:
    """A packed window snapshot waiting to be written."""

    window: int
    offset: int
    payload: bytes


WriteRows = Callable[[dict[Any, Any], list[tuple[str, str, str, str]]], Any]
WriteSnapshot = Callable[[PendingSnapshot], Any]


class Persister:
    """Writes result rows, dead letters and window snapshots of one operator to
    the state server, in the background and in order: the rows produced
    before a snapshot are durable before the snapshot is.

    Pending rows are merged by key (a later value replaces an earlier one), and
    a newer snapshot replaces an older one not yet started, so a slow state
    server costs memory bounded by the operator's state, not by the stream.
    Failed writes are retried with backoff; nothing pending is dropped.
    """

    def __init__(
        self,
        write_rows: WriteRows,
        write_snapshot: WriteSnapshot,
        on_durable: Callable[[int], None],
        name: str,
    ) -> None:
        self._write_rows = write_rows
        self._write_snapshot = write_snapshot
        self._on_durable = on_durable
        self._name = name
        self._rows: dict[Any, Any] = {}
        self._dead: list[tuple[str, str, str, str]] = []
        self._snapshot: PendingSnapshot | None = None
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.windows_persisted = 0
        self.last_durable_window = -1
        self.fenced = False

    def submit(
        self,
        rows: dict[Any, Any],
        dead_letters: list[tuple[str, str, str, str]],
        snapshot: PendingSnapshot | None = None,
    ) -> None:
        """Queues work without waiting."""
        if rows:
            self._rows.update(rows)
        if dead_letters:
            self._dead.extend(dead_letters)
        if snapshot is not None:
            self._snapshot = snapshot
        if self._rows or self._dead or self._snapshot is not None:
            self._idle.clear()
            self._wake.set()

    @property
    def pending(self) -> int:
        """Rows, dead letters and snapshots not yet durable."""
        return (
            len(self._rows)
            + len(self._dead)
            + (1 if self._snapshot is not None else 0)
            + self._in_flight
        )

    async def wait_idle(self) -> None:
        """Waits until everything submitted so far is durable."""
        await self._idle.wait()

    async def _retrying(self, what: str, call: Callable[[], Any]) -> bool:
        """Retries until done (True); False when the state servers fenced this
        operator: a newer owner writes its state now, so retrying is pointless."""
        delay = 0.05
        while True:
            try:
                await call()
                return True
            except asyncio.CancelledError:
                raise
            except StaleEpoch as exc:
                log.error("%s: writing %s refused, this owner was fenced (%s); its successor "
                          "owns the operator's state", self._name, what, exc)
                self.fenced = True
                return False
            except (GridstreamError, OSError) as exc:
                log.warning("%s: writing %s failed (%s); retrying in %.2fs",
                            self._name, what, exc, delay)
            except Exception:
                log.exception("%s: writing %s failed; retrying in %.2fs", self._name, what, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def run(self) -> None:
        """The background loop; owned and cancelled by the task runner."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            rows, self._rows = self._rows, {}
            dead, self._dead = self._dead, []
            snapshot, self._snapshot = self._snapshot, None
            self._in_flight = len(rows) + len(dead) + (1 if snapshot else 0)
            if rows or dead:
                await self._retrying("result rows", functools.partial(self._write_rows, rows, dead))
            if snapshot is not None and await self._retrying(
                f"window {snapshot.window}", functools.partial(self._write_snapshot, snapshot)
            ):
                self.windows_persisted += 1
                self.last_durable_window = snapshot.window
                self._on_durable(snapshot.offset)
            self._in_flight = 0
            if not (self._rows or self._dead or self._snapshot is not None):
                self._idle.set()
