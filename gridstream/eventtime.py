"""Event time: a ``window`` stage's configuration, window assignment, and the
functions that split a window stage's output into fired windows and late
records (docs/eventtime.md).

A ``window`` stage keeps, per key, the windows not fired yet. Its
configuration is ``params["window"]``:

- ``type``: ``tumbling`` (``size``), ``sliding`` (``size`` and ``slide``) or
  ``session`` (``gap``), in the unit the timestamp function returns;
- ``timestamp``: the import path of ``fn(record) -> number``, the record's
  event time, run on the sending side of the shuffle into the stage;
- ``max_delay``: bounded out-of-orderness: a sending partition's watermark is
  the highest event time it has seen minus ``max_delay``;
- ``lateness``: allowed lateness: a window fires once, when the stage's
  watermark reaches its end plus ``lateness``;
- ``idle_timeout`` (optional): an input partition whose watermark is more than
  this behind the most advanced one does not hold the stage's time back;
- ``process`` (optional, a ``window`` stage's): true makes the function a
  process function, ``fn(key, start, end, records)`` over all the window's
  records when it fires, instead of a fold from ``initial``.

Everything is derived from the records, never from a clock, so a replay
computes the same watermarks and fires the same windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gridstream.errors import InvalidArgument

WINDOW_TYPES = ("tumbling", "sliding", "session")
EVENT_TIME_KINDS = ("window", "join")
"""Stage kinds with event time (a watermark on the shuffle into them)."""
JOIN_TYPES = ("inner", "left")
JOINED = "joined"
"""The tag of a joined record in a join stage's output."""
FIRED = "window"
"""The tag of a fired window in a window stage's output."""
LATE = "late"
"""The tag of a late record in a window stage's output."""


@dataclass(frozen=True)
class WindowConfig:
    """A window stage's ``params["window"]``, checked."""

    type: str
    size: float
    slide: float
    gap: float
    lateness: float
    timestamp: str
    max_delay: float
    idle_timeout: float | None
    how: str = ""
    """A windowed stream-stream join's ``inner`` or ``left`` (a ``join``
    stage with a tumbling or sliding window); empty for any other stage."""
    every: float = 0
    """How far a sender's watermark advances before it tells the partitions
    it sent no records to (an empty batch carrying it); 0: the window's size,
    slide or gap."""
    process: bool = False
    """True: the stage keeps each window's records and calls
    ``fn(key, start, end, records)`` once when it fires (a process function,
    for what a fold cannot do: medians, sorting, looking at neighbours);
    False (the default): it folds ``acc = fn(acc, record)`` from ``initial``,
    which keeps one accumulator instead of every record."""

    @property
    def tick(self) -> float:
        """:attr:`every`, or the window's own extent."""
        if self.every:
            return self.every
        return self.gap if self.type == "session" else min(self.size, self.slide)

    def first_start(self, due: float) -> float:
        """The earliest start a tumbling or sliding window that has not fired
        at ``due`` can have (every window ending at or before it has): the
        watermark carried past the stage, as its outputs' times are their
        windows' starts or later."""
        if not math.isfinite(due):
            return due
        return (math.floor((due - self.size) / self.slide) + 1) * self.slide

    def windows(self, ts: float) -> list[tuple[float, float]]:
        """The [start, end) windows an event time falls in (a session's is
        ``[ts, ts + gap)``, merged with the key's overlapping ones)."""
        if self.type == "session":
            return [(ts, ts + self.gap)]
        last = math.floor(ts / self.slide) * self.slide
        out = []
        start = last
        while start > ts - self.size:
            out.append((start, start + self.size))
            start -= self.slide
        out.reverse()
        return out


def _number(raw: Mapping[str, Any], name: str, where: str, default: float | None = None,
            positive: bool = True) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{where}: window {name} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InvalidArgument(f"{where}: window {name} must be "
                              f"{'positive' if positive else 'at least 0'}, got {value!r}")
    return value  # an int stays one, so windows of whole seconds have whole bounds


def window_config(params: Mapping[str, Any], where: str, stage_kind: str = "") -> WindowConfig:
    """The window configuration of a stage's params, or InvalidArgument saying
    what is wrong; ``stage_kind`` (the stage's, when known) also checks the type
    fits it: a ``window`` stage takes tumbling, sliding or session windows, a
    ``join`` stage inner or left (a stream-table join) or tumbling or sliding
    with ``how`` (a windowed stream-stream join)."""
    raw = params.get("window")
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: a window stage needs params.window, e.g. "
                              "{type = \"tumbling\", size = 60, timestamp = \"pkg.mod:fn\"}")
    known = {"type", "size", "slide", "gap", "lateness", "timestamp", "max_delay",
             "idle_timeout", "every", "how", "process"}
    unknown = set(raw) - known
    if unknown:
        raise InvalidArgument(f"{where}: unknown window settings {sorted(unknown)}; "
                              f"known: {sorted(known)}")
    kind = raw.get("type", "tumbling")
    types = JOIN_TYPES if kind in JOIN_TYPES else WINDOW_TYPES
    how = raw.get("how", "inner" if stage_kind == "join" and kind_is_window(kind) else "")
    if kind not in types:
        raise InvalidArgument(f"{where}: window type {kind!r} is not one of "
                              f"{', '.join(WINDOW_TYPES + JOIN_TYPES)}")
    if stage_kind and not _fits(stage_kind, kind, how):
        raise InvalidArgument(f"{where}: a {stage_kind} stage cannot take window type {kind!r}"
                              + (f" with how = {how!r}" if how else "")
                              + "; a window stage takes tumbling, sliding or session, a join "
                              "inner, left, or tumbling or sliding with how = inner or left")
    timestamp = raw.get("timestamp")
    if not isinstance(timestamp, str) or ":" not in timestamp:
        raise InvalidArgument(f"{where}: window timestamp must be the import path "
                              "'package.module:function' of fn(record) -> event time")
    size = slide = gap = 0.0
    every = _number(raw, "every", where) if "every" in raw else 0
    if kind in JOIN_TYPES:
        every = every or 1
    elif kind == "session":
        gap = _number(raw, "gap", where)
    else:
        size = _number(raw, "size", where)
        slide = _number(raw, "slide", where, size) if kind == "sliding" else size
        if slide > size:
            raise InvalidArgument(f"{where}: window slide {slide} is larger than size {size}")
    process = _process(raw, where, kind, how, stage_kind)
    idle = raw.get("idle_timeout")
    return WindowConfig(kind, size, slide, gap, _number(raw, "lateness", where, 0, False),
                        timestamp, _number(raw, "max_delay", where, 0, False),
                        None if idle is None else _number(raw, "idle_timeout", where),
                        str(how), every, process)


def _process(raw: Mapping[str, Any], where: str, kind: Any, how: Any, stage_kind: str) -> bool:
    """``process``, checked: a boolean, and only on a ``window`` stage."""
    process = raw.get("process", False)
    if not isinstance(process, bool):
        raise InvalidArgument(f"{where}: window process must be true or false (true: the "
                              "function is fn(key, start, end, records), called once with "
                              f"the window's records when it fires), got {process!r}")
    if process and (stage_kind == "join" or kind in JOIN_TYPES or how):
        raise InvalidArgument(f"{where}: process = true is for a window stage (kind = "
                              "\"window\"); remove it from the join's params.window")
    return process


def kind_is_window(kind: Any) -> bool:
    """True for the types a windowed join may take."""
    return kind in ("tumbling", "sliding")


def _fits(stage_kind: str, kind: Any, how: Any) -> bool:
    if stage_kind == "window":
        return kind in WINDOW_TYPES and not how
    if stage_kind == "join":
        return (kind in JOIN_TYPES and not how) or (kind_is_window(kind) and how in JOIN_TYPES)
    return True


def event_time(timestamp: Callable[[Any], Any], record: Any) -> float:
    """``timestamp(record)``, checked: a finite int or float (else TypeError or
    ValueError, which dead-letters the record at the window stage)."""
    ts = timestamp(record)
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise TypeError(f"event time must be a number, got {type(ts).__name__}")
    if not math.isfinite(ts):
        raise ValueError(f"event time {ts} is not finite")
    return ts


def user_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A window stage's params without its configuration: the keyword
    arguments of its function."""
    return {k: v for k, v in params.items() if k != "window"}


def fired_windows(value: Any) -> Iterator[Any]:
    """flat_map over a window stage's output: each fired window, as
    ``{"key", "start", "end", "value"}``."""
    if isinstance(value, dict) and value.get("tag") == FIRED:
        yield {"key": value["key"], "start": value["start"], "end": value["end"],
               "value": value["value"]}


def late_records(value: Any) -> Iterator[Any]:
    """flat_map over a window stage's output: each late record, as it was sent
    to the stage (the side output of records whose windows had fired)."""
    if isinstance(value, dict) and value.get("tag") == LATE:
        yield value["record"]


def tag(value: Any, side: str, key: str, time: str) -> list[Any]:
    """map before a join stage: ``[side, key(value), time(value), value]``,
    with the side's key and timestamp functions (import paths, imported as a
    stage's functions are: only from the cluster's job modules)."""
    return [side, _function(key)(value), _function(time)(value), value]


def tagged_key(tagged: list[Any]) -> Any:
    """A join stage's key: the key :func:`tag` computed."""
    return tagged[1]


def tagged_time(tagged: list[Any]) -> Any:
    """A join stage's event time: the time :func:`tag` computed."""
    return tagged[2]


def pair(record: Any, table: Any) -> dict[str, Any]:
    """A join's default combination: ``{"record", "table"}`` (the table side's
    value as of the record's time, None for a left join without one)."""
    return {"record": record, "table": table}


def both(left: Any, right: Any) -> dict[str, Any]:
    """A windowed join's default combination: ``{"left", "right"}`` (right
    None for a left record without a match in a left join)."""
    return {"left": left, "right": right}


def window_start(fired: Mapping[str, Any]) -> Any:
    """The event time of a fired window (``{"key", "start", "end", "value"}``)
    for a second event-time stage downstream: its start, which is at or after
    the watermark the window stage carries on when it fires (docs/eventtime.md)."""
    return fired["start"]


def window_key(fired: Mapping[str, Any]) -> Any:
    """A fired window's key (to key a second stage by it)."""
    return fired["key"]


def joined_records(value: Any) -> Iterator[Any]:
    """flat_map over a join stage's output: each joined record."""
    if isinstance(value, dict) and value.get("tag") == JOINED:
        yield value["value"]


_FUNCTIONS: dict[tuple[str, tuple[str, ...]], Callable[[Any], Any]] = {}


def _function(path: str) -> Callable[[Any], Any]:
    from gridstream.jobspec import allowed_job_modules, resolve  # they import this module

    allowed = allowed_job_modules()
    found = _FUNCTIONS.get((path, allowed))
    if found is None:
        found = _FUNCTIONS[(path, allowed)] = resolve(path, f"join side function {path}")
    return found
