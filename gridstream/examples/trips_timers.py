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
import zlib
from typing import Any

from gridstream.checker import HistoryVerdict, check_history
from gridstream.dataflow import Stream
from gridstream.examples.history import EMPTY, fold
from gridstream.timers import Context, Timer

CLOSING_T = 10**9
"""The trips example's closing time (its records are left out of the reference)."""
DIGEST_MOD = 2**61 - 1


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


def _digest(t: int, m: Any, seq: int) -> int:
    return zlib.crc32(f"{t}:{m}:{seq}".encode())


def fold_released(summary: list[int], trip: list[Any]) -> list[int]:
    """A device's released trips folded as the history checker reads them
    (:func:`gridstream.examples.history.fold` of each place in the history),
    and a digest of what they hold ([t, m, place]); a new list each time."""
    _, t, m, seq = trip
    return [*fold(summary[:5], [trip[0], seq]), (summary[5] + _digest(t, m, seq)) % DIGEST_MOD]


def released_device(trip: list[Any]) -> str:
    """The device of a released trip."""
    return str(trip[0])


def add_in_order(trips: Stream) -> None:
    """Adds the timed stage ("in_order") and its sink ("ordered") to a flow's
    trips (a stream with event time)."""
    ordered = trips.key_by(device_of).stateful("in_order", buffer,
                                               initial={"seq": 0, "held": []},
                                               on_timer=release)
    ordered.reduce("ordered_per_device", fold_released, key=released_device,
                   initial=[*EMPTY, 0]).sink("ordered")


def reference(trips: list[str]) -> dict[str, list[list[Any]]]:
    """Per device, [t, m, place] of its trips in (time, encoding) order,
    computed in this process from the sent JSON events (closing records and
    device records left out)."""
    held: dict[str, list[list[Any]]] = {}
    for text in trips:
        trip = json.loads(text)
        if trip.get("kind", "trip") == "trip" and trip["t"] < CLOSING_T:
            held.setdefault(device_of(trip), []).append([int(trip["t"]), trip["m"]])
    return {device: [[t, m, n] for n, (t, m) in enumerate(sorted(items, key=_order), 1)]
            for device, items in held.items()}


def check(actual: dict[str, Any], trips: list[str]) -> tuple[HistoryVerdict, list[str]]:
    """The history checker's verdict on the "ordered" sink (each device's
    places in its history lost, duplicated or reordered), and the devices
    whose released trips hold other times or distances than the reference's."""
    want = reference(trips)
    verdict = check_history({d: s[:5] for d, s in actual.items()},
                            {device: len(r) for device, r in want.items()})
    differ = [d for d, r in want.items() if d in actual and actual[d][5]
              != sum(_digest(*item) for item in r) % DIGEST_MOD]
    return verdict, differ


def problems(actual: dict[str, Any], trips: list[str]) -> list[str]:
    """:func:`check` as a chaos run's problems (none when exact)."""
    verdict, differ = check(actual, trips)
    return ([] if verdict.ok else [f"timers' event-time order {verdict.summary()}"]) + (
        [f"{len(differ)} devices' released trips differ, e.g. {differ[:3]}"] if differ else [])
