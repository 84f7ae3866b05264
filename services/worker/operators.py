"""JobOperator: the user's logic of one task, run batch by batch.

Every stage kind is a function over a whole batch (``keys``, ``values``);
per-record user functions are wrapped so the loop runs in a list
comprehension. A user function that raises on a record does not stop the
partition: the batch is re-run record by record, the failing records go to the
dead-letter table with the error, and the rest go on.

Contract for operator authors (also in docs/operators.md): functions must be
deterministic — the same input and state give the same output — because
recovery replays records and relies on getting the same results and state.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gridstream.builtins import identity
from gridstream.deadletters import encode_error, encode_record
from gridstream.eventtime import user_params, window_config
from gridstream.ids import partition_for_key
from gridstream.jobspec import Stage, resolve
from gridstream.timers import TIMERS, timer_config
from gridstream.timers import user_params as timer_params
from services.worker.joins import TableJoinStep
from services.worker.timers import TimerStep
from services.worker.windowjoin import WindowJoinStep
from services.worker.windows import Event, WindowStep

Keys = list[Any] | None
Values = list[Any]
DeadLetter = tuple[str, str, str, str]
"""(id, stage, record, error), record and error as gridstream.deadletters stores them."""
_IMMUTABLE = (str, int, float, bool, bytes, type(None), tuple)
_VALID_KEY = (str, int, bytes)
PLAIN_KEY_SET = frozenset(_VALID_KEY)
"""The exact types of keys routed as they are (a subclass is converted first)."""
KEY_CACHE_LIMIT = 200_000
"""Distinct keys whose partition a task remembers before it starts again."""


@dataclass
class ChainResult:
    """What one batch produced: records for the next task, rows for the sink,
    dead letters."""

    keys: Keys
    values: Values
    sink_rows: dict[Any, Any] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)


TEXT_LIMIT = 1000
"""Characters of a record or an error kept in a dead letter."""


def safe_text(make: Any) -> str:
    """``str(make)`` cut to :data:`TEXT_LIMIT`, or a placeholder when even that
    fails (a record nested too deep for ``repr``, a ``__repr__`` that raises):
    describing a bad record must never be what stops a partition."""
    try:
        return str(make)[:TEXT_LIMIT]
    except Exception as exc:  # RecursionError, user __repr__/__str__
        return f"<unprintable: {type(exc).__name__}>"


def record_text(key: Any, value: Any) -> str:
    """A dead letter's stored record: JSON where representable, never raising
    (:func:`gridstream.deadletters.encode_record`)."""
    return encode_record(key, value)


TRACEBACKS_PER_BATCH = 10
"""Dead letters of one batch that keep their traceback. Formatting one costs
about 60 µs, and the records of a batch that fail usually fail the same way:
a batch of poison records must not turn the error path into the bottleneck."""


class _DeadLetters:
    """Collects failed records of one batch with deterministic ids."""

    def __init__(self, batch_id: str, out: list[DeadLetter]) -> None:
        self.batch_id = batch_id
        self.out = out

    def add(self, stage: str, index: int, key: Any, value: Any, exc: BaseException,
            step: str = "") -> None:
        """``step`` tells apart the ids of a stage's own failures and of the
        checks before it (``.key``, ``.partition``), as a shuffle's do."""
        self.out.append((f"{self.batch_id}:{stage}{step}:{index}", stage,
                         encode_record(key, value),
                         encode_error(exc, len(self.out) < TRACEBACKS_PER_BATCH)))


StageFn = Callable[[Keys, Values, _DeadLetters], tuple[Keys, Values]]


def _map(stage: Stage, fn: Callable[[Any], Any]) -> StageFn:
    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        try:
            return keys, [fn(v) for v in values]
        except Exception:
            pass
        out_k: list[Any] = []
        out_v: list[Any] = []
        for i, v in enumerate(values):
            k = None if keys is None else keys[i]
            try:
                out_v.append(fn(v))
            except Exception as exc:
                dead.add(stage.name, i, k, v, exc)
                continue
            out_k.append(k)
        return (None if keys is None else out_k), out_v

    return run


def _filter(stage: Stage, fn: Callable[[Any], Any]) -> StageFn:
    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        try:
            mask = [bool(fn(v)) for v in values]
        except Exception:
            mask = []
            for i, v in enumerate(values):
                try:
                    mask.append(bool(fn(v)))
                except Exception as exc:
                    dead.add(stage.name, i, None if keys is None else keys[i], v, exc)
                    mask.append(False)
        out_v = [v for v, keep in zip(values, mask, strict=True) if keep]
        out_k = None if keys is None else [k for k, keep in zip(keys, mask, strict=True) if keep]
        return out_k, out_v

    return run


def _flat_map(stage: Stage, fn: Callable[[Any], Iterable[Any]]) -> StageFn:
    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        out_v: list[Any] = []
        out_k: list[Any] = []
        extend = out_v.extend
        if keys is None:
            try:
                for v in values:
                    extend(fn(v))
                return None, out_v
            except Exception:
                out_v.clear()
        for i, v in enumerate(values):
            k = None if keys is None else keys[i]
            try:
                produced = list(fn(v))
            except Exception as exc:
                dead.add(stage.name, i, k, v, exc)
                continue
            extend(produced)
            if keys is not None:
                out_k.extend([k] * len(produced))
        return (None if keys is None else out_k), out_v

    return run


def _map_batch(stage: Stage, fn: Callable[[list[Any]], list[Any]]) -> StageFn:
    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        try:
            out = list(fn(values))
            if keys is None:
                return None, out
            if len(out) == len(values):
                return keys, out
            return None, out
        except Exception:
            pass
        out_k: list[Any] = []
        out_v: list[Any] = []
        for i, v in enumerate(values):
            k = None if keys is None else keys[i]
            try:
                produced = list(fn([v]))
            except Exception as exc:
                dead.add(stage.name, i, k, v, exc)
                continue
            out_v.extend(produced)
            out_k.extend([k] * len(produced))
        return (None if keys is None else out_k), out_v

    return run


def _fresh(initial: Any) -> Any:
    return initial if isinstance(initial, _IMMUTABLE) else copy.deepcopy(initial)


def _reduce(stage: Stage, fn: Callable[[Any, Any], Any], state: dict[Any, Any],
            touched: set[Any], emit: bool = True) -> StageFn:
    """A keyed fold; emits ``(key, accumulator)`` per record unless ``emit``
    is False (a keyed sink right after it whose rows are not wanted)."""
    initial = stage.initial
    mutable_initial = not isinstance(initial, _IMMUTABLE)

    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        if keys is None:
            raise RuntimeError(f"stage {stage.name} is keyed but received records without keys")
        touched.update(keys)  # the window's delta: one C call per batch
        out_k: list[Any] = []
        out_v: list[Any] = []
        get = state.get
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            acc = get(k)
            if acc is None and k not in state:
                acc = _fresh(initial) if mutable_initial else initial
            try:
                acc = fn(acc, v)
            except Exception as exc:
                dead.add(stage.name, i, k, v, exc)
                continue
            state[k] = acc
            if emit:
                out_k.append(k)
                out_v.append(acc)
        return out_k, out_v

    return run


class MisroutedRecord(ValueError):
    """A record of a prepartitioned stage found outside its key's partition."""


class KeyPartitions:
    """The partition of each distinct key a task meets, computed once (by
    :func:`gridstream.ids.partition_for_key`, the client's placement too)
    and remembered up to :data:`KEY_CACHE_LIMIT` keys: a shuffle routes by
    it, a prepartitioned stage checks its input by it."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._of: dict[Any, int] = {}

    def of(self, keys: list[Any]) -> tuple[dict[Any, int], set[Any]]:
        """(key -> partition, holding every key of ``keys``; their distinct keys)."""
        known = self._of
        if len(known) > KEY_CACHE_LIMIT:
            known.clear()
        distinct = set(keys)
        # difference(dict) looks each of the batch's keys up in the cache;
        # ``distinct - known.keys()`` copied the whole cache into a set first
        # (3.3 ms a batch with 200,000 keys remembered, against 1.7 us).
        for k in distinct.difference(known):
            known[k] = partition_for_key(k, self.partitions)
        return known, distinct


def _keyed_here(stage: Stage, key_fn: Callable[[Any], Any], partition: int,
                partitions: int) -> StageFn:
    """Keys the records of a prepartitioned stage, which runs in its input's
    task (no shuffle computed their keys), and checks that every key belongs
    to this partition, as the client's keys promised. A record whose key
    function fails, or whose key belongs to another partition, goes to dead
    letters: folded here, its key's state would be split over two
    partitions and its results would be wrong without a word."""
    placed = KeyPartitions(partitions)

    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        keys, values = keyed_records(key_fn, values, stage.name, dead.batch_id, dead.out)
        home, distinct = placed.of(keys)
        if all(home[k] == partition for k in distinct):
            return keys, values
        out_k: list[Any] = []
        out_v: list[Any] = []
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            p = home[k]
            if p != partition:
                dead.add(stage.name, i, k, v, MisroutedRecord(
                    f"stage {stage.name} is prepartitioned, but the key "
                    f"{safe_text(repr(k))} belongs to partition {p} and its record was sent "
                    f"to partition {partition}: send the records keyed by the stage's key "
                    f"({stage.key}), or drop prepartitioned to shuffle them"), ".partition")
                continue
            out_k.append(k)
            out_v.append(v)
        return out_k, out_v

    return run


def _stateful(stage: Stage, fn: Callable[[Any, Any], Any], state: dict[Any, Any],
              touched: set[Any]) -> StageFn:
    initial = stage.initial

    def run(keys: Keys, values: Values, dead: _DeadLetters) -> tuple[Keys, Values]:
        if keys is None:
            raise RuntimeError(f"stage {stage.name} is keyed but received records without keys")
        touched.update(keys)  # the window's delta: one C call per batch
        out_k: list[Any] = []
        out_v: list[Any] = []
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            current = state[k] if k in state else _fresh(initial)
            try:
                new_state, outputs = fn(current, v)
                outputs = list(outputs)
            except Exception as exc:
                dead.add(stage.name, i, k, v, exc)
                continue
            if new_state is None:
                state.pop(k, None)
            else:
                state[k] = new_state
            out_v.extend(outputs)
            out_k.extend([k] * len(outputs))
        return out_k, out_v

    return run


class OperatorChain:
    """The stages of one task, chained, with the keyed state of this partition.

    ``states`` holds one dict per keyed stage (key -> accumulator or state);
    it is what window snapshots carry. ``touched`` holds, per keyed stage,
    the keys written or deleted since the last :meth:`capture_delta`: a
    window snapshot carries only those (see :mod:`services.worker.snapshots`).
    """

    def __init__(self, stages: list[Stage], where: str, rows_wanted: bool = True,
                 placement: tuple[int, int] | None = None) -> None:
        """``placement`` is the chain's (partition, partitions), which a
        prepartitioned stage checks its keys against (required then)."""
        self.stages = stages
        self.states: dict[str, dict[Any, Any]] = {}
        self.touched: dict[str, set[Any]] = {}
        self._steps: list[StageFn] = []
        self.windows: list[WindowStep | TableJoinStep | WindowJoinStep | TimerStep] = []
        """The chain's window stages (told each batch's channel and watermark)."""
        self.has_sink = bool(stages) and stages[-1].kind == "sink"
        self.rows_wanted = rows_wanted
        """False when the task's result rows are read from its stored state
        (taskplan.results_from_state): building them per batch would be waste,
        and so would a reduce right before a keyed sink emitting its per-record
        accumulators (taxi's track, exactly once), which it then does not."""
        self.append_sink = self.has_sink and stages[-1].mode == "append"
        """An append sink keeps every record: rows by batch and index, as the
        rows of records without a key are, never merged by key."""
        self.file_sink = self.has_sink and stages[-1].mode == "files"
        """A files sink keeps every record too (rows by batch and index), which
        the task writes to files (services.worker.filesinks); its state holds
        the files a window commits, so window snapshots carry it."""
        for stage in stages:
            if stage.kind == "sink":
                if stage.mode == "files":
                    self.states[stage.name] = {}
                    self.touched[stage.name] = set()
                continue
            fn = resolve(stage.function, f"{where}, stage {stage.name}")
            if stage.kind in ("window", "join"):
                self._window(stage, fn, where)
                continue
            if stage.kind == "stateful" and TIMERS in stage.params:
                self._timed(stage, fn, where)
                continue
            if stage.params:  # params travel as data: fn(..., **params) on every call
                fn = functools.partial(fn, **stage.params)
            if stage.prepartitioned:  # keyed here: no shuffle keyed its records by its key
                if placement is None:
                    raise ValueError(f"{where}: stage {stage.name} is prepartitioned; its "
                                     "chain needs its placement (partition, partitions)")
                key_fn = resolve(stage.key, f"{where}, stage {stage.name}, key")
                self._steps.append(_keyed_here(stage, key_fn, *placement))
            if stage.kind == "map":
                self._steps.append(_map(stage, fn))
            elif stage.kind == "filter":
                self._steps.append(_filter(stage, fn))
            elif stage.kind == "flat_map":
                self._steps.append(_flat_map(stage, fn))
            elif stage.kind == "map_batch":
                self._steps.append(_map_batch(stage, fn))
            elif stage.kind == "reduce":
                self.states[stage.name] = {}
                self.touched[stage.name] = set()
                feeds_keyed_sink = (self.has_sink and len(stages) >= 2 and stage is stages[-2]
                                    and not (self.append_sink or self.file_sink))
                self._steps.append(_reduce(stage, fn, self.states[stage.name],
                                           self.touched[stage.name],
                                           emit=rows_wanted or not feeds_keyed_sink))
            elif stage.kind == "stateful":
                self.states[stage.name] = {}
                self.touched[stage.name] = set()
                self._steps.append(_stateful(stage, fn, self.states[stage.name],
                                             self.touched[stage.name]))
            else:  # pragma: no cover - validated by jobspec
                raise ValueError(f"unknown stage kind {stage.kind}")

    def _window(self, stage: Stage, fn: Callable[..., Any], where: str) -> None:
        params = user_params(stage.params)
        if params:
            fn = functools.partial(fn, **params)
        stamp = resolve(window_config(stage.params, where).timestamp,
                        f"{where}, stage {stage.name}, timestamp")
        marks = stage.name + "@wm"
        for name in (stage.name, marks):
            self.states[name] = {}
            self.touched[name] = set()
        step: WindowStep | TableJoinStep | WindowJoinStep
        if stage.kind == "join" and window_config(stage.params, where, stage.kind).how:
            step = WindowJoinStep(stage, fn, stamp, self.states[stage.name],
                                  self.touched[stage.name], self.states[marks],
                                  self.touched[marks])
        elif stage.kind == "join":
            step = TableJoinStep(stage, fn, stamp, self.states[stage.name],
                                 self.touched[stage.name], self.states[marks],
                                 self.touched[marks])
        else:
            step = WindowStep(stage, fn, stamp, functools.partial(_fresh, stage.initial),
                              self.states[stage.name], self.touched[stage.name],
                              self.states[marks], self.touched[marks])
        self.windows.append(step)
        self._steps.append(step.run)

    def _timed(self, stage: Stage, fn: Callable[..., Any], where: str) -> None:
        """A stateful stage with timers (services.worker.timers)."""
        config = timer_config(stage.params, where)
        assert config is not None
        params = timer_params(stage.params)
        on_timer = (resolve(config.on_timer, f"{where}, stage {stage.name}, on_timer")
                    if config.on_timer else None)
        if params:
            fn = functools.partial(fn, **params)
            on_timer = None if on_timer is None else functools.partial(on_timer, **params)
        for name in (stage.name, stage.name + "@timers", stage.name + "@wm"):
            self.states[name] = {}
            self.touched[name] = set()
        step = TimerStep(stage, config, fn, on_timer, functools.partial(_fresh, stage.initial),
                         self.states, self.touched)
        self.windows.append(step)
        self._steps.append(step.run)

    def process(self, keys: Keys, values: Values, batch_id: str,
                event: Event | None = None, batch_time: float = 0.0) -> ChainResult:
        """Runs one batch through every stage. ``batch_id`` (the entry's channel
        and sequence) makes dead-letter and sink-row ids stable across replays;
        ``event`` is what a window stage needs of the batch (its channel and
        watermark); ``batch_time`` is the processing time recorded with the
        batch (a timed stateful stage's clock, services.worker.timers)."""
        for window in self.windows:
            window.event = event
            if isinstance(window, TimerStep):
                window.batch_time, window.batch_id = batch_time, batch_id
        dead_list: list[DeadLetter] = []
        dead = _DeadLetters(batch_id, dead_list)
        for step in self._steps:
            keys, values = step(keys, values, dead)
        result = ChainResult(keys, values, dead_letters=dead_list)
        if self.has_sink:
            if not self.rows_wanted:
                result.sink_rows = {}
            elif keys is None or self.append_sink or self.file_sink:
                result.sink_rows = {f"{batch_id}:{i}": v for i, v in enumerate(values)}
            else:
                result.sink_rows = dict(zip(keys, values, strict=True))
            result.keys, result.values = None, []
        return result

    def snapshot_state(self) -> dict[str, list[list[Any]]]:
        """A consistent copy of the keyed state (as [key, value] pairs, so keys of
        any type survive msgpack). Values are shared, not copied: operators
        replace accumulators rather than mutating them (see the contract)."""
        return {name: [[k, v] for k, v in state.items()] for name, state in self.states.items()}

    def restore_state(self, saved: dict[str, list[list[Any]]]) -> None:
        """Replaces the keyed state with a snapshot's."""
        for name, state in self.states.items():
            state.clear()
            for k, v in saved.get(name, []):
                state[k] = v
        for touched in self.touched.values():
            touched.clear()

    def capture_delta(self) -> StateDelta:
        """The keys written or deleted since the last capture, with their
        values now (:data:`DELETED` for a key no longer held), and a fresh
        start for the next window. Costs the keys touched, not the state.
        Values are shared, as in :meth:`snapshot_state`."""
        delta: StateDelta = {}
        for name, touched in self.touched.items():
            if not touched:
                continue
            state = self.states[name]
            delta[name] = {k: state.get(k, DELETED) for k in touched}
            touched.clear()
        return delta

    def capture_full(self) -> StateDelta:
        """Every key (a whole state, for a window without a parent); also
        starts the next window afresh. ``dict(state)`` copies in C, so even
        millions of keys hold the loop for tens of milliseconds only."""
        for touched in self.touched.values():
            touched.clear()
        return {name: dict(state) for name, state in self.states.items()}

    def clear_state(self) -> None:
        """Empties the keyed state (before applying a whole state)."""
        for state in self.states.values():
            state.clear()
        for touched in self.touched.values():
            touched.clear()

    def apply_entries(self, entries: list[list[Any]]) -> int:
        """Applies a chunk of a stored window: [stage, key, value] sets a key,
        [stage, key] deletes it; entries of stages this chain does not have
        are ignored. Returns how many were applied."""
        states = self.states
        applied = 0
        for entry in entries:
            state = states.get(entry[0])
            if state is None:
                continue
            if len(entry) == 3:
                state[entry[1]] = entry[2]
            else:
                state.pop(entry[1], None)
            applied += 1
        return applied


class _Deleted:
    """The value of a key deleted in a window (distinct from a None value)."""

    _instance: _Deleted | None = None

    def __new__(cls) -> _Deleted:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()
"""Stands for a deleted key in a :data:`StateDelta`."""

StateDelta = dict[str, dict[Any, Any]]
"""Per keyed stage: key -> value written in the window, or :data:`DELETED`."""


def check_key(key: Any) -> bool:
    """True when a key function's result can key a record (str, int or bytes)."""
    return isinstance(key, _VALID_KEY) and not isinstance(key, bool)


def keyed_records(key_fn: Callable[[Any], Any], values: list[Any], stage: str,
                  batch_id: str, dead: list[DeadLetter]) -> tuple[list[Any], list[Any]]:
    """(keys, values) of the records whose key function gives a plain key
    (:func:`plain_key`); each other record goes to ``dead``, with the error,
    as ``<batch>:<stage>.key:<index>``. A shuffle keys its output so, and a
    prepartitioned stage its input."""
    try:
        # A record keyed by itself (wordcount's words) needs no call per record.
        keys = values if key_fn is identity else [key_fn(v) for v in values]
        if PLAIN_KEY_SET.issuperset(map(type, keys)):  # every key a plain str, int, bytes
            return keys, values
    except Exception:
        pass
    out_k: list[Any] = []
    out_v: list[Any] = []
    for i, v in enumerate(values):
        try:
            k = plain_key(key_fn(v))
        except Exception as exc:
            dead.append((f"{batch_id}:{stage}.key:{i}", stage, encode_record(None, v),
                         encode_error(exc, len(dead) < TRACEBACKS_PER_BATCH)))
            continue
        out_k.append(k)
        out_v.append(v)
    return out_k, out_v


def plain_key(key: Any) -> Any:
    """A key function's result as a plain str, int or bytes: a subclass's own
    hashing or repr (which may raise) never runs in gridstream's routing."""
    if type(key) in PLAIN_KEY_SET:
        return key
    if not check_key(key):
        raise TypeError(f"key function returned {type(key).__name__}; "
                        "keys must be str, int or bytes")
    if isinstance(key, str):
        return str.__str__(key)
    return int(key) if isinstance(key, int) else bytes(key)
