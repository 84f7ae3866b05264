"""Timers of a dataflow's ``stateful`` operator: the ``params["timers"]``
that :meth:`KeyedStream.stateful` adds when it is given ``on_timer`` (or
``context=True``) (docs/dataflow.md, "Timers"; :mod:`gridstream.timers`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gridstream.dataflow._functions import FunctionLike, check_call, function_path
from gridstream.timers import TIMERS

if TYPE_CHECKING:
    from gridstream.dataflow._flow import Dataflow
    from gridstream.dataflow._windows import Timing


def timed_params(flow: Dataflow, name: str, timing: Timing | None,
                 on_timer: FunctionLike | None,
                 params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The stage's params with its timer configuration: the timer function's
    path (checked to take ``(state, timer, ctx, **params)``) and, when the
    stream has event time (``with_timestamps``), its timestamp function,
    ``max_delay`` and ``idle_timeout``, which make the stage event-time
    aware (watermarks fire its event-time timers)."""
    where = f"dataflow {flow.name}, operator {name!r}"
    config: dict[str, Any] = {}
    if on_timer is not None:
        config["on_timer"] = function_path(on_timer, f"{where}, on_timer")
        check_call(on_timer, 3, dict(params or {}), f"{where}, on_timer")
    if timing is not None:
        config["timestamp"] = function_path(timing.timestamp, f"{where}, timestamp")
        check_call(timing.timestamp, 1, {}, f"{where}, timestamp")
        config["max_delay"] = timing.max_delay
        if timing.idle_timeout is not None:
            config["idle_timeout"] = timing.idle_timeout
    return {**(params or {}), TIMERS: config}
