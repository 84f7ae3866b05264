"""Recovery as the keyed state grows: snapshot bytes per window, restore time,
kill -> processing, kill -> a post-kill batch acknowledged, heartbeat gaps.

For each state size (``--keys``, default 10k, 100k, 1M and 10M distinct keys) a
supervised local cluster (3 workers, 2 state servers, 12 partitions) runs a
keyed count (wordcount) that first receives every key once, then, once the
build's aftermath is over (see :func:`settle`), a steady load of updates to
random keys (each window touches at most ``window_size``
keys). Then one worker is killed with SIGKILL while the load goes on, and it
records:

- bytes/window: mean and max size of the stored window deltas of the
  counting task (the state servers keep the newest few; older ones are
  compacted into the base), next to the whole state of one partition, which
  is what every window carried before snapshots became incremental;
- restore: the longest per-task restore of a victim's counting partition
  (read base + deltas, apply; or adopt the warm standby and read what it
  lacks), from the new owners' logs, and the share that adopted a standby;
- processing: SIGKILL to every victim counting partition restored on its
  new owner (ready to process);
- acked: SIGKILL to a probe batch acknowledged on every victim partition;
- handback: the victim restarts 10 s after the kill and its partitions go
  back to it; the longest restore there (a whole read: a restarted worker
  holds no standby);
- heartbeat gap: the longest heartbeat age of a live worker seen by the
  scheduler during the run (0.25 s interval; the scheduler's own lag counts);
- false deaths: members the scheduler's detector declared dead that were not
  killed (from its log; 0 unless a busy member was convicted);
- settle: after the build, how long the cluster stays busy with its
  aftermath (the state servers folding the build's deltas, standbys reading
  what they lack); the steady phase starts once it is over;
- loop lag: the worst event-loop lag the workers measured themselves
  (their monitor logs each 2 s period's worst above 50 ms), over the whole
  run and from the kill on, and how much of it the loop thread spent
  computing (its CPU time): the part a step of ours holds the loop for, as
  against the machine not running the process.

The job's results are checked against the reference at the end. Prints a
table and writes ``recovery.txt`` and ``recovery.png`` to ``--out`` (a
temporary directory unless given; never inside the repository).

    .venv/bin/python bench/recovery.py [--keys 10000,100000,1000000,10000000] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import re
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import process_cpu_seconds
from gridstream.chaos import wait_healthy
from gridstream.client import Client
from gridstream.config import Config
from gridstream.examples import wordcount
from gridstream.ids import partition_for_key
from gridstream.local import LocalCluster
from services.stateserver.entryforms import newest_values

PARTITIONS = 12
RESTART_DELAY_S = 10.0
"""The victim comes back this long after the kill (a supervisor restarting
with a backoff): after the takeover, so the takeover and the handback to the
restarted worker are measured apart."""
WORDS_PER_LINE = 10
SETTLED_CORES = 0.5
"""The build's aftermath is over once the members together use less than
this many cores for ``SETTLED_FOR_S``."""
SETTLED_FOR_S = 2.0
SETTLE_LIMIT_S = 300.0
_LAG = re.compile(r"^(\S+ \S+) .*event loop lag: worst (\d+\.\d+) s in the last \S+ s, "
                  r"(\d+\.\d+) s of it computing")
_CONVICTED = re.compile(r"^(\S+ \S+) .*epoch \d+: (\S+) declared dead \(phi")
_STARTED = re.compile(r"^(\S+ \S+) .*?/t1/p(\d+) started: snapshot window (\S+),"
                      r".*?standby (none|window \d+ (?:adopted|not continued))"
                      r".*\((\d+\.\d+)s[:)]")


def probe_keys(partitions: int) -> dict[int, str]:
    """One key per partition, for probes that land on a chosen partition."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        key = f"probe{i}"
        keys.setdefault(partition_for_key(key, partitions), key)
        i += 1
    return keys


async def acked_time(client: Client, job_id: str, partitions: list[int], keys: dict[int, str],
                     killed: float) -> float:
    """Seconds from the kill until a probe on every given partition is acknowledged."""
    async def one(p: int) -> float:
        await client.send(job_id, [f"{keys[p]} probe"], keys=[keys[p]])
        return time.monotonic() - killed
    return max(await asyncio.gather(*(one(p) for p in partitions)))


async def settle(cluster: LocalCluster) -> float:
    """Waits until the build's aftermath is over and returns how long that took.

    A drain ends once every window is stored, but the state servers then
    still fold the build's deltas into their bases and every standby reads
    the state it lacks: minutes of work for both cores at 10M keys. The
    steady phase is measured after it (the cluster holding the state and
    closing windows under load), not during it: the members together must
    use less than ``SETTLED_CORES`` for ``SETTLED_FOR_S``. Gives up after
    ``SETTLE_LIMIT_S`` (the steady figures then include the aftermath)."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_LIMIT_S:
        # The members' pids anew each turn: a supervised member may have restarted.
        pids = [member.pid for member in cluster.members.values()]
        before = sum(process_cpu_seconds(pid) for pid in pids)
        await asyncio.sleep(SETTLED_FOR_S)
        used = sum(process_cpu_seconds(pid) for pid in pids) - before
        if used / SETTLED_FOR_S < SETTLED_CORES:
            break
    return time.monotonic() - started


def restored_after(log_dir: Path, partitions: list[int], since_wall: float,
                   workers: str = "worker-*") -> dict[int, tuple[float, float, bool]]:
    """partition -> (wall time, restore seconds, whether it adopted a standby)
    of the first restore of its counting task from a snapshot after
    ``since_wall``, from the logs of the ``workers`` (a file name pattern)."""
    found: dict[int, tuple[float, float, bool]] = {}
    for path in sorted(log_dir.glob(f"{workers}.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = _STARTED.match(line)
            if match is None or match[3] == "None":
                continue
            wall = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            partition = int(match[2])
            if wall >= since_wall and partition in partitions:
                if partition not in found or wall < found[partition][0]:
                    found[partition] = (wall, float(match[5]), match[4].endswith("adopted"))
    return found


def false_convictions(log_dir: Path, victim: str, killed_wall: float) -> int:
    """How many times the scheduler's detector declared a member dead that was
    not killed: any member but ``victim``, or ``victim`` before the kill."""
    count = 0
    for line in (log_dir / "scheduler.log").read_text(errors="replace").splitlines():
        match = _CONVICTED.match(line)
        if match is None:
            continue
        wall = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        count += match[2] != victim or wall < killed_wall
    return count


def loop_lags(log_dir: Path, since_wall: float = 0.0,
              until_wall: float = float("inf")) -> tuple[float, float]:
    """The worst event-loop lag any worker logged (its loop-lag monitor reports
    each 2 s period's worst) between ``since_wall`` and ``until_wall``, and the
    worst part of one that its loop thread spent computing (the rest is the
    loaded machine not running the process)."""
    worst = computing = 0.0
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = _LAG.match(line)
            if match is None:
                continue
            wall = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if since_wall <= wall <= until_wall:
                worst = max(worst, float(match[2]))
                computing = max(computing, float(match[3]))
    return worst, computing


def heads(db: Path, job_id: str) -> dict[str, int]:
    """The newest window of each counting partition."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return dict(conn.execute("SELECT operator_id, head_window FROM state_heads WHERE "
                                 "operator_id LIKE ?", (f"{job_id}/t1/%",)).fetchall())


def window_bytes(db: Path, job_id: str, after: dict[str, int]
                 ) -> tuple[float, int, float, int]:
    """(mean, max) bytes of the stored deltas of the counting task written
    after the ``after`` heads (the steady phase, not the build), and the whole
    state's bytes and keys per partition."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        sizes = [size for op, window, size in conn.execute(
            'SELECT operator_id, "window", size FROM state_deltas WHERE operator_id LIKE ?',
            (f"{job_id}/t1/%",)) if window > after.get(op, -1)]
        mean, top = (sum(sizes) / len(sizes), max(sizes)) if sizes else (0.0, 0)
        # The state as read back: the base and the deltas not yet folded (the
        # newest value of each key), one entry per key.
        state: dict[tuple[str, str, bytes], int] = {
            (op, stage, bytes(key)): nbytes for op, stage, key, nbytes in conn.execute(
                "SELECT operator_id, stage, key, length(key) + length(value) FROM "
                "state_entries WHERE operator_id LIKE ?", (f"{job_id}/t1/%",))}
        rows = conn.execute(
            'SELECT operator_id, "window", chunk, entries FROM state_delta_chunks WHERE '
            'operator_id LIKE ? ORDER BY operator_id, "window", chunk', (f"{job_id}/t1/%",))
        for op, chunks in itertools.groupby(rows, key=lambda row: row[0]):
            for (stage, key), value in newest_values(
                    ((c[1], c[2], bytes(c[3])) for c in chunks), op).items():
                state[(op, stage, key)] = len(key) + (len(value) if value is not None else 0)
        size, count = sum(state.values()), len(state)
        operators = conn.execute(
            "SELECT COUNT(*) FROM state_heads WHERE operator_id LIKE ?",
            (f"{job_id}/t1/%",)).fetchone()[0] or 1
    return float(mean or 0), int(top or 0), float(size or 0) / operators, int(count or 0)


async def heartbeat_gaps(client: Client, gaps: dict[str, float], skip: set[str],
                         stop: asyncio.Event) -> None:
    """Records the longest heartbeat age per live worker, as the scheduler sees it."""
    while not stop.is_set():
        try:
            status = await client.status()
            for member in status.members:
                name = member.member.node_id
                if name.startswith("worker") and name not in skip:
                    gaps[name] = max(gaps.get(name, 0.0), member.last_heartbeat_age_s)
        except Exception:  # the scheduler busy for a moment: the next poll tells
            pass
        await asyncio.sleep(0.05)


async def run_size(keys: int, seed: int, keep: Path | None = None) -> dict[str, float]:
    """One cluster, one state size, one kill."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(keys)]
    build = [" ".join(words[i:i + WORDS_PER_LINE]) for i in range(0, keys, WORDS_PER_LINE)]
    sent: list[str] = list(build)
    figures: dict[str, float] = {"keys": keys}
    with tempfile.TemporaryDirectory(prefix="gridstream-recovery-") as temp_dir:
        run_dir = str(keep / f"{keys}") if keep else temp_dir
        cluster = LocalCluster(run_dir, Config(), workers=3, state_servers=2, supervise=True,
                               restart_delay_s=RESTART_DELAY_S)
        async with cluster, Client(cluster.scheduler_address, batch_size=2_000) as client:
            job_id = await client.submit(wordcount.job(partitions=PARTITIONS))
            gaps: dict[str, float] = {}
            skip: set[str] = set()
            stop = asyncio.Event()
            watcher = asyncio.create_task(heartbeat_gaps(client, gaps, skip, stop))
            started = time.monotonic()
            for start in range(0, len(build), 5_000):
                await client.send(job_id, build[start:start + 5_000])
            await client.drain(job_id, timeout_s=1800)
            figures["build_s"] = time.monotonic() - started
            db = Path(run_dir) / "state-1" / "state.sqlite3"
            built = heads(db, job_id)
            figures["settle_s"] = await settle(cluster)
            figures["gap_build_s"] = max(gaps.values(), default=float("nan"))
            gaps.clear()

            feeding = asyncio.Event()

            async def feed(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end or feeding.is_set():
                    lines = [" ".join(rng.choice(words) for _ in range(WORDS_PER_LINE))
                             for _ in range(500)]
                    await client.send(job_id, lines)
                    sent.extend(lines)
                    await asyncio.sleep(0.05)

            steady_wall = time.time()
            await feed(6.0)  # steady windows
            figures["gap_steady_s"] = max(gaps.values(), default=float("nan"))
            gaps.clear()
            mean, top, whole, held = window_bytes(db, job_id, built)
            figures.update(window_mean=mean, window_max=top, whole_partition=whole)
            routing = await client._routing(job_id, refresh=True)
            victim = "worker-2"
            owned = [p for p, o in enumerate(routing.owners) if o == victim]
            probes = probe_keys(PARTITIONS)
            feeding.set()
            load = asyncio.create_task(feed(0))
            skip.add(victim)
            wall, killed = time.time(), time.monotonic()
            cluster.kill(victim, signal.SIGKILL)
            figures["acked_s"] = await acked_time(client, job_id, owned, probes, killed)
            sent.extend(f"{probes[p]} probe" for p in owned)
            log_dir = Path(run_dir) / "logs"
            deadline = time.monotonic() + 300
            restored = restored_after(log_dir, owned, wall)
            while len(restored) < len(owned) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                restored = restored_after(log_dir, owned, wall)
            figures["processing_s"] = max(w for w, _, _ in restored.values()) - wall
            figures["restore_s"] = max(r for _, r, _ in restored.values())
            figures["standby_share"] = (sum(a for _, _, a in restored.values())
                                        / max(1, len(restored)))
            feeding.clear()
            await load
            await wait_healthy(client, job_id, 3, timeout_s=300)
            back: dict[int, tuple[float, float, bool]] = {}
            while len(back) < len(owned) and time.monotonic() < deadline + 300:
                back = restored_after(log_dir, owned, wall + RESTART_DELAY_S, victim)
                await asyncio.sleep(0.1)
            figures["handback_s"] = max((r for _, r, _ in back.values()), default=float("nan"))
            await client.drain(job_id, timeout_s=1800)
            stop.set()
            await watcher
            figures["heartbeat_gap_s"] = max(gaps.values(), default=float("nan"))
            figures["gap_recovery_s"] = figures["heartbeat_gap_s"]
            figures["heartbeat_gap_s"] = max(figures["gap_build_s"], figures["gap_steady_s"],
                                             figures["gap_recovery_s"])
            actual = await client.results(job_id)
            figures["false_deaths"] = false_convictions(log_dir, victim, wall)
            figures["loop_lag_s"], figures["loop_held_s"] = loop_lags(log_dir)
            figures["loop_lag_recovery_s"], figures["loop_held_recovery_s"] = loop_lags(
                log_dir, wall)
            # The 2 s period that ends first after the steady phase starts
            # covers some of the build's end; the kill is in a later period.
            figures["loop_lag_steady_s"], figures["loop_held_steady_s"] = loop_lags(
                log_dir, steady_wall + 2.0, wall)
    expected: Counter[str] = Counter()
    for line in sent:
        expected.update(line.split())
    figures["matched"] = float(actual == dict(expected))
    figures["state_keys"] = held
    return figures


def table(rows: list[dict[str, float]]) -> str:
    head = (f"{'keys':>10}{'bytes/window':>14}{'max':>10}{'whole part.':>13}{'restore s':>11}"
            f"{'processing s':>14}{'acked s':>9}{'hb gap s':>10}{'loop lag s':>12}{'build s':>9}"
            f"{'standby':>9}{'handback s':>12}{'false deaths':>14}  results")
    lines = [head]
    for r in rows:
        lines.append(
            f"{int(r['keys']):>10,}{r['window_mean']:>14,.0f}{r['window_max']:>10,.0f}"
            f"{r['whole_partition']:>13,.0f}{r['restore_s']:>11.3f}{r['processing_s']:>14.2f}"
            f"{r['acked_s']:>9.2f}{r['heartbeat_gap_s']:>10.2f}{r['loop_lag_s']:>12.2f}"
            f"{r['build_s']:>9.1f}{r['standby_share']:>9.0%}{r['handback_s']:>12.3f}"
            f"{int(r['false_deaths']):>14}  "
            f"{'match' if r['matched'] else 'DIFFER'}")
    lines.append("after the build, until the members used under "
                 f"{SETTLED_CORES} cores for {SETTLED_FOR_S:.0f} s (folds, standbys catching "
                 "up; the steady phase starts then): " + ", ".join(
                     f"{int(r['keys']):,}: {r['settle_s']:.1f} s" for r in rows))
    lines.append("heartbeat gap (s) by phase, build and its aftermath / steady / kill+recovery: "
                 + ", ".join(
        f"{int(r['keys']):,}: {r['gap_build_s']:.2f} / {r['gap_steady_s']:.2f} / "
        f"{r['gap_recovery_s']:.2f}" for r in rows))
    lines.append("worst event-loop lag (s), whole run / steady (the state held, windows "
                 "closing under load) / from the kill on: " + ", ".join(
                     f"{int(r['keys']):,}: {r['loop_lag_s']:.2f} / {r['loop_lag_steady_s']:.2f}"
                     f" / {r['loop_lag_recovery_s']:.2f}" for r in rows))
    lines.append("of which the loop thread was computing (s), whole run / steady / from the "
                 "kill on (the rest: the machine not running the process): " + ", ".join(
                     f"{int(r['keys']):,}: {r['loop_held_s']:.2f} / "
                     f"{r['loop_held_steady_s']:.2f} / {r['loop_held_recovery_s']:.2f}"
                     for r in rows))
    lines.append("standby: share of the victim's counting partitions whose new owner "
                 "adopted its warm standby instead of reading the whole state; handback: "
                 "the longest restore of a partition handed back to the restarted victim "
                 "(it holds no standby: a whole read)")
    lines.append("false deaths: members the scheduler declared dead that were not killed "
                 "(any but the victim, or the victim before the kill)")
    lines.append("bytes/window: stored window deltas of the counting task under the steady "
                 "load (mean, max); whole part.: one partition's whole state (what each "
                 "window carried before deltas)")
    return "\n".join(lines)


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["keys"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(xs, [r["window_mean"] for r in rows], marker="o", label="bytes per window (delta)")
    left.plot(xs, [r["whole_partition"] for r in rows], marker="s",
              label="whole state of a partition")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("keys of state")
    left.set_ylabel("bytes")
    left.legend()
    for measure, label in (("restore_s", "restore (per task)"),
                           ("processing_s", "kill -> processing"),
                           ("acked_s", "kill -> post-kill batch acked"),
                           ("handback_s", "handback restore (restarted victim)"),
                           ("heartbeat_gap_s", "worst heartbeat gap"),
                           ("loop_lag_s", "worst event-loop lag"),
                           ("loop_lag_steady_s", "worst event-loop lag, steady"),
                           ("loop_held_s", "of which computing")):
        right.plot(xs, [r[measure] for r in rows], marker="o", label=label)
    right.set_xscale("log")
    right.set_xlabel("keys of state")
    right.set_ylabel("seconds")
    right.legend()
    fig.suptitle("Recovery as state grows (3 workers, 2 state servers, 12 partitions)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", default="10000,100000,1000000,10000000",
                        help="comma-separated state sizes (distinct keys)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each cluster's data and logs under this directory")
    parser.add_argument("--out", type=Path, default=None,
                        help="where recovery.txt and recovery.png go (default: a temp dir)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gridstream-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for keys in (int(k) for k in args.keys.split(",")):
        print(f"{keys:,} keys ...", flush=True)
        rows.append(asyncio.run(run_size(keys, args.seed, args.keep)))
        print(table(rows[-1:]), flush=True)
    text = table(rows)
    print("\n" + text)
    (out / "recovery.txt").write_text(text + "\n")
    plot(rows, out / "recovery.png")
    print(f"table: {out / 'recovery.txt'}\nplot: {out / 'recovery.png'}")


if __name__ == "__main__":
    main()
