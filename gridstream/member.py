"""Registration and heartbeats of a member (worker or state server).

Heartbeats used to be sent by a task on the member's event loop, so they
proved that the loop was free, not that the process was alive: a state
server committing a long transaction, or a worker decoding a big batch on a
saturated machine, went silent for as long as its loop was held and could be
declared dead while it was working. A busy member convicted is worse than a
slow one: its partitions move, its state is read back elsewhere, and the
move adds load where there already was too much.

So :class:`MemberAgent` sends heartbeats from a thread of its own, on a
blocking gRPC channel of its own. The event loop still has a say: a task on
the loop stamps a *pulse* every :data:`PULSE_S`, and the thread

* reports the loop's worst lateness since the previous heartbeat
  (``loop_lag_ms``; the scheduler shows it per member), and
* stops heartbeating while the loop has not pulsed for
  ``cluster.loop_stall_limit_s``: a member whose loop is stuck cannot do its
  work, and silence is how it gets its work moved. Its heartbeats resume
  when the loop does; the scheduler then tells it to register again, and the
  loop fences itself before it rejoins, as after any conviction.

A process that is stopped (SIGSTOP) or killed stops all its threads, so
pauses and kills are detected exactly as before.

Everything the loop must act on (the first registration, a newer epoch, a
request to fence) goes from the thread to the loop through one queue, read
by one task that :meth:`MemberAgent.run` owns, in the order it happened.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc

from gridstream import rpc
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

PULSE_S = 0.05
"""How often the event loop tells the heartbeat thread that it runs."""

LOOP_STALL_LIMIT_S = 5.0
"""Default of ``cluster.loop_stall_limit_s``."""

_JOIN_TIMEOUT_S = 5.0
"""Longest wait for the heartbeat thread to finish its call in flight."""


@dataclass
class _Registered:
    """The thread registered (again) and learnt this epoch."""

    epoch: int


@dataclass
class _Epoch:
    """A heartbeat's answer named this epoch."""

    epoch: int


@dataclass
class _Fence:
    """The scheduler no longer counts this member: fence before rejoining.
    ``done`` is set by the loop once the member has fenced."""

    done: threading.Event = field(default_factory=threading.Event)


_LoopEvent = _Registered | _Epoch | _Fence


class MemberAgent:
    """Registers a member with the scheduler and keeps it counted alive.

    Keeps going through scheduler restarts: a failed heartbeat is retried on
    the next beat, and a scheduler that no longer knows the member (the
    ``reregister`` flag) gets a fresh registration once ``on_fence`` has
    run. ``on_epoch`` is called on the loop with the epoch of every answer;
    the callee decides whether it is news. ``heartbeat_fields`` is called on
    the loop once per heartbeat interval; the thread sends its latest result.
    """

    def __init__(
        self,
        scheduler_address: str,
        node_id: str,
        role: int,
        address: str,
        on_epoch: Callable[[int], Coroutine[Any, Any, None]] | None = None,
        on_fence: Callable[[], Coroutine[Any, Any, None]] | None = None,
        heartbeat_fields: Callable[[], dict[str, Any]] | None = None,
        loop_stall_limit_s: float = LOOP_STALL_LIMIT_S,
    ) -> None:
        self.scheduler_address = scheduler_address
        self.node_id = node_id
        self.role = role
        self.address = address
        self.incarnation = uuid.uuid4().hex
        self.epoch = 0
        self.interval_s = 0.25
        self.loop_stall_limit_s = loop_stall_limit_s
        self.registered = asyncio.Event()
        """Set on the loop once the scheduler has answered a registration."""
        self._on_epoch = on_epoch
        self._on_fence = on_fence
        self._heartbeat_fields = heartbeat_fields
        self._channel = rpc.open_blocking_channel(scheduler_address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._metadata = rpc.member_metadata()
        self._stop = threading.Event()
        # Written by the loop, read by the thread (single assignments: the
        # GIL makes each one atomic; nothing needs the two to agree).
        self._pulse_at = time.monotonic()
        self._worst_late_s = 0.0
        self._fields: dict[str, Any] = {}
        # The thread's own view.
        self._registered_here = False
        self._withholding = False

    # -- the loop's side --------------------------------------------------------

    async def run(self) -> None:
        """Starts the heartbeat thread and serves it on the loop until
        cancelled; then stops the thread and waits for it."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[_LoopEvent] = asyncio.Queue()

        def post(event: _LoopEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self._stop.clear()
        self._pulse_at = time.monotonic()
        thread = threading.Thread(target=self._beat_forever, args=(post,),
                                  name=f"heartbeats {self.node_id}", daemon=True)
        thread.start()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pulse_forever(), name="heartbeat pulse")
                group.create_task(self._serve_events(events), name="heartbeat answers")
        finally:
            self._stop.set()
            await asyncio.to_thread(thread.join, _JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("the heartbeat thread did not stop within %.0f s", _JOIN_TIMEOUT_S)

    async def _pulse_forever(self) -> None:
        """Tells the thread, every :data:`PULSE_S`, that the loop runs, how
        late it woke, and (once per interval) what heartbeats should carry."""
        fields_due = 0.0
        while True:
            before = time.monotonic()
            await asyncio.sleep(PULSE_S)
            now = time.monotonic()
            self._worst_late_s = max(self._worst_late_s, now - before - PULSE_S)
            self._pulse_at = now
            if now >= fields_due and self._heartbeat_fields is not None:
                self._fields = self._heartbeat_fields()
                fields_due = now + self.interval_s

    async def _serve_events(self, events: asyncio.Queue[_LoopEvent]) -> None:
        """Acts on what the thread learnt, in order."""
        while True:
            event = await events.get()
            if isinstance(event, _Fence):
                try:
                    if self._on_fence is not None:
                        await self._on_fence()
                finally:
                    self.registered.clear()
                    event.done.set()
                continue
            if isinstance(event, _Registered):
                self.registered.set()
            if self._on_epoch is not None:
                await self._on_epoch(event.epoch)

    async def close(self) -> None:
        """Tells the scheduler this member is stopping on purpose (so an
        operator's restart is not logged as a failure), then closes the
        channel. Best effort: a scheduler that is down learns it from silence.
        Call it after :meth:`run` has been cancelled."""
        self._stop.set()
        if self.registered.is_set():
            try:
                await asyncio.to_thread(
                    self._stub.Heartbeat,
                    scheduler_pb2.HeartbeatRequest(node_id=self.node_id,
                                                   incarnation=self.incarnation,
                                                   epoch=self.epoch, stopping=True),
                    timeout=rpc.HEARTBEAT_TIMEOUT_S, metadata=self._metadata)
            except grpc.RpcError as exc:
                log.debug("announcing the stop to the scheduler failed: %s", _code(exc))
        self._channel.close()

    # -- the thread's side ------------------------------------------------------

    def _beat_forever(self, post: Callable[[_LoopEvent], None]) -> None:
        """The thread's body: registers (retrying until the scheduler
        answers), then heartbeats every interval until stopped."""
        next_beat = time.monotonic()
        while not self._stop.is_set():
            try:
                if not self._registered_here:
                    self._register(post)
                else:
                    self._beat(post)
            except grpc.RpcError as exc:
                log.debug("heartbeat to scheduler failed: %s", _code(exc))
            except Exception:  # a bug here must not end the heartbeats in silence
                log.exception("a heartbeat could not be sent; trying again at the next one")
            next_beat += self.interval_s
            if self._stop.wait(max(0.0, next_beat - time.monotonic())):
                return
            next_beat = max(next_beat, time.monotonic() - self.interval_s)

    def _register(self, post: Callable[[_LoopEvent], None]) -> None:
        response = self._stub.Register(
            scheduler_pb2.RegisterRequest(
                node_id=self.node_id,
                role=self.role,  # type: ignore[arg-type]
                address=self.address,
                incarnation=self.incarnation,
            ),
            timeout=rpc.CONTROL_TIMEOUT_S, metadata=self._metadata,
        )
        self.interval_s = max(0.01, response.heartbeat_interval_ms / 1000)
        self.epoch = max(self.epoch, response.epoch)
        self._registered_here = True
        log.info("registered with scheduler at %s, epoch %d", self.scheduler_address,
                 response.epoch)
        post(_Registered(response.epoch))

    def _beat(self, post: Callable[[_LoopEvent], None]) -> None:
        held_s = time.monotonic() - self._pulse_at
        if held_s >= self.loop_stall_limit_s:
            if not self._withholding:
                self._withholding = True
                log.error("the event loop has not run for %.1f s (cluster.loop_stall_limit_s "
                          "= %.1f s): withholding heartbeats so that the scheduler moves this "
                          "member's work", held_s, self.loop_stall_limit_s)
            return
        if self._withholding:
            self._withholding = False
            log.warning("the event loop runs again; heartbeats resume")
        late_s, self._worst_late_s = self._worst_late_s, 0.0
        response = self._stub.Heartbeat(
            scheduler_pb2.HeartbeatRequest(
                node_id=self.node_id, incarnation=self.incarnation, epoch=self.epoch,
                loop_lag_ms=min(int(max(late_s, held_s) * 1000), 2**32 - 1), **self._fields,
            ),
            timeout=max(rpc.HEARTBEAT_TIMEOUT_S, self.interval_s * 2), metadata=self._metadata,
        )
        if response.reregister:
            log.warning("scheduler asked %s to register again (declared dead or unknown); "
                        "fencing before rejoining", self.node_id)
            fence = _Fence()
            post(fence)
            while not fence.done.wait(self.interval_s):
                if self._stop.is_set():
                    return
            self._registered_here = False
            return
        self.epoch = max(self.epoch, response.epoch)
        post(_Epoch(response.epoch))


def _code(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    return code.name if code is not None else type(exc).__name__
