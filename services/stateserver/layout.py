"""The state server's on-disk layout (SQLite schema and its version) and the
records the store hands out. Kept apart from :mod:`services.stateserver.store`,
which is the behaviour: reading, writing, fencing and cleaning up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gridstream.errors import DataLoss, FailedPrecondition

ResultRow = tuple[str, str]
"""(key, JSON text of the value)."""

VersionedRow = tuple[str, str, int]
"""(key, JSON text of the value, version of the write that stored it)."""

DeadLetter = tuple[str, str, str, str]
"""(dead-letter id, stage, record text, error text)."""

VersionedDeadLetter = tuple[str, str, str, str, int]
"""A dead letter and the version of the write that stored it."""

SCHEMA_VERSION = 4
"""``PRAGMA user_version`` of the current layout; an older file is refused
with advice instead of being misread. 3: ``state_delta_entries`` became a
rowid table; 4: a delta's entries are stored as the packed chunks they
arrived in, ``state_delta_chunks`` (see :data:`STATE_TABLES`)."""


SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    job_id      TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    "window"    INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    checksum    TEXT    NOT NULL,
    payload     BLOB    NOT NULL,
    PRIMARY KEY (job_id, operator_id, "window")
);
CREATE TABLE IF NOT EXISTS results (
    job_id      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    value       TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    PRIMARY KEY (job_id, key)
);
-- No index by operator: it would move on every row write (each write raises
-- the row's version), which doubled the cost of a row (10 against 5.5 us in
-- 230-row upserts); only a replica catching up reads rows by operator: one
-- pass over the job's rows in key order per operator (docs/stateservers.md).
-- Files of layout 3 that still have the index lose it here (nothing else
-- changed, so the layout number stays).
DROP INDEX IF EXISTS results_by_operator;
CREATE TABLE IF NOT EXISTS dead_letters (
    job_id      TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    stage       TEXT    NOT NULL,
    record      TEXT    NOT NULL,
    error       TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    PRIMARY KEY (job_id, id)
);
CREATE INDEX IF NOT EXISTS dead_letters_by_operator
    ON dead_letters (job_id, operator_id, version);
CREATE TABLE IF NOT EXISTS state_heads (
    job_id      TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    base_window INTEGER NOT NULL,
    base_epoch  INTEGER NOT NULL,
    base_header BLOB    NOT NULL,
    head_window INTEGER NOT NULL,
    PRIMARY KEY (job_id, operator_id)
);
CREATE TABLE IF NOT EXISTS state_entries (
    job_id      TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    stage       TEXT    NOT NULL,
    key         BLOB    NOT NULL,
    value       BLOB    NOT NULL,
    PRIMARY KEY (job_id, operator_id, stage, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state_deltas (
    job_id      TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    "window"    INTEGER NOT NULL,
    parent      INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    header      BLOB    NOT NULL,
    size        INTEGER NOT NULL,
    PRIMARY KEY (job_id, operator_id, "window")
);
CREATE TABLE IF NOT EXISTS state_delta_chunks (
    job_id      TEXT    NOT NULL,
    operator_id TEXT    NOT NULL,
    "window"    INTEGER NOT NULL,
    chunk       INTEGER NOT NULL,
    entries     BLOB    NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (job_id, operator_id, "window", chunk)
);
CREATE TABLE IF NOT EXISTS operators (
    job_id          TEXT    NOT NULL,
    operator_id     TEXT    NOT NULL,
    epoch           INTEGER NOT NULL,
    results_version INTEGER NOT NULL,
    PRIMARY KEY (job_id, operator_id)
);
"""

META_COLUMNS = 'job_id, operator_id, "window", epoch, size, checksum'

STATE_TABLES = ("state_heads", "state_entries", "state_deltas", "state_delta_chunks")
"""The tables of operators' keyed state (window deltas compacted into a base):

- ``state_heads``: per operator, the base window (every compacted window)
  with its header, and the newest window held (the head of the chain);
- ``state_entries``: the base, one row per key (msgpack key and value);
- ``state_deltas``: windows after the base, each on top of its parent;
- ``state_delta_chunks``: their entries, as the msgpack chunks a PutState
  carried them in (an array of [stage, key, value], or [stage, key] for a
  deleted key; key and value each msgpack-encoded), in order; a reader
  applies them in that order, so a key written twice keeps the later value.
  A window's entries are written together, read together and deleted
  together by a fold, and nothing looks up one key of a delta, so a row per
  chunk, not per key: storing a taxi job's last windows (about 10,000
  tracks of 800 bytes a state server) took SQLite 130 to 150 ms as a row
  per key, the longest part of the job's drain (layout 4; layout 3 held a
  row per key, in a rowid table so that values up to a page stayed in its
  leaves).

Compaction folds the oldest deltas into the base in one transaction, so a
crash between storing a delta and folding it leaves base + deltas, which
read as the same state."""


class OlderLayout(RuntimeError):
    """The data file was written by an older layout: the server refuses to
    start on it (its message names the fix) rather than misread it."""


class SnapshotCorrupted(DataLoss):
    """A stored snapshot no longer matches its checksum; it is never handed out."""


class ChunkUnreadable(DataLoss):
    """A stored chunk of a window delta that no longer decodes as entries:
    checked on arrival, so damaged on disk since. A read refuses it with
    DATA_LOSS (a reader then takes another replica's copy) and a fold leaves
    the chain as it is, rather than hand out or fold half a window."""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What identifies and guards one window snapshot (mirrors the proto message)."""

    job_id: str
    operator_id: str
    window: int
    epoch: int
    size: int
    checksum: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A window snapshot whose payload matched its checksum when read."""

    meta: SnapshotMeta
    payload: bytes


Entry = tuple[str, bytes, bytes | None]
"""One key of a window of keyed state: (stage, msgpack key, msgpack value),
the value None for a key deleted in the window."""


class MissingParent(FailedPrecondition):
    """A delta whose parent window this replica does not hold; catch-up from a
    peer fills the gap (or the writer sends a whole state). Nothing stored."""


@dataclass(frozen=True, slots=True)
class StateWindow:
    """One window of an operator's keyed state, as PutState delivers it."""

    job_id: str
    operator_id: str
    window: int
    epoch: int
    parent: int | None
    """The window this delta applies on top of; None for a whole state."""
    header: bytes
    """msgpack of the window's offsets and sequences (opaque to the store)."""
    entries: list[Entry]
    chunks: list[tuple[bytes, int]] | None = None
    """The packed chunks (msgpack entries, count) ``entries`` arrived in, when
    they came in a PutState: a delta stores them as they are. None: packed
    from ``entries`` when stored."""
    entries_size: int | None = None
    """The keys' and values' bytes of a delta that came in a PutState, whose
    ``entries`` are then left empty (its ``chunks`` are all that is stored,
    checked without decoding: rows.state_entries_size). None: the sum over
    ``entries``."""


@dataclass(frozen=True, slots=True)
class StateHead:
    """Which windows of an operator's keyed state a store holds."""

    base_window: int
    head_window: int
    deltas: int


@dataclass(frozen=True, slots=True)
class OperatorHoldings:
    """What this store holds of one operator; replicas compare these to catch up."""

    job_id: str
    operator_id: str
    latest_window: int | None
    """Newest window snapshot held, None when none."""
    results_version: int
    """Highest version of the operator's result writes held (0: none)."""
    epoch: int
    """The fence: highest writer epoch accepted for the operator."""
    state_window: int | None = None
    """Newest window of keyed state (state chain) held, None when none."""


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Figures for status displays and leak checks (snapshot count must stay flat)."""

    snapshots: int
    snapshot_bytes: int
    commits: int
    writes: int


def meta_from_row(row: Any) -> SnapshotMeta:
    """A SnapshotMeta from a row of ``_META_COLUMNS``."""
    return SnapshotMeta(
        job_id=row[0], operator_id=row[1], window=row[2], epoch=row[3], size=row[4],
        checksum=row[5],
    )
