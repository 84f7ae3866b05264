"""TaskRunner: one (job, task, partition) — a JobContainer feeding a JobOperator
chain, with its shuffle, double buffer and persister.

The loop, per batch, follows the seed's method: take the batch (LatestSnapshot
os=false), run the chain, emit the output and wait for its acknowledgement,
then mark it done (os=true, offset+1) and add it to the WindowSnapshot. When
the window reaches W records, its state and offsets go to the Persister, which
writes them asynchronously; sink rows go with them. When the container runs
empty, pending sink rows are flushed too (the seed persists its map "when its
input queue runs empty").
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from gridstream import codec
from gridstream.ids import container_id, key_text, operator_id, task_channel
from gridstream.jobspec import JobSpec, Stage, resolve
from gridstream.v1 import common_pb2
from services.worker.operators import DeadLetter, OperatorChain
from services.worker.peers import PeerRouter, StateClient
from services.worker.queues import JobContainer
from services.worker.shuffle import Shuffle
from services.worker.snapshots import LatestSnapshot, PendingSnapshot, Persister, WindowSnapshot

log = logging.getLogger(__name__)


def _row_key(key: Any) -> str:
    return key if isinstance(key, str) else key_text(key)


def _json(value: Any) -> str:
    return json.dumps(value, default=repr, separators=(",", ":"))


class TaskRunner:
    """Runs one task of one partition until cancelled."""

    def __init__(
        self,
        job_id: str,
        spec: JobSpec,
        tasks: list[list[Stage]],
        task_index: int,
        partition: int,
        router: PeerRouter,
        state: StateClient,
        max_records: int,
        batch_records: int,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.task_index = task_index
        self.partition = partition
        self.operator_id = operator_id(job_id, task_index, partition)
        self.container = JobContainer(container_id(job_id, task_index, partition), max_records)
        stages = tasks[task_index]
        self.chain = OperatorChain(stages, f"job {spec.name}, task {task_index}")
        self.shuffle: Shuffle | None = None
        if task_index + 1 < len(tasks):
            nxt = tasks[task_index + 1][0]
            self.shuffle = Shuffle(
                job_id,
                task_index + 1,
                nxt.name,
                spec.partitions,
                resolve(nxt.key, f"job {spec.name}, stage {nxt.name}, key"),
                task_channel(task_index, partition),
                router,
                batch_records,
            )
        self.state_client = state
        self.window_size = spec.window_size
        self.latest = LatestSnapshot(
            state=self.chain.states, functions=tuple(s.function for s in stages)
        )
        self.window = WindowSnapshot()
        self.persister = Persister(self._write_rows, self._write_snapshot, self._durable,
                                   self.operator_id)
        self._rows: dict[Any, Any] = {}
        self._dead: list[DeadLetter] = []
        self.records_processed = 0
        self.records_out = 0
        self.dead_letters = 0
        self.outbound_pending = 0
        self.epoch = 0

    async def run(self) -> None:
        """Processes batches forever; the persister runs beside it."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.persister.run(), name=f"persist {self.operator_id}")
            group.create_task(self._loop(), name=f"operate {self.operator_id}")

    async def _loop(self) -> None:
        container = self.container
        while True:
            offset = self.latest.offset
            entry = await container.take(offset)
            self.latest.begin(entry.channel, entry.sequence, offset)
            batch_id = f"{entry.channel}#{entry.sequence}"
            result = self.chain.process(entry.keys, entry.values, batch_id)
            dead = result.dead_letters
            if self.shuffle is not None and result.values:
                segments = self.shuffle.split(result.values, batch_id, dead)
                self.outbound_pending = len(segments)
                await self.shuffle.deliver(segments)
                self.outbound_pending = 0
                self.records_out += sum(len(s.values) for s in segments)
            self.latest.finish(offset + 1)
            await container.mark_consumed(offset + 1)
            self.records_processed += entry.count
            self.window.add(entry.channel, entry.sequence, offset, entry.count)
            if result.sink_rows:
                self._rows.update(result.sink_rows)
            if dead:
                self.dead_letters += len(dead)
                self._dead.extend(dead)
            if self.window.records >= self.window_size:
                self._close_window()
            elif container.pending_batches == 0 and (self._rows or self._dead):
                self._flush()

    def _flush(self, snapshot: PendingSnapshot | None = None) -> None:
        rows, self._rows = self._rows, {}
        dead, self._dead = self._dead, []
        self.persister.submit(rows, dead, snapshot)

    def _close_window(self) -> None:
        offset = self.latest.offset
        payload = codec.pack({
            "window": self.window.window,
            "offset": offset,
            "out_sequences": dict(self.shuffle.sequences) if self.shuffle else {},
            "in_sequences": self.container.sequences(),
            "state": self.chain.snapshot_state(),
            "functions": list(self.latest.functions),
            "batches": self.window.batches,
        })
        number = self.window.close()
        self._flush(PendingSnapshot(number, offset, payload))

    async def _write_rows(self, rows: dict[Any, Any], dead: list[DeadLetter]) -> None:
        encoded = [[_row_key(k), _json(v)] for k, v in rows.items()]
        chunk = 5_000
        for start in range(0, max(len(encoded), 1), chunk):
            part = encoded[start:start + chunk]
            dead_part = dead if start == 0 else []
            if part or dead_part:
                await self.state_client.write_results(
                    self.job_id, self.operator_id, part, dead_part
                )

    async def _write_snapshot(self, snapshot: PendingSnapshot) -> None:
        await self.state_client.put_snapshot(
            self.job_id, self.operator_id, snapshot.window, self.epoch, snapshot.payload
        )

    def _durable(self, offset: int) -> None:
        self.container.trim(offset)

    def progress(self, node_id: str) -> common_pb2.TaskProgress:
        """Counters for the scheduler's drain check and for status displays."""
        return common_pb2.TaskProgress(
            task=self.task_index,
            partition=self.partition,
            records_in=self.container.records_in,
            records_processed=self.records_processed,
            records_out=self.records_out,
            queue_batches=self.container.pending_batches,
            queue_records=self.container.pending_records,
            outbound_pending=self.outbound_pending,
            windows_persisted=self.persister.windows_persisted,
            persist_pending=self.persister.pending + len(self._rows) + len(self._dead),
            dead_letters=self.dead_letters,
            node_id=node_id,
        )
