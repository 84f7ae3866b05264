"""The windowed stream-stream join: a ``join`` stage with a tumbling or
sliding window, inner or left.

Its input is the union of two tagged streams (:func:`gridstream.eventtime.tag`
makes each record ``[side, key, time, value]``, side ``left`` or ``right``).
Per key and event-time window the stage keeps both sides' records; when the
watermark (:class:`services.worker.windows.Clock`, a window's) passes the
window's end plus ``lateness``, the window fires once: an inner join emits
``fn(left, right)`` for every pair of the window's left and right records, a
left join also ``fn(left, None)`` for each left record the window has no
right record for. This is Flink's window join (``join().where().equalTo()
.window(...)``, with coGroup's left outer variant), not an interval join: a
pair joins when both fall in the same window, so with sliding windows a pair
joins once per window they share.

The order is fixed whatever order the records came in: windows by (end,
start, key), as a window stage fires them; inside a window, left records by
(time, encoded record), and for each its right records in the same order.
A record whose windows have all fired is late and goes to the side output
(:func:`gridstream.eventtime.late_records`), from either side. Windows and
watermarks are keyed state of the stage, in every window snapshot, as a
window stage's are: a task restored from one fires no window twice and skips
none, with the same outputs in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gridstream.eventtime import JOINED, LATE, event_time
from gridstream.jobspec import Stage
from services.worker.windows import EventTimeStep, _order, _rank

SIDES = ("left", "right")


class WindowJoinStep(EventTimeStep):
    """The windowed ``join`` stage of one partition (see the module docstring).
    Its state: key -> [[start, end, [[time, left], ...], [[time, right], ...]], ...]."""

    def __init__(self, stage: Stage, fn: Callable[[Any, Any], Any],
                 timestamp: Callable[[Any], Any], state: dict[Any, Any], touched: set[Any],
                 marks: dict[Any, Any], marks_touched: set[Any]) -> None:
        super().__init__(stage, fn, timestamp, state, touched, marks, marks_touched)
        self._first_end = -math.inf
        """No window in the state ends before this (-inf: unknown, look)."""

    @property
    def output_watermark(self) -> float | None:
        """The watermark carried past the stage: the earliest start a window
        not fired yet can have (a joined record's time is its window's start)."""
        due = self.clock.watermark - self.config.lateness
        return None if due == -math.inf else self.config.first_start(due)

    def run(self, keys: list[Any] | None, values: list[Any],
            dead: Any) -> tuple[list[Any], list[Any]]:
        keys = self.keyed(keys)
        out_k: list[Any] = []
        out_v: list[Any] = []
        cfg = self.config
        due = self.clock.watermark - cfg.lateness
        mine: set[Any] = set()
        """Keys whose panes this batch copied already (a captured window
        snapshot shares the lists it holds: copied once, never changed in place)."""
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            try:
                ts = event_time(self.timestamp, v)
                side = SIDES.index(v[0]) if v[0] in SIDES else -1
                if side < 0:
                    raise ValueError(f"a windowed join's record must come from its left or "
                                     f"right side, not {v[0]!r}")
                windows = [w for w in cfg.windows(ts) if w[1] > due]
            except Exception as exc:
                dead.add(self.stage.name, i, k, v, exc)
                continue
            if not windows:
                out_k.append(k)
                out_v.append({"tag": LATE, "key": k, "time": ts, "record": v[3]})
                continue
            self._add(k, windows, side, [ts, v[3]], k in mine)
            mine.add(k)
        if self.event is not None:
            now = self.clock.advance(self.event)
            if now is not None:
                self._fire(now - cfg.lateness, len(values), out_k, out_v, dead)
        return out_k, out_v

    def _add(self, key: Any, windows: list[tuple[float, float]], side: int,
             item: list[Any], copied: bool) -> None:
        panes = self.state.get(key)
        if panes is None:
            panes = []
        elif not copied:
            panes = [[p[0], p[1], list(p[2]), list(p[3])] for p in panes]
        for start, end in windows:
            for pane in panes:
                if pane[0] == start and pane[1] == end:
                    pane[2 + side].append(item)
                    break
            else:
                pane = [start, end, [], []]
                pane[2 + side].append(item)
                panes.append(pane)
                self._first_end = min(self._first_end, end)
        self.state[key] = panes
        self.touched.add(key)

    def _fire(self, due: float, base: int, out_k: list[Any], out_v: list[Any],
              dead: Any) -> None:
        if due < self._first_end:
            return  # nothing ends this early: no need to look
        fired: list[tuple[float, float, tuple[str, Any], Any, list[Any]]] = []
        first = math.inf
        for key, panes in self.state.items():
            for p in panes:
                if p[1] <= due:
                    fired.append((p[1], p[0], _order(key), key, p))
                else:
                    first = min(first, p[1])
        self._first_end = first
        if not fired:
            return
        fired.sort(key=lambda f: (f[0], f[1], f[2]))
        left_join = self.config.how == "left"
        n = base
        for end, start, _, key, pane in fired:
            rights = [r for _, r in sorted(pane[3], key=_rank)]
            for _, left in sorted(pane[2], key=_rank):
                for right in rights if rights else ([None] if left_join else []):
                    try:
                        joined = self.fn(left, right)
                    except Exception as exc:
                        dead.add(self.stage.name, n, key, [left, right], exc)
                    else:
                        out_k.append(key)
                        out_v.append({"tag": JOINED, "key": key, "time": start,
                                      "start": start, "end": end, "value": joined})
                    n += 1
        for key in {f[3] for f in fired}:
            left = [p for p in self.state[key] if p[1] > due]
            if left:
                self.state[key] = left
            else:
                del self.state[key]
            self.touched.add(key)
