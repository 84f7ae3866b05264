"""The taxi devices' trips in event time: a per-device trip summary (trips and
metres) in 5-minute tumbling windows, with late trips to a side output, and
every trip joined with the device table (its driver as of the trip's time,
from a changelog of device records), and every window's summary joined with
the device records of the same device and window (a windowed join after a
window: the watermark carried on past the first), and each device's trips in
event-time order by event-time timers (:mod:`gridstream.examples.trips_timers`)
(docs/eventtime.md).

Every trip event carries the second it ended (``t``); events reach the
cluster out of order by up to ``JITTER_S`` seconds, so the windows' watermark
runs ``JITTER_S`` behind the newest event time a partition has seen, and
each window fires once, when every partition's watermark has passed its end.
:func:`closing` gives the records that end a run: one per source partition,
far in the future, so every window of the real trips fires.
"""

from __future__ import annotations

import json
import random
from typing import Any

from gridstream.dataflow import Dataflow
from gridstream.examples import trips_timers
from gridstream.ids import partition_for_key

WINDOW_S = 300
"""Five minutes of event time per window."""
JITTER_S = 20
"""How far out of order events arrive (the watermark's bound)."""
CLOSING_T = 10**9
"""The event time of :func:`closing` records."""


def generate(records: int, devices: int = 50, seed: int = 0,
             drivers_every: int = 40) -> tuple[list[str], list[str]]:
    """(device ids, JSON events): about one trip per device every ``devices``
    seconds, and every ``drivers_every`` records a device record (a new
    driver for a device from then on: the device table's changelog), each
    sent up to ``JITTER_S`` seconds late. Records only of trips when
    ``drivers_every`` is 0."""
    rng = random.Random(seed)
    keys: list[str] = []
    values: list[str] = []
    for i in range(records):
        device = str(1000 + rng.randrange(devices))
        t = i - rng.randint(0, JITTER_S) + JITTER_S  # sent at i + JITTER_S, ended at t
        keys.append(device)
        if drivers_every and i % drivers_every == drivers_every - 1:
            values.append(json.dumps({"kind": "device", "device": device, "t": t,
                                      "driver": f"driver-{i}"}))
        else:
            values.append(json.dumps({"kind": "trip", "device": device, "t": t,
                                      "m": rng.randint(200, 20_000)}))
    return keys, values


def closing(partitions: int) -> tuple[list[str], list[str]]:
    """One record per source partition with event time :data:`CLOSING_T`
    (device ``close-<n>``, chosen to land in each partition)."""
    keys: list[str] = []
    values: list[str] = []
    n = 0
    while len(keys) < partitions:
        key = f"close-{n}"
        if partition_for_key(key, partitions) == len(keys):
            keys.append(key)
            values.append(json.dumps({"kind": "close", "device": key, "t": CLOSING_T, "m": 0,
                                      "driver": None}))
        n += 1
    return keys, values


def parse(text: str) -> dict[str, Any]:
    """A JSON trip event as a dict."""
    return dict(json.loads(text))


def is_trip(record: dict[str, Any]) -> bool:
    """A trip (or a closing record, which moves time on for both sides)."""
    return record.get("kind", "trip") in ("trip", "close")


def is_device(record: dict[str, Any]) -> bool:
    """A device record (or a closing record)."""
    return record.get("kind") in ("device", "close")


def with_driver(trip: dict[str, Any], device: dict[str, Any] | None) -> dict[str, Any]:
    """The join's combination: the trip with its device's driver at the time."""
    return {"device": trip["device"], "t": trip["t"], "m": trip["m"],
            "driver": None if device is None else device["driver"]}


def event_time(trip: dict[str, Any]) -> int:
    """When the trip ended, in seconds."""
    return int(trip["t"])


def device_of(trip: dict[str, Any]) -> str:
    """The trip's device."""
    return str(trip["device"])


def add_trip(summary: list[int], trip: dict[str, Any]) -> list[int]:
    """[trips, metres] with one more trip."""
    return [summary[0] + 1, summary[1] + int(trip["m"])]


def flow(partitions: int = 4, lateness: float = 0) -> Dataflow:
    """Events -> per device and 5-minute window: [trips, metres], every fired
    window appended once ("summaries"), late trips appended ("late"); every
    trip with its device's driver at the time appended once ("driven")."""
    job = Dataflow("trips", partitions=partitions)
    parsed = job.source().map("parse", parse)
    trips = parsed.filter("trips", is_trip).with_timestamps(event_time, max_delay=JITTER_S)
    devices = parsed.filter("devices", is_device).with_timestamps(event_time,
                                                                  max_delay=JITTER_S)
    windows = trips.key_by(device_of).window("summary", add_trip, initial=[0, 0],
                                             tumbling=WINDOW_S, lateness=lateness)
    windows.sink("summaries", mode="append")
    windows.late("late_trips").sink("late", mode="append")
    driven = trips.join_table("drivers", devices, key=device_of, table_key=device_of,
                              fn=with_driver, how="left")
    driven.sink("driven", mode="append")
    driven.late("late_joins").sink("late_driven", mode="append")
    changes = windows.join_window("change_join", devices, key="gridstream.eventtime:window_key",
                                  right_key=device_of, tumbling=WINDOW_S, how="left",
                                  fn=with_change)
    changes.reduce("per_device", add_change, key=change_device, initial=[]).sink("changes")
    trips_timers.add_in_order(trips)  # event-time timers: each device's trips in time order
    return job


def with_change(summary: dict[str, Any], device: dict[str, Any] | None) -> list[Any]:
    """The windowed join's combination: a window's summary with a device
    record of the same window, as [device, window start, the record's time
    and driver] (None, None without one)."""
    return [summary["key"], summary["start"], None if device is None else device["t"],
            None if device is None else device["driver"]]


def change_device(change: list[Any]) -> str:
    """The device of a :func:`with_change` record."""
    return str(change[0])


def add_change(changes: list[Any], change: list[Any]) -> list[Any]:
    """Every change of a device in the order the join sent them."""
    return [*changes, change[1:]]


def reference_changes(values: list[str]) -> dict[str, list[list[Any]]]:
    """Per device, what the "changes" sink must hold: for each window of its
    trips (by start), the device records of the same window in the join's
    order (time, then encoding), or [start, None, None] when there are none;
    computed in this process."""
    from gridstream.codec import pack

    records = [parse(v) for v in values if parse(v)["t"] < CLOSING_T]
    starts = sorted(reference(values))
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for record in records:
        if is_device(record):
            found.setdefault((record["device"], record["t"] // WINDOW_S * WINDOW_S),
                             []).append(record)
    out: dict[str, list[list[Any]]] = {}
    for device, start in sorted(starts, key=lambda w: (w[1], w[0])):
        rights = sorted(found.get((device, start), []), key=lambda r: (r["t"], pack(r)))
        out.setdefault(device, []).extend([[start, r["t"], r["driver"]] for r in rights]
                                          or [[start, None, None]])
    return out


def check_changes(actual: dict[str, Any], values: list[str]) -> Any:
    """The history checker's verdict on the "changes" sink: each device's
    changes numbered 1..n in the reference's order, folded in the order the
    sink got them (lost, duplicated and reordered changes told apart)."""
    from gridstream.checker import check_history
    from gridstream.examples.history import EMPTY, fold

    want = reference_changes(values)
    summaries: dict[str, Any] = {}
    for device, changes in actual.items():
        rank = {repr(c): n for n, c in enumerate(want.get(device, []), 1)}
        summary: Any = list(EMPTY)
        for change in changes:
            summary = fold(summary, [device, rank.get(repr(list(change)), 0)])
        summaries[device] = summary
    return check_history(summaries, {device: len(c) for device, c in want.items()})


def reference(values: list[str]) -> dict[tuple[str, int], list[int]]:
    """(device, window start) -> [trips, metres] of every trip, computed in
    event-time order in this process (closing records left out)."""
    out: dict[tuple[str, int], list[int]] = {}
    trips = sorted((parse(v) for v in values), key=event_time)
    for trip in trips:
        if trip["t"] >= CLOSING_T or not is_trip(trip):
            continue
        start = trip["t"] // WINDOW_S * WINDOW_S
        out[(trip["device"], start)] = add_trip(out.get((trip["device"], start), [0, 0]), trip)
    return out


def summaries(rows: list[Any]) -> dict[tuple[str, int], list[int]]:
    """An append sink's fired windows as (device, window start) -> value;
    raises AssertionError naming a window that fired twice."""
    out: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        window = (str(row["key"]), int(row["start"]))
        if window in out:
            raise AssertionError(f"window {window} fired twice: {out[window]} and {row['value']}")
        out[window] = list(row["value"])
    return out


def reference_driven(values: list[str]) -> list[str]:
    """Every trip with its device's driver as of its time (the newest device
    record at or before it; None before the first), computed in event-time
    order in this process, as sorted JSON texts (closing records left out)."""
    records = sorted((parse(v) for v in values), key=lambda r: (r["t"], is_trip(r)))
    drivers: dict[str, Any] = {}
    out = []
    for record in records:  # at equal times a device record comes first
        if record["t"] >= CLOSING_T:
            continue
        if is_device(record):
            drivers[record["device"]] = record
        else:
            out.append(json.dumps(with_driver(record, drivers.get(record["device"])),
                                  sort_keys=True))
    return sorted(out)


def driven(rows: list[Any]) -> list[str]:
    """An append sink's joined trips as sorted JSON texts (closing ones left out)."""
    return sorted(json.dumps(row, sort_keys=True) for row in rows if row["t"] < CLOSING_T)
