"""A member asked to stop never hangs: a drain that outlives
``cluster.stop_deadline_s`` (a last write to a state server that is gone, a
handoff to a dead peer) ends the process with status 75, after an ERROR that
names what was still running and a dump of every thread's stack. A drain that
finishes in time exits normally. Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gridstream.service import STOP_OVERDUE_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import asyncio, sys
    from gridstream.service import run_service

    async def main(stop):
        print("ready", flush=True)
        await stop.wait()
        if sys.argv[2] == "hang":  # a drain waiting on a peer that is gone
            await asyncio.create_task(asyncio.Event().wait(), name="write to a gone replica")
        else:
            await asyncio.sleep(0.2)  # a drain that takes a moment and ends

    run_service(main, float(sys.argv[1]))
""")


def stopped(drain: str, deadline_s: float) -> tuple[int, str, float]:
    """Starts the program, waits until it serves, sends SIGTERM; returns its
    exit status, its stderr and how long it took to exit after the signal."""
    process = subprocess.Popen([sys.executable, "-c", PROGRAM, str(deadline_s), drain],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        return process.returncode, stderr, time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_drain_past_its_deadline_ends_the_process_and_says_what_held_it() -> None:
    code, stderr, took = stopped("hang", 1.0)
    assert code == STOP_OVERDUE_EXIT_CODE, stderr
    assert "did not finish draining within cluster.stop_deadline_s=1s" in stderr
    assert "write to a gone replica" in stderr  # the task still running, by name
    assert "most recent call first" in stderr  # every thread's stack
    assert took < 30


def test_a_drain_that_ends_in_time_exits_normally() -> None:
    code, stderr, _ = stopped("finish", 1.0)
    assert code == 0, stderr
    assert "did not finish draining" not in stderr
