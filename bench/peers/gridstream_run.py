"""gridstream's side of the peer comparison: a fresh local cluster (1 scheduler,
3 workers, 2 state servers, each its own process) runs one workload from the
data file in one delivery mode.

The cluster is started before the timed window and stopped after it, so a
run's CPU and peak memory belong to that run alone and an idle cluster never
competes with the other systems' runs. The window covers what a user waits
for: reading the file, submitting the job (its stages name the same user
functions every system runs), sending every record, draining, reading the
results table and writing the result file. The CPU counted is this client
process's plus every member's (``/proc/<pid>/stat``).

taxi records are sent keyed by their device (``common.device_keys_of``, a slice
rather than a JSON parse) so each device's positions stay in order, as the
demo does, and the job says so: its ``track`` reduce is prepartitioned (keyed
by the device too), so it runs in the task that parses, with no shuffle
between them, as a Bytewax dataflow on one worker exchanges nothing (a record
found in another partition would go to dead letters and fail the check).
wordcount lines are spread over the partitions unkeyed.

The file is read as a streaming producer reads it: :data:`READ_CHUNK_RECORDS`
lines at a time, in a thread, each chunk handed to ``Client.send`` as soon as
it is read (and keyed), while the next is read. The SDK keeps a client's
sends to a job in call order per partition, so a device's positions still
arrive in order. Reading the whole file before the first send (as this
runner did until 2026-12-04) left the cluster idle for the half second the
reading and keying took.

Run by gridstream's own interpreter (``.venv``):

    .venv/bin/python bench/peers/gridstream_run.py --workload taxi --delivery exactly_once \
        --input taxi.jsonl --output result.json --stats stats.json --run-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from common import REPO_ROOT, arguments, device_keys_of, measured, read_line_chunks, write_result

sys.path.insert(0, str(REPO_ROOT))

from gridstream.client import DEFAULT_BATCH_SIZE, Client
from gridstream.config import Config
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster

BATCH_SIZE = DEFAULT_BATCH_SIZE
"""Records per client batch: the SDK's default, as ``gridstream demo`` and
``bench/throughput.py`` send."""

READ_CHUNK_RECORDS = 200_000
"""Lines read, and sent, at a time: about one batch of at most
:data:`BATCH_SIZE` for each of the job's 12 partitions, so chunking adds no
pushes. Taxi exactly_once on an idle 2-core machine (2026-12-04), this
runner against the one that read the whole file first, five alternations:
3.36 to 3.52 s (median 3.41) against 3.41 to 3.68 s (3.50); in one client
process, four alternations: 3.25 to 3.36 s against 3.37 to 3.59 s (chunks
of 250,000, a second small batch per partition: 3.31 to 3.58 s against
3.40 to 3.80 s)."""


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=("wordcount", "taxi"), required=True)
    parser.add_argument("--delivery", default="exactly_once",
                        choices=("exactly_once", "at_least_once", "at_most_once"))
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="directory for the cluster's data and logs")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--state-servers", type=int, default=2)


async def run(args: argparse.Namespace) -> None:
    """Starts the cluster, runs the workload in the timed window, stops it."""
    async with LocalCluster(args.run_dir, Config(), workers=args.workers,
                            state_servers=args.state_servers) as cluster:
        pids = [member.pid for member in cluster.members.values()]
        with measured(args.stats, lambda: pids) as stats:
            keyed = args.workload == "taxi"
            spec = taxi.job(prepartitioned=True) if keyed else wordcount.job()
            spec = replace(spec, delivery=args.delivery)
            async with Client(cluster.scheduler_address, batch_size=BATCH_SIZE,
                              security=cluster.config.security) as client:
                job_id = await client.submit(spec)
                await send_file(client, job_id, args.input, keyed)
                await client.drain(job_id)
                result = await client.results(job_id)
            write_result(args.output, result)
            stats.notes = {"delivery": args.delivery, "workers": args.workers,
                           "state_servers": args.state_servers, "job": job_id}


def read_chunk(chunks: Iterator[list[str]], keyed: bool
               ) -> tuple[list[str], list[str] | None]:
    """The next chunk of the data file's records (none past its end), with
    their devices as keys when ``keyed``."""
    values = next(chunks, [])
    return values, device_keys_of(values) if keyed else None


async def send_file(client: Client, job_id: str, path: Path, keyed: bool) -> None:
    """Sends the data file's records to the job chunk by chunk: each chunk is
    read in a thread (the event loop meanwhile drives the pushes of the
    chunks before it) and sent as a task of its own; returns once every
    chunk is acknowledged. A send that fails cancels the other sends and
    stops the reading; the ExceptionGroup raised holds its error (the run
    fails, and the driver shows the log's traceback)."""
    async with asyncio.TaskGroup() as sends:
        with contextlib.closing(read_line_chunks(path, READ_CHUNK_RECORDS)) as chunks:
            while True:
                values, keys = await asyncio.to_thread(read_chunk, chunks, keyed)
                if not values:
                    break
                sends.create_task(client.send(job_id, values, keys))


def main() -> None:
    """Parses the command line and runs."""
    asyncio.run(run(arguments((__doc__ or "").split("\n\n")[0], _extra)))


if __name__ == "__main__":
    main()
