"""Per-key timers of a ``stateful`` operator: what its functions are handed
(:class:`Context`, :class:`Timer`) and the stage's timer configuration
(docs/dataflow.md, "Timers").

A ``stateful`` stage whose params hold a ``timers`` table calls its function
as ``fn(state, value, ctx, **params)`` and, when a timer of a key fires,
``on_timer(state, timer, ctx, **params)``; both return ``(state, outputs)``
as a plain ``stateful`` function does. The ``timers`` table:

- ``on_timer``: the import path of the timer function (optional: a stage that
  only reads the clock needs none);
- ``timestamp`` (optional): the import path of ``fn(record) -> number``, the
  records' event time, which makes the stage event-time aware (a watermark
  on the shuffle into it, as into a ``window``), with ``max_delay``,
  ``idle_timeout`` and ``every`` as a window's (gridstream.eventtime).

Why timers are built this way: a timer is keyed state (in every snapshot and
delta), and the time that fires one is never read from a clock on replay.
Event time comes from the records (watermarks); processing time is the time
the cluster recorded for the batch being processed (when its records entered
the cluster, stored with the batch in its replicated queue and passed on with
its outputs), kept monotone in the stage's state. A replay after a kill
therefore hands the function the same times and fires the same timers in the
same order (design invariant 6).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gridstream.errors import InvalidArgument
from gridstream.eventtime import EVENT_TIME_KINDS, WindowConfig, window_config

if TYPE_CHECKING:
    from gridstream.jobspec import Stage

TIMERS = "timers"
"""The params entry of a stateful stage's timer configuration."""
EVENT = "event"
"""A timer of event time: fires when the stage's watermark reaches it."""
PROCESSING = "processing"
"""A timer of processing time: fires with the first batch whose recorded time
reaches it; a partition that receives nothing appends a tick (an empty batch
with the wall-clock time recorded) once one is due (services.worker.ticks)."""
_KNOWN = frozenset({"on_timer", "timestamp", "max_delay", "idle_timeout", "every"})


class Timer(NamedTuple):
    """A timer that fired, as ``on_timer`` receives it."""

    time: float
    """The time it was set for (event time or processing time, by domain)."""
    domain: str
    """:data:`EVENT` or :data:`PROCESSING`."""


class Context(Protocol):
    """What a timed ``stateful`` function may ask of the stage besides its
    state and record: the key, the clocks and the key's timers. Every value
    it hands out is a function of the input (the records, their watermarks
    and the times recorded with their batches), so a replay sees the same."""

    @property
    def key(self) -> Any:
        """The key whose state and timers these are."""

    @property
    def watermark(self) -> float:
        """The stage's event time: its watermark (-inf before any)."""

    def now(self) -> float:
        """Processing time (Unix seconds): the time the cluster recorded for
        the batch being processed, never earlier than a previous batch's;
        the same on every replay. 0.0 before any batch had a time."""

    def set_timer(self, time: float) -> None:
        """Fires ``on_timer`` for this key once the watermark reaches ``time``
        (one timer per key and time: setting it again changes nothing)."""

    def delete_timer(self, time: float) -> None:
        """Forgets this key's event-time timer at ``time``, if set."""

    def set_processing_timer(self, time: float) -> None:
        """Fires ``on_timer`` for this key with the first batch of its
        partition whose processing time (:meth:`now`) reaches ``time``; on a
        partition that receives nothing, with a tick its task appends soon
        after the wall clock reaches ``time`` (docs/dataflow.md, "Timers")."""

    def delete_processing_timer(self, time: float) -> None:
        """Forgets this key's processing-time timer at ``time``, if set."""

    def timers(self) -> list[Timer]:
        """This key's pending timers, event-time ones first, each by time."""

    def random(self) -> float:
        """A number in [0, 1) drawn from a generator seeded by the batch (or
        timer) and the record's place in it: the same on every replay."""


@dataclass(frozen=True)
class TimerConfig:
    """A stateful stage's ``params["timers"]``, checked."""

    on_timer: str
    """The import path of the timer function ('' for none)."""
    event: WindowConfig | None
    """The stage's event time (a watermark on the shuffle into it), or None."""


def _path(raw: Mapping[str, Any], name: str, where: str) -> str:
    value = raw.get(name, "")
    if value and (not isinstance(value, str) or ":" not in value):
        raise InvalidArgument(f"{where}: timers {name} must be the import path "
                              f"'package.module:function', got {value!r}")
    return str(value or "")


def timer_config(params: Mapping[str, Any], where: str) -> TimerConfig | None:
    """The timer configuration of a stage's params (None without one), or
    InvalidArgument saying what is wrong."""
    raw = params.get(TIMERS)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: params.timers must be a table, e.g. "
                              "{on_timer = \"pkg.mod:fired\", timestamp = \"pkg.mod:time_of\"}")
    unknown = set(raw) - _KNOWN
    if unknown:
        raise InvalidArgument(f"{where}: unknown timers settings {sorted(unknown)}; "
                              f"known: {sorted(_KNOWN)}")
    on_timer, timestamp = _path(raw, "on_timer", where), _path(raw, "timestamp", where)
    event = None
    if timestamp:  # checked as a stream-table join's event time is (no window extent)
        window = {k: v for k, v in raw.items() if k in ("max_delay", "idle_timeout", "every")}
        config = window_config({"window": {"type": "inner", "timestamp": timestamp, **window}},
                               where)
        every = config.every if "every" in raw else config.max_delay or 1
        event = WindowConfig("timers", 0, 0, 0, 0, timestamp, config.max_delay,
                             config.idle_timeout, "", every)
    elif set(raw) & {"max_delay", "idle_timeout", "every"}:
        raise InvalidArgument(f"{where}: timers max_delay, idle_timeout and every need a "
                              "timestamp (the records' event time)")
    return TimerConfig(on_timer, event)


def event_config(stage: Stage) -> WindowConfig | None:
    """The event-time configuration of any stage: a window's or join's
    ``params.window``, a timed stateful stage's with a timestamp; None for a
    stage without event time of its own."""
    if stage.kind in EVENT_TIME_KINDS:
        return window_config(stage.params, stage.name)
    if stage.kind == "stateful":
        found = timer_config(stage.params, stage.name)
        return None if found is None else found.event
    return None


def has_event_time(stage: Stage) -> bool:
    """True for a stage with event time of its own (a watermark is computed
    or carried on the shuffle into it)."""
    return event_config(stage) is not None


def check_event_time(stage: Stage, where: str) -> None:
    """Raises InvalidArgument for a stage whose event-time or timer settings
    are wrong (a window's and join's ``params.window``, a stateful stage's
    ``params.timers``)."""
    if stage.kind in EVENT_TIME_KINDS:
        process = window_config(stage.params, where, stage.kind).process
        if stage.kind == "window" and process and stage.initial is not None:
            raise InvalidArgument(f"{where}: a process window (params.window.process = true) "
                                  "takes no initial: its function gets the window's records; "
                                  "remove initial")
        if stage.kind == "window" and not process and stage.initial is None:
            raise InvalidArgument(f"{where}: a window needs an initial accumulator, the value "
                                  "its function folds each window's first record into (add "
                                  "initial = 0 to count or sum, [] to collect), or "
                                  "params.window.process = true for fn(key, start, end, "
                                  "records)")
    elif stage.kind == "stateful":
        timer_config(stage.params, where)


def event_paths(stage: Stage) -> tuple[str, ...]:
    """The import paths a stage names besides its function and key: a window's
    timestamp function, a timed stateful stage's timer function and timestamp
    (each runs on the workers, so each is checked and resolved as the
    function is)."""
    if stage.kind in EVENT_TIME_KINDS:
        return (str(stage.params["window"]["timestamp"]),)
    if stage.kind == "stateful":
        found = timer_config(stage.params, stage.name)
        if found is not None:
            return tuple(p for p in (found.on_timer, found.event and found.event.timestamp) if p)
    return ()


def user_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A timed stage's params without its timer configuration: the keyword
    arguments of its functions."""
    return {k: v for k, v in params.items() if k != TIMERS}


def fired_order(time: float, key: Any) -> tuple[float, str, Any]:
    """The order timers fire in: by time, then by key (keys of one type by
    value, types by name), the same on every worker and every replay."""
    return (time, type(key).__name__, key)
