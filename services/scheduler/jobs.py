"""The job registry and the scheduler's other durable facts, in SQLite
(aiosqlite, WAL), so a restarted scheduler recovers jobs, members and the epoch
without a manual step."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

from gridstream.jobspec import JobSpec
from gridstream.v1 import common_pb2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    state INTEGER NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    submitted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    node_id TEXT PRIMARY KEY,
    role INTEGER NOT NULL,
    address TEXT NOT NULL,
    incarnation TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass
class JobRecord:
    """One job as registered."""

    job_id: str
    spec: JobSpec
    state: int
    error: str
    submitted_at: float
    created_epoch: int = 0
    """The epoch of the first routing table that lists the job, when it was
    saved before any table at it was served; 0 when unknown (not stored: after
    a scheduler restart every epoch is newer, so the value no longer matters).
    Workers starting a task at exactly this epoch skip its recovery
    (``JobRouting.created_epoch``)."""

    def to_proto(self) -> common_pb2.JobInfo:
        """The wire form."""
        return common_pb2.JobInfo(job_id=self.job_id, spec=self.spec.to_proto(),
                                  state=self.state,  # type: ignore[arg-type]
                                  error=self.error, submitted_at=self.submitted_at)


class JobRegistry:
    """Jobs, members and the epoch, durable across scheduler restarts."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / "scheduler.sqlite3"
        self.jobs: dict[str, JobRecord] = {}
        self._db: aiosqlite.Connection | None = None

    async def open(self) -> None:
        """Opens (creating) the database and loads every job."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.executescript(_SCHEMA)
        await self._db.commit()
        async with self._db.execute(
            "SELECT job_id, spec, state, error, submitted_at FROM jobs ORDER BY submitted_at"
        ) as cursor:
            async for job_id, blob, state, error, submitted in cursor:
                proto = common_pb2.JobSpec.FromString(blob)
                self.jobs[job_id] = JobRecord(job_id, JobSpec.from_proto(proto), state, error,
                                              submitted)

    @property
    def db(self) -> aiosqlite.Connection:
        """The open connection."""
        if self._db is None:
            raise RuntimeError("registry is not open")
        return self._db

    async def close(self) -> None:
        """Closes the database."""
        if self._db is not None:
            await self._db.close()
            self._db = None

    @staticmethod
    def new_id(spec: JobSpec) -> str:
        """A fresh job id: the name and 8 hex characters."""
        return f"{spec.name}-{uuid.uuid4().hex[:8]}"

    async def put(self, record: JobRecord) -> None:
        """Stores (or updates) a job; durable on return. A new job joins
        :meth:`running` (and so the routing table) only once it is durable,
        with no await after: the caller can start its first epoch before any
        table lists it."""
        await self.db.execute(
            "INSERT OR REPLACE INTO jobs (job_id, spec, state, error, submitted_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (record.job_id, record.spec.to_proto().SerializeToString(), record.state,
             record.error, record.submitted_at),
        )
        await self.db.commit()
        self.jobs[record.job_id] = record

    def new_record(self, spec: JobSpec) -> JobRecord:
        """A RUNNING record for a new job (not yet stored)."""
        return JobRecord(self.new_id(spec), spec, common_pb2.JOB_STATE_RUNNING, "", time.time())

    def running(self) -> list[JobRecord]:
        """Running jobs in submission order."""
        return [j for j in self.jobs.values() if j.state == common_pb2.JOB_STATE_RUNNING]

    async def save_member(self, node_id: str, role: int, address: str, incarnation: str) -> None:
        """Remembers a member's registration."""
        await self.db.execute(
            "INSERT OR REPLACE INTO members (node_id, role, address, incarnation) "
            "VALUES (?, ?, ?, ?)", (node_id, role, address, incarnation))
        await self.db.commit()

    async def delete_member(self, node_id: str) -> None:
        """Forgets a member that left the cluster."""
        await self.db.execute("DELETE FROM members WHERE node_id = ?", (node_id,))
        await self.db.commit()

    async def load_members(self) -> list[tuple[str, int, str, str]]:
        """Every remembered registration."""
        async with self.db.execute(
            "SELECT node_id, role, address, incarnation FROM members"
        ) as cursor:
            return [(str(a), int(b), str(c), str(d)) for a, b, c, d in await cursor.fetchall()]

    async def save_epoch(self, epoch: int) -> None:
        """Remembers the epoch, so it never goes backwards across restarts."""
        await self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('epoch', ?)",
                              (epoch,))
        await self.db.commit()

    async def load_epoch(self) -> int:
        """The last saved epoch (0 if none)."""
        async with self.db.execute("SELECT value FROM meta WHERE key = 'epoch'") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0
