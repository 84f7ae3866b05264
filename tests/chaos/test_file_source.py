"""The files source under kills: ``gridstream send JOB DIR`` is killed with
SIGKILL in the middle of a file, started again from its cursor, and a worker
is killed while it sends; every user's clicks must then be exact by the
history checker (none lost, doubled or reordered), every page's aggregate
equal to the fault-free reference, and the files sink hold every click once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gridstream import filesink
from gridstream.checker import check_history
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.examples import clicks
from gridstream.local import LocalCluster

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]


async def cursor_at(path: Path, file: str, timeout_s: float = 60.0) -> dict[str, object]:
    """Waits until the reader's cursor is inside ``file`` past its start."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        try:
            cursor = json.loads(await asyncio.to_thread(path.read_text))
        except (FileNotFoundError, ValueError):
            cursor = {}
        if cursor.get("file") == file and int(cursor.get("offset", 0)) > 0:
            return dict(cursor)
        await asyncio.sleep(0.002)
    raise TimeoutError(f"the reader never got into {file}")


async def test_a_reader_killed_mid_file_resumes_exactly_once(tmp_path: Path) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=1_000, partitions=6,
                                                     backup_count=1))
    keys, lines = clicks.generate(16_000, seed=3)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for n in range(4):  # four files, each user's clicks in order across them
        part = lines[n * 4_000:(n + 1) * 4_000]
        (inbox / f"clicks-{n}.jsonl").write_text("\n".join(part) + "\n")
    files = tmp_path / "files"
    cursor = inbox / ".cursor.json"
    async with LocalCluster(tmp_path / "run", config, workers=3, state_servers=2,
                            supervise=True, restart_delay_s=1.0) as cluster:
        async with Client(cluster.scheduler_address, security=cluster.config.security) as client:
            job_id = await client.submit(replace(clicks.flow(files).job(),
                                                 tracking_timeout_s=5.0))
            argv = [sys.executable, "-m", "gridstream.cli", "send", job_id, str(inbox),
                    "--key-field", "user", "--chunk-records", "200", "--batch-size", "50",
                    "--cursor", str(cursor), "--config", str(cluster.config_path),
                    "--scheduler", cluster.scheduler_address]
            env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSTREAM_")}
            reader = await asyncio.create_subprocess_exec(*argv, cwd=str(REPO_ROOT), env=env)
            at_kill = await cursor_at(cursor, "clicks-1.jsonl")
            reader.send_signal(signal.SIGKILL)  # mid-file, mid-send or mid-cursor
            await reader.wait()
            reader = await asyncio.create_subprocess_exec(*argv, cwd=str(REPO_ROOT), env=env)
            try:
                await cursor_at(cursor, "clicks-2.jsonl")
                cluster.kill("worker-2", signal.SIGKILL)  # records in flight on every edge
                assert await asyncio.wait_for(reader.wait(), 180) == 0
            finally:
                if reader.returncode is None:  # a failure must not leave the reader running
                    reader.kill()
                    await reader.wait()
            progress = await client.drain(job_id, timeout_s=180)
            assert not progress.losses
            users = await client.results(job_id, sink="users")
            pages = await client.results(job_id, sink="pages")
    verdict = check_history(users, clicks.sent_counts(keys))
    assert verdict.ok, (verdict.summary(), at_kill)
    assert pages == clicks.reference(lines)["pages"]
    found = filesink.read_records(files, job_id, "clicks")
    assert clicks.check_files(found, lines) == ""
    assert json.loads(cursor.read_text())["done"] == [f"clicks-{n}.jsonl" for n in range(4)]
