"""The trips in event-time order per device, by event-time timers: a timed
``stateful`` stage buffers each device's trips and sets a timer at each
trip's time; when the watermark reaches it, the timer releases the buffered
trips up to it in (time, encoding) order, each numbered with its place in the
device's history (docs/dataflow.md, "Timers"). Whatever order the trips
arrive in, and whatever replays a kill causes, every device's released trips
are the same sequence, which the history checker compares with the
in-process reference."""

from __future__ import annotations

import json
from typing import Any

from gridstream.checker import HistoryVerdict, check_history
from gridstream.dataflow import Stream
from gridstream.timers import Context, Timer

CLOSING_T = 10**9
"""The trips example's closing time (its records are left out of the reference)."""


def device_of(trip: dict[str, Any]) -> str:
    """The trip's device."""
    return str(trip["device"])


def _order(trip: list[Any]) -> tuple[int, str]:
    return int(trip[0]), json.dumps(trip)


def buffer(state: dict[str, Any], trip: dict[str, Any],
           ctx: Context) -> tuple[dict[str, Any], list[Any]]:
    """Keeps the trip as [t, m] until the watermark passes its time."""
    ctx.set_timer(int(trip["t"]))
    return {"seq": state["seq"], "held": [*state["held"], [int(trip["t"]), trip["m"]]]}, []


def release(state: dict[str, Any], timer: Timer,
            ctx: Context) -> tuple[dict[str, Any], list[Any]]:
    """Sends the held trips up to the timer's time, in time order, as
    [device, t, m, place in the device's history]."""
    due = sorted((h for h in state["held"] if h[0] <= timer.time), key=_order)
    seq = state["seq"]
    out = []
    for t, m in due:
        seq += 1
        out.append([ctx.key, t, m, seq])
    return {"seq": seq, "held": [h for h in state["held"] if h[0] > timer.time]}, out


def collect(released: list[Any], trip: list[Any]) -> list[Any]:
    """Every released trip of a device, in the order they came ([t, m, seq])."""
    return [*released, trip[1:]]


def released_device(trip: list[Any]) -> str:
    """The device of a released trip."""
    return str(trip[0])


def add_in_order(trips: Stream) -> None:
    """Adds the timed stage ("in_order") and its sink ("ordered") to a flow's
    trips (a stream with event time)."""
    ordered = trips.key_by(device_of).stateful("in_order", buffer,
                                               initial={"seq": 0, "held": []},
                                               on_timer=release)
    ordered.reduce("ordered_per_device", collect, key=released_device,
                   initial=[]).sink("ordered")


def reference(trips: list[dict[str, Any]]) -> dict[str, list[list[Any]]]:
    """Per device, [t, m, seq] of its trips in (time, encoding) order,
    computed in this process (closing records left out)."""
    out: dict[str, list[list[Any]]] = {}
    held: dict[str, list[list[Any]]] = {}
    for trip in trips:
        if trip.get("kind", "trip") == "trip" and trip["t"] < CLOSING_T:
            held.setdefault(device_of(trip), []).append([int(trip["t"]), trip["m"]])
    for device, items in held.items():
        out[device] = [[t, m, n] for n, (t, m) in enumerate(sorted(items, key=_order), 1)]
    return out


def check(actual: dict[str, Any], trips: list[dict[str, Any]]) -> HistoryVerdict:
    """The history checker's verdict on the "ordered" sink: each device's
    released trips numbered by the reference's order, folded in the order
    the sink got them (lost, duplicated and reordered trips told apart)."""
    from gridstream.examples.history import EMPTY, fold

    want = reference(trips)
    summaries: dict[str, Any] = {}
    for device, released in actual.items():
        rank = {repr(r): n for n, r in enumerate(want.get(device, []), 1)}
        summary: Any = list(EMPTY)
        for item in released:
            summary = fold(summary, [device, rank.get(repr(list(item)), 0)])
        summaries[device] = summary
    return check_history(summaries, {device: len(r) for device, r in want.items()})
