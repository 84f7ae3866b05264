"""A processing-time timer job: each key's count, emitted QUIET_S after the
key's last record (tests/integration/test_idle_timers.py and
tests/unit/test_ticks.py)."""

from __future__ import annotations

from typing import Any

from gridstream.dataflow import Dataflow
from gridstream.timers import PROCESSING, Context, Timer

QUIET_S = 0.5
"""How long after a key's last record its count is emitted."""


def key_of(record: dict[str, Any]) -> str:
    """The record's key."""
    return str(record["k"])


def count(state: int, record: dict[str, Any], ctx: Context) -> tuple[int, list[Any]]:
    """Counts the key's records and moves its one timer to QUIET_S from now."""
    for timer in ctx.timers():
        if timer.domain == PROCESSING:
            ctx.delete_processing_timer(timer.time)
    ctx.set_processing_timer(ctx.now() + QUIET_S)
    return state + 1, []


def emit(state: int, timer: Timer, ctx: Context) -> tuple[int, list[Any]]:
    """The key went quiet: its count so far, and when its timer fired."""
    return state, [{"key": ctx.key, "count": state, "due": timer.time, "fired_at": ctx.now()}]


def quiet_counts(partitions: int = 4, mode: str = "latest") -> Dataflow:
    """records -> per key, {"count", "due", "fired_at"} once the key goes
    quiet (``mode="append"`` keeps every firing, as a row of its own)."""
    flow = Dataflow("quiet_counts", partitions=partitions)
    (flow.source().key_by(key_of)
     .stateful("counts", count, initial=0, on_timer=emit)
     .sink("quiet", mode=mode))
    return flow
