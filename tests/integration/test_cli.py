"""The operator's CLI against a real local cluster (separate processes on
loopback): dead letters as JSON lines, an empty result table said on stderr,
a whole-cluster health check, metrics addresses in ``status``, logs that name
their node and stay quiet in a clean restart; and, against a port nobody
listens on, the one "cannot reach the scheduler" sentence from every command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.jobspec import JobSpec, Stage
from gridstream.local import REPO_ROOT, LocalCluster
from tests.integration.conftest import small_config

pytestmark = pytest.mark.integration

OPS = "tests.integration.poison_ops"
SUM_BY_PARITY = JobSpec("cli", (
    Stage("parse", "map", f"{OPS}:parse"),
    Stage("sum", "reduce", f"{OPS}:add", key=f"{OPS}:parity", initial=0),
    Stage("store", "sink"),
), partitions=2)


@dataclass
class Run:
    """What one ``gridstream`` invocation did."""

    code: int
    out: str
    err: str


async def gridstream(*argv: str) -> Run:
    """Runs the CLI as its own process, as an operator's shell would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSTREAM_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gridstream.cli", *argv, cwd=str(REPO_ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 2 workers (a backup for each container), 1 state server."""
    async with LocalCluster(tmp_path_factory.mktemp("cli"), small_config(), workers=2,
                            state_servers=1) as local:
        yield local


def flags(cluster: LocalCluster) -> list[str]:
    """What points the CLI at the test cluster."""
    return ["--scheduler", cluster.scheduler_address, "--config", str(cluster.config_path)]


async def test_dead_letters_are_json_lines_and_results_of_an_empty_job_say_so(
        cluster: LocalCluster) -> None:
    async with Client(cluster.scheduler_address) as client:
        empty = await client.submit(SUM_BY_PARITY)
        job_id = await client.submit(SUM_BY_PARITY)
        await client.send(job_id, ["1", "x", "2", "y", "3"])
        await client.drain(job_id, timeout_s=60)

    nothing = await gridstream("results", empty, *flags(cluster))
    assert (nothing.code, nothing.out) == (0, ""), nothing
    assert f"job {empty} has no results yet" in nothing.err

    rows = await gridstream("results", job_id, *flags(cluster))
    assert rows.code == 0 and rows.out.strip(), rows

    letters = await gridstream("dead-letters", job_id, *flags(cluster))
    assert letters.code == 0, letters
    parsed = [json.loads(line) for line in letters.out.splitlines()]
    assert len(parsed) == 2, parsed
    assert all(set(p) == {"id", "stage", "key", "record", "record_format", "error",
                          "traceback"} for p in parsed)
    # The record itself as JSON (not a Python repr), the error with the
    # traceback that leads into the user's function.
    assert sorted(p["record"] for p in parsed) == ["x", "y"], parsed
    assert all(p["record_format"] == "json" for p in parsed), parsed
    assert all(p["error"].startswith("ValueError") and p["stage"] for p in parsed), parsed
    assert all(p["traceback"].startswith("Traceback (most recent call last)")
               and "poison_ops.py" in p["traceback"] and "in parse" in p["traceback"]
               and p["traceback"].rstrip().endswith(p["error"]) for p in parsed), parsed

    limited = await gridstream("dead-letters", job_id, "--limit", "1", *flags(cluster))
    assert len(limited.out.splitlines()) == 1, limited
    none = await gridstream("dead-letters", empty, *flags(cluster))
    assert (none.code, none.out) == (0, "") and "no dead letters" in none.err, none


async def test_status_job_shows_the_schedulers_warnings_of_that_job(
        cluster: LocalCluster) -> None:
    async with Client(cluster.scheduler_address) as client:
        quiet = await client.submit(SUM_BY_PARITY)
        job_id = await client.submit(SUM_BY_PARITY)
        await client.send(job_id, ["1", "x", "2", "y", "3"])
        await client.drain(job_id, timeout_s=60)
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # the monitor samples once a second
            run = await gridstream("status", "--job", job_id, *flags(cluster))
            assert run.code == 0, run
            if "went to the dead letters" in run.out:
                break
            assert asyncio.get_running_loop().time() < deadline, run.out
            await asyncio.sleep(0.5)
        warnings = (await client.status()).warnings
    # The same warning the scheduler publishes (and the console shows), with
    # what to do and since when.
    line = next(x for x in run.out.splitlines() if "went to the dead letters" in x)
    ours = [w for w in warnings if w.job_id == job_id and w.kind == "dead_letters_rising"]
    assert ours and any(line.strip().startswith(f"! {w.text} — {w.action}") for w in ours), (
        line, ours)
    assert f"warnings (job {job_id} and the cluster):" in run.out and "(for " in line
    # Another job's warnings are not listed under this one.
    other = await gridstream("status", "--job", quiet, *flags(cluster))
    assert other.code == 0 and "went to the dead letters" not in other.out, other.out
    assert job_id not in other.out.split("warnings", 1)[-1], other.out
    # Plain status lists every warning.
    every = await gridstream("status", *flags(cluster))
    assert "went to the dead letters" in every.out, every.out


async def test_status_shows_each_members_metrics_address(cluster: LocalCluster) -> None:
    run = await gridstream("status", "--run-dir", str(cluster.run_dir), *flags(cluster))
    assert run.code == 0, run
    for member in cluster.members.values():
        assert member.metrics_address, member
        assert member.metrics_address in run.out, (member.name, run.out)


async def test_logs_name_their_node_and_a_clean_worker_restart_warns_of_nothing(
        cluster: LocalCluster) -> None:
    offsets = {n: m.log_path.stat().st_size for n, m in cluster.members.items()}
    cluster.hold("worker-1")
    cluster.kill("worker-1", signal.SIGTERM)
    assert await cluster.wait_exit("worker-1") == 0
    await cluster.restart("worker-1")
    cluster.release("worker-1")
    await cluster.wait_registered()
    for name, member in cluster.members.items():
        new = member.log_path.read_bytes()[offsets[name]:].decode(errors="replace")
        assert " WARNING " not in new, (name, new)
        assert "routing table epoch" not in new, (name, new)  # DEBUG, not INFO
    worker_log = cluster.members["worker-1"].log_path.read_text(errors="replace")
    assert " worker-1 INFO " in worker_log, worker_log[-2000:]
    state_log = cluster.members["state-1"].log_path.read_text(errors="replace")
    assert " state-1 INFO " in state_log, state_log[-2000:]


async def test_health_checks_every_member_and_fails_when_one_does_not_serve(
        cluster: LocalCluster) -> None:
    healthy = await gridstream("health", "--timeout", "2", *flags(cluster))
    assert healthy.code == 0, healthy
    lines = healthy.out.splitlines()[1:]
    names = sorted(line.split()[0] for line in lines)
    assert names == ["scheduler", "state-1", "worker-1", "worker-2"], lines
    assert all(line.endswith("SERVING") for line in lines), lines

    cluster.hold("worker-1")
    cluster.kill("worker-1", signal.SIGSTOP)  # alive to the kernel, deaf to gRPC
    try:
        stopped = await gridstream("health", "--timeout", "1", *flags(cluster))
    finally:
        cluster.kill("worker-1", signal.SIGCONT)
        cluster.release("worker-1")
    assert stopped.code == 1, stopped
    worker_line = next(line for line in stopped.out.splitlines() if line.startswith("worker-1"))
    assert not worker_line.endswith(" SERVING"), worker_line
    assert "not serving: worker-1" in stopped.err


def free_port() -> int:
    """A loopback port nobody listens on (bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_every_command_says_it_cannot_reach_a_scheduler_that_is_down() -> None:
    address = f"127.0.0.1:{free_port()}"
    commands = [["status"], ["status", "--job", "j"], ["submit", "examples/taxi.toml"],
                ["results", "j"], ["dead-letters", "j"], ["cancel", "j"], ["trackers", "3"],
                ["retire", "state-1"], ["health"]]
    runs = await asyncio.gather(*(gridstream(*c, "--scheduler", address) for c in commands))
    for command, run in zip(commands, runs, strict=True):
        assert run.code == 2, (command, run)
        assert run.err.strip() == (f"gridstream: cannot reach the scheduler at {address} "
                                   "(is the cluster up? see `gridstream up`)"), (command, run)
        assert "Traceback" not in run.err
