"""The "gridstream" Spark data source: a streaming (and batch) sink and a batch reader.

Why a Python Data Source rather than a JVM connector: the gridstream SDK is
Python, and pyspark >= 4.1 runs Python data source writers inside the
executors' Python workers and hands them Arrow record batches
(``DataSourceStreamArrowWriter``). Each Spark partition therefore sends its
rows straight to the workers that own the gridstream partitions; nothing is
collected to the driver.

Exactly once across Spark restarts. A micro-batch is identified by
(query id, batch id); within it, a task by its partition id. The executor reads
the query id and the batch id from the task's local properties
(``sql.streaming.queryId``, stable for a checkpoint, and
``streaming.sql.batchId``), which Spark's MicroBatchExecution sets on the
thread that launches the micro-batch and ships to every task. The task then
sends with ``producer = f"spark-{query_id}-{partition_id}"`` and
``first_sequence = (batch_id + 1) << 24`` (plus ``chunk << 10`` for the
chunk within the task); a micro-batch re-run after a restart from the
checkpoint, or a retried task, sends the same batches with the same sequences
and the containers acknowledge them as duplicates.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
)

from gridstream.client import Client
from gridstream.config import SecurityConfig
from gridstream.ids import (
    MICRO_BATCH_CHUNK_BITS,
    MICRO_BATCH_SEQUENCE_BITS,
    micro_batch_first_sequence,
)

NAME = "gridstream"
SEQUENCE_SHIFT = MICRO_BATCH_SEQUENCE_BITS
"""A micro-batch owns sequences [(batch_id + 1) << 24, (batch_id + 2) << 24)
(defined in :mod:`gridstream.ids`, with the other id spaces)."""
CHUNK_SHIFT = MICRO_BATCH_CHUNK_BITS
"""Within a micro-batch, chunk c of a task starts at ``c << 10``."""
BATCH_SIZE = 5_000
"""Records per SDK batch unless the ``batch_size`` option says otherwise:
smaller than the SDK's default because a task turns ``batch_size << 10`` rows
at a time into Python objects (one chunk), and that chunk bounds its memory."""
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
SECURITY_OPTIONS = ("tls_ca", "tls_cert", "tls_key", "token")
"""TLS to the cluster: the CA bundle, the client certificate and key (mutual
TLS), and a bearer token with the send and read rights."""


def security_from(opts: Mapping[str, str]) -> SecurityConfig | None:
    """The SDK security settings the options describe (None: plaintext)."""
    ca = opts.get("tls_ca") or ""
    token = opts.get("token") or ""
    if not ca:
        if opts.get("tls_cert") or opts.get("tls_key") or token:
            raise BridgeError('gridstream: "tls_cert", "tls_key" and "token" need "tls_ca" '
                              "(the cluster's CA bundle); tokens never travel in plaintext")
        return None
    return SecurityConfig(tls=True, ca_file=ca, cert_file=opts.get("tls_cert") or "",
                          key_file=opts.get("tls_key") or "", token=token)

_KEY_TYPES: tuple[type[DataType], ...] = (StringType, IntegerType, LongType, ShortType, ByteType)
_NATIVE_TYPES: tuple[type[DataType], ...] = (
    StringType, IntegerType, LongType, ShortType, ByteType, DoubleType, FloatType, BooleanType,
    NullType,
)


class BridgeError(ValueError):
    """A misconfigured query: the message says what to change."""


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, parsed and checked once on the driver."""

    scheduler: str
    job: str
    key: str | None
    value: tuple[str, ...]
    value_format: str  # "native" (msgpack values) or "json" (a JSON text per row)
    single: bool  # one value column: send its value rather than a dict
    batch_size: int
    order_by: str | None
    dead_letter_dir: str | None
    send_timeout_s: float
    producer: str | None  # batch writes: a stable producer name for exactly-once re-runs
    batch_id: int  # batch writes: which sequence range (foreach_batch_writer passes its batch id)
    security: SecurityConfig | None = None  # TLS and token, from tls_ca/tls_cert/tls_key/token


def _check_type(name: str, data_type: DataType, allowed: tuple[type[DataType], ...]) -> bool:
    if isinstance(data_type, allowed):
        return True
    if isinstance(data_type, ArrayType):
        return _check_type(name, data_type.elementType, allowed)
    if isinstance(data_type, MapType):
        return isinstance(data_type.keyType, StringType) and _check_type(
            name, data_type.valueType, allowed)
    if isinstance(data_type, StructType):
        return all(_check_type(f.name, f.dataType, allowed) for f in data_type.fields)
    return False


def parse_options(options: Mapping[str, str], schema: StructType) -> SinkOptions:
    """Checks the options against the query's schema; raises BridgeError with
    the fix when a column is missing or has a type gridstream cannot carry."""
    opts = {k.lower(): v for k, v in options.items()}
    for name in ("scheduler", "job"):
        if not opts.get(name):
            raise BridgeError(f'gridstream sink: option "{name}" is required, e.g. '
                              f'.option("{name}", ...)')
    security = security_from(opts)
    columns = {f.name: f for f in schema.fields}
    key = opts.get("key") or None
    if key is not None:
        if key not in columns:
            raise BridgeError(f"gridstream sink: key column {key!r} is not in the query's "
                              f"columns {sorted(columns)}; set .option('key', <column>)")
        if not isinstance(columns[key].dataType, _KEY_TYPES):
            raise BridgeError(
                f"gridstream sink: key column {key!r} has type "
                f"{columns[key].dataType.simpleString()}; keys must be string or integer "
                f"(cast it: df.withColumn({key!r}, col({key!r}).cast('string')))")
    if opts.get("value"):
        value = tuple(c.strip() for c in opts["value"].split(",") if c.strip())
        unknown = [c for c in value if c not in columns]
        if unknown:
            raise BridgeError(f"gridstream sink: value column(s) {unknown} not in the query's "
                              f"columns {sorted(columns)}")
        single = len(value) == 1
    else:
        value = tuple(columns)
        single = len(value) == 1
    value_format = opts.get("value_format", "native").lower()
    if value_format not in ("native", "json"):
        raise BridgeError('gridstream sink: value_format must be "native" or "json"')
    if value_format == "native":
        bad = [f"{c} ({columns[c].dataType.simpleString()})" for c in value
               if not _check_type(c, columns[c].dataType, _NATIVE_TYPES)]
        if bad:
            raise BridgeError(
                f"gridstream sink: column(s) {bad} cannot travel as msgpack values; cast them "
                "to string/number, or set .option('value_format', 'json')")
    order_by = opts.get("order_by") or None
    if order_by is not None and order_by not in columns:
        raise BridgeError(f"gridstream sink: order_by column {order_by!r} is not in the "
                          f"query's columns {sorted(columns)}")
    try:
        batch_size = int(opts.get("batch_size", BATCH_SIZE))
        send_timeout_s = float(opts.get("send_timeout_s", 60.0))
    except ValueError as exc:
        raise BridgeError(f"gridstream sink: batch_size/send_timeout_s must be numbers: {exc}"
                          ) from None
    if batch_size < 1:
        raise BridgeError("gridstream sink: batch_size must be >= 1")
    return SinkOptions(
        scheduler=opts["scheduler"], job=opts["job"], key=key, value=value,
        value_format=value_format, single=single, batch_size=batch_size, order_by=order_by,
        dead_letter_dir=opts.get("dead_letter_dir") or None, send_timeout_s=send_timeout_s,
        producer=opts.get("producer") or None, batch_id=int(opts.get("batch_id", 0)),
        security=security,
    )


@dataclass
class SentMessage(WriterCommitMessage):
    """What one task sent: rows accepted by the cluster and rows dead-lettered."""

    partition: int
    rows: int
    dead: int


def _to_values(table: pa.Table, options: SinkOptions) -> list[Any]:
    if options.single and options.value_format == "native":
        values: list[Any] = table.column(options.value[0]).to_pylist()
        return values
    rows: list[dict[str, Any]] = table.select(list(options.value)).to_pylist()
    if options.value_format == "json":
        if options.single:
            return [json.dumps(r[options.value[0]], default=str) for r in rows]
        return [json.dumps(r, default=str) for r in rows]
    return rows


def _dead_letter(table: pa.Table, options: SinkOptions, batch_id: int, partition: int,
                 reason: str) -> None:
    """Writes rejected rows as JSON lines; the file name is fixed per
    (batch, partition), so a re-run replaces rather than appends."""
    assert options.dead_letter_dir is not None
    os.makedirs(options.dead_letter_dir, exist_ok=True)
    path = os.path.join(options.dead_letter_dir, f"batch-{batch_id}-part-{partition}.jsonl")
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for row in table.to_pylist():
            out.write(json.dumps({"error": reason, "row": row}, default=str) + "\n")
    os.replace(tmp, path)


def send_partition(batches: Iterable[pa.RecordBatch], schema: pa.Schema | None,
                   options: SinkOptions, producer: str, batch_id: int,
                   partition: int) -> SentMessage:
    """Sends one Spark partition of one micro-batch to the cluster, from the
    executor, exactly once for (producer, batch_id). Rows with a null key go to
    the dead-letter directory, or fail the task with a message saying what to fix."""
    collected = list(batches)
    if not collected:
        return SentMessage(partition, 0, 0)
    table = pa.Table.from_batches(collected, schema=schema or collected[0].schema)
    dead = 0
    if options.key is not None:
        nulls = pc.is_null(table.column(options.key))
        dead = int(pc.sum(nulls).as_py() or 0)
        if dead:
            reason = f"null key column {options.key!r}"
            if options.dead_letter_dir is None:
                example = table.filter(nulls).slice(0, 1).to_pylist()[0]
                raise BridgeError(
                    f"gridstream sink: {dead} row(s) in batch {batch_id}, partition "
                    f"{partition} have a null key column {options.key!r} (e.g. {example}); "
                    f"filter them (df.where(col({options.key!r}).isNotNull())) or set "
                    ".option('dead_letter_dir', <dir>) to set them aside")
            _dead_letter(table.filter(nulls), options, batch_id, partition, reason)
            table = table.filter(pc.invert(nulls))
    if options.order_by is not None:
        table = table.sort_by([(options.order_by, "ascending")])
    chunk_rows = options.batch_size << CHUNK_SHIFT
    if (table.num_rows + chunk_rows - 1) // chunk_rows >= 1 << (SEQUENCE_SHIFT - CHUNK_SHIFT):
        raise BridgeError(f"gridstream sink: {table.num_rows} rows in one task exceed what a "
                          "micro-batch's sequence range holds; raise batch_size or lower "
                          "maxFilesPerTrigger/maxOffsetsPerTrigger")

    async def run() -> int:
        sent = 0
        async with Client(options.scheduler, batch_size=options.batch_size,
                          send_timeout_s=options.send_timeout_s,
                          security=options.security) as client:
            for chunk, start in enumerate(range(0, table.num_rows, chunk_rows)):
                part = table.slice(start, chunk_rows)
                keys = None
                if options.key is not None:
                    keys = [str(k) for k in part.column(options.key).to_pylist()]
                sent += await client.send(
                    options.job, _to_values(part, options), keys, producer=producer,
                    first_sequence=micro_batch_first_sequence(batch_id, chunk),
                )
        return sent

    return SentMessage(partition, asyncio.run(run()), dead)


def _task_ids() -> tuple[TaskContext, str | None, str | None]:
    context = TaskContext.get()
    if context is None:
        raise BridgeError("gridstream sink: write() must run inside a Spark task")
    return (context, context.getLocalProperty(QUERY_ID_PROPERTY),
            context.getLocalProperty(BATCH_ID_PROPERTY))


class GridstreamStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer: each task sends its partition of the micro-batch."""

    def __init__(self, options: SinkOptions) -> None:
        """Holds the parsed options; pickled to the executors."""
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessage:
        """Runs on an executor, once per (micro-batch, partition)."""
        context, query_id, batch_id = _task_ids()
        if query_id is None or batch_id is None:
            raise BridgeError("gridstream sink: this Spark did not set the streaming query id "
                              f"({QUERY_ID_PROPERTY}) and batch id ({BATCH_ID_PROPERTY}) on "
                              "the task; exactly-once needs them")
        partition = context.partitionId()
        return send_partition(iterator, None, self.options, f"spark-{query_id}-{partition}",
                              int(batch_id), partition)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task's records are acknowledged by the cluster; nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Sent batches stay sent; a re-run of the micro-batch is deduplicated."""


class GridstreamBatchWriter(DataSourceArrowWriter):
    """Batch (``df.write``) writer; exactly once per task attempt (retries are
    deduplicated), and across re-runs when ``producer`` is given."""

    def __init__(self, options: SinkOptions) -> None:
        """Fixes the producer name on the driver so every task attempt shares it."""
        self.options = options
        self.producer = options.producer or f"batch-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessage:
        """Runs on an executor, once per partition."""
        context, _, _ = _task_ids()
        partition = context.partitionId()
        return send_partition(iterator, None, self.options,
                              f"spark-{self.producer}-{partition}", self.options.batch_id,
                              partition)


class GridstreamReader(DataSourceReader):
    """Reads a job's results table through ``Client.results`` (one partition)."""

    def __init__(self, scheduler: str, job: str,
                 security: SecurityConfig | None = None, sink: str | None = None) -> None:
        """Where to read from; ``sink`` picks one sink of a job with several."""
        self.scheduler = scheduler
        self.job = job
        self.security = security
        self.sink = sink

    def partitions(self) -> list[InputPartition]:
        """The results table is read whole, by one task."""
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
        """Rows (key, value as JSON text)."""
        async def fetch() -> dict[str, Any]:
            async with Client(self.scheduler, security=self.security) as client:
                return await client.results(self.job, self.sink)

        for key, value in sorted(asyncio.run(fetch()).items()):
            yield key, json.dumps(value)


class GridstreamDataSource(DataSource):
    """``format("gridstream")``: options scheduler, job, key, value, value_format,
    batch_size, order_by, dead_letter_dir, send_timeout_s, tls_ca, tls_cert, tls_key, token;
    and sink, for reading one sink of a job with several."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return NAME

    def schema(self) -> str:
        """The reader's rows."""
        return "key string, value string"

    def streamWriter(self, schema: StructType, overwrite: bool) -> GridstreamStreamWriter:
        """Checks the options on the driver, so a bad query fails before it starts."""
        return GridstreamStreamWriter(parse_options(self.options, schema))

    def writer(self, schema: StructType, overwrite: bool) -> GridstreamBatchWriter:
        """``df.write.format("gridstream")``."""
        return GridstreamBatchWriter(parse_options(self.options, schema))

    def reader(self, schema: StructType) -> GridstreamReader:
        """``spark.read.format("gridstream")``."""
        opts = {k.lower(): v for k, v in self.options.items()}
        for name in ("scheduler", "job"):
            if not opts.get(name):
                raise BridgeError(f'gridstream source: option "{name}" is required')
        return GridstreamReader(opts["scheduler"], opts["job"], security_from(opts),
                                opts.get("sink") or None)


def foreach_batch_writer(scheduler: str, job: str, key: str | None = None,
                         value: str | None = None, *, value_format: str = "native",
                         batch_size: int = BATCH_SIZE, order_by: str | None = None,
                         dead_letter_dir: str | None = None,
                         query_id: str | None = None) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function for users who prefer that style:
    ``df.writeStream.foreachBatch(foreach_batch_writer(s, job, key="device"))``.
    The sending still happens on the executors (a batch write of the micro-batch
    through this data source, with the same producer/sequence scheme); only
    commit messages come back to the driver. ``query_id`` defaults to the
    running query's id (stable for its checkpoint)."""
    def write_batch(df: Any, batch_id: int) -> None:
        raw: dict[str, str] = {"scheduler": scheduler, "job": job,
                               "value_format": value_format, "batch_size": str(batch_size)}
        for name, given in (("key", key), ("value", value), ("order_by", order_by),
                            ("dead_letter_dir", dead_letter_dir)):
            if given is not None:
                raw[name] = given
        parse_options(raw, df.schema)  # fail on the driver, with the fix, before sending
        qid = query_id or df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not qid:
            raise BridgeError("gridstream foreach_batch_writer: cannot tell the streaming "
                              "query id; pass query_id=<a name stable across restarts>")
        from spark_bridge.session import activate

        activate(df.sparkSession)
        writer = df.write.format(NAME).mode("append")
        for name, setting in {**raw, "producer": qid, "batch_id": str(batch_id)}.items():
            writer = writer.option(name, setting)
        writer.save()

    return write_batch


def register(spark: Any) -> None:
    """Registers ``format("gridstream")`` with a SparkSession."""
    spark.dataSource.register(GridstreamDataSource)
