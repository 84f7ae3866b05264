"""Jobs as users write them: a pipeline of stages, from TOML or from code.

A job file looks like::

    [job]
    name = "taxi"
    partitions = 12            # optional; the cluster default otherwise
    delivery = "exactly_once"  # or "at_least_once", "at_most_once"
    window_size = 50000        # optional; records per window snapshot

    [[stages]]
    name = "parse"
    kind = "map"
    function = "gridstream.examples.taxi:parse_position"
    [[stages]]
    name = "track"
    kind = "reduce"
    key = "gridstream.examples.taxi:device_of"
    function = "gridstream.examples.taxi:append_position"
    initial = ""
    prepartitioned = true      # optional: sent keyed by device, no shuffle
    [[stages]]
    name = "store"
    kind = "sink"

The runtime cuts the pipeline into *tasks* at every keyed stage that is not
prepartitioned: a task's stages run chained in one JobOperator per
partition; between tasks, records shuffle by key to the partition's owner.

A job may also be a graph (a DAG): a stage names the stages it reads with
``inputs = ["parse"]`` (several names: a union; ``"@source"``: the records
sent to the job; none: the stage before it), one stream may feed several
stages (fan-out), and there may be several sinks, each ``mode = "latest"``
(one row per key) or ``"append"`` (every record). A stage's ``params`` table
is passed to its function as keyword arguments. The cluster's workers run
the whole graph (:mod:`gridstream.taskplan` cuts it into tasks);
:func:`gridstream.testing.run_local` runs it in one process, and
:mod:`gridstream.dataflow` builds graphs in Python.
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridstream.config import ClusterConfig
from gridstream.errors import InvalidArgument, PermissionDenied
from gridstream.filesink import check_file_params
from gridstream.timers import TIMERS, check_event_time, event_paths
from gridstream.v1 import common_pb2
from gridstream.validation import MAX_NESTING, json_nesting_depth, nesting_depth, short

STAGE_KINDS: dict[str, int] = {
    "map": common_pb2.STAGE_KIND_MAP,
    "flat_map": common_pb2.STAGE_KIND_FLAT_MAP,
    "filter": common_pb2.STAGE_KIND_FILTER,
    "map_batch": common_pb2.STAGE_KIND_MAP_BATCH,
    "reduce": common_pb2.STAGE_KIND_REDUCE,
    "stateful": common_pb2.STAGE_KIND_STATEFUL,
    "sink": common_pb2.STAGE_KIND_SINK,
    "window": common_pb2.STAGE_KIND_WINDOW,
    "join": common_pb2.STAGE_KIND_JOIN,
}
KIND_NAMES = {v: k for k, v in STAGE_KINDS.items()}
KEYED_KINDS = frozenset({"reduce", "stateful", "window", "join"})

SINK_MODES: dict[str, int] = {
    "latest": common_pb2.SINK_MODE_LATEST,
    "append": common_pb2.SINK_MODE_APPEND,
    "files": common_pb2.SINK_MODE_FILES,
}
"""What a sink keeps: the latest value per key, or every record (in the
results table, or in files: :mod:`gridstream.filesink`)."""
SINK_MODE_NAMES = {v: k for k, v in SINK_MODES.items()}

SOURCE = "@source"
"""The name a stage's ``inputs`` give the records sent to the job (no stage
can be called that: stage names have no '@')."""
DELIVERY_MODES: dict[str, int] = {
    "exactly_once": common_pb2.DELIVERY_MODE_EXACTLY_ONCE,
    "at_least_once": common_pb2.DELIVERY_MODE_AT_LEAST_ONCE,
    "at_most_once": common_pb2.DELIVERY_MODE_AT_MOST_ONCE,
}
DELIVERY_NAMES = {v: k for k, v in DELIVERY_MODES.items()}
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
MAX_IMPORT_PATH_CHARS = 256
"""Longest ``package.module:function`` a stage may name."""
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# The most a job may ask for: a submit never makes a member hold unbounded data.
MAX_PARTITIONS = 4096
MAX_STAGES = 64
MAX_WINDOW_SIZE = 100_000_000  # records per window snapshot
MAX_TRACKING_TIMEOUT_S = 86_400.0  # a day
MAX_INITIAL_JSON_BYTES = 1024 * 1024  # a stage's ``initial``, as JSON
MAX_PARAMS_JSON_BYTES = 1024 * 1024  # a stage's ``params``, as JSON

DEFAULT_JOB_MODULES: tuple[str, ...] = ClusterConfig().job_modules
"""What jobs may name when the cluster's config says nothing (cluster.job_modules)."""

_allowed_modules: tuple[str, ...] = DEFAULT_JOB_MODULES


def allow_job_modules(modules: tuple[str, ...]) -> None:
    """Sets the modules this process lets jobs name (services call it once at
    start with cluster.job_modules); :func:`resolve` refuses anything else
    before importing it."""
    global _allowed_modules
    _allowed_modules = tuple(modules)


def allowed_job_modules() -> tuple[str, ...]:
    """The modules this process lets jobs name."""
    return _allowed_modules


def module_allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """True when ``module`` is gridstream.eventtime, one of ``allowed`` or inside one."""
    return any(module == entry or module.startswith(entry + ".")
               for entry in (*allowed, "gridstream.eventtime"))


def check_allowed_path(path: str, where: str, allowed: tuple[str, ...] | None = None) -> None:
    """Refuses (PERMISSION_DENIED) an import path outside the allowed modules,
    or naming a dunder attribute, without importing anything; one that is not
    an import path at all is INVALID_ARGUMENT."""
    allowed = _allowed_modules if allowed is None else allowed
    if len(path) > MAX_IMPORT_PATH_CHARS or not _IMPORT_PATH.match(path):
        raise InvalidArgument(f"{where}: {short(path)} is not an import path "
                              f"'package.module:function' of at most {MAX_IMPORT_PATH_CHARS} "
                              "characters")
    module_name, _, attr = path.partition(":")
    if not module_allowed(module_name, allowed):
        raise PermissionDenied(
            f"{where}: module {short(module_name)} is not one this cluster lets jobs use "
            f"(cluster.job_modules = {list(allowed)}); nothing was imported")
    if attr.startswith("__"):
        raise PermissionDenied(f"{where}: {short(path)} names a special attribute; name a "
                               "function the module defines")


def check_allowed(job: JobSpec, allowed: tuple[str, ...] | None = None) -> None:
    """Checks every import path of a job against the allowed modules before
    anything is imported (scheduler at submit, workers at deploy), and that
    the cluster can run the job's shape (:func:`check_cluster_runnable`)."""
    check_cluster_runnable(job)
    for stage in job.stages:
        where = f"job {job.name}, stage {stage.name}"
        if stage.function:
            check_allowed_path(stage.function, f"{where}, function", allowed)
        if stage.key:
            check_allowed_path(stage.key, f"{where}, key", allowed)


def _unknown_kind(name: str, kind: str) -> str:
    """The message for a kind that is not one: the kinds, and the nearest."""
    near = difflib.get_close_matches(kind, list(STAGE_KINDS), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return (f"stage {short(name)}: unknown kind {short(kind)}{hint}; use one of "
            f"{', '.join(STAGE_KINDS)}")


@dataclass(frozen=True)
class Stage:
    """One step of a job; see the module docstring for the kinds.

    The kind is checked here, so ``Stage("a", "mapp")`` fails where it is
    written rather than at submit (InvalidArgument naming the kinds); the
    rest (import paths, keys, a reduce's ``initial``, the graph) is checked by
    :func:`validate`, which every way of building a job runs.
    """

    name: str
    kind: str
    function: str = ""
    key: str = ""
    initial: Any = None
    inputs: tuple[str, ...] = ()
    """Stages whose output this stage reads (several: their union);
    :data:`SOURCE` is the sent records; empty means the stage before it."""
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Keyword arguments of the function (JSON data), given on every call."""
    mode: str = "latest"
    """A sink's mode: ``latest`` (one row per key), ``append`` (every record)
    or ``files`` (every record, in files; params ``path`` and ``format``)."""
    prepartitioned: bool = False
    """Sent keyed by this stage's key: no shuffle before it (docs/jobs.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in STAGE_KINDS:
            raise InvalidArgument(_unknown_kind(str(self.name), str(self.kind)))
        if isinstance(self.inputs, str):
            object.__setattr__(self, "inputs", (self.inputs,))
        elif not isinstance(self.inputs, tuple):
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.params is None:
            object.__setattr__(self, "params", {})

    @property
    def keyed(self) -> bool:
        """True when records shuffle by key into this stage."""
        return self.kind in KEYED_KINDS


@dataclass(frozen=True)
class JobSpec:
    """A job: stages over a fixed number of partitions."""

    name: str
    stages: tuple[Stage, ...]
    partitions: int = 0
    delivery: str = "exactly_once"
    window_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    tracking_timeout_s: float = 0.0
    """Seconds before an incomplete root fails; 0 means the cluster's default."""

    def to_proto(self) -> common_pb2.JobSpec:
        """The wire form."""
        return common_pb2.JobSpec(
            name=self.name,
            partitions=self.partitions,
            delivery=DELIVERY_MODES[self.delivery],  # type: ignore[arg-type]
            window_size=self.window_size,
            tracking_timeout_s=self.tracking_timeout_s,
            stages=[
                common_pb2.StageSpec(
                    name=s.name,
                    kind=STAGE_KINDS[s.kind],  # type: ignore[arg-type]
                    function=s.function,
                    key=s.key,
                    initial_json="" if s.initial is None else json.dumps(s.initial),
                    inputs=list(s.inputs),
                    params_json=json.dumps(dict(s.params)) if s.params else "",
                    # A latest sink stays unset, so a linear job's wire form is
                    # what it was before sinks had modes.
                    sink_mode=(SINK_MODES[s.mode]  # type: ignore[arg-type]
                               if s.mode != "latest" else common_pb2.SINK_MODE_UNSPECIFIED),
                    prepartitioned=s.prepartitioned,
                )
                for s in self.stages
            ],
        )

    @classmethod
    def from_proto(cls, spec: common_pb2.JobSpec) -> JobSpec:
        """Parses and validates the wire form; raises InvalidArgument."""
        stages = []
        if len(spec.stages) > MAX_STAGES:
            raise InvalidArgument(f"a job has at most {MAX_STAGES} stages, not "
                                  f"{len(spec.stages)}")
        for i, s in enumerate(spec.stages):
            where = f"stage {i} ({short(s.name) if s.name else 'unnamed'})"
            if s.kind not in KIND_NAMES:
                raise InvalidArgument(f"{where}: unknown kind {s.kind}")
            initial = _parse_json(s.initial_json, where, "initial_json",
                                  MAX_INITIAL_JSON_BYTES)
            params = _parse_json(s.params_json, where, "params_json", MAX_PARAMS_JSON_BYTES)
            _require(params is None or isinstance(params, dict),
                     f"{where}: params_json must be a JSON object")
            mode = SINK_MODE_NAMES.get(s.sink_mode or common_pb2.SINK_MODE_LATEST)
            _require(mode is not None, f"{where}: unknown sink_mode {s.sink_mode}")
            stages.append(Stage(s.name, KIND_NAMES[s.kind], s.function, s.key, initial,
                                tuple(s.inputs), params or {}, str(mode), s.prepartitioned))
        delivery = DELIVERY_NAMES.get(spec.delivery or common_pb2.DELIVERY_MODE_EXACTLY_ONCE)
        if delivery is None:
            raise InvalidArgument(f"unknown delivery mode {spec.delivery}")
        job = cls(spec.name, tuple(stages), spec.partitions, delivery, spec.window_size,
                  tracking_timeout_s=spec.tracking_timeout_s)
        validate(job)
        return job

    def with_defaults(self, partitions: int, window_size: int) -> JobSpec:
        """The job with the cluster's defaults filled in where it left them at 0."""
        return JobSpec(
            self.name,
            self.stages,
            self.partitions or partitions,
            self.delivery,
            self.window_size or window_size,
            tracking_timeout_s=self.tracking_timeout_s,
        )


def _parse_json(text: str, where: str, name: str, limit: int) -> Any:
    """A stage's initial value or params from JSON, refusing texts too large
    or too deep before the parser sees them."""
    if not text:
        return None
    if len(text) > limit:
        raise InvalidArgument(f"{where}: {name} is {len(text)} bytes; at most {limit}")
    if json_nesting_depth(text) > MAX_NESTING:
        raise InvalidArgument(f"{where}: {name} is nested more than {MAX_NESTING} "
                              "levels deep; flatten it")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{where}: {name} is not valid JSON: "
                              f"{short(str(exc), 120)}") from None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidArgument(message)


def validate(job: JobSpec) -> None:
    """Checks a job's shape without importing anything; raises InvalidArgument
    with a message that names the stage and what to fix."""
    _require(bool(_NAME.match(job.name)), f"job name {short(job.name)} must be 1-64 "
             "characters of letters, digits, '_', '.', '-'")
    _require(0 <= job.partitions <= MAX_PARTITIONS,
             f"job {job.name}: partitions must be between 1 and {MAX_PARTITIONS}")
    _require(0 <= job.window_size <= MAX_WINDOW_SIZE,
             f"job {job.name}: window_size must be between 1 and {MAX_WINDOW_SIZE}")
    _require(math.isfinite(job.tracking_timeout_s)
             and 0 <= job.tracking_timeout_s <= MAX_TRACKING_TIMEOUT_S,
             f"job {job.name}: tracking_timeout_s is {job.tracking_timeout_s!r}; it must be a "
             f"finite number of seconds up to {MAX_TRACKING_TIMEOUT_S:g} (or 0 for the "
             "cluster default)")
    _require(len(job.stages) <= MAX_STAGES, f"job {job.name}: at most {MAX_STAGES} stages")
    _require(job.delivery in DELIVERY_MODES,
             f"job {job.name}: delivery must be one of {', '.join(DELIVERY_MODES)}")
    _require(len(job.stages) >= 1, f"job {job.name}: needs at least one stage (a sink)")
    seen: set[str] = set()
    for i, stage in enumerate(job.stages):
        where = f"job {job.name}, stage {i} ({short(stage.name) if stage.name else 'unnamed'})"
        check_stage(stage, where)
        _require(stage.name not in seen, f"{where}: duplicate stage name")
        seen.add(stage.name)
    _check_graph(job)


def check_stage(stage: Stage, where: str) -> None:
    """One stage's own fields: kind, function, key, initial, params, mode
    (:mod:`gridstream.dataflow` checks each operator with it as it is added)."""
    _require(bool(_NAME.match(stage.name)), f"{where}: name must be 1-64 characters of "
             "letters, digits, '_', '.', '-'")
    if stage.kind not in STAGE_KINDS:  # the nearest kind is looked up only then
        raise InvalidArgument(f"{where}: " + _unknown_kind(stage.name, stage.kind))
    _require(nesting_depth(stage.initial) <= MAX_NESTING,
             f"{where}: initial is nested more than {MAX_NESTING} levels deep; flatten it")
    _require(stage.mode in SINK_MODES, f"{where}: mode {short(str(stage.mode))} is not one of "
             f"{', '.join(SINK_MODES)}")
    _check_params(stage, where)
    if stage.kind == "sink":
        _require(not stage.function and not stage.key,
                 f"{where}: a sink takes no function or key")
        if stage.mode == "files":
            check_file_params(stage.params, where)
        else:
            _require(not stage.params, f"{where}: a sink takes no function, key or params "
                     "(only a files sink, mode = \"files\", takes params path and format)")
        return
    _require(stage.mode == "latest", f"{where}: only a sink takes a mode")
    _require(len(stage.function) <= MAX_IMPORT_PATH_CHARS
             and bool(_IMPORT_PATH.match(stage.function)),
             f"{where}: function {short(stage.function)} must be an import path "
             f"'package.module:function' of at most {MAX_IMPORT_PATH_CHARS} characters")
    if stage.keyed:
        _require(len(stage.key) <= MAX_IMPORT_PATH_CHARS
                 and bool(_IMPORT_PATH.match(stage.key)),
                 f"{where}: a {stage.kind} stage needs key = 'package.module:function'")
    else:
        _require(not stage.key, f"{where}: only reduce and stateful stages take a key")
    _require(not stage.prepartitioned or (stage.kind in ("reduce", "stateful")
                                          and TIMERS not in stage.params),
             f"{where}: only a reduce, or a stateful stage without timers, is prepartitioned")
    check_event_time(stage, where)  # a window's or join's params.window, a stateful's timers
    _require(stage.kind != "reduce" or stage.initial is not None,
             f"{where}: a reduce needs an initial accumulator, the value its function "
             "receives for a key's first record: add initial = 0 (to count or sum), "
             "initial = \"\" (to concatenate) or initial = [] (to collect)")


def _check_params(stage: Stage, where: str) -> None:
    """Params are a JSON object of keyword arguments: names are identifiers,
    values are data that survives JSON (no code crosses the wire)."""
    params = stage.params
    _require(isinstance(params, Mapping), f"{where}: params must be a table of keyword "
             "arguments, e.g. params = {threshold = 3}")
    for name in params:
        _require(isinstance(name, str) and name.isidentifier(),
                 f"{where}: params key {name!r} is not a Python identifier (params are "
                 "passed as keyword arguments)")
    _require(nesting_depth(dict(params)) <= MAX_NESTING,
             f"{where}: params are nested more than {MAX_NESTING} levels deep; flatten them")
    try:
        text = json.dumps(dict(params), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where}: params must be JSON data (str, numbers, bools, None, "
                              f"lists, tables) since they travel to the workers as data: "
                              f"{short(str(exc), 120)}") from None
    _require(len(text) <= MAX_PARAMS_JSON_BYTES,
             f"{where}: params are {len(text)} bytes as JSON; at most {MAX_PARAMS_JSON_BYTES}")
    _require(json.loads(text) == params, f"{where}: params do not survive JSON unchanged "
             "(tuples become lists, keys become strings); give lists and str keys")


def effective_inputs(job: JobSpec) -> list[tuple[str, ...]]:
    """Each stage's inputs with the default filled in: the stage before it, or
    :data:`SOURCE` for the first stage."""
    out: list[tuple[str, ...]] = []
    for i, stage in enumerate(job.stages):
        if stage.inputs:
            out.append(tuple(stage.inputs))
        else:
            out.append((SOURCE,) if i == 0 else (job.stages[i - 1].name,))
    return out


def _check_graph(job: JobSpec) -> None:
    """The stages form a DAG listed in data-flow order: every input names the
    source or an earlier stage that is not a sink, every stage but the sinks
    feeds another, and there is at least one sink."""
    names = {stage.name: i for i, stage in enumerate(job.stages)}
    inputs = effective_inputs(job)
    by_name = {stage.name: inputs[i] for i, stage in enumerate(job.stages)}
    consumed: set[str] = set()
    for i, stage in enumerate(job.stages):
        where = f"job {job.name}, stage {i} ({short(stage.name)})"
        _require(len(set(inputs[i])) == len(inputs[i]), f"{where}: inputs name a stage twice")
        for upstream in inputs[i]:
            consumed.add(upstream)
            if upstream == SOURCE:
                continue
            _require(upstream in names, f"{where}: reads from {short(upstream)}, which is not "
                     f"a stage of the job (inputs name earlier stages or {SOURCE!r})")
            _require(names[upstream] < i, f"{where}: reads from {short(upstream)}, which "
                     "comes later; list stages in the order data flows (each after its "
                     "inputs), so the graph has no cycle" + (
                         " (these two form one)" if stage.name in by_name[upstream] else ""))
            _require(job.stages[names[upstream]].kind != "sink",
                     f"{where}: reads from sink {short(upstream)}; a sink must be the last "
                     "stage of its branch")
    for i, stage in enumerate(job.stages):
        if stage.kind != "sink" and stage.name not in consumed:
            _require(False, f"job {job.name}, stage {i} ({short(stage.name)}): its output "
                     "feeds no stage; the last stage must be a sink (kind = \"sink\") and "
                     "every branch must end in one")


def is_linear(job: JobSpec) -> bool:
    """True for a pipeline the cluster's workers run: each stage reads the one
    before it (the first the source), and the one sink is the last stage."""
    inputs = effective_inputs(job)
    for i, stage in enumerate(job.stages):
        expected = (SOURCE,) if i == 0 else (job.stages[i - 1].name,)
        if inputs[i] != expected or (stage.kind == "sink") != (i == len(job.stages) - 1):
            return False
    return True


def check_cluster_runnable(job: JobSpec) -> None:
    """Checks that the cluster's workers can run the job's shape: they run any
    graph :func:`validate` accepts (linear pipelines, branches, unions,
    several sinks), cut into tasks by :func:`plan_tasks`, so this only makes
    sure the plan can be made (the scheduler checks it at submit)."""
    validate(job)
    plan_tasks(job)


def resolve(path: str, where: str, allowed: tuple[str, ...] | None = None
            ) -> Callable[..., Any]:
    """Imports ``package.module:function`` if the module is allowed (this
    process's job modules unless ``allowed`` is given); raises
    PermissionDenied before importing anything that is not, InvalidArgument
    saying what failed otherwise. The function must also be defined in an
    allowed module, so an allowed module cannot hand out ``os.system`` by
    importing it."""
    allowed = _allowed_modules if allowed is None else allowed
    check_allowed_path(path, where, allowed)
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise InvalidArgument(
            f"{where}: cannot import module {module_name!r} of {path!r} "
            f"({type(exc).__name__}: {exc}); is it installed on every worker?"
        ) from None
    target = getattr(module, attr, None)
    if target is None:
        raise InvalidArgument(f"{where}: module {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise InvalidArgument(f"{where}: {path!r} is not callable")
    defined_in = getattr(target, "__module__", None)
    if not isinstance(defined_in, str) or not module_allowed(defined_in, allowed):
        raise PermissionDenied(
            f"{where}: {path!r} is defined in {defined_in!r}, not in a module this cluster "
            f"lets jobs use (cluster.job_modules = {list(allowed)})")
    return target  # type: ignore[no-any-return]


def check_imports(job: JobSpec, allowed: tuple[str, ...] | None = None) -> None:
    """Checks every import path against the allowed modules first, then
    resolves each, so a typo fails at submission and a module that is not
    allowed is never imported."""
    check_allowed(job, allowed)
    for stage in job.stages:
        where = f"job {job.name}, stage {stage.name}"
        if stage.function:
            resolve(stage.function, f"{where}, function", allowed)
        if stage.key:
            resolve(stage.key, f"{where}, key", allowed)
        for path in event_paths(stage):  # timestamp and timer functions run on workers too
            resolve(path, f"{where}, {path}", allowed)


def plan_tasks(job: JobSpec) -> list[list[Stage]]:
    """The stages of each task (:func:`gridstream.taskplan.plan_graph`): a new
    task starts at every keyed stage, union and reader of a fan-out; task 0
    receives the source records (empty, a pass-through, when the first stage
    is keyed). A linear pipeline plans as it always did."""
    from gridstream.taskplan import plan_graph  # it builds on this module

    return [list(task.stages) for task in plan_graph(job).tasks]


def from_mapping(data: dict[str, Any], source: str = "job") -> JobSpec:
    """Builds a job from a parsed TOML document; raises InvalidArgument."""
    head = data.get("job", {})
    _require(isinstance(head, dict), f"{source}: [job] must be a table")
    unknown = set(head) - {"name", "partitions", "delivery", "window_size",
                           "snapshot_every", "tracking_timeout_s"}
    _require(not unknown, f"{source}: unknown keys in [job]: {', '.join(sorted(unknown))}")
    raw_stages = data.get("stages")
    _require(isinstance(raw_stages, list) and bool(raw_stages),
             f"{source}: needs one or more [[stages]] tables")
    stages = []
    for i, raw in enumerate(raw_stages):  # type: ignore[arg-type]
        _require(isinstance(raw, dict), f"{source}: stage {i} must be a table")
        unknown = set(raw) - {"name", "kind", "function", "key", "initial", "inputs",
                              "params", "mode", "prepartitioned"}
        _require(not unknown,
                 f"{source}: stage {i}: unknown keys {', '.join(sorted(unknown))}")
        for text_key in ("name", "kind", "function", "key", "mode"):
            _require(isinstance(raw.get(text_key, ""), str),
                     f"{source}: stage {i}: {text_key} must be a string")
        inputs = raw.get("inputs", [])
        _require(isinstance(inputs, list) and all(isinstance(n, str) for n in inputs),
                 f"{source}: stage {i}: inputs must be a list of stage names, "
                 'e.g. inputs = ["parse"]')
        params = raw.get("params", {})
        _require(isinstance(params, dict), f"{source}: stage {i}: params must be a table, "
                 "e.g. params = { threshold = 3 }")
        _require(isinstance(raw.get("prepartitioned", False), bool),
                 f"{source}: stage {i}: prepartitioned must be true or false")
        try:
            stage = Stage(
                name=raw.get("name", f"stage{i}"),
                kind=raw.get("kind", ""),
                function=raw.get("function", ""),
                key=raw.get("key", ""),
                initial=raw.get("initial"),
                inputs=tuple(inputs),
                params=params,
                mode=raw.get("mode", "latest"),
                prepartitioned=raw.get("prepartitioned", False),
            )
        except InvalidArgument as exc:
            raise InvalidArgument(f"{source}: stage {i}: {exc}") from None
        stages.append(stage)
    partitions = head.get("partitions", 0)
    window = head.get("snapshot_every", head.get("window_size", 0))  # records per snapshot
    _require(head.get("window_size", window) == window, f"{source}: give snapshot_every "
             "(window_size's other name) or window_size")
    timeout = head.get("tracking_timeout_s", 0.0)
    _require(isinstance(partitions, int), f"{source}: partitions must be an integer")
    _require(isinstance(window, int), f"{source}: window_size must be an integer")
    _require(isinstance(timeout, int | float) and not isinstance(timeout, bool),
             f"{source}: tracking_timeout_s must be a number")
    job = JobSpec(
        name=str(head.get("name", "job")),
        stages=tuple(stages),
        partitions=partitions,
        delivery=str(head.get("delivery", "exactly_once")),
        window_size=window,
        tracking_timeout_s=float(timeout),
    )
    validate(job)
    return job


def load_job_file(path: str | Path) -> JobSpec:
    """Reads and validates a job TOML file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"job file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"job file {path} is not valid TOML: {exc}") from None
    return from_mapping(data, str(path))
