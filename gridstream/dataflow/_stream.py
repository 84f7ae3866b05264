"""Streams and their operators: each call adds one stage to the dataflow and
returns the stream of its output, which any number of later operators may
read (fan-out).

How the worker calls the functions (the params given here are passed as
keyword arguments on every call, bound once when the stage is deployed):

=============  ==========================================  ======================
operator       function                                    output
=============  ==========================================  ======================
``map``        ``fn(value, **params) -> value``            one record per record
``flat_map``   ``fn(value, **params) -> iterable``         zero or more records
``filter``     ``fn(value, **params) -> bool``             the records kept
``map_batch``  ``fn(values, **params) -> list``            the fast path, a batch
``reduce``     ``fn(acc, value, **params) -> acc``         the new acc, per record
``stateful``   ``fn(state, value, **params) ->             each output, with the
               (state, outputs)``; None state deletes      key
``window``     ``fn(acc, value, **params) -> acc``         each window, once
``window_      ``fn(key, start, end, records, **params)``  each window, once
process``      over the window's records
=============  ==========================================  ======================

A ``stateful`` given ``on_timer`` (or ``context=True``) calls
``fn(state, value, ctx, **params)`` and ``on_timer(state, timer, ctx,
**params)``, both returning ``(state, outputs)``: per-key timers and a
recorded clock (:mod:`gridstream.timers`, docs/dataflow.md "Timers").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gridstream.dataflow._flow import Dataflow
from gridstream.dataflow._functions import FunctionLike
from gridstream.dataflow._timers import timed_params
from gridstream.dataflow._windows import (
    LATE_FN,
    WINDOW_START_FN,
    Timing,
    add_table_join,
    add_window,
    add_window_join,
    window_params,
)
from gridstream.errors import InvalidArgument

Params = Mapping[str, Any] | None


class Stream:
    """Records flowing out of an operator (or the source, or a union), with
    their keys: the keys sent with them, or those of the last keyed operator
    upstream (non-keyed operators keep a record's key)."""

    def __init__(self, flow: Dataflow, inputs: tuple[str, ...],
                 timing: Timing | None = None) -> None:
        """Made by :class:`Dataflow` and by operators, not by users."""
        self.flow = flow
        self.inputs = inputs
        """The stage names (or ``@source``) a reader of this stream reads."""
        self.timing = timing
        """Event time (:meth:`with_timestamps`), kept by non-keyed operators."""

    def _then(self, kind: str, name: str, fn: FunctionLike, params: Params) -> Stream:
        return Stream(self.flow, (self.flow.add(kind, name, self.inputs, fn, params=params),),
                      self.timing)

    def with_timestamps(self, fn: FunctionLike, *, max_delay: float = 0,
                        idle_timeout: float | None = None) -> Stream:
        """The same records with event time: ``fn(record) -> number`` (any
        unit; window sizes are in the same), for the next ``window``, which
        runs it on the records as they reach it. A partition's watermark is
        the highest event time it has sent minus ``max_delay`` (bounded
        out-of-orderness); an input partition more than ``idle_timeout``
        behind the most advanced does not hold time back (docs/eventtime.md)."""
        return Stream(self.flow, self.inputs, Timing(fn, max_delay, idle_timeout))

    def map(self, name: str, fn: FunctionLike, *, params: Params = None) -> Stream:
        """One output per record: ``fn(value, **params)``."""
        return self._then("map", name, fn, params)

    def flat_map(self, name: str, fn: FunctionLike, *, params: Params = None) -> Stream:
        """Zero or more outputs per record: ``fn(value, **params)`` returns them."""
        return self._then("flat_map", name, fn, params)

    def filter(self, name: str, fn: FunctionLike, *, params: Params = None) -> Stream:
        """The records for which ``fn(value, **params)`` is true."""
        return self._then("filter", name, fn, params)

    def map_batch(self, name: str, fn: FunctionLike, *, params: Params = None) -> Stream:
        """``fn(values, **params)`` over a whole batch: the fast path for
        vectorised code. Records keep their keys when the list it returns is
        as long as the batch; otherwise the outputs have none."""
        return self._then("map_batch", name, fn, params)

    def join_table(self, name: str, table: Stream, *, key: FunctionLike,
                   table_key: FunctionLike, fn: FunctionLike | None = None,
                   how: str = "inner", params: Params = None) -> WindowedStream:
        """Enriches this stream's records with ``table``, a changelog (each of
        its records the key's value from its event time on): each record, once
        the watermark passes its time, as ``fn(record, table_value, **params)``
        (default ``{"record", "table"}``) with the table's newest value for
        ``key(record)`` (``table_key`` on the table's side) at or before the
        record's time. ``how="left"`` keeps records whose key has no value yet
        (``table_value`` None); ``"inner"`` drops them. Both streams need
        event time (:meth:`with_timestamps`); records that come after the
        watermark passed their time are the side output
        :meth:`WindowedStream.late` (docs/eventtime.md)."""
        stage, joined = add_table_join(self.flow, name, (self.inputs, self.timing),
                                       (table.inputs, table.timing), key, table_key, fn, how,
                                       params)
        return WindowedStream(self.flow, (joined,), stage)

    def join_window(self, name: str, right: Stream, *, key: FunctionLike,
                    right_key: FunctionLike | None = None, tumbling: float | None = None,
                    sliding: tuple[float, float] | None = None, how: str = "inner",
                    fn: FunctionLike | None = None, lateness: float = 0,
                    params: Params = None) -> WindowedStream:
        """Joins this stream (the left side) with ``right`` per key and
        event-time window, as Flink's window join does: when a window fires
        (the watermark of both sides past its end plus ``lateness``), every
        pair of a left and a right record with the same key (``key(left)``,
        ``right_key(right)``; ``right_key`` defaults to ``key``) in it goes
        out once as ``fn(left, right, **params)`` (default ``{"left",
        "right"}``), in a fixed order (windows by end, start and key; inside,
        records by time). ``how="left"`` also sends ``fn(left, None)`` for a
        left record with no right record in its window. Give
        ``tumbling=size`` or ``sliding=(size, slide)``; both streams need
        event time. Records whose windows fired are :meth:`WindowedStream.late`
        (docs/eventtime.md)."""
        window = window_params(self.flow, name, self.timing, tumbling, sliding, None, lateness)
        stage, joined = add_window_join(self.flow, name, (self.inputs, self.timing),
                                        (right.inputs, right.timing),
                                        (key, right_key if right_key is not None else key),
                                        fn, how, window, params)
        return WindowedStream(self.flow, (joined,), stage)

    def key_by(self, key: FunctionLike, *, prepartitioned: bool = False) -> KeyedStream:
        """The same records, to be grouped by ``key(value)`` (a str, int or
        bytes) by the next keyed operator: on the cluster the key function
        runs on the upstream side and records shuffle to the key's partition,
        so each key's records are processed in order by one worker.

        ``prepartitioned=True`` says the records are already in their key's
        partition (the client sends them with ``keys`` that are this key),
        so the next ``reduce`` or ``stateful`` (without timers) runs where
        they are, with no shuffle; a record found in another partition than
        its key's goes to dead letters (docs/dataflow.md)."""
        return KeyedStream(self.flow, self.inputs, key, self.timing, prepartitioned)

    def reduce(self, name: str, fn: FunctionLike, *, key: FunctionLike, initial: Any = None,
               params: Params = None) -> Stream:
        """Per key, ``acc = fn(acc, value, **params)`` from ``initial`` (a
        required value: 0 to count, "" to concatenate, [] to collect); emits
        the key's new accumulator for every record."""
        return self.key_by(key).reduce(name, fn, initial=initial, params=params)

    def stateful(self, name: str, fn: FunctionLike, *, key: FunctionLike, initial: Any = None,
                 params: Params = None, on_timer: FunctionLike | None = None,
                 context: bool = False) -> Stream:
        """Per key, ``state, outputs = fn(state, value, **params)`` from
        ``initial``; emits every output with the key; a None state deletes
        the key's state. With ``on_timer`` or ``context``, see
        :meth:`KeyedStream.stateful`."""
        return self.key_by(key).stateful(name, fn, initial=initial, params=params,
                                         on_timer=on_timer, context=context)

    def union(self, *others: Stream) -> Stream:
        """This stream and ``others`` as one (see :meth:`Dataflow.union`)."""
        return self.flow.union(self, *others)

    def sink(self, name: str, *, mode: str = "latest") -> None:
        """Ends the branch in the job's results: ``latest`` keeps one row per
        key (the latest value; a record without a key is a row of its own),
        ``append`` keeps every record that arrives, exactly once."""
        self.flow.add("sink", name, self.inputs, mode=mode)

    def file_sink(self, name: str, path: str | os.PathLike[str], *,
                  format: str = "jsonl") -> None:
        """Ends the branch in files: every record that arrives, exactly once,
        as JSON lines or Parquet under ``path/<job id>/<name>/``, one file per
        window and partition, each renamed into place only once its window
        is durable (:mod:`gridstream.filesink` reads them back). ``path``
        must be a directory every worker can write (a shared filesystem;
        on one machine, any directory); a relative one is made absolute here."""
        params = {"path": os.path.abspath(os.fspath(path)), "format": format}
        self.flow.add("sink", name, self.inputs, params=params, mode="files")


class KeyedStream:
    """A stream with the key function its next keyed operator groups by."""

    def __init__(self, flow: Dataflow, inputs: tuple[str, ...], key: FunctionLike,
                 timing: Timing | None = None, prepartitioned: bool = False) -> None:
        """Made by :meth:`Stream.key_by`."""
        self.flow = flow
        self.inputs = inputs
        self.key = key
        self.timing = timing
        self.prepartitioned = prepartitioned

    def window(self, name: str, fn: FunctionLike, *, initial: Any = None,
               tumbling: float | None = None, sliding: tuple[float, float] | None = None,
               session: float | None = None, lateness: float = 0,
               params: Params = None) -> WindowedStream:
        """Per key and event-time window, ``acc = fn(acc, value, **params)``
        from ``initial``; each window fires once, when the watermark passes
        its end plus ``lateness``, as ``{"key", "start", "end", "value"}``.
        Give one of ``tumbling=size``, ``sliding=(size, slide)`` or
        ``session=gap``. Records whose windows have fired are the side output
        :meth:`WindowedStream.late`."""
        self._not_prepartitioned(name)
        config = window_params(self.flow, name, self.timing, tumbling, sliding, session,
                               lateness)
        stage, fired = add_window(self.flow, name, self.inputs, fn, self.key, initial,
                                  params, config)
        timing = Timing(WINDOW_START_FN, 0, config.get("idle_timeout"))
        return WindowedStream(self.flow, (fired,), stage, timing)

    def window_process(self, name: str, fn: FunctionLike, *, tumbling: float | None = None,
                       sliding: tuple[float, float] | None = None,
                       session: float | None = None, lateness: float = 0,
                       params: Params = None) -> WindowedStream:
        """Per key and event-time window, a process function: the stage keeps
        the window's records and, when the window fires (as :meth:`window`'s
        do), calls ``fn(key, start, end, records, **params)`` once, the
        records in event-time order (equal times by their encoding, so the
        order never depends on arrival); the result is the fired window's
        ``value``. For what a fold cannot do (medians, percentiles, sorting,
        looking at neighbours), at the price of holding every record of an
        open window in the state. A function that raises sends the window
        to the dead letters. Late records are :meth:`WindowedStream.late`."""
        self._not_prepartitioned(name)
        config = window_params(self.flow, name, self.timing, tumbling, sliding, session,
                               lateness)
        config["process"] = True
        stage, fired = add_window(self.flow, name, self.inputs, fn, self.key, None,
                                  params, config)
        timing = Timing(WINDOW_START_FN, 0, config.get("idle_timeout"))
        return WindowedStream(self.flow, (fired,), stage, timing)

    def _not_prepartitioned(self, name: str) -> None:
        """Windows always shuffle: a prepartitioned key is refused, not ignored."""
        if self.prepartitioned:
            raise InvalidArgument(f"dataflow {self.flow.name}, operator {name!r}: only "
                                  "reduce and stateful run prepartitioned; key the stream "
                                  "without prepartitioned=True for a window")

    def reduce(self, name: str, fn: FunctionLike, *, initial: Any = None,
               params: Params = None) -> Stream:
        """:meth:`Stream.reduce` with this stream's key."""
        added = self.flow.add("reduce", name, self.inputs, fn, key=self.key, initial=initial,
                              params=params, prepartitioned=self.prepartitioned)
        return Stream(self.flow, (added,))

    def stateful(self, name: str, fn: FunctionLike, *, initial: Any = None,
                 params: Params = None, on_timer: FunctionLike | None = None,
                 context: bool = False) -> Stream:
        """:meth:`Stream.stateful` with this stream's key. Given ``on_timer``
        (or ``context=True``), per-key timers: ``fn(state, value, ctx,
        **params)`` may call ``ctx.set_timer(t)`` (event time: fires when the
        watermark reaches ``t``; the stream needs ``with_timestamps``) or
        ``ctx.set_processing_timer(t)`` (fires with the first batch whose
        recorded time ``ctx.now()`` reaches ``t``, or on an idle partition
        with a tick soon after the wall clock does), and each timer fires once
        as ``on_timer(state, timer, ctx, **params) -> (state, outputs)``, by
        (time, key); timers are keyed state, and every time ``ctx`` hands
        out is recorded with the input, so a replay fires them the same way
        (docs/dataflow.md, "Timers")."""
        if on_timer is not None or context:
            params = timed_params(self.flow, name, self.timing, on_timer, params)
        added = self.flow.add("stateful", name, self.inputs, fn, key=self.key,
                              initial=initial, params=params, prepartitioned=self.prepartitioned)
        return Stream(self.flow, (added,))


class WindowedStream(Stream):
    """The fired windows of a window operator, ``{"key", "start", "end",
    "value"}`` each, keyed by the window's key (or a join's joined records).
    Fired windows have event time, their start, for a second window or join
    downstream; a join's records have none until :meth:`with_timestamps`
    gives them one (a time in the record's window: docs/eventtime.md)."""

    def __init__(self, flow: Dataflow, inputs: tuple[str, ...], stage: str,
                 timing: Timing | None = None) -> None:
        super().__init__(flow, inputs, timing)
        self.stage = stage
        """The window (or join) stage, whose output has its results and late records."""

    def late(self, name: str) -> Stream:
        """The side output: every record that reached the window after all its
        windows had fired, as it was sent to it (end it in a sink to read it)."""
        return Stream(self.flow, (self.flow.add("flat_map", name, (self.stage,), LATE_FN),))
