"""The faults a scenario injects into a local cluster: what one step is,
whom it lands on and the record of when it landed.

A fault lands on a process this run started, signalled by PID: a worker
that runs and is ready, the scheduler, a state server, a worker hosting a
tuple tracker, or a worker cut off from the scheduler by a fault proxy.
:mod:`gridstream.scenarios` runs sequences of them against a job and
judges the outcome.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Protocol

from gridstream.chaos import detection_time
from gridstream.client import Client
from gridstream.errors import DeadlineExceeded, Unavailable
from gridstream.faultproxy import FaultProxy
from gridstream.local import LocalCluster
from gridstream.retry import retry
from gridstream.tracking.ring import tracker_hosts
from gridstream.v1 import scheduler_pb2

DEAD = scheduler_pb2.MEMBER_STATE_DEAD
WORKER_FAULTS = ("kill", "tracker", "pause", "isolate")
"""Step kinds whose victims are workers (their detection is measured)."""


@dataclass(frozen=True)
class Step:
    """One fault of a scenario.

    ``kind``: ``kill`` (SIGKILL ``victims`` workers, ``gap_s`` apart),
    ``pause`` (SIGSTOP a worker for ``pause_s``, then SIGCONT), ``scheduler``
    (SIGKILL the scheduler), ``state`` (SIGKILL a state server),
    ``tracker`` (SIGKILL a worker that hosts a tuple tracker, by the current
    routing table) or ``isolate`` (cut one worker off from the scheduler, not from its peers,
    for ``pause_s``: the run must be given ``isolate=True``).

    A ``kill`` (or ``pause``) with ``again`` hits the previous kill's victims
    once more, as soon as their restarted processes are in the routing table
    (from ``at_s`` on): each gets its partitions back and is restoring them when it
    dies. That is one failure after another, within ``backup_count = 1``:
    the partitions' logs are still on the workers that held them meanwhile.
    (A second victim picked among the other workers may instead hold the last
    copy of a partition the first one lost: two simultaneous failures.)
    """

    kind: str
    at_s: float
    victims: int = 1
    gap_s: float = 0.0
    pause_s: float = 0.0
    again: bool = False


@dataclass
class FaultRecord:
    """What one step did and what it cost."""

    kind: str
    victims: list[str]
    wall_at: float
    mono_at: float
    in_flight: bool
    detected_s: float | None = None
    resumed_s: float | None = None
    incarnations: dict[str, str] = field(default_factory=dict)
    """Worker kills: the victims' incarnations when killed (``again`` waits for new ones)."""


class FaultSender(Protocol):
    """What a fault reads of the run's sender: its client, and whether
    records are in flight as the fault lands."""

    client: Client

    def in_flight(self) -> bool:
        """Whether the fault lands mid-stream."""
        ...


async def detections_of(client: Client, fault: FaultRecord) -> list[float | None]:
    """Seconds until each victim of a worker fault was declared dead (watched
    live: the scheduler's event list is short); empty for other faults."""
    if fault.kind not in WORKER_FAULTS:
        return []
    return list(await asyncio.gather(*(
        detection_time(client, victim, fault.wall_at, timeout_s=15.0)
        for victim in fault.victims)))


async def isolatable(cluster: LocalCluster, worker: str) -> FaultProxy:
    """Restarts ``worker`` so that it reaches the scheduler only through a
    fault proxy (its peers it reaches directly)."""
    proxy = await FaultProxy(cluster.scheduler_address).start()
    member = cluster.members[worker]
    member.argv[member.argv.index("--scheduler") + 1] = proxy.address
    cluster.hold(worker)
    try:
        cluster.kill(worker, signal.SIGKILL)
        await cluster.wait_exit(worker)
        await cluster.restart(worker)
    finally:
        cluster.release(worker)
    await cluster.wait_registered()
    return proxy


async def incarnations(client: Client) -> dict[str, str]:
    """node id -> incarnation of every live worker in the table (asked again a while)."""
    table = await retry("reading the routing table", client.routing_table,
                        (Unavailable, DeadlineExceeded), deadline_s=30.0)
    return {m.node_id: m.incarnation for m in table.members
            if m.role == scheduler_pb2.MEMBER_ROLE_WORKER and m.state != DEAD}


async def restarted(client: Client, before: dict[str, str], timeout_s: float = 30.0) -> None:
    """Waits until every worker of ``before`` has a new incarnation in the table."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = await incarnations(client)
        if all(now.get(node, old) != old for node, old in before.items()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sorted(before)} not back in the routing table after "
                               f"{timeout_s:.0f}s")
        await asyncio.sleep(0.05)


NO_WORKER_BACK_S = 30.0
"""How long a fault waits for a worker process to be back when every one is
down: a restart takes a second or two, so this long means restarts fail."""


async def running_workers(cluster: LocalCluster, workers: list[str],
                          timeout_s: float = NO_WORKER_BACK_S) -> list[str]:
    """The workers a fault can land on: their process runs and has written
    its ready file (one killed a moment ago may still be restarting; a
    process not yet ready was never given work, and no detector can see it
    go). Faults do not wait for the cluster to heal, and faults close
    together can leave every worker down at once; a fault still needs a
    process to land on, so this waits for the first one back. A signal
    sent to a worker that is down would fail with ProcessLookupError
    (the chaos run died of one when every worker was down at a pause).
    Raises TimeoutError naming the workers when none is back in
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [w for w in workers if cluster.members[w].alive()
                   and cluster.members[w].ready_file.exists()]
        if running:
            return running
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no worker of {', '.join(workers)} was running and ready {timeout_s:.0f}s "
                f"into a fault's wait for one: their restarts fail (logs in "
                f"{cluster.run_dir / 'logs'})")
        await asyncio.sleep(0.05)


async def inject(cluster: LocalCluster, step: Step, rng: random.Random,
                 sender: FaultSender, proxy: FaultProxy | None,
                 earlier: list[FaultRecord], note_incarnations: bool) -> FaultRecord:
    """Lands ``step`` on ``cluster`` and returns its record: whom it hit,
    when, and whether records were in flight. ``proxy`` is the isolated
    worker's (an ``isolate`` step needs it); ``earlier`` are the run's
    faults so far (an ``again`` step hits the last kill's victims); with
    ``note_incarnations`` a kill notes its victims' incarnations for one."""
    workers = sorted(n for n, m in cluster.members.items() if m.role == "worker")
    if step.kind == "isolate":
        if proxy is None:
            raise ValueError("an isolate step needs run_history(..., isolate=True)")
        record = FaultRecord("isolate", ["worker-1"], time.time(), time.monotonic(),
                             sender.in_flight())
        proxy.cut()
        await asyncio.sleep(step.pause_s)
        proxy.heal()
        return record
    if step.kind == "scheduler":
        victims = ["scheduler"]
    elif step.kind == "state":
        victims = [rng.choice(sorted(n for n, m in cluster.members.items()
                                     if m.role == "stateserver"))]
    elif step.kind == "tracker":
        table = await sender.client.routing_table()
        live = sorted(m.node_id for m in table.members
                      if m.role == scheduler_pb2.MEMBER_ROLE_WORKER and m.state != DEAD)
        hosts = sorted(set(tracker_hosts(max(1, table.tracker_count), live)) - {""})
        victims = [rng.choice(hosts)]
    elif step.again:
        previous = next(f for f in reversed(earlier) if f.kind == "kill")
        await restarted(sender.client, previous.incarnations)
        victims = previous.victims
    else:
        running = await running_workers(cluster, workers)
        victims = rng.sample(running, min(step.victims, len(running)))
    record = FaultRecord(step.kind, victims, time.time(), time.monotonic(), sender.in_flight())
    if step.kind == "kill" and note_incarnations:  # a later step hits them again
        current = await incarnations(sender.client)
        record.incarnations = {v: current[v] for v in victims if v in current}
    if step.kind == "pause":
        cluster.kill(victims[0], signal.SIGSTOP)
        await asyncio.sleep(step.pause_s)
        cluster.kill(victims[0], signal.SIGCONT)
        return record
    for i, victim in enumerate(victims):
        if i and step.gap_s:
            await asyncio.sleep(step.gap_s)
        if cluster.members[victim].alive():
            cluster.kill(victim, signal.SIGKILL)
    return record
