"""The graph builder: a :class:`Dataflow` collects the stages its streams add
and turns them into a :class:`~gridstream.jobspec.JobSpec`.

Every operator is checked as it is added (kind, function, key, initial,
params, a name used twice), and the whole graph when :meth:`Dataflow.job`
builds it (a branch that ends nowhere, no sink): errors show at the line
that made them, never first at submit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gridstream.dataflow._functions import FunctionLike, check_call, function_path
from gridstream.errors import InvalidArgument
from gridstream.jobspec import SOURCE, JobSpec, Stage, check_stage, validate
from gridstream.timers import TIMERS, user_params

if TYPE_CHECKING:
    from gridstream.dataflow._stream import Stream

POSITIONAL = {"map": 1, "flat_map": 1, "filter": 1, "map_batch": 1, "reduce": 2,
              "stateful": 2, "window": 2, "join": 2}
"""Values the worker passes before the params, per kind (``fn(acc, value, **p)``)."""


class Dataflow:
    """A job built in Python as a graph of operators.

    Streams come from :meth:`source` and from operators on other streams;
    one stream may feed several operators (fan-out) and :meth:`union` merges
    streams. Functions are named by import path or given as module-level
    functions (turned into their path); per-operator ``params`` are JSON data
    passed to the function as keyword arguments on the workers.

    >>> from gridstream.dataflow import Dataflow
    >>> flow = Dataflow("words")
    >>> words = flow.source().flat_map("split", "gridstream.builtins:split_words")
    >>> counts = words.reduce("count", "gridstream.builtins:count",
    ...                       key="gridstream.builtins:identity", initial=0)
    >>> counts.sink("counts")
    >>> [s.name for s in flow.job().stages]
    ['split', 'count', 'counts']
    """

    def __init__(self, name: str, *, partitions: int = 0, delivery: str = "exactly_once",
                 window_size: int = 0, tracking_timeout_s: float = 0.0,
                 snapshot_every: int = 0) -> None:
        """The job's fields as :class:`~gridstream.jobspec.JobSpec` has them (0:
        the cluster's default); checked here with the stages' checks.
        ``snapshot_every`` is ``window_size``'s other name: records per state
        snapshot (a snapshot window), nothing to do with event-time windows."""
        if snapshot_every and window_size and snapshot_every != window_size:
            raise InvalidArgument(f"dataflow {name}: snapshot_every is window_size's other "
                                  "name (records per state snapshot); give one of them")
        self.name = name
        self.partitions = partitions
        self.delivery = delivery
        self.window_size = snapshot_every or window_size
        self.tracking_timeout_s = tracking_timeout_s
        self._stages: list[Stage] = []
        validate(self._spec((Stage("check", "sink"),)))  # the job's own fields, at once

    def source(self) -> Stream:
        """The records sent to the job (``Client.send``, ``gridstream send``, or
        the inputs of :func:`gridstream.testing.run_local`), with their keys."""
        from gridstream.dataflow._stream import Stream

        return Stream(self, (SOURCE,))

    def union(self, *streams: Stream) -> Stream:
        """One stream of the records of all ``streams`` (no stage of its own:
        the next operator reads them all). Records of one input keep their
        order; the inputs interleave in no promised order."""
        from gridstream.dataflow._stream import Stream

        names: list[str] = []
        for stream in streams:
            if stream.flow is not self:
                raise InvalidArgument(f"dataflow {self.name}: union of a stream of another "
                                      "dataflow")
            names.extend(n for n in stream.inputs if n not in names)
        if not names:
            raise InvalidArgument(f"dataflow {self.name}: union needs at least one stream")
        return Stream(self, tuple(names))

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The stages added so far, in the order they were added."""
        return tuple(self._stages)

    def add(self, kind: str, name: str, inputs: tuple[str, ...], fn: FunctionLike | None = None,
            *, key: FunctionLike | None = None, initial: Any = None,
            params: Mapping[str, Any] | None = None, mode: str = "latest",
            prepartitioned: bool = False) -> str:
        """Adds one stage reading ``inputs`` and returns its name; raises
        InvalidArgument at once for anything the stage checks refuse."""
        where = f"dataflow {self.name}, operator {name!r}"
        if any(stage.name == name for stage in self._stages):
            raise InvalidArgument(f"{where}: the name is used by another operator; each "
                                  "operator needs its own (it names its state and dead letters)")
        params = dict(params or {})
        function = ""
        if fn is not None:
            function = function_path(fn, f"{where}, function")
            given = {k: v for k, v in params.items()
                     if k != "window" or kind not in ("window", "join")}
            positional = POSITIONAL.get(kind, 1)
            if kind == "stateful" and TIMERS in params:  # fn(state, value, ctx, **params)
                given, positional = user_params(params), 3
            window = params.get("window")
            if kind == "window" and isinstance(window, Mapping) and window.get("process"):
                positional = 4  # fn(key, start, end, records, **params)
            check_call(fn, positional, given, f"{where}, function")
        key_path = ""
        if key is not None:
            key_path = function_path(key, f"{where}, key")
            check_call(key, 1, {}, f"{where}, key")
        try:
            stage = Stage(name, kind, function, key_path, initial, inputs, params, mode,
                          prepartitioned)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: {exc}") from None
        check_stage(stage, where)
        self._stages.append(stage)
        return name

    def job(self) -> JobSpec:
        """The validated job (:func:`gridstream.jobspec.validate`): every branch
        must end in a sink. A stage that reads the stage added just before
        it leaves ``inputs`` empty, so a linear flow gives the same JobSpec
        (and TOML) as a pipeline written by hand, which the cluster runs."""
        stages: list[Stage] = []
        for i, stage in enumerate(self._stages):
            default = (SOURCE,) if i == 0 else (self._stages[i - 1].name,)
            inputs = () if stage.inputs == default else stage.inputs
            stages.append(replace(stage, inputs=inputs))
        if not stages:
            raise InvalidArgument(f"dataflow {self.name} has no operators; add some to "
                                  "flow.source() and end each branch with .sink(...)")
        job = self._spec(tuple(stages))
        validate(job)
        return job

    def _spec(self, stages: tuple[Stage, ...]) -> JobSpec:
        return JobSpec(self.name, stages, self.partitions, self.delivery, self.window_size,
                       tracking_timeout_s=self.tracking_timeout_s)
