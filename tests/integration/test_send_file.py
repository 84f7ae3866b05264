"""``gridstream send FILE`` and user code on workers, against a real
``gridstream up`` cluster (1 worker, 1 state server, free loopback ports).

The job's functions live in a package of the test's own temporary directory
that is on no import path but the worker's ``worker.python_paths``: if that
setting were not applied, the submit would fail to import it. Records are
sent from JSON-lines and CSV files keyed by a field, and an order-sensitive
reduce must give, per key, the records in the file's order.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.errors import InvalidArgument
from gridstream.jobspec import DEFAULT_JOB_MODULES, JobSpec, Stage
from gridstream.local import REPO_ROOT

pytestmark = pytest.mark.integration

OPS = '''
def seq_of(record):
    return [record["user"], f"{record['seq']};"]

def user_of(pair):
    return pair[0]

def append(acc, pair):
    return acc + pair[1]
'''

JOB = """
[job]
name = "sequences"
partitions = 4

[[stages]]
name = "seq"
kind = "map"
function = "userjobs.ops:seq_of"

[[stages]]
name = "joined"
kind = "reduce"
function = "userjobs.ops:append"
key = "userjobs.ops:user_of"
initial = ""

[[stages]]
name = "store"
kind = "sink"
"""

USERS = ["ann", "bob", "cyd", "dee", "eve"]
RECORDS = [{"user": USERS[i % 5] if i % 7 else "ann", "seq": i} for i in range(3000)]


def reference(records: list[dict[str, Any]] = RECORDS) -> dict[str, str]:
    """Each user's sequence numbers in the records' order, as the job joins them."""
    out: dict[str, str] = {}
    for record in records:
        out[record["user"]] = out.get(record["user"], "") + f"{record['seq']};"
    return out


def json_lines(records: list[dict[str, Any]]) -> str:
    """The records as a JSON-lines file's text."""
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, Path]]:
    """A ``gridstream up`` whose config puts the user's directory on the
    workers' import path; (scheduler address, the test's directory)."""
    root = tmp_path_factory.mktemp("send")
    package = root / "userdir" / "userjobs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text(OPS)
    modules = json.dumps([*DEFAULT_JOB_MODULES, "userjobs"])
    (root / "cluster.toml").write_text(
        f"[cluster]\njob_modules = {modules}\nwindow_size = 500\nbackup_count = 0\n\n"
        f"[worker]\npython_paths = [{json.dumps(str(package.parent))}]\n")
    (root / "job.toml").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSTREAM_")}
    env.pop("PYTHONPATH", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gridstream.cli", "up", "--config", str(root / "cluster.toml"),
        "--port", "0", "--workers", "1", "--state-servers", "1", "--run-dir",
        str(root / "run"), cwd=str(REPO_ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert process.stdout is not None
    printed: list[str] = []
    try:
        while not printed or "stops it gracefully" not in printed[-1]:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=90)
            assert line, f"gridstream up exited: {''.join(printed)}"
            printed.append(line.decode())
        ready = json.loads((root / "run" / "ready" / "scheduler.json").read_text())
        yield ready["address"], root
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=30)
            except TimeoutError:
                process.kill()
                await process.wait()


async def gridstream(*args: str) -> tuple[int, str, str]:
    """Runs the CLI; (exit status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gridstream.cli", *args, cwd=str(REPO_ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode or 0, out.decode(), err.decode()


async def submit(address: str, root: Path) -> str:
    code, out, err = await gridstream("submit", str(root / "job.toml"), "--scheduler", address)
    assert code == 0, err  # the worker imported userjobs.ops from worker.python_paths
    return out.strip()


async def test_a_jsonl_file_sent_keyed_keeps_each_keys_order(
        cluster: tuple[str, Path]) -> None:
    address, root = cluster
    job_id = await submit(address, root)
    path = root / "clicks.jsonl"
    path.write_text(json_lines(RECORDS))
    code, out, err = await gridstream("send", job_id, str(path), "--key-field", "user",
                                      "--batch-size", "100", "--scheduler", address)
    assert code == 0, err
    assert f"sent {len(RECORDS)} records to job {job_id} (keyed by 'user')" in out
    async with Client(address) as client:
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == reference(), await client.dead_letters(job_id)


async def test_a_csv_file_is_sent_by_its_header(cluster: tuple[str, Path]) -> None:
    address, root = cluster
    job_id = await submit(address, root)
    path = root / "clicks.csv"
    path.write_text("user,seq\n" + "".join(f"{r['user']},{r['seq']}\n" for r in RECORDS))
    code, out, err = await gridstream("send", job_id, str(path), "--key-field", "user",
                                      "--batch-size", "250", "--scheduler", address)
    assert code == 0, err
    assert f"sent {len(RECORDS)} records" in out
    async with Client(address) as client:
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == reference()  # CSV fields are text: same


async def test_a_record_without_the_key_field_is_named(cluster: tuple[str, Path]) -> None:
    address, root = cluster
    job_id = await submit(address, root)
    path = root / "bad.jsonl"
    path.write_text('{"user": "ann", "seq": 1}\n{"seq": 2}\n')
    code, _, err = await gridstream("send", job_id, str(path), "--key-field", "user",
                                    "--scheduler", address)
    assert code == 1
    assert "line 2: the record has no field 'user'" in err


async def test_a_graph_of_user_code_runs_on_the_cluster(cluster: tuple[str, Path]) -> None:
    # A fan-out of the user's own stage: every record to an append sink, and
    # per user to an order-sensitive reduce; both sinks read apart.
    address, _ = cluster
    graph = JobSpec("graph", (
        Stage("seq", "map", "userjobs.ops:seq_of"),
        Stage("all", "sink", mode="append"),
        Stage("joined", "reduce", "userjobs.ops:append", key="userjobs.ops:user_of",
              initial="", inputs=("seq",)),
        Stage("store", "sink")), partitions=4)
    async with Client(address) as client:
        job_id = await client.submit(graph)
        await client.send(job_id, RECORDS, keys=[r["user"] for r in RECORDS])
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id, sink="store") == reference()
        appended = await client.results(job_id, sink="all")
        assert sorted(appended.values()) == sorted(
            [r["user"], f"{r['seq']};"] for r in RECORDS)
        with pytest.raises(InvalidArgument, match="has no sink 'nope'"):
            await client.results(job_id, sink="nope")


async def test_records_piped_to_send_go_on_before_the_pipe_closes(
        cluster: tuple[str, Path]) -> None:
    # ``tail -f log | gridstream send JOB -``: records written to the pipe
    # must reach the job while the pipe stays open. Read in chunks of 50,000
    # records, these three waited until the pipe closed, and the results
    # below never showed them.
    address, root = cluster
    job_id = await submit(address, root)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gridstream.cli", "send", job_id, "-", "--key-field", "user",
        "--scheduler", address, cwd=str(REPO_ROOT), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdin is not None
    try:
        first = RECORDS[:3]
        process.stdin.write(json_lines(first).encode())
        await process.stdin.drain()
        expected = reference(first)
        rows: dict[str, object] = {}
        async with Client(address) as client:
            deadline = asyncio.get_running_loop().time() + 60
            while rows != expected:
                assert asyncio.get_running_loop().time() < deadline, (
                    f"records piped in did not arrive while the pipe was open: {rows}")
                assert process.returncode is None
                await client.drain(job_id, timeout_s=30)
                rows = await client.results(job_id)
                if rows != expected:
                    await asyncio.sleep(0.1)  # polling, bounded by the deadline
        rest = RECORDS[3:]
        process.stdin.write(json_lines(rest).encode())
        process.stdin.close()
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0, err.decode()
        assert f"sent {len(RECORDS)} records to job {job_id}" in out.decode()
        async with Client(address) as client:
            await client.drain(job_id, timeout_s=120)
            assert await client.results(job_id) == reference()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_bad_line_stops_the_send_after_the_records_before_it(
        cluster: tuple[str, Path]) -> None:
    address, root = cluster
    job_id = await submit(address, root)
    path = root / "half-bad.jsonl"
    path.write_text(json_lines(RECORDS[:10]) + "{not json\n" + json_lines(RECORDS[10:11]))
    code, _, err = await gridstream("send", job_id, str(path), "--key-field", "user",
                                    "--scheduler", address)
    assert code == 1
    assert "line 11 is not JSON" in err and "(10 records were sent before it)" in err
    async with Client(address) as client:
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == reference(RECORDS[:10])


async def test_a_failed_send_ends_a_piped_send_while_the_pipe_is_open(
        cluster: tuple[str, Path]) -> None:
    # The send fails (no such job) while the pipe has nothing more to read:
    # the command must end with the error now, not at the next line or
    # when the pipe closes.
    address, _ = cluster
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gridstream.cli", "send", "nosuchjob-00000000", "-",
        "--scheduler", address, cwd=str(REPO_ROOT), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdin is not None and process.stderr is not None
    try:
        process.stdin.write(json_lines(RECORDS[:1]).encode())
        await process.stdin.drain()
        code = await asyncio.wait_for(process.wait(), timeout=60)
        err = (await process.stderr.read()).decode()
        assert code == 2, err
        assert "unknown job id 'nosuchjob-00000000'" in err
        assert "a send of 1 records failed" in err
        assert "Fatal Python error" not in err
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
