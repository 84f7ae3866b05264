"""The local cluster's supervisor: a member that dies right after it said it
was ready is restarted, not waited for."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gridstream.local import LocalCluster

pytestmark = [pytest.mark.integration]

# Writes a ready file naming an address nobody serves, then idles: a member
# that died (here: is killed) between its ready file and its first health
# answer. It writes the file as members do (gridstream.service.write_ready_file,
# atomically): written in place, the test could read it empty.
READY_THEN_IDLE = (
    "import sys, time\n"
    "from gridstream.service import write_ready_file\n"
    "write_ready_file(sys.argv[1], address='127.0.0.1:9')\n"
    "time.sleep(120)\n"
)


async def test_a_member_killed_after_its_ready_file_ends_the_wait_at_once(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path)
    ready = tmp_path / "ready.json"
    member = cluster._member("worker-9", "worker", [])
    member.ready_file = ready
    member.argv = [sys.executable, "-c", READY_THEN_IDLE, str(ready)]
    member.process = subprocess.Popen(member.argv)  # noqa: ASYNC220 - as LocalCluster does
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline, "the stand-in member never wrote its file"
            await asyncio.sleep(0.02)
        assert json.loads(ready.read_text())["address"]
        waiting = asyncio.create_task(cluster._await_ready(member, timeout_s=60.0))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # still waiting for health: nothing answers there
        member.process.send_signal(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="before it was healthy"):
            await asyncio.wait_for(waiting, 10.0)
        assert time.monotonic() - started < 2.0
    finally:
        if member.process.poll() is None:
            member.process.kill()
        member.process.wait()
