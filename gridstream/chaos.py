"""Chaos runs: a local cluster, a job streaming through it, and faults injected
into random workers — SIGKILL, or SIGSTOP followed by SIGCONT — at a set
interval. Each fault is reported with its detection time (fault to the
scheduler declaring the worker dead) and the time until the cluster is healthy
again (every worker alive and every JobContainer fully replicated at the
current epoch); at the end the job's results are compared with a fault-free
reference computed in-process, record for record.

Only processes this run started are signalled, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gridstream.client import Client
from gridstream.config import Config, load_config
from gridstream.demo import compare, workload
from gridstream.errors import DeadlineExceeded, Unavailable
from gridstream.jobspec import JobSpec
from gridstream.local import LocalCluster
from gridstream.v1 import scheduler_pb2

DEAD = scheduler_pb2.MEMBER_STATE_DEAD
WORKER = scheduler_pb2.MEMBER_ROLE_WORKER


@dataclass
class Fault:
    """One injected fault and what it cost."""

    kind: str
    victim: str
    wall_at: float
    detected_s: float | None = None
    healthy_s: float | None = None


@dataclass
class ChaosReport:
    """The faults of a run and whether the results survived them."""

    workload: str
    records: int
    faults: list[Fault] = field(default_factory=list)
    missing: int = 0
    unexpected: int = 0
    different: int = 0
    seconds: float = 0.0
    actual: dict[str, Any] = field(default_factory=dict, repr=False)
    expected: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def match(self) -> bool:
        """True when the results equal the fault-free reference."""
        return self.missing == self.unexpected == self.different == 0

    def table(self) -> str:
        """The faults as a table, with medians and maxima."""
        lines = [f"{'#':>3} {'fault':<6} {'worker':<10} {'detected (s)':>13} {'healthy (s)':>12}"]
        for i, f in enumerate(self.faults, 1):
            detected = "-" if f.detected_s is None else f"{f.detected_s:.2f}"
            healthy = "-" if f.healthy_s is None else f"{f.healthy_s:.2f}"
            lines.append(f"{i:>3} {f.kind:<6} {f.victim:<10} {detected:>13} {healthy:>12}")
        for label, values in (
            ("detection", [f.detected_s for f in self.faults if f.detected_s is not None]),
            ("healthy", [f.healthy_s for f in self.faults if f.healthy_s is not None]),
        ):
            if values:
                lines.append(f"{label}: median {statistics.median(values):.2f} s, "
                             f"max {max(values):.2f} s over {len(values)} faults")
        verdict = "results match the fault-free reference" if self.match else (
            f"results DIFFER: {self.missing} keys missing, {self.unexpected} unexpected, "
            f"{self.different} with different values")
        lines.append(f"{self.workload}: {self.records:,} input records in {self.seconds:.1f} s; "
                     f"{verdict}")
        return "\n".join(lines)


async def wait_healthy(client: Client, job_id: str, workers: int,
                       timeout_s: float = 60.0) -> float:
    """Waits until every worker is alive and every task of the job reports its
    container fully replicated at the current epoch; returns the seconds waited."""
    started = time.monotonic()
    while True:
        try:
            healthy = await _healthy(client, job_id, workers)
        except (Unavailable, DeadlineExceeded):  # the scheduler itself may be restarting
            healthy = False
        if healthy:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"cluster not healthy after {timeout_s:.0f}s")
        await asyncio.sleep(0.05)


async def _healthy(client: Client, job_id: str, workers: int) -> bool:
    status = await client.status()
    alive = [m for m in status.members
             if m.member.role == WORKER and m.member.state == scheduler_pb2.MEMBER_STATE_ALIVE]
    if len(alive) == workers:
        progress = await client.progress(job_id)
        info = await client.job(job_id)
        expected = info.spec.partitions * len({t.task for t in progress.tasks} or {0})
        keys = {(t.task, t.partition) for t in progress.tasks}
        return (len(progress.tasks) == len(keys) == expected
                and all(t.replicated_epoch >= status.epoch for t in progress.tasks))
    return False


async def detection_time(client: Client, victim: str, since_wall: float,
                         timeout_s: float = 10.0) -> float | None:
    """Seconds from a fault to the scheduler declaring the victim dead, or None
    if it came back (a new incarnation) before being declared."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = await client.status()
        except (Unavailable, DeadlineExceeded):
            await asyncio.sleep(0.05)
            continue
        for event in status.events:
            if event.node_id == victim and event.at >= since_wall and event.new_state == DEAD:
                return event.at - since_wall
        await asyncio.sleep(0.02)
    return None


class ChaosMonkey:
    """Injects faults into a supervised local cluster while a job runs."""

    def __init__(self, cluster: LocalCluster, client: Client, job_id: str, *,
                 interval_s: float, kinds: list[str], pause_s: float, seed: int) -> None:
        self.cluster = cluster
        self.client = client
        self.job_id = job_id
        self.interval_s = interval_s
        self.kinds = kinds
        self.pause_s = pause_s
        self.rng = random.Random(seed)
        self.faults: list[Fault] = []

    def workers(self) -> list[str]:
        """Names of the cluster's workers."""
        return sorted(n for n, m in self.cluster.members.items() if m.role == "worker")

    async def inject(self, kind: str, victim: str) -> Fault:
        """One fault, then waits for detection and for the cluster to heal."""
        fault = Fault(kind, victim, time.time())
        started = time.monotonic()
        if kind == "kill":
            self.cluster.kill(victim, signal.SIGKILL)
            fault.detected_s = await detection_time(self.client, victim, fault.wall_at)
        elif kind == "pause":
            self.cluster.kill(victim, signal.SIGSTOP)
            fault.detected_s = await detection_time(self.client, victim, fault.wall_at,
                                                    timeout_s=self.pause_s)
            remaining = self.pause_s - (time.monotonic() - started)
            if remaining > 0:
                await asyncio.sleep(remaining)
            self.cluster.kill(victim, signal.SIGCONT)
        else:
            raise ValueError(f"unknown fault kind {kind!r}; use kill or pause")
        await wait_healthy(self.client, self.job_id, len(self.workers()))
        fault.healthy_s = time.monotonic() - started
        self.faults.append(fault)
        return fault

    async def run(self, faults: int, duration_s: float | None = None,
                  first_after: Path | None = None) -> list[Fault]:
        """Injects up to ``faults`` faults (for at most ``duration_s`` seconds if
        given), ``interval_s`` apart, each after the previous one has healed: a
        single failure at a time. With ``first_after``, the first fault waits
        until that file exists (a crash point has fired) and the cluster healed."""
        if first_after is not None:
            while True:  # the file is written by another process: poll it
                if await asyncio.to_thread(first_after.exists):
                    break
                await asyncio.sleep(0.05)
            await wait_healthy(self.client, self.job_id, len(self.workers()))
        started = time.monotonic()
        for _ in range(faults):
            if duration_s is not None and time.monotonic() - started >= duration_s:
                break
            await asyncio.sleep(self.interval_s)
            fault = await self.inject(self.rng.choice(self.kinds), self.rng.choice(self.workers()))
            print(f"  {fault.kind} {fault.victim}: detected "
                  f"{'-' if fault.detected_s is None else f'{fault.detected_s:.2f}s'}, healthy "
                  f"after {fault.healthy_s:.2f}s", flush=True)
        return self.faults


async def stream(client: Client, job_id: str, keys: list[Any] | None, values: list[Any],
                 seconds: float, chunk: int = 5_000) -> None:
    """Sends the input in chunks spread over about ``seconds``."""
    chunks = max(1, (len(values) + chunk - 1) // chunk)
    pause = seconds / chunks
    for start in range(0, len(values), chunk):
        part_keys = None if keys is None else keys[start:start + chunk]
        await client.send(job_id, values[start:start + chunk], part_keys)
        await asyncio.sleep(pause)


async def run_chaos(
    name: str = "taxi",
    records: int = 200_000,
    faults: int = 3,
    interval_s: float = 1.0,
    kinds: tuple[str, ...] = ("kill",),
    pause_s: float = 3.0,
    workers: int = 3,
    seed: int = 0,
    stream_s: float = 8.0,
    run_dir: str | Path | None = None,
    config: Config | None = None,
    delivery: str = "exactly_once",
    extra_env: dict[str, str] | None = None,
    chunk: int = 5_000,
    duration_s: float | None = None,
    first_after: Path | None = None,
    job: JobSpec | None = None,
) -> ChaosReport:
    """A whole chaos run on a fresh local cluster; ``job`` runs instead of the
    workload's own (the same records and reference: taxi without its
    prepartitioned reduce, say, so a batch crosses a shuffle)."""
    spec, keys, values, expected, units, _ = workload(name, records)
    spec = replace(spec if job is None else job, delivery=delivery)
    directory = Path(run_dir or tempfile.mkdtemp(prefix=f"gridstream-chaos-{name}-"))
    cluster = LocalCluster(directory, config, workers=workers, state_servers=2,
                           supervise=True, restart_delay_s=2.0, extra_env=extra_env)
    report = ChaosReport(name, len(values))
    report.actual, report.expected = {}, expected
    async with cluster, Client(cluster.scheduler_address,
                               security=cluster.config.security) as client:
        job_id = await client.submit(spec)
        monkey = ChaosMonkey(cluster, client, job_id, interval_s=interval_s,
                             kinds=list(kinds), pause_s=pause_s, seed=seed)
        started = time.monotonic()
        sender = asyncio.create_task(stream(client, job_id, keys, values, stream_s, chunk))
        try:
            report.faults = await monkey.run(faults, duration_s, first_after)
            await sender
        finally:
            if not sender.done():
                sender.cancel()
        await client.drain(job_id, timeout_s=120)
        report.seconds = time.monotonic() - started
        actual = await client.results(job_id)
    report.actual = actual
    report.missing, report.unexpected, report.different = compare(actual, expected)
    del units
    return report


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``gridstream chaos`` and ``deploy/chaos.py``."""
    parser = argparse.ArgumentParser(
        prog="gridstream chaos",
        description="Start a local cluster, stream a workload through it while killing "
        "(SIGKILL) or pausing (SIGSTOP/SIGCONT) random workers, then report detection and "
        "recovery times and whether the results match a fault-free reference.")
    parser.add_argument("--workload", choices=["taxi", "wordcount", "history"], default="taxi",
                        help="history: the order-sensitive job judged per key by the history "
                        "checker (loss, duplication, reordering); faults do not wait for the "
                        "cluster to heal")
    parser.add_argument("--records", type=int, default=200_000,
                        help="input size (taxi records or wordcount words)")
    parser.add_argument("--faults", type=int, default=3,
                        help="faults to inject at most (default 3)")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="faults per second once the previous one healed (default 1): the "
                        "pause between healing and the next fault is 1/rate")
    parser.add_argument("--for", dest="for_s", type=_duration,
                        help="stop injecting after this long: 90, 90s, 10m (default: after "
                        "--faults)")
    parser.add_argument("--kinds", default="kill",
                        help="comma-separated fault kinds: kill, pause (default kill)")
    parser.add_argument("--pause", type=float, default=3.0,
                        help="seconds a paused worker stays stopped (default 3)")
    parser.add_argument("--duration", type=float, default=8.0,
                        help="seconds over which the input is streamed (default 8)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--delivery", default="exactly_once",
                        choices=["exactly_once", "at_least_once", "at_most_once"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", help="directory for logs and data (default: a temp dir)")
    parser.add_argument("--config", help="TOML config file")
    return parser


async def history_main(args: argparse.Namespace) -> int:
    """``--workload history``: a fault every 1/rate seconds for ``--for``
    seconds (or ``--faults`` faults), under continuous load, then the checker."""
    from gridstream.faultsteps import Step
    from gridstream.scenarios import run_history

    interval = 1.0 / max(args.rate, 1e-3)
    duration = args.for_s if args.for_s else interval * (args.faults + 1)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    steps = []
    at = interval
    rng = random.Random(args.seed)
    while at < duration:
        kind = rng.choice(kinds)
        steps.append(Step(kind, at, pause_s=args.pause if kind == "pause" else 0.0))
        at += interval
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="gridstream-chaos-history-"))
    stream_s = duration + interval
    records = max(args.records, int(stream_s * 2_000)) if args.for_s else args.records
    run = await run_history(steps, run_dir, records=records, stream_s=stream_s,
                            workers=args.workers, config=load_config(args.config),
                            seed=args.seed, drain_timeout_s=300.0)
    print(run.table())
    return 0 if run.verdict.ok and not run.losses and not run.undrained else 1


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m`` or ``1h``."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


async def main_async(args: argparse.Namespace) -> int:
    """Runs the chaos run the flags describe; 0 when results match."""
    if args.workload == "history":
        return await history_main(args)
    report = await run_chaos(
        args.workload, args.records, args.faults, 1.0 / max(args.rate, 1e-3),
        tuple(k.strip() for k in args.kinds.split(",") if k.strip()), args.pause,
        args.workers, args.seed, args.duration, args.run_dir, load_config(args.config),
        args.delivery, duration_s=args.for_s)
    print(report.table())
    return 0 if report.match else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``deploy/chaos.py``."""
    return asyncio.run(main_async(build_parser().parse_args(argv)))
