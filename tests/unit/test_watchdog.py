"""The suite's watchdog (tests/conftest.py) ends a test process that is stuck,
with every thread's stack, even where pytest-timeout cannot act."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_stuck_test_process_is_ended_with_its_stacks(tmp_path: Path) -> None:
    stuck = tmp_path / "test_stuck.py"
    stuck.write_text("import time\n\n\ndef test_stuck() -> None:\n    time.sleep(120)\n")
    env = {**os.environ, "GRIDSTREAM_TEST_WATCHDOG_S": "1"}
    started = time.monotonic()
    # pytest-timeout off, as when the process is frozen where it cannot act.
    ended = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:timeout", "-p", "no:cacheprovider",
         "-p", "tests.conftest", "--rootdir", str(tmp_path), str(stuck)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 45
    assert ended.returncode != 0
    assert "Timeout" in ended.stderr and "test_stuck" in ended.stderr, ended.stderr[-2000:]
