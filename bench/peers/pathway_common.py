"""Running a Pathway 0.33 program inside the timed window of
:func:`common.measured`, with filesystem persistence on or off.

Input is read with ``pw.io.plaintext.read(..., mode="static")`` (one row per
line, then the source closes, so ``pw.run`` returns once all is computed);
the result table is written with ``pw.io.jsonlines.write``, a stream of
updates (``diff`` +1/-1 at a ``time``), which :func:`run` folds into the final
rows and the result file every runner writes (inside the window: it is how
this system delivers its result). Persistence uses
``pw.persistence.Config(pw.persistence.Backend.filesystem(DIR))`` with 1 s
snapshots, the interval Bytewax's recovery runs with; the driver gives every
run a fresh, empty directory, so nothing is replayed. The monitoring
dashboard is off; telemetry is off without a license key (none is set).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pathway as pw
from common import write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Pathway's options: the persistence directory and snapshot interval."""
    parser.add_argument("--persistence-dir", type=Path, default=None,
                        help="filesystem persistence root (empty); persistence is off without it")
    parser.add_argument("--snapshot-interval-ms", type=int, default=1000,
                        help="milliseconds between persisted snapshots")


def run(table: pw.Table, args: argparse.Namespace) -> None:
    """Writes ``table`` (columns ``key`` and ``value``) with
    ``pw.io.jsonlines``, runs the program to completion and turns the update
    stream into the result file."""
    updates_path = args.output.with_suffix(".updates.jsonl")
    updates_path.unlink(missing_ok=True)
    pw.io.jsonlines.write(table, updates_path)
    config = None
    if args.persistence_dir is not None:
        config = pw.persistence.Config(pw.persistence.Backend.filesystem(args.persistence_dir),
                                       snapshot_interval_ms=args.snapshot_interval_ms)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE, persistence_config=config)
    updates = []
    with updates_path.open() as lines:
        for line in lines:
            row = json.loads(line)
            updates.append((row["time"], row["diff"], row["key"], row["value"]))
    result: dict[str, Any] = {}
    for _time, diff, key, value in sorted(updates, key=lambda update: update[:2]):
        if diff > 0:
            result[key] = value
        elif result.get(key) == value:
            del result[key]
    write_result(args.output, result)
