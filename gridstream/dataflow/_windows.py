"""Event-time operators of a dataflow: ``with_timestamps`` and ``window``
(docs/eventtime.md). A window stage's output is tagged (fired windows and late
records); :class:`WindowedStream` is its fired windows, and
:meth:`WindowedStream.late` the side output of late records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gridstream.dataflow._functions import FunctionLike, check_call, function_path
from gridstream.errors import InvalidArgument

if TYPE_CHECKING:
    from gridstream.dataflow._flow import Dataflow

FIRED_FN = "gridstream.eventtime:fired_windows"
LATE_FN = "gridstream.eventtime:late_records"


@dataclass(frozen=True)
class Timing:
    """A stream's event time: the timestamp function, the bound on disorder
    and the idle timeout, given to the next window."""

    timestamp: FunctionLike
    max_delay: float = 0
    idle_timeout: float | None = None


def window_params(flow: Dataflow, name: str, timing: Timing | None,
                  tumbling: float | None, sliding: tuple[float, float] | None,
                  session: float | None, lateness: float) -> dict[str, Any]:
    """The ``params["window"]`` of a window operator, from its arguments."""
    where = f"dataflow {flow.name}, operator {name!r}"
    if timing is None:
        raise InvalidArgument(f"{where}: a window needs event time: call "
                              ".with_timestamps(fn, max_delay=...) on the stream first")
    given = [g for g in (tumbling, sliding, session) if g is not None]
    if len(given) != 1:
        raise InvalidArgument(f"{where}: give exactly one of tumbling=size, "
                              "sliding=(size, slide), session=gap")
    path = function_path(timing.timestamp, f"{where}, timestamp")
    check_call(timing.timestamp, 1, {}, f"{where}, timestamp")
    config: dict[str, Any] = {"timestamp": path, "max_delay": timing.max_delay,
                              "lateness": lateness}
    if timing.idle_timeout is not None:
        config["idle_timeout"] = timing.idle_timeout
    if tumbling is not None:
        config.update(type="tumbling", size=tumbling)
    elif sliding is not None:
        config.update(type="sliding", size=sliding[0], slide=sliding[1])
    else:
        config.update(type="session", gap=session)
    return config


def add_window(flow: Dataflow, name: str, inputs: tuple[str, ...], fn: FunctionLike,
               key: FunctionLike, initial: Any, params: Mapping[str, Any] | None,
               config: dict[str, Any]) -> tuple[str, str]:
    """Adds the window stage and the stage of its fired windows; returns both names."""
    stage = flow.add("window", name, inputs, fn, key=key, initial=initial,
                     params={**(params or {}), "window": config})
    fired = flow.add("flat_map", f"{name}.fired", (stage,), FIRED_FN)
    return stage, fired


TAG_FN = "gridstream.eventtime:tag"
PAIR_FN = "gridstream.eventtime:pair"
JOINED_FN = "gridstream.eventtime:joined_records"


def add_table_join(flow: Dataflow, name: str, stream: tuple[tuple[str, ...], Timing | None],
                   table: tuple[tuple[str, ...], Timing | None], key: FunctionLike,
                   table_key: FunctionLike, fn: FunctionLike | None, how: str,
                   params: Mapping[str, Any] | None) -> tuple[str, str]:
    """Adds a stream-table join: a tagging map on each side, the join stage
    and the stage of its joined records; returns the join's and the last's names."""
    where = f"dataflow {flow.name}, operator {name!r}"
    if stream[1] is None or table[1] is None:
        raise InvalidArgument(f"{where}: both sides of a join need event time: call "
                              ".with_timestamps(fn, max_delay=...) on each first")
    if how not in ("inner", "left"):
        raise InvalidArgument(f"{where}: how must be 'inner' or 'left', not {how!r}")
    sides = []
    for side, (inputs, timing), side_key in (("stream", stream, key), ("table", table, table_key)):
        assert timing is not None
        tagged = {"side": side, "key": function_path(side_key, f"{where}, {side} key"),
                  "time": function_path(timing.timestamp, f"{where}, {side} timestamp")}
        check_call(side_key, 1, {}, f"{where}, {side} key")
        sides.append(flow.add("map", f"{name}.{side}", inputs, TAG_FN, params=tagged))
    delay = max(stream[1].max_delay, table[1].max_delay)
    config: dict[str, Any] = {"type": how, "timestamp": "gridstream.eventtime:tagged_time",
                              "max_delay": delay, "every": delay or 1}
    if stream[1].idle_timeout is not None:
        config["idle_timeout"] = stream[1].idle_timeout
    stage = flow.add("join", name, tuple(sides), fn if fn is not None else PAIR_FN,
                     key="gridstream.eventtime:tagged_key",
                     params={**(params or {}), "window": config})
    return stage, flow.add("flat_map", f"{name}.joined", (stage,), JOINED_FN)


BOTH_FN = "gridstream.eventtime:both"
WINDOW_START_FN = "gridstream.eventtime:window_start"


def add_window_join(flow: Dataflow, name: str, left: tuple[tuple[str, ...], Timing | None],
                    right: tuple[tuple[str, ...], Timing | None], keys: tuple[FunctionLike,
                                                                          FunctionLike],
                    fn: FunctionLike | None, how: str, window: dict[str, Any],
                    params: Mapping[str, Any] | None) -> tuple[str, str]:
    """Adds a windowed stream-stream join: a tagging map on each side, the
    join stage (kind ``join`` with a tumbling or sliding window and ``how``)
    and the stage of its joined records; returns the join's and the last's
    names. ``window`` is :func:`window_params`'s for the left side's timing."""
    where = f"dataflow {flow.name}, operator {name!r}"
    if right[1] is None:
        raise InvalidArgument(f"{where}: both sides of a join need event time: call "
                              ".with_timestamps(fn, max_delay=...) on each first")
    if how not in ("inner", "left"):
        raise InvalidArgument(f"{where}: how must be 'inner' or 'left', not {how!r}")
    if window["type"] == "session":
        raise InvalidArgument(f"{where}: a windowed join takes tumbling=size or "
                              "sliding=(size, slide), not session windows")
    sides = []
    for side, (inputs, timing), side_key in (("left", left, keys[0]), ("right", right, keys[1])):
        assert timing is not None
        tagged = {"side": side, "key": function_path(side_key, f"{where}, {side} key"),
                  "time": function_path(timing.timestamp, f"{where}, {side} timestamp")}
        check_call(side_key, 1, {}, f"{where}, {side} key")
        check_call(timing.timestamp, 1, {}, f"{where}, {side} timestamp")
        sides.append(flow.add("map", f"{name}.{side}", inputs, TAG_FN, params=tagged))
    config = {**window, "how": how, "timestamp": "gridstream.eventtime:tagged_time",
              "max_delay": max(window["max_delay"], right[1].max_delay)}
    stage = flow.add("join", name, tuple(sides), fn if fn is not None else BOTH_FN,
                     key="gridstream.eventtime:tagged_key",
                     params={**(params or {}), "window": config})
    return stage, flow.add("flat_map", f"{name}.joined", (stage,), JOINED_FN)
