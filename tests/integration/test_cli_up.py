"""``gridstream up`` takes its members down with it: when its terminal closes
(SIGHUP) it stops them, and when it is killed outright (SIGKILL, no chance to
clean up) they notice and exit, so no orphan keeps holding the cluster's
ports. Real processes on free loopback ports."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gridstream.local import REPO_ROOT

pytestmark = pytest.mark.integration


def running(pid: int) -> bool:
    """True while the process exists and is not a zombie awaiting its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    """Polls until every process has exited; those still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if running(pid)]
        if not left:
            return []
        await asyncio.sleep(0.1)
    return [pid for pid in pids if running(pid)]


@pytest_asyncio.fixture
async def up(tmp_path: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[int]]]:
    """A running ``gridstream up`` (1 worker, 1 state server, scheduler on a
    free port) and its members' PIDs from their ready files; whatever is left
    at the end is killed by PID."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDSTREAM_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gridstream.cli", "up", "--port", "0", "--workers", "1",
        "--state-servers", "1", "--run-dir", str(tmp_path), cwd=str(REPO_ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert process.stdout is not None
    printed: list[str] = []
    pids: list[int] = []
    try:
        while not printed or "stops it gracefully" not in printed[-1]:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=90)
            assert line, f"gridstream up exited: {''.join(printed)}"
            printed.append(line.decode())
        pids = [json.loads(p.read_text())["pid"] for p in (tmp_path / "ready").glob("*.json")]
        assert len(pids) == 3, printed
        assert all("metrics http://127.0.0.1:" in line for line in printed
                   if " pid " in line), printed  # each member's metrics address
        consoles = [line.split()[1] for line in printed if line.split()[:1] == ["console"]]
        assert len(consoles) == 1 and consoles[0].startswith("http://127.0.0.1:"), printed
        ready = json.loads((tmp_path / "ready" / "scheduler.json").read_text())
        assert ready["console"] == consoles[0]
        yield process, pids
    finally:
        for pid in [process.pid, *pids]:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        await process.wait()


async def test_sigkill_of_up_stops_every_member(
        up: tuple[asyncio.subprocess.Process, list[int]]) -> None:
    process, pids = up
    os.kill(process.pid, signal.SIGKILL)
    await process.wait()
    assert await wait_gone(pids) == [], "members outlived a killed `gridstream up`"


async def test_sighup_of_up_stops_every_member_and_up_itself(
        up: tuple[asyncio.subprocess.Process, list[int]]) -> None:
    process, pids = up
    os.kill(process.pid, signal.SIGHUP)
    assert await asyncio.wait_for(process.wait(), timeout=30) == 0
    assert await wait_gone(pids, timeout_s=1.0) == []
