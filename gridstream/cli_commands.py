"""The operator's commands of ``gridstream`` that look at a whole cluster:
dead letters, cluster health, metrics addresses, sending a file's records,
and the one message every command prints when the scheduler cannot be
reached (kept apart from gridstream.cli, which holds the parser and the job
commands)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gridstream import rpc
from gridstream.config import SecurityConfig
from gridstream.errors import DeadlineExceeded, Unavailable, from_rpc_error
from gridstream.producer import Producer
from gridstream.recordfeed import RecordFeed
from gridstream.types import Member
from gridstream.v1 import scheduler_pb2

UNREACHABLE_EXIT_CODE = 2
"""Exit status of a command that could not reach the scheduler (as for a
configuration error: nothing was done)."""

ROLE_NAMES: dict[int, str] = {scheduler_pb2.MEMBER_ROLE_WORKER: "worker",
              scheduler_pb2.MEMBER_ROLE_STATE_SERVER: "stateserver"}
MEMBER_STATES = {0: "gone", 1: "alive", 2: "suspect", 3: "dead", 4: "leaving"}


def unreachable_message(address: str) -> str:
    """What an operator reads when the cluster is down, instead of gRPC's text."""
    return (f"cannot reach the scheduler at {address} (is the cluster up? see "
            "`gridstream up`)")


async def check_serving(address: str, security: SecurityConfig | None,
                        timeout_s: float) -> str:
    """One health check of a gRPC server: ``"SERVING"`` or why not. Retries
    until ``timeout_s`` while the answer is no answer (a member that is
    starting), never longer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer"
    async with rpc.open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return last
            try:
                response = await stub.Check(health_pb2.HealthCheckRequest(),
                                            timeout=min(1.0, left))
                return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
            except grpc.aio.AioRpcError as exc:
                last = exc.code().name
            await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))


async def scheduler_reachable(address: str, security: SecurityConfig | None) -> bool:
    """True when the scheduler answers its health service (quickly): tells a
    cluster that is down from a member that failed behind a running scheduler."""
    return await check_serving(address, security, timeout_s=1.5) == "SERVING"


async def describe_failure(exc: BaseException, address: str,
                           security: SecurityConfig | None) -> str:
    """The message of a command's failure: the unreachable-scheduler sentence
    when the call could not get through and the scheduler does not answer,
    otherwise the error's own text."""
    if isinstance(exc, grpc.aio.AioRpcError):
        exc = from_rpc_error(exc)
    if (isinstance(exc, Unavailable | DeadlineExceeded) and address
            and not await scheduler_reachable(address, security)):
        return unreachable_message(address)
    return str(exc)


@dataclass(frozen=True)
class MemberHealth:
    """One line of ``gridstream health``."""

    name: str
    role: str
    address: str
    state: str
    health: str

    @property
    def ok(self) -> bool:
        """Serving, or left the cluster on purpose (gone: nothing to check)."""
        return self.health == "SERVING" or self.state == "gone"

    def line(self) -> str:
        """The member's line: name, role, address, scheduler's view, health."""
        return (f"{self.name:<14}{self.role:<13}{self.address:<22}{self.state:<9}"
                f"{self.health}")


async def cluster_health(scheduler: str, security: SecurityConfig | None,
                         timeout_s: float) -> list[MemberHealth]:
    """The scheduler's health, then every member the scheduler lists, each
    checked on its own gRPC health service (concurrently). Raises
    :class:`Unavailable` when the scheduler does not serve."""
    from gridstream.client import Client

    own = await check_serving(scheduler, security, timeout_s)
    if own != "SERVING":
        raise Unavailable(f"scheduler health: {own}")
    async with Client(scheduler, security=security) as client:
        status = await client.status()
    members = [m.member for m in status.members]

    async def one(member: Member) -> MemberHealth:
        state = MEMBER_STATES.get(member.state, "?")
        health = ("-" if state == "gone"
                  else await check_serving(member.address, security, timeout_s))
        return MemberHealth(member.node_id, ROLE_NAMES.get(member.role, "?"), member.address,
                            state, health)

    checked = await asyncio.gather(*(one(m) for m in members))
    return [MemberHealth("scheduler", "scheduler", scheduler, "-", own), *checked]


async def run_health(args: argparse.Namespace, scheduler: str,
                     security: SecurityConfig) -> int:
    """``gridstream health [ADDRESS]``: one address (container health checks),
    or the whole cluster: exit 0 when every member serves, 1 otherwise."""
    if args.address:
        answer = await check_serving(args.address, security, args.timeout)
        if answer != "SERVING":
            print(f"{args.address}: not serving ({answer})", file=sys.stderr)
            return 1
        print(f"{args.address}: SERVING")
        return 0
    members = await cluster_health(scheduler, security, args.timeout)
    print(f"{'member':<14}{'role':<13}{'address':<22}{'state':<9}health")
    for member in members:
        print(member.line())
    bad = [m.name for m in members if not m.ok]
    if bad:
        print(f"not serving: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


async def run_dead_letters(args: argparse.Namespace, scheduler: str,
                           security: SecurityConfig) -> int:
    """``gridstream dead-letters JOB``: one JSON object per line (id, stage,
    key, record as JSON where representable, record_format, error and its
    traceback), for jq and log tools; nothing on stdout when there are none."""
    from gridstream.client import Client

    async with Client(scheduler, security=security) as client:
        letters = await client.dead_letters(args.job_id)
    if not letters:
        print(f"job {args.job_id} has no dead letters", file=sys.stderr)
        return 0
    for letter in letters[: args.limit or None]:
        print(json.dumps(letter.to_json()))
    return 0


def metrics_by_address(run_dir: str | Path) -> dict[str, str]:
    """Member address -> metrics address, from the ready files of a local
    cluster (``gridstream up --run-dir``); empty when there are none."""
    found: dict[str, str] = {}
    for path in sorted(Path(run_dir, "ready").glob("*.json")):
        try:
            ready = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(ready, dict) and ready.get("address") and ready.get("metrics"):
            found[str(ready["address"])] = str(ready["metrics"])
    return found


SEND_CHUNK_RECORDS = 50_000
"""Records read from a file and not yet handed to the sender at most (a file
is never held whole; see :class:`gridstream.recordfeed.RecordFeed`)."""


def read_records(path: str, fmt: str, key_field: str | None
                 ) -> Iterator[tuple[Any, Any]]:
    """(key or None, record) per line of a JSON-lines file or row of a CSV
    file (a dict of strings, by the header), ``-`` meaning stdin. With
    ``key_field``, the key is that field of the record (a str or int; the
    record keeps it too). Raises ValueError naming the line of a bad one."""
    handle = _stdin_text() if path == "-" else open(path, newline="", encoding="utf-8")
    with handle:
        rows: Iterator[tuple[int, Any]]
        if fmt == "csv":
            rows = ((n + 2, row) for n, row in enumerate(csv.DictReader(handle)))
        else:
            rows = _json_lines(handle)
        for line, record in rows:
            if key_field is None:
                yield None, record
                continue
            if not isinstance(record, dict) or key_field not in record:
                raise ValueError(f"{path}, line {line}: the record has no field {key_field!r} "
                                 "to key it by")
            key = record[key_field]
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ValueError(f"{path}, line {line}: field {key_field!r} is "
                                 f"{type(key).__name__}; keys must be str or int")
            yield key, record


def _stdin_text() -> TextIO:
    """Standard input read as a file given by its path is: UTF-8 whatever the
    locale says, and lines left as they are (``newline=""``, which the csv
    module needs for a quoted field that holds a line end). File descriptor
    0 stays open."""
    raw = open(sys.stdin.fileno(), "rb", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _json_lines(handle: TextIO) -> Iterator[tuple[int, Any]]:
    for line, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            yield line, json.loads(text)
        except ValueError as exc:
            raise ValueError(f"line {line} is not JSON: {exc}") from None


def send_format(path: str, fmt: str | None) -> str:
    """The file's format: as given, else ``csv`` for a ``.csv`` file and
    JSON lines otherwise."""
    return fmt or ("csv" if path.lower().endswith(".csv") else "jsonl")


async def run_send(args: argparse.Namespace, scheduler: str, security: SecurityConfig) -> int:
    """``gridstream send JOB FILE``: the file's records in batches through
    the SDK. With ``--key-field``, each record goes to its key's partition,
    so one key's records are processed in the file's order (without keys,
    batches are spread over the partitions and no order is kept), and the
    key stays on the record to the sink, where it keys the result row."""
    from gridstream.client import Client

    if await asyncio.to_thread(os.path.isdir, args.file):
        return await run_send_directory(args, scheduler, security)
    fmt = send_format(args.file, args.format)
    feed = RecordFeed(read_records(args.file, fmt, args.key_field), SEND_CHUNK_RECORDS,
                      name=f"reading {args.file}")
    read_error: OSError | ValueError | None = None
    async with Client(scheduler, batch_size=args.batch_size, security=security) as client:
        # Records go on as they are read (a pipe's too, not once a chunk
        # fills): everything put while a send is in flight is the next send.
        # A failed send ends the command at once, even while the input
        # has nothing new to read.
        async with Producer(client, args.job_id, max_send_records=SEND_CHUNK_RECORDS,
                            max_buffered_records=SEND_CHUNK_RECORDS) as producer:
            reading = asyncio.create_task(_put_as_read(feed, producer, bool(args.key_field)),
                                          name=f"sending {args.file}")
            stopped = asyncio.create_task(producer.wait_stopped(),
                                          name=f"watching the sends of {args.file}")
            try:
                await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                reading.cancel()
                stopped.cancel()
                outcome, _ = await asyncio.gather(reading, stopped, return_exceptions=True)
            if isinstance(outcome, OSError | ValueError):
                read_error = outcome  # what was read before it is still sent
            elif isinstance(outcome, Exception):
                raise outcome
            # Otherwise the input ended, or a send failed: leaving the
            # producer flushes, and raises that failure with its counts.
        total = producer.acknowledged
    if read_error is not None:
        print(f"gridstream: {read_error} ({total} records were sent before it)", file=sys.stderr)
        return 1
    how = (f"keyed by {args.key_field!r}" if args.key_field
           else "without keys: no order is kept between batches; --key-field keeps each key's")
    print(f"sent {total} records to job {args.job_id} ({how})")
    return 0


async def _put_as_read(feed: RecordFeed[tuple[Any, Any]], producer: Producer,
                       keyed: bool) -> None:
    """Puts the (key, record) pairs into the producer as the feed reads them."""
    async with contextlib.aclosing(feed.batches()) as batches:
        async for chunk in batches:
            await producer.put([record for _, record in chunk],
                               [key for key, _ in chunk] if keyed else None)


async def run_send_directory(args: argparse.Namespace, scheduler: str,
                             security: SecurityConfig) -> int:
    """``gridstream send JOB DIR [--follow]``: the directory's files exactly
    once through :class:`gridstream.filesource.DirectorySource`, resuming
    from its cursor; with ``--follow`` until SIGTERM or Ctrl-C."""
    import signal

    from gridstream.client import Client
    from gridstream.filesource import DirectorySource

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Client(scheduler, batch_size=args.batch_size, security=security) as client:
        source = DirectorySource(client, args.job_id, args.file, args.cursor,
                                 key_field=args.key_field, fmt=args.format,
                                 chunk_records=args.chunk_records)
        try:
            total = await source.run(follow=args.follow, stop=stop)
        except (OSError, ValueError) as exc:
            print(f"gridstream: {exc} ({source.records_sent} records were sent before it; "
                  f"the cursor {source.cursor_path} resumes after them)", file=sys.stderr)
            return 1
    print(f"sent {total} records of {len(source.cursor.done)} files to job {args.job_id} "
          f"(cursor {source.cursor_path})")
    return 0
