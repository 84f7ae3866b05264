"""A state server started on a data file of an older layout refuses it: the
process exits with 2 and one line naming the fix, no traceback, and leaves
the file as it was (a real process on a real SQLite file)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

from services.stateserver.main import DB_FILE
from services.stateserver.store import SnapshotStore

REPO = Path(__file__).resolve().parents[2]


def test_a_state_server_refuses_an_older_layout_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def create() -> None:
        async with SnapshotStore(data / DB_FILE):
            pass

    asyncio.run(create())
    with sqlite3.connect(data / DB_FILE) as conn:
        conn.execute("PRAGMA user_version=2")
    secret = tmp_path / "cluster.secret"
    secret.write_text("s" * 64)
    secret.chmod(0o600)
    config = tmp_path / "config.toml"
    config.write_text(f'[security]\ncluster_secret_file = "{secret}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "services.stateserver", "--config", str(config),
         "--data-dir", str(data), "--standalone"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "layout 2, this one needs 4); move it aside" in output
    assert "Traceback" not in output
    with sqlite3.connect(data / DB_FILE) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_file_of_the_same_layout_loses_the_index_that_made_row_writes_cost_double(
        tmp_path: Path) -> None:
    """Layout-3 files made before the index by operator was dropped still have
    it; opening them drops it (it moved on every row write), and their rows
    stay readable by operator, as a catching-up replica reads them."""
    path = tmp_path / DB_FILE

    async def write(rows: list[tuple[str, str]]) -> None:
        async with SnapshotStore(path) as store:
            await store.write_results("job-1", rows, operator_id="job-1/1/0", version=7,
                                      fenced=False)

    asyncio.run(write([("a", "1")]))
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE INDEX results_by_operator ON results (job_id, operator_id, version)")

    async def reopen_and_read() -> list[object]:
        async with SnapshotStore(path) as store:
            await store.write_results("job-1", [("b", "2")], operator_id="job-1/1/0",
                                      version=8, fenced=False)
            return [row async for chunk, _ in store.read_operator("job-1", "job-1/1/0", 7)
                    for row in chunk]

    assert asyncio.run(reopen_and_read()) == [("b", "2", 8)]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND "
                            "name = 'results_by_operator'").fetchall() == []
