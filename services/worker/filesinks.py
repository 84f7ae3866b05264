"""A files sink on the worker that owns the partition: one file per window,
committed atomically once the window's snapshot is durable.

The commit protocol, under the idempotence rule (docs/recovery.md):

1. **Seal** (the window closes, in the task's loop): the records the sink
   received since the last window become one file, named by the container
   offsets it covers (:func:`gridstream.filesink.final_name`). The file is
   added to the sink's *pending list*, which lives in the operator's state
   (a state entry of the sink stage), so the window snapshot itself records
   which files it commits.
2. **Prepare** (the persister, before it writes the window's snapshot): every
   sealed file is written under a temporary name of this owner and fsynced.
3. **Commit** (once the snapshot is durable): the files of that window and
   those before it are renamed into place and leave the pending list (the
   next window records that).
4. **Recover** (a new owner, after restoring the newest durable window and
   before it processes anything): the restored pending list names the files
   that window covers whose rename may not have happened: each temporary
   file still there is renamed into place (a rename already done is
   recognised by the temporary file being gone). Every other temporary file
   of the partition belongs to a window that never became durable (its
   records are replayed after the restored offset) and is deleted.

A replay starts at the restored window's offset, after every committed file,
so no record is written to two committed files; a superseded owner's
snapshots are refused by the state servers, so its temporary files are
never named by a durable window (and a rename it raced with the new owner
renames a complete, fsynced file that the durable window names).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridstream import filesink
from gridstream.jobspec import Stage
from gridstream.retry import Backoff
from services.worker.operators import OperatorChain

log = logging.getLogger(__name__)

PENDING = "pending"
"""The sink state's key holding the files sealed and not known committed,
as [temporary name, final name] pairs."""


@dataclass
class Sealed:
    """A file of one window, from seal to commit."""

    window: int
    temp: str
    final: str
    records: list[Any]
    written: bool = False


class FileSinkWriter:
    """The files sink of one (job, task, partition)."""

    def __init__(self, stage: Stage, job_id: str, partition: int,
                 chain: Callable[[], OperatorChain], epoch: Callable[[], int],
                 name: str) -> None:
        """``chain`` gives the task's operator chain now (a restore may adopt
        a standby's): the sink stage's state there holds the pending list,
        so it goes into window snapshots."""
        self.fmt = str(stage.params.get("format", "jsonl"))
        self.directory = filesink.sink_dir(str(stage.params["path"]), job_id, stage.name)
        self.partition = partition
        self.stage = stage.name
        self.chain = chain
        self.epoch = epoch
        self.name = name
        self.start = 0
        """Container offset where the open window began."""
        self.buffered: list[Any] = []
        self.sealed: list[Sealed] = []
        self.files_committed = 0

    def add(self, rows: dict[Any, Any]) -> None:
        """A batch's sink records, in order."""
        self.buffered.extend(rows.values())

    @property
    def state(self) -> dict[Any, Any]:
        """The sink stage's state in the chain (holds :data:`PENDING`)."""
        return self.chain().states[self.stage]

    def _set_pending(self, pending: list[list[str]]) -> None:
        self.state[PENDING] = pending  # replaced, never mutated: snapshots share it
        self.chain().touched[self.stage].add(PENDING)

    def seal(self, window: int, end: int) -> None:
        """Closes the open window at container offset ``end``: its records (if
        any) become a file, named by the offsets, on the pending list."""
        start, self.start = self.start, end
        if not self.buffered:
            return
        final = filesink.final_name(self.partition, start, end, self.fmt)
        temp = filesink.temp_name(final, self.epoch())
        self.sealed.append(Sealed(window, temp, final, self.buffered))
        self.buffered = []
        self._set_pending([*self.state.get(PENDING, []), [temp, final]])

    async def prepare(self) -> None:
        """Writes and fsyncs every sealed file not yet written (before the
        snapshot that names it is written)."""
        for sealed in list(self.sealed):
            if not sealed.written:
                data = await asyncio.to_thread(filesink.encode, sealed.records, self.fmt)
                await asyncio.to_thread(filesink.write_durably, self.directory, sealed.temp,
                                        data)
                sealed.written = True

    async def commit(self, window: int) -> None:
        """Renames the files of windows up to ``window`` (now durable) into
        place; retried until done (a durable window's files must not stay
        uncommitted while this owner lives)."""
        ready = [s for s in self.sealed if s.window <= window and s.written]
        if not ready:
            return
        backoff = Backoff(f"{self.name}: committing files", first_s=0.05, max_s=2.0)
        for sealed in ready:
            while True:
                try:
                    await asyncio.to_thread(filesink.commit, self.directory, sealed.temp,
                                            sealed.final)
                    break
                except OSError as exc:
                    log.warning("%s: renaming %s into place failed (%s); retrying", self.name,
                                sealed.final, exc)
                    await backoff.wait(exc)
            self.files_committed += 1
        done = {s.temp for s in ready}
        self.sealed = [s for s in self.sealed if s.temp not in done]
        self._set_pending([p for p in self.state.get(PENDING, []) if p[0] not in done])

    async def recover(self, offset: int) -> None:
        """After a restore at container ``offset``: commits the files the
        restored window names, deletes every other temporary file of the
        partition (windows that never became durable), and starts the next
        window at ``offset``."""
        self.start = offset
        pending = list(self.state.get(PENDING, []))
        committed = 0
        for temp, final in pending:
            if await asyncio.to_thread(filesink.commit, self.directory, str(temp), str(final)):
                committed += 1
        stale = await asyncio.to_thread(self._delete_stale)
        if pending:
            self._set_pending([])
        if pending or stale:
            log.info("%s: files sink recovered at offset %d: %d of %d pending files committed "
                     "now (the others were already), %d uncommitted temporary files deleted",
                     self.name, offset, committed, len(pending), stale)

    def _delete_stale(self) -> int:
        if not self.directory.is_dir():
            return 0
        prefix = filesink.temp_prefix(self.partition)
        deleted = 0
        for entry in self.directory.iterdir():
            if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                entry.unlink(missing_ok=True)
                deleted += 1
        return deleted


def writer_of(chain: OperatorChain, job_id: str, partition: int,
              current: Callable[[], OperatorChain], epoch: Callable[[], int],
              name: str) -> FileSinkWriter | None:
    """The files sink of a task whose chain ends in one; None otherwise."""
    if not chain.file_sink:
        return None
    return FileSinkWriter(chain.stages[-1], job_id, partition, current, epoch, name)


def directory_of(stage: Stage, job_id: str) -> Path:
    """Where a files sink stage writes (for logs and tests)."""
    return filesink.sink_dir(str(stage.params["path"]), job_id, stage.name)
