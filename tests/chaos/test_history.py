"""Exactly once under fault *sequences*, judged per key by the history checker.

Each run streams the order-sensitive history job for its whole length while
faults land one after another without waiting for the cluster to heal; each
fault must land while records are in flight; the job must drain and every key
must hold exactly the fold of its sequences 1..n (no loss, no duplicate, no
reorder). A deliberately broken build (acknowledge before replicating) must
fail the same check: the checker has teeth.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.config import ClusterConfig, Config
from gridstream.faultsteps import Step
from gridstream.scenarios import HistoryRun, run_history

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]


def config(backup_count: int = 1) -> Config:
    """Small windows (kills land between, during and after persists)."""
    return replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=8,
                                                   backup_count=backup_count))


def assert_exact(run: HistoryRun) -> None:
    """Every fault landed mid-stream; the verdict is exact; nothing was lost or convicted."""
    print(run.table())
    assert all(f.in_flight for f in run.faults), run.table()
    assert run.verdict.ok, run.table()
    assert not run.losses, run.table()
    assert not run.undrained, run.table()


async def test_kills_pauses_and_a_kill_during_a_restore(tmp_path: Path) -> None:
    # A kill; the same worker killed again as soon as its restarted process
    # is in the routing table, while it restores the partitions it got back;
    # a pause past detection (the paused worker is fenced, rejoins, and its
    # late reports and pushes are refused); and one more kill: none waits
    # for the cluster to heal. (A second victim among the *other* workers
    # 1.5 s after the first may hold the last copy of a batch the first one
    # died with: two simultaneous failures, beyond backup_count = 1, and
    # named as a loss, not hidden.)
    steps = [Step("kill", 3.0), Step("kill", 4.5, again=True),
             Step("pause", 8.0, pause_s=3.5), Step("kill", 13.0)]
    run = await run_history(steps, tmp_path, records=50_000, stream_s=18.0,
                            config=config(), seed=1)
    assert_exact(run)
    assert any(f.detected_s is not None for f in run.faults if f.kind == "pause")
    first, again = run.faults[0], run.faults[1]
    assert again.victims == first.victims
    assert again.incarnations != first.incarnations  # the restarted process


async def test_kills_and_a_pause_on_a_prepartitioned_fold(tmp_path: Path) -> None:
    # The fold runs in the task that receives the records (sent keyed by its
    # key, no shuffle): a kill takes the fold's state and its input queue at
    # once, and a restore replays the queue into the restored fold. The same
    # worker killed twice in a row, a pause past detection, another kill.
    steps = [Step("kill", 2.5), Step("kill", 4.0, again=True),
             Step("pause", 7.0, pause_s=3.5), Step("kill", 11.5)]
    run = await run_history(steps, tmp_path, records=40_000, stream_s=14.0,
                            config=config(), seed=7, prepartitioned=True)
    assert_exact(run)
    assert run.tasks == 1  # the fused plan ran: stamp and fold in one task


async def test_two_simultaneous_kills_with_backup_count_two(tmp_path: Path) -> None:
    # f = 2: two workers killed 100 ms apart lose nothing (every acknowledged
    # batch is on three workers), twice in a row.
    steps = [Step("kill", 3.0, victims=2, gap_s=0.1), Step("kill", 9.0, victims=2, gap_s=0.1)]
    run = await run_history(steps, tmp_path, records=40_000, stream_s=14.0, workers=4,
                            config=config(backup_count=2), seed=2)
    assert_exact(run)


async def test_scheduler_and_state_server_kills_convict_nobody(tmp_path: Path) -> None:
    # The scheduler is killed ten times and a state server once, mid-stream:
    # a restarted scheduler trusts phi only after fresh heartbeats, so no live
    # worker is declared dead, and no record is lost or applied twice.
    steps = [Step("scheduler", 2.0 + 1.6 * i) for i in range(10)] + [Step("state", 6.5)]
    run = await run_history(steps, tmp_path, records=40_000, stream_s=19.0,
                            config=config(), seed=3)
    assert_exact(run)
    assert run.wrongly_convicted == [], run.table()


async def test_the_checker_catches_a_build_that_acknowledges_before_replicating(
    tmp_path: Path,
) -> None:
    # The same kind of run against a deliberately broken build: acknowledged
    # batches die with their worker. The checker must report the loss, and the
    # cluster must name it (drain's data-loss error), not stay silent. A kill
    # loses only what was acknowledged and not yet passed on: one kill can
    # miss on a loaded machine (it did once in a CI run with two), four in a
    # row do not.
    steps = [Step("kill", 3.0 + 2.5 * i) for i in range(4)]
    env = {"GRIDSTREAM_FAULT_ACK_BEFORE_REPLICATE": "1"}
    # Short root timeouts: trees that lost a batch are abandoned (and named)
    # after three rebuilds instead of after three default timeouts.
    # (A tree whose batch was lost can stay incomplete past the drain bound:
    # drain then fails naming what holds it, and the losses are named in the
    # job's progress. Seen once in CI; tracked as an open bug.)
    run = await run_history(steps, tmp_path, records=50_000, stream_s=12.0,
                            config=config(), extra_env=env, seed=4, tracking_timeout_s=2.0,
                            drain_timeout_s=60.0)
    print(run.table())
    assert not run.verdict.ok
    assert run.verdict.lost, run.table()
    assert run.losses, run.table()  # named by the cluster too, not only by the checker


async def test_a_worker_cut_off_from_the_scheduler_but_not_its_peers(tmp_path: Path) -> None:
    # worker-1 reaches the scheduler only through a proxy that drops the link
    # for 4 s (past detection) while it still reaches its peers: it is declared
    # dead, its partitions move, its late pushes and reports are refused, and
    # when the link heals it is fenced, rejoins, and gets its share back. Then
    # a kill lands before the cluster has settled.
    steps = [Step("isolate", 3.0, pause_s=4.0), Step("kill", 9.0)]
    run = await run_history(steps, tmp_path, records=40_000, stream_s=14.0,
                            config=config(), seed=5, isolate=True)
    assert_exact(run)
    assert run.faults[0].detected_s is not None, run.table()  # the cut was past detection


async def test_a_tracker_host_that_restarts_before_detection(tmp_path: Path) -> None:
    # A slow detector (1 s heartbeats) lets the killed tracker host come back
    # under its own name before it is convicted: its tracking tables are gone
    # although the tracker layout names the same node. The sources must see
    # the new incarnation and have the roots rebuilt at once; waiting for a
    # root timeout (60 s here) would miss the drain bound.
    slow = config()
    slow = replace(slow, cluster=replace(slow.cluster, heartbeat_interval_s=1.0))
    run = await run_history([Step("tracker", 3.0)], tmp_path, records=20_000, stream_s=8.0,
                            config=slow, seed=7, tracking_timeout_s=60.0, drain_timeout_s=30.0)
    assert_exact(run)
    assert run.faults[0].detected_s is not None


async def test_a_kill_every_four_seconds_for_a_minute(tmp_path: Path) -> None:
    # Fifteen kills, one every four seconds, each landing while the previous
    # victim may still be restarting or handing its partitions back. Short
    # root timeouts keep the final drain short (trees that lost their tracker
    # host are rebuilt after two timeouts).
    steps = [Step("kill", 3.0 + 4.0 * i) for i in range(15)]
    run = await run_history(steps, tmp_path, records=60_000, stream_s=62.0,
                            config=config(), seed=6, tracking_timeout_s=5.0)
    assert_exact(run)
    assert len(run.faults) == 15 and all(f.detected_s is not None for f in run.faults)


async def test_kills_with_a_million_keys_of_state(tmp_path: Path) -> None:
    # Every task of the fold holds its share of a million keys when the
    # faults land: restores read large window snapshots (a base and its
    # deltas) back while records are in flight; the restarted victim is
    # killed again while it restores the partitions it got back, then
    # paused past detection. Every key, loaded or streamed, must come out
    # exact. (Faults on other workers before the restores end would be
    # simultaneous failures: a restore of a million keys takes seconds.)
    steps = [Step("kill", 2.0), Step("kill", 3.0, again=True),
             Step("pause", 8.0, pause_s=3.0, again=True)]
    run = await run_history(steps, tmp_path, records=30_000, stream_s=13.0,
                            config=config(), seed=8, state_keys=1_000_000)
    assert_exact(run)
    assert run.verdict.keys >= 1_000_000
    # The takeovers after the pause adopt the new owner's warm standby of the
    # fold instead of reading its keys back (docs/recovery.md).
    restores = [line for path in (tmp_path / "logs").glob("worker-*.log")
                for line in path.read_text(errors="replace").splitlines()
                if "/t1/" in line and " started: snapshot window " in line]
    assert any(line.endswith(")") and " adopted; " in line for line in restores), restores[-6:]
