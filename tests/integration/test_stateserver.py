"""The real state server process over real gRPC: API, refusals, SIGTERM and SIGKILL.

The process-start and health-wait helpers at the top are general (any
gridstream service with a ready file and a health service) and are meant to
move to gridstream/testing.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
import msgpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gridstream.auth import create_cluster_secret
from gridstream.ids import checksum
from gridstream.replicas import MAX_RESULT_WRITES_PER_CALL, MAX_STATE_WRITES_PER_CALL
from gridstream.rpc import hold_member_secret, open_channel
from gridstream.statewindows import state_messages
from gridstream.v1 import stateserver_pb2 as pb
from gridstream.v1 import stateserver_pb2_grpc

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SERVICE = "gridstream.v1.StateServer"
START_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 10.0


# -- general helpers (candidates for gridstream/testing.py) -------------------


@dataclass
class ServiceProcess:
    """A service process started by a test, with its address and log file."""

    proc: asyncio.subprocess.Process
    address: str
    ready: dict[str, Any]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        """The end of the process's stderr, for assertion messages."""
        return _log_tail(self.log_path, lines)

    async def wait_exit(self, timeout_s: float = 10.0) -> int:
        """Waits for the exit code; kills the process and fails with its log on timeout."""
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            pytest.fail(f"process did not exit within {timeout_s} s\n{self.log_tail()}")

    async def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Sends ``sig`` (if still running) and waits for the exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await self.wait_exit(timeout_s)


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


def _read_ready_file(path: Path, pid: int) -> dict[str, Any] | None:
    """The ready file's fields if ``pid`` wrote it (a stale one does not count)."""
    try:
        ready: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return ready if ready.get("pid") == pid else None


async def wait_for_ready_file(path: Path, proc: asyncio.subprocess.Process, log_path: Path,
                              timeout_s: float) -> dict[str, Any]:
    """Polls for the ready file written by ``proc``; fails fast if the process dies."""
    deadline = time.monotonic() + timeout_s
    while (ready := _read_ready_file(path, proc.pid)) is None:
        if proc.returncode is not None:
            pytest.fail(f"process exited with {proc.returncode} before it was ready:\n"
                        f"{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no ready file {path} after {timeout_s} s\n{_log_tail(log_path)}")
        await asyncio.sleep(0.02)
    return ready


async def wait_serving(address: str, service: str, proc: asyncio.subprocess.Process,
                       timeout_s: float) -> None:
    """Polls the gRPC health check until ``service`` reports SERVING."""
    deadline = time.monotonic() + timeout_s
    async with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc.returncode is not None:
                pytest.fail(f"process exited with {proc.returncode} while waiting for health")
            try:
                response = await stub.Check(health_pb2.HealthCheckRequest(service=service),
                                            timeout=0.5)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{service} at {address} not SERVING after {timeout_s} s")
            await asyncio.sleep(0.05)


def _open_log(ready_file: Path, log_path: Path) -> IO[bytes]:
    """Removes a stale ready file and opens the process log for appending."""
    ready_file.unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return log_path.open("ab")


MEMBER_SECRET = "a-cluster-secret-for-the-state-server-tests"
"""The services started here and this process share it, as members do."""


def member_secret_file(directory: Path) -> Path:
    """Writes the tests' cluster secret (mode 0600) and makes this process present it."""
    hold_member_secret(MEMBER_SECRET)
    return create_cluster_secret(directory / "cluster.secret", MEMBER_SECRET)


async def start_service(module: str, args: Sequence[str], ready_file: Path, log_path: Path,
                        service: str, timeout_s: float = START_TIMEOUT_S) -> ServiceProcess:
    """Starts ``python -m module args`` in the repository, waits for its ready file
    and for its health check to say SERVING; never sleeps a fixed time. The
    service authenticates members with the tests' cluster secret."""
    secret = member_secret_file(ready_file.parent)
    with _open_log(ready_file, log_path) as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args, "--ready-file", str(ready_file),
            cwd=REPO, stdout=log, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 "GRIDSTREAM_SECURITY_CLUSTER_SECRET_FILE": str(secret)},
        )
    try:
        ready = await wait_for_ready_file(ready_file, proc, log_path, timeout_s)
        await wait_serving(ready["address"], service, proc, timeout_s)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    return ServiceProcess(proc, ready["address"], ready, log_path)


# -- state-server specifics ----------------------------------------------------


async def start_stateserver(data_dir: Path, tag: str = "ss") -> ServiceProcess:
    """A state server on a free port, with no scheduler running (it must serve anyway)."""
    return await start_service(
        "services.stateserver",
        ["--port", "0", "--data-dir", str(data_dir), "--scheduler", "127.0.0.1:1",
         "--node-id", f"state-{tag}", "--standalone"],
        data_dir.parent / f"{tag}.ready.json",
        data_dir.parent / f"{tag}.log",
        SERVICE,
    )


@dataclass
class StateClient:
    """A channel and stub to one state server."""

    channel: grpc.aio.Channel
    stub: stateserver_pb2_grpc.StateServerAsyncStub

    @classmethod
    def to(cls, address: str) -> StateClient:
        channel = open_channel(address)
        return cls(channel, stateserver_pb2_grpc.StateServerStub(channel))  # type: ignore[arg-type]

    async def put(self, job: str, op: str, window: int, payload: bytes,
                  digest: str | None = None) -> bool:
        meta = pb.SnapshotMeta(job_id=job, operator_id=op, window=window, epoch=1,
                               size=len(payload), checksum=digest or checksum(payload))
        response = await self.stub.PutSnapshot(pb.PutSnapshotRequest(meta=meta, payload=payload),
                                               timeout=CALL_TIMEOUT_S)
        return bool(response.created)

    async def write(self, job: str, rows: list[list[str]],
                    dead_letters: list[list[str]] | None = None) -> None:
        letters = dead_letters or []
        await self.stub.WriteResults(
            pb.WriteResultsRequest(
                job_id=job, operator_id=f"{job}/t0/p0", rows=msgpack.packb(rows),
                row_count=len(rows), dead_letters=msgpack.packb(letters) if letters else b"",
                dead_letter_count=len(letters), epoch=1,
            ),
            timeout=CALL_TIMEOUT_S,
        )

    async def read(self, job: str) -> list[list[list[str]]]:
        chunks = []
        async for chunk in self.stub.ReadResults(pb.ReadResultsRequest(job_id=job),
                                                 timeout=CALL_TIMEOUT_S):
            rows = msgpack.unpackb(chunk.rows)
            assert len(rows) == chunk.row_count
            chunks.append([row[:2] for row in rows])  # [key, value, version]
        return chunks


@pytest.fixture(scope="module")
async def state_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServiceProcess]:
    process = await start_stateserver(tmp_path_factory.mktemp("stateserver") / "data")
    yield process
    assert await process.stop() == 0, process.log_tail()


@pytest.fixture
async def state_client(state_server: ServiceProcess) -> AsyncIterator[StateClient]:
    c = StateClient.to(state_server.address)
    yield c
    await c.channel.close()


async def expect_error(call: Any, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert text in (info.value.details() or ""), info.value.details()


# -- API -----------------------------------------------------------------------


async def test_snapshot_put_get_list_delete(state_client: StateClient) -> None:
    job, op = "snap-job", "snap-job/t0/p0"
    assert await state_client.put(job, op, 1, b"one") is True
    assert await state_client.put(job, op, 1, b"one") is False  # idempotent retry
    for window in (2, 3):
        await state_client.put(job, op, window, b"w%d" % window)
    await state_client.put(job, "snap-job/t1/p0", 1, b"other")

    latest = await state_client.stub.GetLatestSnapshot(
        pb.GetLatestSnapshotRequest(job_id=job, operator_id=op), timeout=CALL_TIMEOUT_S)
    assert latest.found and latest.meta.window == 3 and latest.payload == b"w3"
    assert latest.meta.checksum == checksum(b"w3") and latest.meta.size == 2

    listed = await state_client.stub.ListSnapshots(pb.ListSnapshotsRequest(job_id=job),
                                             timeout=CALL_TIMEOUT_S)
    assert [(m.operator_id, m.window) for m in listed.snapshots] == [
        (op, 2), (op, 3), ("snap-job/t1/p0", 1)]  # retention kept the newest two

    deleted = await state_client.stub.DeleteSnapshots(
        pb.DeleteSnapshotsRequest(job_id=job, operator_id=op, below_window=3),
        timeout=CALL_TIMEOUT_S)
    assert deleted.deleted == 1
    deleted = await state_client.stub.DeleteSnapshots(pb.DeleteSnapshotsRequest(job_id=job),
                                                timeout=CALL_TIMEOUT_S)
    assert deleted.deleted == 2
    missing = await state_client.stub.GetLatestSnapshot(
        pb.GetLatestSnapshotRequest(job_id=job, operator_id=op), timeout=CALL_TIMEOUT_S)
    assert not missing.found


async def test_corrupt_and_oversized_snapshots_are_refused(state_client: StateClient) -> None:
    job, op = "bad-job", "bad-job/t0/p0"
    await expect_error(state_client.put(job, op, 1, b"payload", digest=checksum(b"other")),
                       grpc.StatusCode.INVALID_ARGUMENT, "checksum mismatch")
    big = bytes(48 * 1024 * 1024 + 1)
    await expect_error(state_client.put(job, op, 2, big), grpc.StatusCode.RESOURCE_EXHAUSTED,
                       "above the limit")
    await expect_error(state_client.put("", op, 3, b"x"), grpc.StatusCode.INVALID_ARGUMENT,
                       "meta.job_id is empty")
    await expect_error(state_client.put(job, "", 3, b"x"), grpc.StatusCode.INVALID_ARGUMENT,
                       "meta.operator_id is empty")
    await expect_error(
        state_client.stub.GetLatestSnapshot(pb.GetLatestSnapshotRequest(job_id=job),
                                            timeout=CALL_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT, "operator_id is empty")
    listed = await state_client.stub.ListSnapshots(pb.ListSnapshotsRequest(job_id=job),
                                             timeout=CALL_TIMEOUT_S)
    assert list(listed.snapshots) == []  # nothing was stored


async def test_results_round_trip_upsert_chunks_and_delete(state_client: StateClient) -> None:
    job = "res-job"
    assert await state_client.read(job) == []  # unknown job: no rows, no error
    rows = [[f"k{i:05d}", json.dumps({"n": i})] for i in range(12_000)]
    await state_client.write(job, rows[:6_000], [["dl-1", "map", "'bad'", "ValueError: bad"]])
    await state_client.write(job, rows[6_000:])
    await state_client.write(job, [["k00000", '"replaced"']])
    chunks = await state_client.read(job)
    assert [len(c) for c in chunks] == [5_000, 5_000, 2_000]
    flat = [row for chunk in chunks for row in chunk]
    assert flat[0] == ["k00000", '"replaced"'] and flat[1:] == rows[1:]

    letters = [msgpack.unpackb(c.entries) async for c in state_client.stub.ReadDeadLetters(
        pb.ReadDeadLettersRequest(job_id=job), timeout=CALL_TIMEOUT_S)]
    assert letters == [[["dl-1", "map", "'bad'", "ValueError: bad"]]]

    await state_client.stub.DeleteJob(pb.DeleteJobRequest(job_id=job), timeout=CALL_TIMEOUT_S)
    assert await state_client.read(job) == []


@pytest.mark.parametrize(
    ("rows", "row_count", "message"),
    [
        (b"\xc1\x00", 1, "not valid msgpack"),
        (msgpack.packb({"k": "v"}), 1, "must be a msgpack array"),
        (msgpack.packb([["k", "v"]]), 2, "row_count is 2"),
        (msgpack.packb([["k", 1]]), 1, "rows[0] must be [key: str, json_value: str]"),
        (msgpack.packb([["k"]]), 1, "rows[0]"),
        (b"", 3, "row_count is 3 but rows is empty"),
    ],
)
async def test_malformed_rows_are_refused(state_client: StateClient, rows: bytes, row_count: int,
                                          message: str) -> None:
    job = "malformed-job"
    request = pb.WriteResultsRequest(job_id=job, operator_id=f"{job}/t0/p0", rows=rows,
                                     row_count=row_count)
    await expect_error(state_client.stub.WriteResults(request, timeout=CALL_TIMEOUT_S),
                       grpc.StatusCode.INVALID_ARGUMENT, message)
    bad_letters = pb.WriteResultsRequest(
        job_id=job, operator_id=f"{job}/t0/p0", rows=msgpack.packb([["ok", "1"]]), row_count=1,
        dead_letters=msgpack.packb([["id", "stage"]]), dead_letter_count=1)
    await expect_error(state_client.stub.WriteResults(bad_letters, timeout=CALL_TIMEOUT_S),
                       grpc.StatusCode.INVALID_ARGUMENT, "dead_letters[0]")
    assert await state_client.read(job) == []  # the good row of a refused request is not stored


@pytest.mark.parametrize(
    ("from_state", "message"),
    [
        ([pb.ResultsFromState(stage="count@timers")], "no '@'"),
        ([pb.ResultsFromState(stage="")], "1 to 512 characters"),
        ([pb.ResultsFromState(stage="x" * 600)], "1 to 512 characters"),
        ([pb.ResultsFromState(stage="count", key_prefix="p" * 600)], "key_prefix is longer"),
        ([pb.ResultsFromState(stage=f"s{i}") for i in range(65)], "more than 64"),
    ],
)
async def test_results_from_state_refuse_internal_and_oversized_names(
        state_client: StateClient, from_state: list[pb.ResultsFromState], message: str) -> None:
    call = state_client.stub.ReadResults(
        pb.ReadResultsRequest(job_id="from-state-job", from_state=from_state),
        timeout=CALL_TIMEOUT_S)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert message in (info.value.details() or ""), info.value.details()


async def test_result_writes_in_one_call_are_answered_each_on_its_own(
        state_client: StateClient) -> None:
    """A worker's sink tasks' writes share a WriteResultsMany call: a refused
    one (malformed rows) is answered with the error a call of its own would
    get, and the others of the call are stored; more writes than allowed
    are refused whole."""

    def write(job: str, rows: list[list[Any]]) -> pb.WriteResultsRequest:
        return pb.WriteResultsRequest(job_id=job, operator_id=f"{job}/t1/p0",
                                      rows=msgpack.packb(rows), row_count=len(rows), epoch=1,
                                      version=1)

    response = await state_client.stub.WriteResultsMany(pb.WriteResultsManyRequest(writes=[
        write("many-a", [["a", "1"]]), write("many-b", [["b", 2]]),
        write("many-c", [["c", "3"], ["cc", "4"]])]), timeout=CALL_TIMEOUT_S)
    codes = [outcome.code for outcome in response.outcomes]
    assert codes == [0, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0], response
    assert "rows[0] must be [key: str, json_value: str]" in response.outcomes[1].details
    assert await state_client.read("many-a") == [[["a", "1"]]]
    assert await state_client.read("many-b") == []
    assert await state_client.read("many-c") == [[["c", "3"], ["cc", "4"]]]

    too_many = [write("many-d", [[f"k{i}", "1"]]) for i in range(MAX_RESULT_WRITES_PER_CALL + 1)]
    await expect_error(state_client.stub.WriteResultsMany(
        pb.WriteResultsManyRequest(writes=too_many), timeout=CALL_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_RESULT_WRITES_PER_CALL}")
    assert await state_client.read("many-d") == []


async def test_fenced_writer_and_older_versions_change_nothing(state_client: StateClient) -> None:
    job, op = "fence-job", "fence-job/t0/p0"

    async def put(window: int, epoch: int) -> None:
        meta = pb.SnapshotMeta(job_id=job, operator_id=op, window=window, epoch=epoch,
                               size=1, checksum=checksum(b"x"))
        await state_client.stub.PutSnapshot(pb.PutSnapshotRequest(meta=meta, payload=b"x"),
                                            timeout=CALL_TIMEOUT_S)

    async def write(value: str, epoch: int, version: int) -> None:
        await state_client.stub.WriteResults(pb.WriteResultsRequest(
            job_id=job, operator_id=op, rows=msgpack.packb([["k", value]]), row_count=1,
            epoch=epoch, version=version), timeout=CALL_TIMEOUT_S)

    await put(5 << 20, epoch=5)
    await write('"new"', epoch=5, version=50)
    # The previous owner (epoch 3) was fenced when the epoch-5 owner wrote.
    await expect_error(put(3 << 20, epoch=3), grpc.StatusCode.FAILED_PRECONDITION, "stale epoch 3")
    await expect_error(write('"old"', epoch=3, version=99), grpc.StatusCode.FAILED_PRECONDITION,
                       "was fenced")
    # An older version from the current owner (a late retry) does not overwrite.
    await write('"late"', epoch=5, version=40)
    assert await state_client.read(job) == [[["k", '"new"']]]
    listed = await state_client.stub.ListSnapshots(pb.ListSnapshotsRequest(job_id=job),
                                                   timeout=CALL_TIMEOUT_S)
    assert [m.window for m in listed.snapshots] == [5 << 20]


async def test_a_retried_window_is_answered_from_its_first_chunk(
        state_client: StateClient) -> None:
    """A retry of a stored window is answered before its entries are read:
    receiving a big window costs the server in proportion to its bytes, and
    retries that cost as much again kept an overloaded server overloaded. A
    new window is still checked chunk by chunk."""
    job, op = "retry-job", "retry-job/t0/p0"

    def entries(*keys: str) -> tuple[bytes, int]:
        return msgpack.packb([["sum", msgpack.packb(k), msgpack.packb(1)] for k in keys]), len(keys)

    async def put_state(window: int, parent: int | None, corrupt_tail: bool = False) -> bool:
        messages = await state_messages(job, op, window, 1, parent, b"header",
                                        [entries("a", "b"), entries("c")])
        if corrupt_tail:
            messages[-1].entries = messages[-1].entries[:-1] + b"\x02"
        reply = await state_client.stub.PutState(iter(messages), timeout=CALL_TIMEOUT_S)
        return bool(reply.created)

    assert await put_state(1, None) is True
    assert await put_state(1, None, corrupt_tail=True) is False  # stored: the tail is unread
    await expect_error(put_state(2, 1, corrupt_tail=True), grpc.StatusCode.INVALID_ARGUMENT,
                       "does not match its meta.size/meta.checksum")
    head = await state_client.stub.StateHead(pb.StateHeadRequest(job_id=job, operator_id=op),
                                             timeout=CALL_TIMEOUT_S)
    assert (head.found, head.head_window) == (True, 1)


async def test_put_state_many_stores_each_window_as_a_put_state_of_it_would(
        state_client: StateClient) -> None:
    """Windows of one chunk share a PutStateMany call: each is checked,
    stored and answered on its own (one refused stops nothing), and one
    operator's windows are stored in the order given, as they chain."""
    job = "many-job"

    def entries(*keys: str) -> tuple[bytes, int]:
        return msgpack.packb([["sum", msgpack.packb(k), msgpack.packb(1)] for k in keys]), len(keys)

    async def window(op: str, number: int, parent: int | None, *keys: str) -> pb.StateChunk:
        [message] = await state_messages(job, f"{job}/{op}", number, 1, parent, b"header",
                                         [entries(*keys)])
        return message

    async def put_many(windows: list[pb.StateChunk]) -> list[tuple[int, bool]]:
        reply = await state_client.stub.PutStateMany(pb.PutStateManyRequest(windows=windows),
                                                     timeout=CALL_TIMEOUT_S)
        return [(outcome.code, outcome.created) for outcome in reply.outcomes]

    corrupt = await window("t0/p2", 1, None, "c")
    corrupt.entries = corrupt.entries[:-1] + b"\x02"
    unended = await window("t0/p3", 1, None, "d")
    unended.window_end = False
    big = [f"a{i:06d}" for i in range(20_000)]  # hashed off the loop: slower than the next
    outcomes = await put_many([
        await window("t0/p0", 1, None, *big),
        await window("t0/p0", 2, 1, "b"),  # chains on the window before it in the call
        await window("t0/p1", 2, 1, "x"),  # its parent is not held here
        corrupt,
        unended,
        await window("t0/p4", 1, None, "e"),
    ])
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    refused = grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert outcomes == [(0, True), (0, True), (refused, False), (invalid, False),
                        (invalid, False), (0, True)], outcomes
    reply = await state_client.stub.PutStateMany(pb.PutStateManyRequest(windows=[
        await window("t0/p1", 2, 1, "x"), await window("t0/p0", 1, None, *big)]),
        timeout=CALL_TIMEOUT_S)
    assert "missing parent window 1" in reply.outcomes[0].details
    assert (reply.outcomes[1].code, reply.outcomes[1].created) == (0, False)  # a retry
    for op, head_window in (("t0/p0", 2), ("t0/p4", 1)):
        head = await state_client.stub.StateHead(
            pb.StateHeadRequest(job_id=job, operator_id=f"{job}/{op}"), timeout=CALL_TIMEOUT_S)
        assert (head.found, head.head_window) == (True, head_window), op
    for op in ("t0/p1", "t0/p2", "t0/p3"):
        head = await state_client.stub.StateHead(
            pb.StateHeadRequest(job_id=job, operator_id=f"{job}/{op}"), timeout=CALL_TIMEOUT_S)
        assert not head.found, op  # nothing of a refused window was stored

    too_many = [await window(f"t1/p{p}", 1, None, "k")
                for p in range(MAX_STATE_WRITES_PER_CALL + 1)]
    await expect_error(put_many(too_many), grpc.StatusCode.INVALID_ARGUMENT,
                       f"at most {MAX_STATE_WRITES_PER_CALL}")


# -- process lifecycle -----------------------------------------------------------


async def test_sigterm_drains_and_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process = await start_stateserver(data, "life")
    client = StateClient.to(process.address)
    try:
        await client.put("life", "life/t0/p0", 1, b"snapshot-1")
        await client.write("life", [["before", "1"]])
        # Writes keep flowing while SIGTERM arrives: every acknowledged one must survive.
        acked: set[str] = set()
        failures: list[grpc.aio.AioRpcError] = []
        enough = asyncio.Event()

        async def writer(lane: int) -> None:
            for i in range(10_000):
                key = f"lane{lane}-{i:05d}"
                try:
                    await client.write("life", [[key, str(i)]])
                except grpc.aio.AioRpcError as exc:
                    failures.append(exc)
                    return
                acked.add(key)
                if len(acked) >= 100:
                    enough.set()

        lanes = [asyncio.ensure_future(writer(lane)) for lane in range(16)]
        await asyncio.wait_for(enough.wait(), CALL_TIMEOUT_S)
        process.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*lanes), CALL_TIMEOUT_S)
        assert await process.wait_exit() == 0, process.log_tail()
    finally:
        await client.channel.close()
    refused = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert all(exc.code() in refused for exc in failures), failures

    process = await start_stateserver(data, "life")
    client = StateClient.to(process.address)
    try:
        stored = {row[0] for chunk in await client.read("life") for row in chunk}
        assert {"before"} | acked <= stored, sorted(acked - stored)[:10]
        latest = await client.stub.GetLatestSnapshot(
            pb.GetLatestSnapshotRequest(job_id="life", operator_id="life/t0/p0"),
            timeout=CALL_TIMEOUT_S)
        assert latest.found and latest.payload == b"snapshot-1"

        await client.put("life", "life/t0/p0", 2, b"snapshot-2")
        await client.write("life", [["after-kill", "2"]])
        assert await process.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        await client.channel.close()

    process = await start_stateserver(data, "life")
    client = StateClient.to(process.address)
    try:
        stored = {row[0] for chunk in await client.read("life") for row in chunk}
        assert "after-kill" in stored and "before" in stored
        latest = await client.stub.GetLatestSnapshot(
            pb.GetLatestSnapshotRequest(job_id="life", operator_id="life/t0/p0"),
            timeout=CALL_TIMEOUT_S)
        assert latest.found and latest.meta.window == 2 and latest.payload == b"snapshot-2"
    finally:
        await client.channel.close()
        assert await process.stop() == 0, process.log_tail()
