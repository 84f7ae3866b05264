"""A blocking wrapper of :class:`gridstream.Client` for scripts and notebooks.

Every call of the asyncio client, blocking. The client lives on a private
event loop in a thread of its own (:mod:`gridstream.loopthread`), so it works
the same from a plain script and from code that already runs an event loop,
such as a Jupyter notebook, where ``asyncio.run`` would refuse to start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gridstream.client import DEFAULT_BATCH_SIZE, Client
from gridstream.config import SecurityConfig
from gridstream.control import DRAIN_POLL_S
from gridstream.jobspec import JobSpec
from gridstream.loopthread import LoopThread
from gridstream.producer import DEFAULT_MAX_BUFFERED_RECORDS, DEFAULT_MAX_SEND_RECORDS, Producer
from gridstream.types import ClusterStatus, DeadLetter, JobInfo, JobProgress, RoutingTable
from gridstream.v1 import scheduler_pb2


class SyncClient:
    """Same calls as :class:`Client`, blocking; usable inside a running loop."""

    def __init__(self, scheduler: str, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 producer_id: str | None = None, send_timeout_s: float = 60.0,
                 security: SecurityConfig | None = None) -> None:
        """Takes the arguments of :class:`Client`."""
        self._loop = LoopThread()
        try:
            self._client: Client = self._loop.run(self._make(
                scheduler, batch_size, producer_id, send_timeout_s, security))
        except BaseException:
            self._loop.close()
            raise

    @staticmethod
    async def _make(scheduler: str, batch_size: int, producer_id: str | None,
                    send_timeout_s: float, security: SecurityConfig | None) -> Client:
        # gRPC's asyncio channels belong to the loop they are made on.
        return Client(scheduler, batch_size=batch_size, producer_id=producer_id,
                      send_timeout_s=send_timeout_s, security=security)

    @property
    def client(self) -> Client:
        """The asyncio client underneath (its coroutines run on the private loop)."""
        return self._client

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection and the private event loop; a second call does nothing."""
        try:
            self._loop.run(self._client.close())
        except RuntimeError:
            pass  # closed already
        finally:
            self._loop.close()

    def producer(self, job_id: str, *, max_in_flight: int = 1,
                 max_send_records: int = DEFAULT_MAX_SEND_RECORDS,
                 max_buffered_records: int = DEFAULT_MAX_BUFFERED_RECORDS) -> SyncProducer:
        """A started :class:`gridstream.producer.Producer` for ``job_id``
        (same limits), blocking: its sends run on this client's loop thread
        while the caller goes on."""
        return SyncProducer(self._loop, self._loop.run(self._start_producer(
            job_id, max_in_flight, max_send_records, max_buffered_records)))

    async def _start_producer(self, job_id: str, max_in_flight: int, max_send_records: int,
                              max_buffered_records: int) -> Producer:
        producer = Producer(self._client, job_id, max_in_flight=max_in_flight,
                            max_send_records=max_send_records,
                            max_buffered_records=max_buffered_records)
        producer.start()  # its tasks belong to the private loop
        return producer

    def submit(self, job: JobSpec | str | Path) -> str:
        """See :meth:`Client.submit`."""
        return self._loop.run(self._client.submit(job))

    def send(self, job_id: str, values: Iterable[Any], keys: Sequence[Any] | None = None, *,
             producer: str | None = None, first_sequence: int | None = None) -> int:
        """See :meth:`Client.send`."""
        return self._loop.run(self._client.send(job_id, values, keys, producer=producer,
                                                first_sequence=first_sequence))

    def flush(self, job_id: str) -> None:
        """See :meth:`Client.flush`."""
        self._loop.run(self._client.flush(job_id))

    def drain(self, job_id: str, timeout_s: float = 300.0,
              poll_s: float = DRAIN_POLL_S) -> JobProgress:
        """See :meth:`Client.drain`."""
        return self._loop.run(self._client.drain(job_id, timeout_s, poll_s))

    def progress(self, job_id: str) -> JobProgress:
        """See :meth:`Client.progress`."""
        return self._loop.run(self._client.progress(job_id))

    def progress_message(self, job_id: str, flush: bool = False) -> scheduler_pb2.JobProgress:
        """See :meth:`Client.progress_message`."""
        return self._loop.run(self._client.progress_message(job_id, flush))

    def results(self, job_id: str, sink: str | None = None) -> dict[str, Any]:
        """See :meth:`Client.results` (``sink`` picks one sink of a job with several)."""
        return self._loop.run(self._client.results(job_id, sink))

    def dead_letters(self, job_id: str) -> list[DeadLetter]:
        """See :meth:`Client.dead_letters`."""
        return self._loop.run(self._client.dead_letters(job_id))

    def job(self, job_id: str) -> JobInfo:
        """See :meth:`Client.job`."""
        return self._loop.run(self._client.job(job_id))

    def jobs(self) -> list[JobInfo]:
        """See :meth:`Client.jobs`."""
        return self._loop.run(self._client.jobs())

    def cancel(self, job_id: str) -> JobInfo:
        """See :meth:`Client.cancel`."""
        return self._loop.run(self._client.cancel(job_id))

    def status(self) -> ClusterStatus:
        """See :meth:`Client.status`."""
        return self._loop.run(self._client.status())

    def status_message(self) -> scheduler_pb2.ClusterStatus:
        """See :meth:`Client.status_message`."""
        return self._loop.run(self._client.status_message())

    def routing_table(self) -> RoutingTable:
        """See :meth:`Client.routing_table`."""
        return self._loop.run(self._client.routing_table())

    def set_tracker_count(self, count: int) -> int:
        """See :meth:`Client.set_tracker_count`."""
        return self._loop.run(self._client.set_tracker_count(count))

    def retire_state_server(self, node_id: str) -> int:
        """See :meth:`Client.retire_state_server`."""
        return self._loop.run(self._client.retire_state_server(node_id))


class SyncProducer:
    """A :class:`gridstream.producer.Producer` for blocking code (made by
    :meth:`SyncClient.producer`): each call blocks until the producer's
    does, while its sends go on in the client's loop thread. Use it as a
    context manager: a clean exit flushes and closes, an error aborts."""

    def __init__(self, loop: LoopThread, producer: Producer) -> None:
        self._loop = loop
        self.producer = producer
        """The asyncio producer underneath."""

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def put(self, values: Sequence[Any], keys: Sequence[Any] | None = None) -> None:
        """See :meth:`Producer.put <gridstream.producer.Producer.put>`."""
        self._loop.run(self.producer.put(values, keys))

    def flush(self) -> None:
        """See :meth:`Producer.flush <gridstream.producer.Producer.flush>`."""
        self._loop.run(self.producer.flush())

    def close(self) -> None:
        """See :meth:`Producer.close <gridstream.producer.Producer.close>`."""
        self._loop.run(self.producer.close())

    def abort(self) -> None:
        """See :meth:`Producer.abort <gridstream.producer.Producer.abort>`."""
        self._loop.run(self.producer.abort())

    @property
    def acknowledged(self) -> int:
        """Records whose send was acknowledged."""
        return self.producer.acknowledged

    @property
    def sends(self) -> int:
        """Sends made so far."""
        return self.producer.sends

    @property
    def unsent(self) -> list[tuple[list[Any] | None, list[Any]]]:
        """See :attr:`Producer.unsent <gridstream.producer.Producer.unsent>`."""
        return self.producer.unsent
