"""Running a Bytewax 0.21 dataflow the way ``python -m bytewax.run`` does,
inside the timed window of :func:`common.measured`.

``bytewax.run``'s command line ends in ``cli_main(flow, workers_per_process=...,
epoch_interval=..., recovery_config=...)``; calling it from the runner lets the
runner time the run itself rather than the interpreter's start and imports.
With recovery, the epoch (and so the snapshot) interval is the ``-s`` value,
1 s here, and the store must have been created beforehand with
``python -m bytewax.recovery DIR PARTITIONS`` (the driver does that, outside
the timed window); without it, the epoch is ``bytewax.run``'s default of 10 s.

The result is written with ``bytewax.connectors.files.FileSink``, one JSON
``[key, value]`` line per key, then turned into the result object every
runner writes (inside the window: it is how this system delivers its result).
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.connectors.files import FileSink
from bytewax.dataflow import Dataflow
from bytewax.operators import KeyedStream
from bytewax.recovery import RecoveryConfig
from bytewax.run import cli_main
from common import write_result

DEFAULT_EPOCH = timedelta(seconds=10)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Bytewax's options: workers (threads of this one process) and recovery."""
    parser.add_argument("--workers", type=int, default=1,
                        help="workers in this process (bytewax.run -w)")
    parser.add_argument("--recovery-dir", type=Path, default=None,
                        help="an initialised SQLite recovery store (bytewax.run -r); "
                             "recovery is off without it")
    parser.add_argument("--snapshot-interval", type=float, default=1.0,
                        help="seconds between snapshots with recovery (bytewax.run -s)")


def sink_to_file(step_id: str, results: KeyedStream[Any], path: Path) -> None:
    """Writes each (key, value) as one JSON ``[key, value]`` line."""
    lines = op.map(f"{step_id}_format", results,
                   lambda item: (item[0], json.dumps([item[0], item[1]])))
    op.output(step_id, lines, FileSink(path))


def run(flow: Dataflow, args: argparse.Namespace, sink_path: Path) -> None:
    """Runs ``flow`` to completion with the command line's workers and
    recovery, then converts the sink file into the result file."""
    if args.recovery_dir is not None:
        interval = timedelta(seconds=args.snapshot_interval)
        cli_main(flow, workers_per_process=args.workers, epoch_interval=interval,
                 recovery_config=RecoveryConfig(args.recovery_dir, timedelta(0)))
    else:
        cli_main(flow, workers_per_process=args.workers, epoch_interval=DEFAULT_EPOCH)
    result: dict[str, Any] = {}
    # FileSink creates its file with the first item: no file, no results.
    if sink_path.exists():
        with sink_path.open() as lines:
            for line in lines:
                key, value = json.loads(line)
                result[key] = value
    write_result(args.output, result)
