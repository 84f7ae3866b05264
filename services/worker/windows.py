"""Event-time windows on a worker: the sending side's watermark
(:class:`TimedShuffle`) and the ``window`` stage (:class:`WindowStep`).

The shuffle into a window stage runs the stage's timestamp function on every
record it sends and keeps the highest event time this partition has seen; its
watermark (that minus ``max_delay``) rides on every segment it sends
(``RecordBatch.watermark``), and an empty segment carries it to a partition
the batch had no records for, once it advanced by a tick (the window's size,
slide or gap). Both numbers are part of the sender's window snapshot (the
edge's header), so a replay sends the same watermarks with the same
sequences.

The window stage keeps, per input channel (``t<task>/p<partition>``), the
newest watermark it heard; the stage's watermark is the minimum over every
channel its upstream tasks can send on (one never heard holds time back),
leaving out channels more than ``idle_timeout`` behind the most advanced.
When it advances, every window whose end plus ``lateness`` it reached fires,
once, in a fixed order (end, start, key), and leaves the state; a record whose
windows have all fired is late and goes to the stage's output tagged as such
(the side output, :func:`gridstream.eventtime.late_records`). Windows and
watermarks are keyed state of the stage (the watermarks under the stage's
name plus ``@wm``), so they are in every window snapshot: a task restored
from one neither fires a window again nor skips one.

A window folds ``acc = fn(acc, record)`` as records come, or, with
``process = true``, keeps the window's records (``[time, record]`` pairs, as
a session does) and calls ``fn(key, start, end, records)`` once when it
fires, the records in the order (time, encoding) — whatever order they came
in. A function that raises sends the window to the dead letters, not the
task down. A captured snapshot shares the state's lists, so a batch copies a
key's panes before its first change to them and changes only its copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gridstream.codec import pack
from gridstream.eventtime import FIRED, LATE, WindowConfig, event_time, window_config
from gridstream.jobspec import Stage

Event = tuple[str, float | None, tuple[str, ...]]
"""What a window stage needs of a batch besides its records: the channel it
came on, the watermark it carries (None: none) and every channel the stage's
task can hear from."""
TASK = "@task"
"""The stage's own watermark, in its ``@wm`` state."""


def _order(key: Any) -> tuple[str, Any]:
    return type(key).__name__, key


def _rank(item: list[Any]) -> tuple[Any, bytes]:
    """A record's place in its window: (time, its encoding), so the order does
    not depend on arrival; records that encode the same are the same record."""
    try:
        return item[0], pack(item[1])
    except Exception:  # not msgpack data (only in-process tests send such)
        return item[0], repr(item[1]).encode()


class Clock:
    """A stage's event time: the newest watermark heard per input channel and
    the stage's own, the minimum over its inputs (idle ones left out), which
    never goes back; all in the stage's ``@wm`` state (so in its snapshots)."""

    def __init__(self, marks: dict[Any, Any], touched: set[Any],
                 idle_timeout: float | None) -> None:
        self.marks = marks
        """channel -> watermark heard, and ``@task`` -> the stage's watermark."""
        self.touched = touched
        self.idle_timeout = idle_timeout

    @property
    def watermark(self) -> float:
        """The stage's watermark (-inf before any)."""
        return float(self.marks.get(TASK, -math.inf))

    def advance(self, event: Event) -> float | None:
        """Takes in a batch's watermark; the stage's new one if it advanced."""
        channel, mark, inputs = event
        if mark is None:
            return None
        if mark > self.marks.get(channel, -math.inf):
            self.marks[channel] = mark
            self.touched.add(channel)
        heard = [float(self.marks.get(c, -math.inf)) for c in inputs]
        idle = self.idle_timeout
        if idle is not None and heard:
            ahead = max(heard)
            heard = [m for m in heard if m >= ahead - idle] or [ahead]
        now = min(heard) if heard else -math.inf
        if now <= self.watermark:
            return None
        self.marks[TASK] = now
        self.touched.add(TASK)
        return now


class EventTimeStep:
    """What every event-time stage of a partition shares (a window, a
    stream-table join, a windowed join): its settings and functions, its keyed
    state with the keys a batch touched, the clock of its watermarks, and the
    event of the batch being processed (set by the chain before each batch)."""

    def __init__(self, stage: Stage, fn: Callable[..., Any],
                 timestamp: Callable[[Any], Any], state: dict[Any, Any], touched: set[Any],
                 marks: dict[Any, Any], marks_touched: set[Any]) -> None:
        self.stage = stage
        self.config: WindowConfig = window_config(stage.params, stage.name, stage.kind)
        self.fn = fn
        self.timestamp = timestamp
        self.state = state
        self.touched = touched
        self.clock = Clock(marks, marks_touched, self.config.idle_timeout)
        self.event: Event | None = None

    def keyed(self, keys: list[Any] | None) -> list[Any]:
        """The batch's keys; an event-time stage always runs after a shuffle."""
        if keys is None:
            raise RuntimeError(f"stage {self.stage.name} is keyed but received records "
                               "without keys")
        return keys


class WindowStep(EventTimeStep):
    """The ``window`` stage of one partition (see the module docstring). Its
    state: key -> [[start, end, acc], ...]; a session's acc, and a process
    window's, is its [ts, value]s."""

    def __init__(self, stage: Stage, fn: Callable[..., Any],
                 timestamp: Callable[[Any], Any], fresh: Callable[[], Any],
                 state: dict[Any, Any], touched: set[Any], marks: dict[Any, Any],
                 marks_touched: set[Any]) -> None:
        super().__init__(stage, fn, timestamp, state, touched, marks, marks_touched)
        self.fresh = fresh
        """A fresh accumulator (the stage's ``initial``, copied when mutable)."""
        self._first_end = -math.inf
        """No window in the state ends before this (-inf: unknown, look)."""
        self._mine: set[Any] = set()
        """Keys whose panes this batch copied already (see :meth:`_panes`)."""

    @property
    def output_watermark(self) -> float | None:
        """The watermark carried past the stage (to a second event-time stage
        downstream): the earliest start a window that has not fired can have,
        as a fired window's time is its start (:func:`gridstream.eventtime.window_start`).
        A session's is the earliest of its open sessions' starts and the
        start a record not yet late could open; that one looks at the state."""
        due = self.clock.watermark - self.config.lateness
        if due == -math.inf:
            return None
        if self.config.type != "session":
            return self.config.first_start(due)
        opened = (p[0] for panes in self.state.values() for p in panes)
        return min(due - self.config.gap, min(opened, default=math.inf))

    def run(self, keys: list[Any] | None, values: list[Any],
            dead: Any) -> tuple[list[Any], list[Any]]:
        keys = self.keyed(keys)
        out_k: list[Any] = []
        out_v: list[Any] = []
        cfg = self.config
        due = self.clock.watermark - cfg.lateness
        self._mine.clear()  # a window ending at or before this has fired
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            try:
                ts = event_time(self.timestamp, v)
                if cfg.type == "session":
                    late = ts + cfg.gap <= due
                    if not late:
                        self._add_session(k, ts, v, self._panes(k))
                else:
                    windows = [w for w in cfg.windows(ts) if w[1] > due]
                    late = not windows
                    if not late:
                        self._add(k, windows, ts, v)
            except Exception as exc:
                if self.state.get(k) == []:  # a first record the fold refused
                    del self.state[k]
                dead.add(self.stage.name, i, k, v, exc)
                continue
            if late:
                out_k.append(k)
                out_v.append({"tag": LATE, "key": k, "time": ts, "record": v})
        if self.event is not None:
            now = self.clock.advance(self.event)
            if now is not None:
                self._fire(now - cfg.lateness, len(values), out_k, out_v, dead)
        self._mine.clear()
        return out_k, out_v

    def _panes(self, key: Any) -> list[Any]:
        """The key's panes, this batch's own: a captured snapshot may share
        the state's lists, so the first change in a batch copies them (and a
        session's or process window's record lists) once."""
        panes = self.state.get(key)
        if panes is None:
            panes = []
        elif key not in self._mine:
            items = self.config.process or self.config.type == "session"
            panes = [[p[0], p[1], list(p[2])] if items else list(p) for p in panes]
        self._mine.add(key)
        self.state[key] = panes
        self.touched.add(key)
        return panes

    def _add(self, key: Any, windows: list[tuple[float, float]], ts: float,
             value: Any) -> None:
        if self.config.process:
            for item in self._missing(key, windows):
                item.append([ts, value])
            return
        fn = self.fn
        panes = self._panes(key)
        for start, end in windows:
            for pane in panes:
                if pane[0] == start and pane[1] == end:
                    pane[2] = fn(pane[2], value)
                    break
            else:
                panes.append([start, end, fn(self.fresh(), value)])
                self._first_end = min(self._first_end, end)

    def _missing(self, key: Any, windows: list[tuple[float, float]]) -> list[list[Any]]:
        """The record lists of the key's panes of ``windows``, opened where missing."""
        panes = self._panes(key)
        found = []
        for start, end in windows:
            for pane in panes:
                if pane[0] == start and pane[1] == end:
                    found.append(pane[2])
                    break
            else:
                panes.append([start, end, []])
                found.append(panes[-1][2])
                self._first_end = min(self._first_end, end)
        return found

    def _add_session(self, key: Any, ts: float, value: Any, panes: list[Any]) -> None:
        start, end, items = ts, ts + self.config.gap, [[ts, value]]
        kept = []
        for pane in panes:  # the batch's own copies: merged in place
            if pane[0] < end and start < pane[1]:  # overlapping sessions merge
                start, end = min(start, pane[0]), max(end, pane[1])
                pane[2].extend(items)
                items = pane[2]
            else:
                kept.append(pane)
        kept.append([start, end, items])
        self._first_end = min(self._first_end, end)
        panes[:] = kept

    def _fire(self, due: float, base: int, out_k: list[Any], out_v: list[Any],
              dead: Any) -> None:
        if due < self._first_end:
            return  # nothing ends this early: no need to look
        fired: list[tuple[float, float, tuple[str, Any], Any, Any]] = []
        first = math.inf
        for key, panes in self.state.items():
            for p in panes:
                if p[1] <= due:
                    fired.append((p[1], p[0], _order(key), key, p[2]))
                else:
                    first = min(first, p[1])
        self._first_end = first
        if not fired:
            return
        fired.sort(key=lambda f: (f[0], f[1], f[2]))
        for n, (end, start, _, key, acc) in enumerate(fired):
            try:
                value = self._result(key, start, end, acc)
            except Exception as exc:  # the window to the dead letters; the task goes on
                records = [item[1] for item in sorted(acc, key=_rank)]
                dead.add(self.stage.name, base + n, key,
                         {"start": start, "end": end, "records": records}, exc)
                continue
            out_k.append(key)
            out_v.append({"tag": FIRED, "key": key, "start": start, "end": end, "value": value})
        for key in {f[3] for f in fired}:
            left = [p for p in self.state[key] if p[1] > due]
            if left:
                self.state[key] = left
            else:
                del self.state[key]
            self.touched.add(key)


    def _result(self, key: Any, start: float, end: float, acc: Any) -> Any:
        """A fired window's value: the process function's over its records in
        (time, encoding) order, a session's fold over them in that order, or
        the fold's accumulator."""
        if self.config.process:
            return self.fn(key, start, end, [r for _, r in sorted(acc, key=_rank)])
        if self.config.type == "session":
            value = self.fresh()
            for _, item in sorted(acc, key=_rank):
                value = self.fn(value, item)
            return value
        return acc
