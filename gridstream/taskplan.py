"""How a job's graph is cut into tasks, and where each task's output goes.

A *task* is a chain of stages that runs in one JobContainer and one
JobOperator per partition. A stage joins the task of its input when records
can flow into it without leaving the partition's chain: it is not keyed (or
it is a prepartitioned one: its records are already in their key's
partition), it reads one input, and that input feeds no other stage.
Otherwise it starts a task of its own (a prepartitioned stage too: records
then shuffle to it by its key, as to any keyed stage):

- a keyed stage (``reduce``, ``stateful``): records shuffle by key;
- a stage with several inputs (a union): each input's task sends to it;
- a reader of a stage that feeds several (a fan-out): the output goes to
  every reader's task.

Task 0 receives the sent records; it is empty (a pass-through) when the
first stage does not join it. Tasks are numbered in the order their first
stage is listed, so an edge always goes to a higher task. Each task lists
its outbound :class:`Edge` s: the task it sends to, and whether the records
shuffle by the destination stage's key (keyed) or stay in their partition
with their key (forward). Only a task's last stage has readers outside the
task, so its output is the task's output, sent on every edge.

A linear pipeline plans exactly as before graphs existed: a task at every
keyed stage, one keyed edge from each task to the next. A task that is a
counting reduce into a latest sink combines: its edges send partial counts
and its reduce adds them (:mod:`gridstream.combiners`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gridstream.combiners import combiner_of, merging
from gridstream.jobspec import SOURCE, JobSpec, Stage, effective_inputs


@dataclass(frozen=True)
class Edge:
    """Where one task's output goes."""

    task: int
    """The destination task."""
    stage: Stage
    """The destination task's first stage (a keyed one names the key function)."""
    combine: str = ""
    """The reduce function whose partials the edge sends, one per key per
    batch, when the destination combines (:mod:`gridstream.combiners`);
    empty: every record as it is."""

    @property
    def keyed(self) -> bool:
        """True when records shuffle by the destination stage's key; False for a
        forward edge, which keeps each record in its partition with its key."""
        return self.stage.keyed


@dataclass(frozen=True)
class TaskPlan:
    """One task: its chained stages, the tasks that send to it, its edges."""

    index: int
    stages: tuple[Stage, ...]
    inputs: tuple[int, ...]
    """Tasks with an edge into this one (none for task 0, which the sent
    records feed)."""
    edges: tuple[Edge, ...]
    """Where the task's output goes, in the order the readers are listed."""


@dataclass(frozen=True)
class GraphPlan:
    """The tasks of a job, task 0 first."""

    tasks: tuple[TaskPlan, ...]
    sinks: tuple[str, ...]
    """The job's sinks, in the order listed."""

    def task_of(self, stage: str) -> int:
        """The task a stage runs in."""
        for task in self.tasks:
            if any(s.name == stage for s in task.stages):
                return task.index
        raise KeyError(stage)


def plan_graph(job: JobSpec) -> GraphPlan:
    """Cuts ``job`` (validated) into tasks and edges; see the module docstring."""
    inputs = effective_inputs(job)
    readers: dict[str, int] = {}
    for names in inputs:
        for name in names:
            readers[name] = readers.get(name, 0) + 1
    task_of = {SOURCE: 0}
    stages: list[list[Stage]] = [[]]
    edges: list[list[Edge]] = [[]]
    feeds: list[list[int]] = [[]]
    for stage, names in zip(job.stages, inputs, strict=True):
        if ((not stage.keyed or stage.prepartitioned) and len(names) == 1
                and readers[names[0]] == 1):
            task = task_of[names[0]]
            stages[task].append(stage)
        else:  # a prepartitioned stage starting a task is shuffled as any keyed one
            task = len(stages)
            stages.append([replace(stage, prepartitioned=False)])
            edges.append([])
            feeds.append([])
            for name in names:
                edges[task_of[name]].append(Edge(task, stage))
                feeds[task].append(task_of[name])
        task_of[stage.name] = task
    for task in range(1, len(stages)):
        if combiner_of(stages[task]) is not None:
            function = stages[task][0].function
            for sender in set(feeds[task]):
                edges[sender] = [replace(e, combine=function) if e.task == task else e
                                 for e in edges[sender]]
            stages[task] = list(merging(stages[task]))
    tasks = tuple(TaskPlan(i, tuple(stages[i]), tuple(feeds[i]), tuple(edges[i]))
                  for i in range(len(stages)))
    return GraphPlan(tasks, tuple(s.name for s in job.stages if s.kind == "sink"))


def sink_row_prefix(job: JobSpec, stages: tuple[Stage, ...] | list[Stage]) -> str:
    """What a task's sink rows are stored under in the job's results table:
    ``"<sink>/"`` when the job has several sinks (rows of different sinks
    then never share a key), nothing when it has one (as before graphs)."""
    sinks = [s.name for s in job.stages if s.kind == "sink"]
    if len(sinks) < 2 or not stages or stages[-1].kind != "sink":
        return ""
    return f"{stages[-1].name}/"


def sink_rows(job: JobSpec, rows: dict[str, object], sink: str) -> dict[str, object]:
    """One sink's rows out of a job's results table (keys without the sink's
    prefix); raises KeyError naming the sinks for a name that is not one."""
    sinks = [s.name for s in job.stages if s.kind == "sink"]
    if sink not in sinks:
        raise KeyError(f"job {job.name} has no sink {sink!r}; its sinks are "
                       f"{', '.join(sinks)}")
    if len(sinks) < 2:
        return dict(rows)
    prefix = f"{sink}/"
    return {key[len(prefix):]: value for key, value in rows.items() if key.startswith(prefix)}


def results_from_state(job: JobSpec, stages: tuple[Stage, ...] | list[Stage]) -> str | None:
    """The stage whose keyed state *is* a task's sink rows, or None.

    A task that ends in a reduce into a ``latest`` sink emits,
    for every key it touches, the key's new accumulator, and the sink keeps
    the newest: the rows are the reduce's state. In an exactly_once job
    those rows need not be written a second time: every window's state is
    stored, and a drain waits for every tuple tree, so for every window
    covering a processed record to be stored; the state servers read the
    rows from the stored state (``ReadResultsRequest.from_state``). Returns
    the reduce's name then. The other modes keep writing rows: an
    at_least_once drain does not wait for windows to be stored, and
    at_most_once windows close by count only. Stages before the reduce in
    the same task (a prepartitioned reduce's maps) change nothing of that."""
    if job.delivery != "exactly_once" or len(stages) < 2:
        return None
    reduce, sink = stages[-2:]
    if reduce.kind != "reduce" or reduce.params or sink.kind != "sink" or sink.mode != "latest":
        return None
    return reduce.name


def state_result_sources(job: JobSpec) -> list[tuple[str, str]]:
    """(reduce stage, row key prefix) of every task of ``job`` whose sink rows
    are read from state (:func:`results_from_state`): what a reader of the
    job's results asks the state servers for."""
    sources = []
    for task in plan_graph(job).tasks:
        stage = results_from_state(job, task.stages)
        if stage is not None:
            sources.append((stage, sink_row_prefix(job, task.stages)))
    return sources
