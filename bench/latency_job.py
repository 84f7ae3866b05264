"""The jobs of ``bench/latency.py``: wordcount and taxi whose records carry the
wall-clock time they were due to be sent, and two ``map_batch`` stages that
observe, on the workers, how long each record took to reach them.

Every record travels as ``[payload, stamp]``: ``stamp`` is the ``time.time()``
at which the paced sender was due to send it (not when it managed to), so a
sender held back by a slow cluster shows as latency, not as a lower rate. The
keyed stage carries the stamp of the record it last folded in its
accumulator (``[value, stamp]``), and the sink task's last stage
(``observe_sink``) records ``time.time() - stamp`` for each record and hands
the plain value on, so the sink keeps exactly what the plain wordcount and
taxi jobs keep and the bench checks it against their references.

The first stage (``split_batch``, ``parse_batch``) observes the same for the
source task, which splits the latency into "sent to the first task" and "first
task to the sink".

Observations are counted per process, keyed by the stamp's whole second and
the latency in steps of 0.1 ms (``RESOLUTION_S``), and a thread appends the
counts made since its last turn to ``$BENCH_LATENCY_DIR/<point>-<pid>.jsonl``
every ``FLUSH_S`` (nothing is recorded when the variable is unset). That is
a side effect of an operator, which the operator contract forbids: a replay
after a failure would count its records twice. The bench runs without faults
and checks that the sink observed exactly as many records as it sent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from gridstream.examples import taxi

ENV = "BENCH_LATENCY_DIR"
"""Where the workers append their observations (set by the bench for the
cluster it starts; not a GRIDSTREAM_* variable, which the config would refuse)."""

RESOLUTION_S = 0.0001
"""Latencies are counted in steps of 0.1 ms (rounded down)."""

SPAN = 10**9
"""One observation key is ``stamp second * SPAN + latency steps``: latencies up
to 10^5 s fit, more than any run lasts."""

SMALL_BATCH = 24
"""A batch of at most this many stamps is counted in a Python loop: below it,
numpy's fixed cost per call (about 20 us) is more than the loop's. Batches
are that small at low rates or short ticks, when a tick's records are split
over many partitions."""

BINCOUNT_SPAN = 100_000
"""A batch whose latencies span fewer steps than this (10 s), with stamps in
at most three distinct seconds, is counted with ``np.bincount``; a more
spread-out one is sorted (``np.unique``)."""

FLUSH_S = 0.5
"""How often each process appends its new counts to its file."""


class Recorder:
    """Counts the latencies observed at one point of the job in this process,
    and appends them to a file from a thread of its own."""

    def __init__(self, point: str) -> None:
        self.point = point
        self._counts: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        directory = os.environ.get(ENV)
        self.path = Path(directory) / f"{point}-{os.getpid()}.jsonl" if directory else None

    def observe(self, stamps: list[float], now: float | None = None) -> None:
        """Counts ``now - stamp`` (``now``: ``time.time()`` unless given) for
        every stamp (0 means unstamped: skipped)."""
        if self.path is None:
            return
        self.count(stamps, now)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._flush_forever,
                                                name=f"latency {self.point}", daemon=True)
                self._thread.start()

    def count(self, stamps: list[float], now: float | None = None) -> None:
        """Counts as :meth:`observe` does, without writing anything."""
        if now is None:
            now = time.time()
        with self._lock:
            if len(stamps) <= SMALL_BATCH:
                self._count_each(stamps, now)
            else:
                self._count_vectorised(stamps, now)

    def _count_each(self, stamps: list[float], now: float) -> None:
        counts, scale = self._counts, 1.0 / RESOLUTION_S
        for s in stamps:
            if s > 0:
                counts[int(s) * SPAN + min(SPAN - 1, max(0, int((now - s) * scale)))] += 1

    def _count_vectorised(self, stamps: list[float], now: float) -> None:
        # The same float64 arithmetic as _count_each, counted with bincount
        # per stamp second (a batch's stamps lie within a tick or two) rather
        # than sorted: the bench's bookkeeping runs in the workers it measures.
        stamped = np.asarray(stamps, dtype=np.float64)
        stamped = stamped[stamped > 0]
        if not stamped.size:
            return
        seconds = stamped.astype(np.int64)
        steps = np.minimum(np.maximum(((now - stamped) * (1.0 / RESOLUTION_S)).astype(np.int64),
                                      0), SPAN - 1)
        first, last = int(seconds.min()), int(seconds.max())
        low, high = int(steps.min()), int(steps.max())
        if last - first > 2 or high - low >= BINCOUNT_SPAN:  # spread out: sort instead
            found, counts = np.unique(seconds * SPAN + steps, return_counts=True)
            self._counts.update(dict(zip(found.tolist(), counts.tolist(), strict=True)))
            return
        for second in range(first, last + 1):
            chosen = steps if first == last else steps[seconds == second]
            if chosen.size:
                counts = np.bincount(chosen - low)
                present = np.flatnonzero(counts)
                self._counts.update(dict(zip((present + (second * SPAN + low)).tolist(),
                                             counts[present].tolist(), strict=True)))

    def close(self) -> None:
        """Stops the flushing thread after a last flush. A worker's recorders
        live as long as its process; a test's must not outlive the test (a
        pytest process that made hundreds kept their threads contending for
        the GIL with every later test)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _flush_forever(self) -> None:
        while not self._closed.wait(FLUSH_S):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        assert self.path is not None
        with self._lock:
            counts, self._counts = self._counts, Counter()
        if counts:
            with self.path.open("a") as out:
                out.write(json.dumps(list(counts.items()), separators=(",", ":")) + "\n")


_SOURCE = Recorder("source")
_SINK = Recorder("sink")


def read_observations(directory: Path, point: str) -> Counter[tuple[int, int]]:
    """``(stamp second, latency steps) -> records`` over every process's file
    for ``point`` (``source`` or ``sink``)."""
    found: Counter[tuple[int, int]] = Counter()
    for path in sorted(directory.glob(f"{point}-*.jsonl")):
        for line in path.read_text().splitlines():
            for key, n in json.loads(line):
                found[divmod(key, SPAN)] += n
    return found


# -- wordcount ---------------------------------------------------------------


def split_batch(values: list[Any]) -> list[Any]:
    """Stage 1 (``map_batch``): ``[line, stamp]`` -> ``[word, stamp]`` for each
    lower-cased word, as ``gridstream.builtins:split_words`` splits."""
    _SOURCE.observe([v[1] for v in values])
    return [[word, stamp] for line, stamp in values for word in line.lower().split()]


def word_of(value: list[Any]) -> str:
    """Key of stage 2: the word."""
    return str(value[0])


def count_stamped(acc: Any, value: list[Any]) -> list[Any]:
    """Stage 2 (``reduce`` from 0): ``[count, stamp of the last word]``."""
    return [(acc[0] if acc else 0) + 1, value[1]]


# -- taxi --------------------------------------------------------------------


def parse_batch(values: list[Any]) -> list[Any]:
    """Stage 1 (``map_batch``): ``[json, stamp]`` -> ``[device, "lat,lon;", stamp]``,
    as ``gridstream.examples.taxi:parse_position`` parses."""
    _SOURCE.observe([v[1] for v in values])
    return [[*taxi.parse_position(text), stamp] for text, stamp in values]


def append_stamped(acc: Any, position: list[Any]) -> list[Any]:
    """Stage 2 (``reduce`` from ""): ``[track, stamp of the last position]``."""
    return [(acc[0] if acc else "") + position[1], position[2]]


# -- both --------------------------------------------------------------------


def observe_sink(values: list[Any]) -> list[Any]:
    """Last stage before the sink (``map_batch``, same task): observes each
    ``[value, stamp]`` and passes ``value`` on to the sink."""
    _SINK.observe([v[1] for v in values])
    return [v[0] for v in values]
