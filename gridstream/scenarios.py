"""Fault sequences against a running history job, judged by the history checker.

A scenario is a list of :class:`Step` s, each at a time after streaming
started: kill or pause workers, kill several at once, kill the scheduler or a
state server. Steps do not wait for the cluster to heal in between (that is
the point: real faults come in sequences). The input streams the whole time;
each fault records whether records were in flight when it landed, how long
the scheduler took to declare its victims dead, and how long until a batch
sent after it was acknowledged. At the end the job must drain, and
:func:`gridstream.checker.check_history` must find every key exact.

Only processes this run started are signalled, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from gridstream.checker import HistoryVerdict, check_graph_branches, check_history
from gridstream.client import Client
from gridstream.config import Config
from gridstream.errors import DataLoss, DeadlineExceeded, GridstreamError, Unavailable
from gridstream.examples import history, history_graph
from gridstream.faultproxy import FaultProxy
from gridstream.faultsteps import (
    DEAD,
    FaultRecord,
    Step,
    detections_of,
    inject,
    isolatable,
)
from gridstream.local import LocalCluster
from gridstream.retry import retry


@dataclass
class HistoryRun:
    """The outcome of a scenario."""

    faults: list[FaultRecord] = field(default_factory=list)
    verdict: HistoryVerdict = field(default_factory=HistoryVerdict)
    losses: list[str] = field(default_factory=list)
    undrained: str = ""
    """Why the job did not drain within the bound (empty when it did)."""
    wrongly_convicted: list[str] = field(default_factory=list)
    records: int = 0
    state_keys: int = 0
    """Keys of state loaded before the faults (see ``run_history``)."""
    seconds: float = 0.0
    branches: list[str] = field(default_factory=list)
    """A graph run: what the other branches got wrong (empty when exact)."""
    tasks: int = 0  # of the job, as its progress listed them at the drain

    def table(self) -> str:
        """Faults with detection and resume times, then the verdict."""
        lines = [f"{'#':>3} {'fault':<10} {'victims':<22} {'in flight':>9} "
                 f"{'detected (s)':>13} {'resumed (s)':>12}"]
        for i, f in enumerate(self.faults, 1):
            detected = "-" if f.detected_s is None else f"{f.detected_s:.2f}"
            resumed = "-" if f.resumed_s is None else f"{f.resumed_s:.2f}"
            lines.append(f"{i:>3} {f.kind:<10} {','.join(f.victims):<22} "
                         f"{'yes' if f.in_flight else 'no':>9} {detected:>13} {resumed:>12}")
        for label, values in (
            ("detection", [f.detected_s for f in self.faults if f.detected_s is not None]),
            ("resume", [f.resumed_s for f in self.faults if f.resumed_s is not None]),
        ):
            if values:
                lines.append(f"{label}: median {statistics.median(values):.2f} s, "
                             f"max {max(values):.2f} s over {len(values)} faults")
        state = f" over {self.state_keys:,} keys of loaded state" if self.state_keys else ""
        lines.append(f"{self.records:,} records in {self.seconds:.1f} s{state}; "
                     f"{self.verdict.summary()}")
        lines += [f"graph branch wrong: {problem}" for problem in self.branches]
        if self.losses:
            lines.append("named losses: " + "; ".join(self.losses))
        if self.undrained:
            lines.append("NOT DRAINED: " + self.undrained)
        if self.wrongly_convicted:
            lines.append("convicted while alive: " + ", ".join(self.wrongly_convicted))
        return "\n".join(lines)


class Sender:
    """Streams the input in chunks and notes when each chunk was acknowledged."""

    def __init__(self, client: Client, job_id: str, keys: list[str], values: list[Any],
                 seconds: float, chunk: int) -> None:
        self.client = client
        self.job_id = job_id
        self.keys = keys
        self.values = values
        self.seconds = seconds
        self.chunk = chunk
        self.acked = 0
        self.busy = False
        self.send_errors: list[str] = []
        """Sends that failed in part and were completed by a flush."""
        self.acks: list[tuple[float, float]] = []
        """(monotonic start of the send, monotonic time it was acknowledged)."""

    async def run(self) -> None:
        """Sends everything, spread over about ``seconds``."""
        chunks = max(1, (len(self.values) + self.chunk - 1) // self.chunk)
        pause = self.seconds / chunks
        for start in range(0, len(self.values), self.chunk):
            end = start + self.chunk
            began = time.monotonic()
            self.busy = True
            try:
                await self.client.send(self.job_id, self.values[start:end],
                                       self.keys[start:end])
            except GridstreamError as exc:
                # A partial send: what was not acknowledged is held by the
                # client with its sequences; flush until it is (as a user would).
                self.send_errors.append(str(exc)[:300])
                await self._flush_until_sent()
            self.busy = False
            self.acked = min(end, len(self.values))
            self.acks.append((began, time.monotonic()))
            await asyncio.sleep(pause)

    async def _flush_until_sent(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            await asyncio.sleep(0.5)
            try:
                await self.client.flush(self.job_id)
                return
            except GridstreamError as exc:
                self.send_errors.append(str(exc)[:300])
                if time.monotonic() > deadline:
                    raise

    def in_flight(self) -> bool:
        """Whether the fault lands mid-stream: a send is under way, or some
        input was acknowledged (and is queued or being processed) while more
        is still to come."""
        return self.busy or 0 < self.acked < len(self.values)

    def resumed_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the acknowledgement of the first chunk
        sent after it, if any."""
        later = [acked for began, acked in self.acks if began >= moment]
        return min(later) - moment if later else None


async def _dead_events(client: Client, since_wall: float) -> list[tuple[str, float]]:
    """(member, time) of every death the scheduler recorded since the run
    began (a scheduler that restarted remembers only its own); an unreachable
    scheduler is asked again for a while, then is an error, never "none"."""
    status = await retry("asking the scheduler for member events", client.status,
                         (Unavailable, DeadlineExceeded), deadline_s=30.0)
    return [(e.node_id, e.at) for e in status.events
            if e.at >= since_wall and e.new_state == DEAD]


async def run_history(
    steps: list[Step],
    run_dir: Path,
    records: int = 60_000,
    keys: int = 200,
    stream_s: float = 20.0,
    chunk: int = 1_000,
    workers: int = 3,
    config: Config | None = None,
    extra_env: dict[str, str] | None = None,
    seed: int = 0,
    drain_timeout_s: float = 180.0,
    tracking_timeout_s: float = 0.0,
    isolate: bool = False,
    state_keys: int = 0,
    graph: bool = False, prepartitioned: bool = False,
) -> HistoryRun:
    """Runs the history job on a fresh supervised local cluster through the
    scenario; returns the faults and the checker's verdict.

    With ``state_keys``, that many other keys (one record each) are sent and
    drained before the stream starts, so every fault lands on tasks holding
    that much keyed state: their restores read it back, and the checker
    judges those keys too.

    With ``graph``, the job is :mod:`gridstream.examples.history_graph` (a
    fan-out to three branches, a union, three sinks): its fold is judged as
    the history job's, and its other branches per key against the
    fault-free reference (``HistoryRun.branches``); ``prepartitioned``: one task."""
    rng = random.Random(seed)
    send_keys, values = history.generate(records, keys, seed)
    sent = history.sent_counts(values)
    send_keys_set = set(sent)
    run = HistoryRun(records=len(values), state_keys=state_keys)
    cluster = LocalCluster(run_dir, config, workers=workers, state_servers=2, supervise=True,
                           restart_delay_s=1.0, extra_env=extra_env)
    proxy: FaultProxy | None = None
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(cluster)
        if isolate:
            proxy = await isolatable(cluster, "worker-1")
            stack.push_async_callback(proxy.close)
        client = await stack.enter_async_context(
            Client(cluster.scheduler_address, batch_size=250, security=cluster.config.security))
        spec = history_graph.job() if graph else history.job(prepartitioned=prepartitioned)
        if tracking_timeout_s:
            spec = replace(spec, tracking_timeout_s=tracking_timeout_s)
        job_id = await client.submit(spec)
        if state_keys:
            sent.update(await _load_state(client, job_id, state_keys, drain_timeout_s))
        sender = Sender(client, job_id, send_keys, values, stream_s, chunk)
        started = time.monotonic()
        wall_started = time.time()
        sending = asyncio.create_task(sender.run(), name="history sender")
        watchers: list[asyncio.Task[list[float | None]]] = []
        try:
            for step in sorted(steps, key=lambda s: s.at_s):
                delay = started + step.at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                fault = await inject(cluster, step, rng, sender, proxy, run.faults,
                                      any(s.again for s in steps))
                run.faults.append(fault)
                watchers.append(asyncio.create_task(detections_of(client, fault)))
            await sending
            detections = await asyncio.gather(*watchers)
        finally:
            for task in [sending, *watchers]:
                if not task.done():
                    task.cancel()
        try:
            progress = await client.drain(job_id, timeout_s=drain_timeout_s)
            run.losses = list(progress.losses)
            run.tasks = len({t.task for t in progress.tasks})
        except DataLoss as exc:  # named, not silent: the caller decides
            run.losses = [str(exc)]
        except DeadlineExceeded as exc:  # named too: what holds it, and the losses so far
            run.undrained = str(exc)
            run.losses = list((await client.progress(job_id)).losses)
        run.seconds = time.monotonic() - started
        actual = await client.results(job_id, sink="folds" if graph else None)
        if graph:
            raw = await client.results(job_id, sink="raw")
            loaded = [[name, 1] for name in sent if name not in send_keys_set]
            run.branches = check_graph_branches(
                await client.results(job_id, sink="tallies"), list(raw.values()),
                loaded + values)
        events = await _dead_events(client, wall_started)
    # Every member a fault hit may be declared dead (a killed state server that
    # restarts before the detector convicts it is recorded dead as restarted).
    victims = {v for f in run.faults for v in f.victims}
    run.wrongly_convicted = sorted({n for n, _ in events if n not in victims})
    for fault, found in zip(run.faults, detections, strict=True):
        times = [t for t in found if t is not None]
        fault.detected_s = max(times) if times and len(times) == len(found) else None
        fault.resumed_s = sender.resumed_after(fault.mono_at)
    run.verdict = check_history(actual, sent)
    return run


async def _load_state(client: Client, job_id: str, count: int,
                      timeout_s: float) -> dict[str, int]:
    """Sends one record for each of ``count`` keys of their own and waits until
    they are processed; returns the records sent per key."""
    names = [f"s{i:08d}" for i in range(count)]
    step = 50_000
    for start in range(0, count, step):
        part = names[start:start + step]
        await client.send(job_id, [[name, 1] for name in part], part)
    await client.drain(job_id, timeout_s=timeout_s)
    return dict.fromkeys(names, 1)


class _FaultedRun(Protocol):
    """What :func:`_send_under_faults` fills in of a scenario's run."""

    faults: list[FaultRecord]
    losses: list[str]
    undrained: str


def _report(run: _FaultedRun, verdict: str, problems: list[str]) -> str:
    """A scenario's table: its faults, its verdict, what was wrong, the named
    losses and a drain that missed its bound."""
    lines = [f"{f.kind} {','.join(f.victims)} in flight={f.in_flight}" for f in run.faults]
    lines.append(verdict)
    lines += [f"wrong: {problem}" for problem in problems]
    lines += [f"named losses: {'; '.join(run.losses)}"] if run.losses else []
    lines += [f"NOT DRAINED: {run.undrained}"] if run.undrained else []
    return "\n".join(lines)


async def _supervised(stack: contextlib.AsyncExitStack, run_dir: Path,
                      config: Config | None) -> tuple[LocalCluster, Client]:
    """A supervised cluster (3 workers, 2 state servers) and its client, closed with ``stack``."""
    cluster = await stack.enter_async_context(LocalCluster(
        run_dir, config, workers=3, state_servers=2, supervise=True, restart_delay_s=1.0))
    client = await stack.enter_async_context(
        Client(cluster.scheduler_address, batch_size=250, security=cluster.config.security))
    return cluster, client


async def _send_under_faults(cluster: LocalCluster, client: Client, job_id: str,
                             sender: Sender, steps: list[Step], rng: random.Random,
                             run: _FaultedRun, drain_timeout_s: float) -> None:
    """Sends while the steps' faults land (each at its time from the start),
    then drains: the faults go in ``run.faults``, losses the cluster named in
    ``run.losses``, a drain that missed its bound in ``run.undrained``."""
    started = time.monotonic()
    sending = asyncio.create_task(sender.run(), name=f"sender of {job_id}")
    try:
        for step in sorted(steps, key=lambda s: s.at_s):
            delay = started + step.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            run.faults.append(await inject(cluster, step, rng, sender, None, run.faults,
                                            any(s.again for s in steps)))
        await sending
    finally:
        if not sending.done():
            sending.cancel()
    try:
        run.losses = list((await client.drain(job_id, timeout_s=drain_timeout_s)).losses)
    except DataLoss as exc:
        run.losses = [str(exc)]
    except DeadlineExceeded as exc:
        run.undrained = str(exc)


@dataclass
class ClicksRun:
    """The outcome of :func:`run_clicks`: the faults, the per-user verdict of
    the history checker, and what the other sinks and the files got wrong."""

    faults: list[FaultRecord] = field(default_factory=list)
    verdict: HistoryVerdict = field(default_factory=HistoryVerdict)
    problems: list[str] = field(default_factory=list)
    """Pages that differ from the reference, and the files' verdict."""
    losses: list[str] = field(default_factory=list)
    undrained: str = ""
    files: int = 0
    """Committed files of the files sink."""

    def table(self) -> str:
        """The faults, then the verdicts."""
        return _report(self, f"{self.verdict.summary()}; {self.files} committed files",
                       self.problems)


async def run_clicks(steps: list[Step], run_dir: Path, records: int = 30_000,
                     stream_s: float = 15.0, chunk: int = 1_000, config: Config | None = None,
                     seed: int = 0, drain_timeout_s: float = 180.0,
                     tracking_timeout_s: float = 0.0, fmt: str = "jsonl") -> ClicksRun:
    """The clicks job (:mod:`gridstream.examples.clicks`) on a fresh
    supervised local cluster through the scenario: the per-user fold is
    judged by the history checker, the per-page aggregates key by key
    against the fault-free reference, and the files sink's committed files
    must hold every click exactly once."""
    from gridstream import filesink
    from gridstream.examples import clicks

    rng = random.Random(seed)
    keys, lines = clicks.generate(records, seed=seed)
    expected = clicks.reference(lines)
    files = run_dir / "files"
    run = ClicksRun()
    async with contextlib.AsyncExitStack() as stack:
        cluster, client = await _supervised(stack, run_dir, config)
        spec = clicks.flow(files, fmt).job()
        if tracking_timeout_s:
            spec = replace(spec, tracking_timeout_s=tracking_timeout_s)
        job_id = await client.submit(spec)
        sender = Sender(client, job_id, keys, lines, stream_s, chunk)
        await _send_under_faults(cluster, client, job_id, sender, steps, rng, run,
                                 drain_timeout_s)
        run.verdict = check_history(await client.results(job_id, sink="users"),
                                    clicks.sent_counts(keys))
        pages = await client.results(job_id, sink="pages")
    wrong = {p for p, want in expected["pages"].items() if pages.get(p) != want}
    if wrong or set(pages) - set(expected["pages"]):
        run.problems.append(f"pages: {len(wrong)} of {len(expected['pages'])} differ")
    found = await asyncio.to_thread(filesink.read_records, files, job_id, "clicks")
    run.files = len(await asyncio.to_thread(filesink.committed_files, files, job_id, "clicks"))
    problem = clicks.check_files(found, lines)
    if problem:
        run.problems.append(problem)
    return run


@dataclass
class TripsRun:
    """The outcome of :func:`run_trips`: the faults, and how the fired
    windows differ from the in-process reference."""

    faults: list[FaultRecord] = field(default_factory=list)
    windows: int = 0
    """Windows fired (rows of the append sink of fired windows)."""
    problems: list[str] = field(default_factory=list)
    """Windows that fired twice, differ or are missing; late trips."""
    changes: HistoryVerdict = field(default_factory=HistoryVerdict)  # the windowed join's
    losses: list[str] = field(default_factory=list)
    undrained: str = ""

    def table(self) -> str:
        """The faults, then the verdict."""
        return _report(self, f"{self.windows} windows fired; windowed join: "
                       f"{self.changes.summary()}; {len(self.problems)} problems",
                       self.problems)


async def run_trips(steps: list[Step], run_dir: Path, records: int = 20_000,
                    stream_s: float = 12.0, chunk: int = 500, config: Config | None = None,
                    seed: int = 0, drain_timeout_s: float = 180.0,
                    partitions: int = 8) -> TripsRun:
    """The trips job (:mod:`gridstream.examples.trips`) on a fresh supervised
    local cluster through the scenario: every window fired once with the
    reference's value, every trip joined once with its driver as of its time,
    each device's changes (a windowed join) and its trips in event-time order
    (timers) as the reference's, in order (history checker), no trip late."""
    from gridstream.examples import trips, trips_timers

    rng = random.Random(seed)
    keys, values = trips.generate(records, seed=seed)
    closing_keys, closing = trips.closing(partitions)
    expected = trips.reference(values)
    run = TripsRun()
    async with contextlib.AsyncExitStack() as stack:
        cluster, client = await _supervised(stack, run_dir, config)
        job_id = await client.submit(trips.flow(partitions).job())
        sender = Sender(client, job_id, keys + closing_keys, values + closing, stream_s, chunk)
        await _send_under_faults(cluster, client, job_id, sender, steps, rng, run,
                                 drain_timeout_s)
        rows = list((await client.results(job_id, sink="summaries")).values())
        joined = trips.driven(list((await client.results(job_id, sink="driven")).values()))
        late = {**await client.results(job_id, sink="late"),
                **await client.results(job_id, sink="late_driven")}
        run.changes = trips.check_changes(await client.results(job_id, sink="changes"), values)
        run.problems += trips_timers.problems(await client.results(job_id, sink="ordered"), values)
    run.windows = len(rows)
    if joined != trips.reference_driven(values):
        run.problems.append(f"{len(joined)} joined trips, not the reference's "
                            f"{len(trips.reference_driven(values))} with their drivers")
    run.problems += [] if run.changes.ok else [f"windowed join {run.changes.summary()}"]
    try:
        fired = trips.summaries(rows)
    except AssertionError as exc:
        run.problems, fired = [*run.problems, str(exc)], {}
    wrong = [w for w, want in expected.items() if w in fired and fired[w] != want]
    missing, extra = ([w for w in expected if w not in fired],
                      [w for w in fired if w not in expected])
    run.problems += [f"{len(found)} windows {label}, e.g. {sorted(found)[:3]}" for label, found
                     in (("differ", wrong), ("missing", missing), ("not sent", extra)) if found]
    return replace(run, problems=run.problems + ([f"{len(late)} trips late"] if late else []))
