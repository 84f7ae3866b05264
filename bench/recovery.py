"""Failure detection and recovery, over many kills.

Streams wordcount through a supervised local cluster while ``--kills`` workers
are killed with SIGKILL one after another (each after the cluster healed from
the previous one). For every kill it records:

- detection: SIGKILL to the scheduler declaring the worker dead (phi accrual);
- resume: SIGKILL to the first acknowledged batch on every partition the
  victim owned (its records flowing again, on the new owners);
- healthy: SIGKILL to every worker alive again (restarted by the supervisor
  after 2 s) and every JobContainer fully replicated at the current epoch.

Then drains the job and checks the results against the fault-free reference.
Prints medians and maxima and writes ``bench/out/recovery.txt`` and ``.png``.

    .venv/bin/python bench/recovery.py [--kills 10]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridstream.chaos import detection_time, wait_healthy
from gridstream.client import Client
from gridstream.config import Config
from gridstream.demo import compare
from gridstream.examples import wordcount
from gridstream.ids import partition_for_key
from gridstream.local import LocalCluster

OUT = Path(__file__).resolve().parent / "out"


def probe_keys(partitions: int) -> dict[int, str]:
    """One key per partition, for probes that land on a chosen partition."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        key = f"probe{i}"
        keys.setdefault(partition_for_key(key, partitions), key)
        i += 1
    return keys


async def resume_time(client: Client, job_id: str, partitions: list[int], keys: dict[int, str],
                      killed: float) -> float:
    """Seconds from the kill until a probe on every given partition is acknowledged."""
    async def one(p: int) -> float:
        await client.send(job_id, [f"{keys[p]} probe"], keys=[keys[p]])
        return time.monotonic() - killed
    return max(await asyncio.gather(*(one(p) for p in partitions)))


async def run(kills: int, seed: int) -> tuple[list[dict[str, float]], bool]:
    rng = random.Random(seed)
    rows: list[dict[str, float]] = []
    lines = wordcount.generate(120_000 * max(1, kills // 3), seed=seed)
    probes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gridstream-recovery-") as run_dir:
        cluster = LocalCluster(run_dir, Config(), workers=3, state_servers=2, supervise=True,
                               restart_delay_s=2.0)
        async with cluster, Client(cluster.scheduler_address, batch_size=1_000) as client:
            job_id = await client.submit(wordcount.job())
            routing = await client._routing(job_id)
            keys = probe_keys(routing.partitions)
            stop = asyncio.Event()
            sent = 0

            async def feed() -> None:
                nonlocal sent
                for start in range(0, len(lines), 1_000):
                    await client.send(job_id, lines[start:start + 1_000])
                    sent = min(len(lines), start + 1_000)
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.02)

            sender = asyncio.create_task(feed())
            for i in range(kills):
                await asyncio.sleep(0.5)
                victim = rng.choice(["worker-1", "worker-2", "worker-3"])
                routing = await client._routing(job_id, refresh=True)
                owned = [p for p, o in enumerate(routing.owners) if o == victim]
                wall, killed = time.time(), time.monotonic()
                cluster.kill(victim, signal.SIGKILL)
                resume_task = asyncio.create_task(
                    resume_time(client, job_id, owned, keys, killed))
                detected = await detection_time(client, victim, wall)
                resumed = await resume_task
                probes.extend(f"{keys[p]} probe" for p in owned)
                await wait_healthy(client, job_id, 3, timeout_s=60)
                healthy = time.monotonic() - killed
                rows.append({"detected": detected or float("nan"), "resumed": resumed,
                             "healthy": healthy})
                print(f"  kill {i + 1:>2} {victim}: detected {detected:.2f}s, resumed "
                      f"{resumed:.2f}s, healthy {healthy:.2f}s", flush=True)
            stop.set()
            await sender
            await client.drain(job_id, timeout_s=120)
            actual = await client.results(job_id)
    expected = wordcount.reference(lines[:sent] + probes)
    return rows, compare(actual, expected) == (0, 0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rows, matched = asyncio.run(run(args.kills, args.seed))
    lines = [f"{'measure':<12}{'median (s)':>12}{'max (s)':>10}{'kills':>7}"]
    for measure in ("detected", "resumed", "healthy"):
        values = [r[measure] for r in rows if r[measure] == r[measure]]
        lines.append(f"{measure:<12}{statistics.median(values):>12.2f}{max(values):>10.2f}"
                     f"{len(values):>7}")
    lines.append(f"results after {len(rows)} kills: "
                 f"{'match the fault-free reference' if matched else 'DIFFER'}")
    table = "\n".join(lines)
    print("\n" + table)
    OUT.mkdir(exist_ok=True)
    (OUT / "recovery.txt").write_text(table + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    xs = list(range(1, len(rows) + 1))
    for measure in ("detected", "resumed", "healthy"):
        ax.plot(xs, [r[measure] for r in rows], marker="o", label=measure)
    ax.set_xlabel("kill")
    ax.set_ylabel("seconds after SIGKILL")
    ax.set_title("Detection, resumption and full recovery per kill")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "recovery.png", dpi=100)
    print(f"plot: {OUT / 'recovery.png'}")


if __name__ == "__main__":
    main()
