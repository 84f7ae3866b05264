"""A blocking wrapper of :class:`gridstream.Client` for scripts and notebooks.

It runs its own event loop in the calling thread; do not use it from inside
a running event loop (use the async Client there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gridstream.client import DEFAULT_BATCH_SIZE, Client
from gridstream.config import SecurityConfig
from gridstream.jobspec import JobSpec
from gridstream.v1 import common_pb2, scheduler_pb2


class SyncClient:
    """Same calls as Client, blocking."""

    def __init__(self, scheduler: str, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 producer_id: str | None = None, security: SecurityConfig | None = None) -> None:
        self._runner = asyncio.Runner()
        self._client: Client = self._runner.run(
            self._make(scheduler, batch_size, producer_id, security))

    @staticmethod
    async def _make(scheduler: str, batch_size: int, producer_id: str | None,
                    security: SecurityConfig | None) -> Client:
        return Client(scheduler, batch_size=batch_size, producer_id=producer_id,
                      security=security)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection and the private event loop."""
        self._runner.run(self._client.close())
        self._runner.close()

    def submit(self, job: JobSpec | str | Path) -> str:
        """See :meth:`Client.submit`."""
        return self._runner.run(self._client.submit(job))

    def send(self, job_id: str, values: Iterable[Any], keys: Sequence[Any] | None = None) -> int:
        """See :meth:`Client.send`."""
        return self._runner.run(self._client.send(job_id, values, keys))

    def flush(self, job_id: str) -> None:
        """See :meth:`Client.flush`."""
        self._runner.run(self._client.flush(job_id))

    def drain(self, job_id: str, timeout_s: float = 300.0) -> scheduler_pb2.JobProgress:
        """See :meth:`Client.drain`."""
        return self._runner.run(self._client.drain(job_id, timeout_s))

    def results(self, job_id: str) -> dict[str, Any]:
        """See :meth:`Client.results`."""
        return self._runner.run(self._client.results(job_id))

    def dead_letters(self, job_id: str) -> list[dict[str, str]]:
        """See :meth:`Client.dead_letters`."""
        return self._runner.run(self._client.dead_letters(job_id))

    def job(self, job_id: str) -> common_pb2.JobInfo:
        """See :meth:`Client.job`."""
        return self._runner.run(self._client.job(job_id))

    def jobs(self) -> list[common_pb2.JobInfo]:
        """See :meth:`Client.jobs`."""
        return self._runner.run(self._client.jobs())

    def cancel(self, job_id: str) -> common_pb2.JobInfo:
        """See :meth:`Client.cancel`."""
        return self._runner.run(self._client.cancel(job_id))

    def status(self) -> scheduler_pb2.ClusterStatus:
        """See :meth:`Client.status`."""
        return self._runner.run(self._client.status())
