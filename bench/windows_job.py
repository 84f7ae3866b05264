"""The job of ``bench/windows.py``: per-device sums in event-time tumbling
windows, the fired windows stamped with the wall-clock time they came out.

Each event is ``{"device", "t", "m"}``; for the latency run ``t`` is the
wall-clock second the paced sender was due to send it, so a window's end is
a wall-clock time too. The window keeps, beside the event count and metres,
how far before the window's end each event happened (counts per
``STEP_S``), and :func:`stamp_out` adds ``out``, the ``time.time()`` at
which the fired window reached the stage after the window: out - end is the
time from a window's close to its result, and out - end + (end - t) is each
event's time to its window's result. Reading the clock in an operator is
what the operator contract forbids (a replay would see another time); the
bench runs without faults.
"""

from __future__ import annotations

import time
from typing import Any

from gridstream.dataflow import Dataflow

STEP_S = 0.01
"""The step of the event-to-window-end counts."""


def event_time(event: dict[str, Any]) -> float:
    """When the event happened (seconds)."""
    return float(event["t"])


def device_of(event: dict[str, Any]) -> str:
    """The event's device (the key)."""
    return str(event["device"])


def add_event(acc: list[Any], event: dict[str, Any], size: float = 0.0) -> list[Any]:
    """[events, metres, {steps before the window's end: events}] with one
    more event (the last only when ``size``, the window's, is given)."""
    steps = dict(acc[2])
    if size:
        ahead = int(((event["t"] // size + 1) * size - event["t"]) / STEP_S)
        steps[ahead] = steps.get(ahead, 0) + 1
    return [acc[0] + 1, acc[1] + int(event.get("m", 0)), steps]


def stamp_out(fired: dict[str, Any]) -> dict[str, Any]:
    """The fired window with the wall-clock time it came out."""
    return {**fired, "out": time.time()}


def flow(partitions: int, size: float, max_delay: float, latency: bool) -> Dataflow:
    """Events -> per device and window of ``size``: [events, metres, steps];
    every fired window appended once ("windows"), late events apart."""
    job = Dataflow("bench-windows", partitions=partitions)
    windows = (job.source().with_timestamps(event_time, max_delay=max_delay)
               .key_by(device_of)
               .window("per_window", add_event, initial=[0, 0, {}], tumbling=size,
                       params={"size": size if latency else 0.0}))
    windows.map("stamped", stamp_out).sink("windows", mode="append")
    windows.late("late_events").sink("late", mode="append")
    return job
