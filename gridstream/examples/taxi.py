"""Seed 000's worked example: taxi devices send position records.

Records are sent keyed by device, so each device's positions stay in order.
Stage 1 (``parse``) converts each JSON position record into a compact
``[device, "lat,lon;"]`` pair; stage 2 (``track``, keyed by device) appends the
position to the device's value, so ``<1111, "111,112;">`` becomes
``<1111, "111,112;113,115;">``; the sink keeps one string per device.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from gridstream.jobspec import JobSpec, Stage

DEVICES = 10_000


def generate(records: int, devices: int = DEVICES, seed: int = 0) -> Iterator[str]:
    """Deterministic JSON position records: each device reports in turn, so all
    ``devices`` appear once ``records >= devices``. Each is the text
    ``json.dumps`` makes of ``{"device", "lat", "lon", "seq"}`` (all but the
    device's text are ints), written directly: three times faster, which
    matters to a bench that makes its records while it sends them."""
    rng = random.Random(seed)
    randint = rng.randint
    positions = {d: (randint(100, 999), randint(100, 999)) for d in range(devices)}
    for i in range(records):
        device = i % devices
        lat, lon = positions[device]
        lat += randint(-3, 3)
        lon += randint(-3, 3)
        positions[device] = (lat, lon)
        yield f'{{"device": "{1000 + device}", "lat": {lat}, "lon": {lon}, "seq": {i}}}'


def keyed(records: int, devices: int = DEVICES, seed: int = 0) -> tuple[list[str], list[str]]:
    """(device ids, JSON records): the source routes each record by its device
    (the seed's scheduler routes the stream by consistent hashing), which keeps
    every device's positions in order through the pipeline."""
    values = list(generate(records, devices, seed))
    keys = [str(1000 + i % devices) for i in range(records)]
    return keys, values


def parse_position(text: str) -> list[Any]:
    """Stage 1: JSON record -> [device, "lat,lon;"]."""
    record = json.loads(text)
    return [record["device"], f"{record['lat']},{record['lon']};"]


def device_of(position: list[Any]) -> str:
    """Key of stage 2: the device id."""
    return str(position[0])


def append_position(track: str, position: list[Any]) -> str:
    """Stage 2: append "lat,lon;" to the device's string."""
    return track + str(position[1])


def job(partitions: int = 0, window_size: int = 0, delivery: str = "exactly_once",
        prepartitioned: bool = False) -> JobSpec:
    """The taxi job. ``prepartitioned``: the records are sent keyed by their
    device (as :func:`keyed` keys them), so ``track`` runs in ``parse``'s task
    with no shuffle between them (docs/jobs.md); records sent otherwise go
    to dead letters."""
    return JobSpec(
        name="taxi",
        partitions=partitions,
        window_size=window_size,
        delivery=delivery,
        stages=(
            Stage("parse", "map", "gridstream.examples.taxi:parse_position"),
            Stage("track", "reduce", "gridstream.examples.taxi:append_position",
                  key="gridstream.examples.taxi:device_of", initial="",
                  prepartitioned=prepartitioned),
            Stage("store", "sink"),
        ),
    )


def reference(records: Iterator[str] | list[str]) -> dict[str, str]:
    """The expected sink contents, computed in-process."""
    tracks: dict[str, str] = {}
    for text in records:
        device, position = parse_position(text)
        tracks[device] = tracks.get(device, "") + position
    return tracks
