"""A ``stateful`` stage with per-key timers on a worker (:class:`TimerStep`);
the user's side is :mod:`gridstream.timers`.

State, all of it keyed state of the stage, so in every window snapshot and
delta (a restored task neither fires a timer again nor skips one):

- under the stage's name, each key's state, as a plain ``stateful`` keeps it;
- under ``<stage>@timers``, each key's pending timers as
  ``[event times, processing times]``, each list sorted;
- under ``<stage>@wm``, the watermarks heard per input channel and the
  stage's own (a window's :class:`~services.worker.windows.Clock`), and
  ``@now``, the processing time handed out last.

A batch runs in three steps: the processing clock moves to the time recorded
with the batch (never back) and the processing-time timers it reached fire;
the records run through ``fn``; the watermark the batch carries is taken in
and the event-time timers it reached fire, then any processing-time timer set
meanwhile for a time already reached. Timers fire once each, by (time, key);
a timer set while timers fire, for a time already reached, fires at the next
step. Lists are replaced, never changed in place, because a captured snapshot
shares them (:meth:`~services.worker.operators.OperatorChain.snapshot_state`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from gridstream.jobspec import Stage
from gridstream.timers import EVENT, PROCESSING, Timer, TimerConfig, fired_order
from services.worker.windows import Clock, Event

NOW = "@now"
"""The processing time handed out last, in the stage's ``@wm`` state."""
_SLOT = {EVENT: 0, PROCESSING: 1}


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a timer's time must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"a timer's time {value} is not finite")
    return value


class _Context:
    """The :class:`gridstream.timers.Context` of one call: the key's timers
    are copied on the first change and written back only when the call
    succeeds, so a call that raises (its record dead-lettered) changes no
    timer, as it changes no state."""

    __slots__ = ("_changed", "_lists", "_rng", "_seed", "_step", "key")

    def __init__(self, step: TimerStep, key: Any, seed: str) -> None:
        self._step = step
        self.key = key
        self._seed = seed
        self._lists: list[list[float]] | None = None
        self._changed = False
        self._rng: random.Random | None = None

    @property
    def watermark(self) -> float:
        return self._step.clock.watermark

    def now(self) -> float:
        return self._step.now

    def _mine(self) -> list[list[float]]:
        if self._lists is None:
            held = self._step.timers.get(self.key)
            self._lists = [list(held[0]), list(held[1])] if held else [[], []]
        return self._lists

    def _set(self, domain: str, time: Any) -> None:
        if not self._step.config.on_timer:
            raise RuntimeError(f"stage {self._step.stage.name} has no on_timer function to "
                               "fire: give stateful(..., on_timer=fn)")
        times = self._mine()[_SLOT[domain]]
        at = _time(time)
        if at not in times:
            times.append(at)
            times.sort()
            self._changed = True

    def _delete(self, domain: str, time: Any) -> None:
        times = self._mine()[_SLOT[domain]]
        if time in times:
            times.remove(time)
            self._changed = True

    def set_timer(self, time: float) -> None:
        self._set(EVENT, time)

    def delete_timer(self, time: float) -> None:
        self._delete(EVENT, time)

    def set_processing_timer(self, time: float) -> None:
        self._set(PROCESSING, time)

    def delete_processing_timer(self, time: float) -> None:
        self._delete(PROCESSING, time)

    def timers(self) -> list[Timer]:
        lists = self._lists if self._lists is not None else self._step.timers.get(self.key)
        if not lists:
            return []
        return ([Timer(t, EVENT) for t in lists[0]]
                + [Timer(t, PROCESSING) for t in lists[1]])

    def random(self) -> float:
        if self._rng is None:
            self._rng = random.Random(self._seed)  # a str seed: the same in every process
        return self._rng.random()

    def commit(self) -> None:
        """Writes the key's changed timers back (after a call that succeeded)."""
        if self._changed and self._lists is not None:
            self._step.store_timers(self.key, self._lists)


class TimerStep:
    """The timed ``stateful`` stage of one partition (see the module docstring)."""

    def __init__(self, stage: Stage, config: TimerConfig, fn: Callable[..., Any],
                 on_timer: Callable[..., Any] | None, fresh: Callable[[], Any],
                 states: dict[str, dict[Any, Any]], touched: dict[str, set[Any]]) -> None:
        self.stage = stage
        self.config = config
        self.fn = fn
        self.on_timer = on_timer
        self.fresh = fresh
        name = stage.name
        self.state, self.touched = states[name], touched[name]
        self.timers, self.timers_touched = states[name + "@timers"], touched[name + "@timers"]
        self.marks, self.marks_touched = states[name + "@wm"], touched[name + "@wm"]
        self.clock = Clock(self.marks, self.marks_touched,
                           None if config.event is None else config.event.idle_timeout)
        self.event: Event | None = None
        """The batch's channel, watermark and inputs (set by the chain), if it hears time."""
        self.batch_time = 0.0
        """The processing time recorded with the batch (set by the chain; 0: none)."""
        self.batch_id = ""
        """The batch's identity (set by the chain): seeds :meth:`_Context.random`."""
        self._first = [-math.inf, -math.inf]
        """Per domain, no timer is set before this (-inf: unknown, look)."""

    @property
    def now(self) -> float:
        """The processing time handed out last (0.0 before any)."""
        return float(self.marks.get(NOW, 0.0))

    @property
    def output_watermark(self) -> float | None:
        """The watermark carried past the stage: its own, sent after the
        timers it reached fired (as Flink forwards a watermark after firing)."""
        mark = self.clock.watermark
        return None if mark == -math.inf else mark

    def next_processing_timer(self) -> float:
        """The earliest pending processing-time timer (inf: none), or a time
        at or before it (a deleted timer's, until the next firing looks
        again). Scans the keys' timers only when not known (after a restore);
        otherwise costs nothing (services.worker.ticks asks it every 100 ms)."""
        if self.on_timer is None:
            return math.inf
        if self._first[1] == -math.inf:
            self._first[1] = min((lists[1][0] for lists in self.timers.values() if lists[1]),
                                 default=math.inf)
        return self._first[1]

    def store_timers(self, key: Any, lists: list[list[float]]) -> None:
        """Sets a key's timers (new lists: a snapshot may share the old ones)."""
        if lists[0] or lists[1]:
            self.timers[key] = lists
            for slot in (0, 1):
                if lists[slot]:
                    self._first[slot] = min(self._first[slot], lists[slot][0])
        else:
            self.timers.pop(key, None)
        self.timers_touched.add(key)

    def run(self, keys: list[Any] | None, values: list[Any],
            dead: Any) -> tuple[list[Any], list[Any]]:
        if keys is None:
            if values:
                raise RuntimeError(f"stage {self.stage.name} is keyed but received records "
                                   "without keys")
            keys = []
        out_k: list[Any] = []
        out_v: list[Any] = []
        fired = [len(values)]  # dead-letter indices of timers come after the records'
        if self.batch_time > self.now:
            self.marks[NOW] = self.batch_time
            self.marks_touched.add(NOW)
        self._fire(PROCESSING, self.now, out_k, out_v, dead, fired)
        self.touched.update(keys)
        state, fn, fresh = self.state, self.fn, self.fresh
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            ctx = _Context(self, k, f"{self.batch_id}:{i}")
            current = state[k] if k in state else fresh()
            try:
                new_state, outputs = fn(current, v, ctx)
                outputs = list(outputs)
            except Exception as exc:
                dead.add(self.stage.name, i, k, v, exc)
                continue
            ctx.commit()
            self._keep(k, new_state)
            out_v.extend(outputs)
            out_k.extend([k] * len(outputs))
        if self.event is not None:
            self.clock.advance(self.event)
        self._fire(EVENT, self.clock.watermark, out_k, out_v, dead, fired)
        self._fire(PROCESSING, self.now, out_k, out_v, dead, fired)
        return out_k, out_v

    def _keep(self, key: Any, new_state: Any) -> None:
        if new_state is None:
            self.state.pop(key, None)
        else:
            self.state[key] = new_state
        self.touched.add(key)

    def _fire(self, domain: str, due: float, out_k: list[Any], out_v: list[Any], dead: Any,
              fired: list[int]) -> None:
        """Fires, by (time, key), every timer of ``domain`` at or before ``due``."""
        slot = _SLOT[domain]
        if due < self._first[slot] or self.on_timer is None:
            return
        ready: list[tuple[float, str, Any]] = []
        first = math.inf
        for key, lists in self.timers.items():
            for t in lists[slot]:
                if t <= due:
                    ready.append(fired_order(t, key))
                else:
                    first = min(first, t)
                    break
        self._first[slot] = first
        ready.sort()
        for t, _, key in ready:
            lists = self.timers.get(key)
            if not lists or t not in lists[slot]:
                continue  # deleted by an earlier timer of its key
            left = [list(lists[0]), list(lists[1])]
            left[slot].remove(t)
            self.store_timers(key, left)  # fires once, even if on_timer raises
            ctx = _Context(self, key, f"{self.batch_id}:{domain}:{t!r}:{key!r}")
            current = self.state[key] if key in self.state else self.fresh()
            index = fired[0]
            fired[0] += 1
            try:
                new_state, outputs = self.on_timer(current, Timer(t, domain), ctx)
                outputs = list(outputs)
            except Exception as exc:
                dead.add(self.stage.name, index, key, {"timer": t, "domain": domain}, exc)
                continue
            ctx.commit()
            self._keep(key, new_state)
            out_v.extend(outputs)
            out_k.extend([key] * len(outputs))
