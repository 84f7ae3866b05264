"""Jobs as users write them: a pipeline of stages, from TOML or from code.

A job file looks like::

    [job]
    name = "taxi"
    partitions = 12            # optional; the cluster default otherwise
    delivery = "exactly_once"  # or "at_least_once", "at_most_once"
    window_size = 10000        # optional; records per window snapshot

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

    [[stages]]
    name = "store"
    kind = "sink"

The runtime cuts the pipeline into *tasks* at every keyed stage: the stages of
a task run chained in one JobOperator per partition; between tasks, records
shuffle by key to the partition's owner.
"""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridstream.errors import InvalidArgument
from gridstream.v1 import common_pb2

STAGE_KINDS: dict[str, int] = {
    "map": common_pb2.STAGE_KIND_MAP,
    "flat_map": common_pb2.STAGE_KIND_FLAT_MAP,
    "filter": common_pb2.STAGE_KIND_FILTER,
    "map_batch": common_pb2.STAGE_KIND_MAP_BATCH,
    "reduce": common_pb2.STAGE_KIND_REDUCE,
    "stateful": common_pb2.STAGE_KIND_STATEFUL,
    "sink": common_pb2.STAGE_KIND_SINK,
}
KIND_NAMES = {v: k for k, v in STAGE_KINDS.items()}
KEYED_KINDS = frozenset({"reduce", "stateful"})

DELIVERY_MODES: dict[str, int] = {
    "exactly_once": common_pb2.DELIVERY_MODE_EXACTLY_ONCE,
    "at_least_once": common_pb2.DELIVERY_MODE_AT_LEAST_ONCE,
    "at_most_once": common_pb2.DELIVERY_MODE_AT_MOST_ONCE,
}
DELIVERY_NAMES = {v: k for k, v in DELIVERY_MODES.items()}

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_PARTITIONS = 4096


@dataclass(frozen=True)
class Stage:
    """One step of a pipeline; see the module docstring for the kinds."""

    name: str
    kind: str
    function: str = ""
    key: str = ""
    initial: Any = None

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
                )
                for s in self.stages
            ],
        )

    @classmethod
    def from_proto(cls, spec: common_pb2.JobSpec) -> JobSpec:
        """Parses and validates the wire form; raises InvalidArgument."""
        stages = []
        for i, s in enumerate(spec.stages):
            if s.kind not in KIND_NAMES:
                raise InvalidArgument(f"stage {i} ({s.name or 'unnamed'}): unknown kind {s.kind}")
            try:
                initial = json.loads(s.initial_json) if s.initial_json else None
            except json.JSONDecodeError as exc:
                raise InvalidArgument(
                    f"stage {s.name}: initial_json is not valid JSON: {exc}"
                ) from None
            stages.append(Stage(s.name, KIND_NAMES[s.kind], s.function, s.key, initial))
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


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidArgument(message)


def validate(job: JobSpec) -> None:
    """Checks a job's shape without importing anything; raises InvalidArgument
    with a message that names the stage and what to fix."""
    _require(bool(_NAME.match(job.name)), f"job name {job.name!r} must be 1-64 characters of "
             "letters, digits, '_', '.', '-'")
    _require(0 <= job.partitions <= MAX_PARTITIONS,
             f"job {job.name}: partitions must be between 1 and {MAX_PARTITIONS}")
    _require(job.window_size >= 0, f"job {job.name}: window_size must be >= 1")
    _require(job.tracking_timeout_s >= 0,
             f"job {job.name}: tracking_timeout_s must be > 0 (or 0 for the cluster default)")
    _require(job.delivery in DELIVERY_MODES,
             f"job {job.name}: delivery must be one of {', '.join(DELIVERY_MODES)}")
    _require(len(job.stages) >= 1, f"job {job.name}: needs at least one stage (a sink)")
    seen: set[str] = set()
    for i, stage in enumerate(job.stages):
        where = f"job {job.name}, stage {i} ({stage.name or 'unnamed'})"
        _require(bool(_NAME.match(stage.name)), f"{where}: name must be 1-64 characters of "
                 "letters, digits, '_', '.', '-'")
        _require(stage.name not in seen, f"{where}: duplicate stage name")
        seen.add(stage.name)
        _require(stage.kind in STAGE_KINDS,
                 f"{where}: unknown kind {stage.kind!r}; use one of {', '.join(STAGE_KINDS)}")
        last = i == len(job.stages) - 1
        if stage.kind == "sink":
            _require(last, f"{where}: a sink must be the last stage")
            _require(not stage.function and not stage.key,
                     f"{where}: a sink takes no function or key")
            continue
        _require(not last, f"{where}: the last stage must be a sink (kind = \"sink\")")
        _require(bool(_IMPORT_PATH.match(stage.function)),
                 f"{where}: function {stage.function!r} must be an import path "
                 "'package.module:function'")
        if stage.keyed:
            _require(bool(_IMPORT_PATH.match(stage.key)),
                     f"{where}: a {stage.kind} stage needs key = 'package.module:function'")
        else:
            _require(not stage.key, f"{where}: only reduce and stateful stages take a key")


def resolve(path: str, where: str) -> Callable[..., Any]:
    """Imports ``package.module:function``; raises InvalidArgument saying what failed."""
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
    return target  # type: ignore[no-any-return]


def check_imports(job: JobSpec) -> None:
    """Resolves every import path of a job, so a typo fails at submission."""
    for stage in job.stages:
        where = f"job {job.name}, stage {stage.name}"
        if stage.function:
            resolve(stage.function, f"{where}, function")
        if stage.key:
            resolve(stage.key, f"{where}, key")


def plan_tasks(job: JobSpec) -> list[list[Stage]]:
    """Cuts the pipeline into tasks: a new task starts at every keyed stage.

    Task 0 receives the source records; it may be empty (pass-through) when
    the first stage is keyed.
    """
    tasks: list[list[Stage]] = [[]]
    for stage in job.stages:
        if stage.keyed:
            tasks.append([stage])
        else:
            tasks[-1].append(stage)
    return tasks


def from_mapping(data: dict[str, Any], source: str = "job") -> JobSpec:
    """Builds a job from a parsed TOML document; raises InvalidArgument."""
    head = data.get("job", {})
    _require(isinstance(head, dict), f"{source}: [job] must be a table")
    unknown = set(head) - {"name", "partitions", "delivery", "window_size",
                           "tracking_timeout_s"}
    _require(not unknown, f"{source}: unknown keys in [job]: {', '.join(sorted(unknown))}")
    raw_stages = data.get("stages")
    _require(isinstance(raw_stages, list) and bool(raw_stages),
             f"{source}: needs one or more [[stages]] tables")
    stages = []
    for i, raw in enumerate(raw_stages):  # type: ignore[arg-type]
        _require(isinstance(raw, dict), f"{source}: stage {i} must be a table")
        unknown = set(raw) - {"name", "kind", "function", "key", "initial"}
        _require(not unknown,
                 f"{source}: stage {i}: unknown keys {', '.join(sorted(unknown))}")
        for text_key in ("name", "kind", "function", "key"):
            _require(isinstance(raw.get(text_key, ""), str),
                     f"{source}: stage {i}: {text_key} must be a string")
        stages.append(Stage(
            name=raw.get("name", f"stage{i}"),
            kind=raw.get("kind", ""),
            function=raw.get("function", ""),
            key=raw.get("key", ""),
            initial=raw.get("initial"),
        ))
    partitions = head.get("partitions", 0)
    window = head.get("window_size", 0)
    _require(isinstance(partitions, int), f"{source}: partitions must be an integer")
    _require(isinstance(window, int), f"{source}: window_size must be an integer")
    job = JobSpec(
        name=str(head.get("name", "job")),
        stages=tuple(stages),
        partitions=partitions,
        delivery=str(head.get("delivery", "exactly_once")),
        window_size=window,
        tracking_timeout_s=float(head.get("tracking_timeout_s", 0.0)),
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
