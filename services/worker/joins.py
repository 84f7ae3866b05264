"""The ``join`` stage: an event-time stream-table join, per key.

Its input is the union of two tagged streams (:func:`gridstream.eventtime.tag`
makes each record ``[side, key, time, value]``): the *table* side is a
changelog, each record the key's value from its time on; the *stream* side's
records are enriched with the table's value **as of their own time** — the
newest table record of the key at or before it. A stream record waits in the
stage's state until the watermark (:class:`services.worker.windows.Clock`,
the same as a window stage's) passes its time, when every table record that
can come before it has come; then it goes out, once, as
``fn(record, table_value)`` (a left join gives table_value None when the key
has none yet; an inner join drops the record). The output therefore does not
depend on how the two sides interleave on arrival, and a replay from a
snapshot (the table's versions, the waiting records and the watermarks are
all keyed state of the stage) gives the same. A stream record whose time the
watermark has already passed is late: it goes to the side output
(:func:`gridstream.eventtime.late_records`), as a window's late records do.
Table versions older than the newest one before the watermark are dropped.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

from gridstream.eventtime import JOINED, LATE, event_time
from gridstream.jobspec import Stage
from services.worker.windows import EventTimeStep, _order


class TableJoinStep(EventTimeStep):
    """The ``join`` stage of one partition (see the module docstring). Its
    state: key -> [[[time, table value], ...] by time, [[time, stream record], ...]]."""

    def __init__(self, stage: Stage, fn: Callable[[Any, Any], Any],
                 timestamp: Callable[[Any], Any], state: dict[Any, Any], touched: set[Any],
                 marks: dict[Any, Any], marks_touched: set[Any]) -> None:
        super().__init__(stage, fn, timestamp, state, touched, marks, marks_touched)
        self._first_wait = -math.inf
        """No stream record waits with a time before this (-inf: unknown, look)."""

    @property
    def output_watermark(self) -> float | None:
        """The watermark carried past the stage: its own, as a joined record's
        time is the stream record's, which came at or after it."""
        mark = self.clock.watermark
        return None if mark == -math.inf else mark

    def run(self, keys: list[Any] | None, values: list[Any],
            dead: Any) -> tuple[list[Any], list[Any]]:
        keys = self.keyed(keys)
        out_k: list[Any] = []
        out_v: list[Any] = []
        mark = self.clock.watermark
        mine: set[Any] = set()
        """Keys whose lists this batch copied already (a captured window
        snapshot shares the lists it holds, so they are copied before the
        first change in a batch, never changed in place)."""
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            try:
                ts = event_time(self.timestamp, v)
                side, value = v[0], v[3]
                if side not in ("table", "stream"):
                    raise ValueError(f"a join's record must come from its table or stream "
                                     f"side, not {side!r}")
            except Exception as exc:
                dead.add(self.stage.name, i, k, v, exc)
                continue
            if side == "stream" and ts < mark:
                out_k.append(k)
                out_v.append({"tag": LATE, "key": k, "time": ts, "record": value})
                continue
            held = self.state.get(k)
            if held is None:
                versions, waiting = [], []
            elif k in mine:
                versions, waiting = held
            else:
                versions, waiting = list(held[0]), list(held[1])
            mine.add(k)
            if side == "table":
                versions.insert(bisect.bisect_right([t for t, _ in versions], ts),
                                [ts, value])
            else:
                waiting.append([ts, value])
                self._first_wait = min(self._first_wait, ts)
            self.state[k] = [versions, waiting]
            self.touched.add(k)
        if self.event is not None:
            now = self.clock.advance(self.event)
            if now is not None:
                self._emit(now, len(values), out_k, out_v, dead)
        return out_k, out_v

    def _emit(self, now: float, base: int, out_k: list[Any], out_v: list[Any],
              dead: Any) -> None:
        """Every stream record with a time before ``now``, joined, in the order
        (time, key, arrival); then the versions no record can need again go."""
        if now <= self._first_wait:
            return  # no record waits for this time yet
        none = _NONE if self.config.type == "inner" else None
        ready: list[tuple[float, tuple[str, Any], int, Any, Any, Any]] = []
        first = math.inf
        for key, (versions, waiting) in self.state.items():
            for n, (ts, record) in enumerate(waiting):
                if ts < now:
                    at = bisect.bisect_right([t for t, _ in versions], ts) - 1
                    ready.append((ts, _order(key), n, key, record,
                                  versions[at][1] if at >= 0 else none))
                else:
                    first = min(first, ts)
        self._first_wait = first
        ready.sort(key=lambda r: (r[0], r[1], r[2]))
        for n, (ts, _, _, key, record, table) in enumerate(ready):
            if table is _NONE:
                continue
            try:
                joined = self.fn(record, table)
            except Exception as exc:
                dead.add(self.stage.name, base + n, key, record, exc)
                continue
            out_k.append(key)
            out_v.append({"tag": JOINED, "key": key, "time": ts, "value": joined})
        for key in list(self.state):
            versions, waiting = self.state[key]
            left = [w for w in waiting if w[0] >= now]
            keep = max(0, bisect.bisect_left([t for t, _ in versions], now) - 1)
            if len(left) != len(waiting) or keep:
                self.state[key] = [versions[keep:], left]
                self.touched.add(key)


class _Missing:
    """Stands for "no table value" in an inner join (distinct from None)."""


_NONE: Any = _Missing()
