"""Replicated state servers: snapshot write rate and latency with R=1 and R=2,
and how long a replica takes to catch up after missing writes.

Writes: a local cluster of 3 state servers (and one worker, so a job can be
registered) takes window snapshots of ``--payload`` bytes from ``--writers``
concurrent writers in this process, each writing to its own operators through
the same quorum client the workers use, for ``--seconds``. Every round starts
R=1 and R=2 in turn; the table shows medians over ``--runs`` rounds and the
R=2/R=1 ratio measured within each round.

Catch-up: with R=2, one replica is killed with SIGKILL and kept down while
writers go on for ``--missed`` seconds (snapshots and result rows); then it
is started again. Catch-up time runs from its process being ready to its
holdings (newest window and result version of every operator it is a
replica of) equalling the newest on its peers.

Prints tables and writes ``stateserver.txt`` and ``stateserver.png`` to
``--out`` (default ``~/.cache/gridstream-bench/out``, outside the repository).

    .venv/bin/python bench/stateserver.py [--missed 60] [--runs 3]
    .venv/bin/python bench/stateserver.py --runs 1 --seconds 1 --missed 2   # a quick check

The bench writes as the operators' owner would: at the routing epoch, and
past the fence the job's worker set when it claimed its partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plots import add_out_argument, bars, out_dir, pyplot
from gridstream import rpc
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config, StateServerConfig
from gridstream.errors import StaleEpoch, Unavailable
from gridstream.examples import wordcount
from gridstream.ids import operator_id
from gridstream.local import LocalCluster
from gridstream.replicas import ReplicaClient
from gridstream.v1 import stateserver_pb2, stateserver_pb2_grpc

PARTITIONS = 16


@dataclass
class OwnerEpoch:
    """The epoch the bench writes at, as an operator's owner would.

    The job's worker claims every operator when it takes its partitions,
    which raises each operator's fence to that routing epoch; a write below
    it is refused (StaleEpoch). The bench starts at the routing table's
    epoch and, when refused, moves past the fence it was shown, as a new
    owner would, instead of failing.
    """

    epoch: int = 1
    fenced: int = 0
    """Writes refused and retried at a newer epoch."""

    def past(self, refusal: StaleEpoch) -> None:
        """Writes from now on at an epoch no older than the refusal's fence."""
        self.fenced += 1
        self.epoch = max(self.epoch + 1, refusal.epoch)


@dataclass
class WriteFigures:
    """One measurement of the write path."""

    writes: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.writes / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def config_for(replicas: int) -> Config:
    return replace(Config(), cluster=ClusterConfig(partitions=PARTITIONS, replica_count=replicas),
                   stateserver=StateServerConfig(sync_interval_s=0.5))


@contextlib.asynccontextmanager
async def cluster_with_job(run_dir: Path, replicas: int
                           ) -> AsyncIterator[tuple[LocalCluster, ReplicaClient, str]]:
    cluster = LocalCluster(run_dir, config_for(replicas), workers=1, state_servers=3,
                           supervise=True, restart_delay_s=0.2)
    async with cluster, Client(cluster.scheduler_address) as client:
        job_id = await client.submit(wordcount.job())  # gets no input: the bench writes
        async with cluster.state_client() as writer:
            yield cluster, writer, job_id


async def write_load(writer: ReplicaClient, job_id: str, seconds: float, writers: int,
                     payload_bytes: int, rows: int = 0) -> WriteFigures:
    """``writers`` loops, each over its own operators, for ``seconds``."""
    ops = [operator_id(job_id, t, p) for t in range(2) for p in range(PARTITIONS)]
    figures = WriteFigures()
    owner = OwnerEpoch(max(1, writer.routing.epoch))
    payload = bytes(payload_bytes)
    deadline = time.monotonic() + seconds

    async def loop(index: int) -> None:
        mine = ops[index::writers]
        window = 0
        while time.monotonic() < deadline:
            window += 1
            for op in mine:
                started = time.monotonic()
                try:
                    await writer.put_snapshot(job_id, op, window, owner.epoch, payload)
                    if rows:
                        await writer.write_results(
                            job_id, op, [[f"{op}:{window}:{i}", "1"] for i in range(rows)], [],
                            epoch=owner.epoch, version=window)
                except StaleEpoch as refusal:
                    owner.past(refusal)
                    continue
                except Unavailable:
                    await asyncio.sleep(0.05)
                    continue
                figures.latencies.append(time.monotonic() - started)
                figures.writes += 1

    started = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(writers)))
    figures.seconds = time.monotonic() - started
    return figures


async def holdings(cluster: LocalCluster, name: str, job_id: str
                   ) -> dict[str, tuple[int, int]]:
    async with rpc.open_channel(cluster.members[name].address) as channel:
        response = await stateserver_pb2_grpc.StateServerStub(channel).Digest(
            stateserver_pb2.DigestRequest(job_id=job_id), timeout=10)
    return {d.operator_id: (d.latest_window, d.results_version) for d in response.operators}


async def catch_up(run_dir: Path, missed_s: float, writers: int, payload: int) -> dict[str, float]:
    async with cluster_with_job(run_dir, 2) as (cluster, writer, job_id):
        await write_load(writer, job_id, 2.0, writers, payload, rows=20)
        cluster.hold("state-3")
        cluster.kill("state-3", signal.SIGKILL)
        missed = await write_load(writer, job_id, missed_s, writers, payload, rows=20)
        cluster.release("state-3")
        for _ in range(3000):  # the supervisor restarts it within a second or so
            if any(entry[0] == "state-3" for entry in cluster.restart_log):
                break
            await asyncio.sleep(0.02)
        ready = cluster.restart_log[-1][2]
        await writer.routing.refresh(at_least=writer.routing.epoch + 1)
        while "state-3" not in writer.routing.replica_set.writable:
            await asyncio.sleep(0.05)
            await writer.routing.refresh()
        share = [op for op in (operator_id(job_id, t, p) for t in range(2)
                               for p in range(PARTITIONS))
                 if "state-3" in writer.routing.replica_set.placement(op)]
        while True:
            peers = [await holdings(cluster, n, job_id) for n in ("state-1", "state-2")]
            mine = await holdings(cluster, "state-3", job_id)
            newest = {op: max(p.get(op, (0, 0)) for p in peers) for op in share}
            if all(mine.get(op, (0, 0)) >= newest[op] for op in share):
                break
            await asyncio.sleep(0.02)
        return {"missed_s": missed.seconds, "missed_writes": float(missed.writes),
                "operators": float(len(share)), "catch_up_s": time.monotonic() - ready}


async def rounds(args: argparse.Namespace) -> tuple[dict[int, list[WriteFigures]],
                                                    dict[str, float]]:
    results: dict[int, list[WriteFigures]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="gridstream-bench-") as tmp:
        for run in range(args.runs):
            for replicas in (1, 2):
                async with cluster_with_job(Path(tmp) / f"w{run}-{replicas}", replicas) as (
                        _cluster, writer, job_id):
                    figures = await write_load(writer, job_id, args.seconds, args.writers,
                                               args.payload)
                results[replicas].append(figures)
                print(f"  round {run + 1} R={replicas}: {figures.rate:,.0f} writes/s, "
                      f"p99 {figures.percentile(0.99):.1f} ms", flush=True)
        print(f"catch-up after {args.missed:.0f} s of missed writes...", flush=True)
        caught = await catch_up(Path(tmp) / "catch-up", args.missed, args.writers, args.payload)
    return results, caught


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="write load per round")
    parser.add_argument("--writers", type=int, default=8, help="concurrent writers")
    parser.add_argument("--payload", type=int, default=4096, help="snapshot bytes")
    parser.add_argument("--missed", type=float, default=60.0,
                        help="seconds of writes the killed replica misses")
    add_out_argument(parser)
    args = parser.parse_args()
    results, caught = asyncio.run(rounds(args))
    rows = [f"{'R':>3}{'writes/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'min/s':>10}{'max/s':>10}"]
    for replicas, runs in results.items():
        rates = [f.rate for f in runs]
        rows.append(f"{replicas:>3}{statistics.median(rates):>12,.0f}"
                    f"{statistics.median(f.percentile(0.5) for f in runs):>9.1f}"
                    f"{statistics.median(f.percentile(0.99) for f in runs):>9.1f}"
                    f"{min(rates):>10,.0f}{max(rates):>10,.0f}")
    ratios = [b.rate / a.rate for a, b in zip(results[1], results[2], strict=True)]
    rows.append(f"R=2/R=1 write-rate ratio (median of per-round ratios): "
                f"{statistics.median(ratios):.2f}")
    rows.append("")
    rows.append(f"catch-up: replica down {caught['missed_s']:.1f} s while "
                f"{caught['missed_writes']:,.0f} snapshot writes (+20 result rows each) went "
                f"on; it is a replica of {caught['operators']:.0f} operators; caught up "
                f"{caught['catch_up_s']:.2f} s after it was ready again")
    table = "\n".join(rows)
    print("\n" + table)
    out = out_dir(args.out)
    (out / "stateserver.txt").write_text(
        f"{args.writers} writers, {args.payload}-byte snapshots, {args.seconds:.0f} s per "
        f"round, {args.runs} rounds, 3 state servers on 2 cores\n" + table + "\n")
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    labels = ["R=1", "R=2"]
    bars(axes[0], labels, [statistics.median(f.rate for f in results[r]) for r in (1, 2)],
         ["C0", "C1"])
    axes[0].set_ylabel("snapshot writes/s")
    bars(axes[1], labels, [statistics.median(f.percentile(0.99) for f in results[r])
                           for r in (1, 2)], ["C0", "C1"], fmt=lambda v: f"{v:.1f} ms")
    axes[1].set_ylabel("p99 write latency (ms)")
    bars(axes[2], [f"missed {caught['missed_s']:.0f} s"], [caught["catch_up_s"]], ["C2"],
         fmt=lambda v: f"{v:.2f} s")
    axes[2].set_ylabel("catch-up time (s)")
    fig.suptitle("Replicated state servers (3 servers, 2 cores, median of rounds)")
    fig.tight_layout()
    fig.savefig(out / "stateserver.png", dpi=100)
    plt.close(fig)
    print(f"plot: {out / 'stateserver.png'}")


if __name__ == "__main__":
    main()
