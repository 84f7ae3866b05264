"""Hostile input and untrusted callers (issue 15), one test per row of its
table, against a real local cluster on loopback.

This process started the cluster, so it holds the cluster secret as members
do: ``rpc.open_channel`` and the default ``Client`` act as members. Calls
meant to come from a stranger go over :func:`stranger`, a plain channel
without the secret.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
import pytest_asyncio

from gridstream import codec, rpc
from gridstream.auth import create_cluster_secret
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config, SecurityConfig
from gridstream.errors import (
    DeadlineExceeded,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from gridstream.examples import wordcount
from gridstream.ids import partition_for_key
from gridstream.jobspec import DEFAULT_JOB_MODULES, JobSpec, Stage
from gridstream.local import REPO_ROOT, LocalCluster
from gridstream.v1 import (
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    stateserver_pb2,
    stateserver_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from gridstream.validation import MAX_NESTING

pytestmark = pytest.mark.integration

PARTITIONS = 4
JOB_MODULES = (*DEFAULT_JOB_MODULES, "tests.integration.faulty_ops")
"""Not tests.integration.import_probe: these tests check it is never imported."""

CALL_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where a worker that imported tests.integration.import_probe leaves its trace."""
    return tmp_path_factory.mktemp("probe") / "imported"


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory,
                  probe_file: Path) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 2 workers, 1 state server; jobs may name the built-ins,
    the examples and tests.integration.faulty_ops only."""
    config = replace(Config(), cluster=ClusterConfig(window_size=1_000, partitions=PARTITIONS,
                                                     job_modules=JOB_MODULES))
    local = LocalCluster(tmp_path_factory.mktemp("hostile"), config, workers=2,
                         state_servers=1,
                         extra_env={"GRIDSTREAM_TEST_IMPORT_PROBE": str(probe_file)})
    async with local:
        yield local


@pytest_asyncio.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    """An SDK client (holding the secret, like the process that started the cluster)."""
    async with Client(cluster.scheduler_address, batch_size=500) as sdk:
        yield sdk


def stranger(address: str) -> grpc.aio.Channel:
    """A channel of a local process that does not know the cluster secret."""
    return grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024),
                          ("grpc.max_receive_message_length", 64 * 1024 * 1024)])


async def refused(call: Any, code: grpc.StatusCode, text: str = "") -> str:
    """Awaits a call that must fail with ``code`` (and ``text`` in its details)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    details = info.value.details() or ""
    assert info.value.code() == code, (info.value.code(), details)
    assert text in details, details
    return details


def address_of(cluster: LocalCluster, name: str) -> str:
    return cluster.members[name].address


async def owner_address(client: Client, cluster: LocalCluster, job_id: str,
                        partition: int = 0) -> str:
    routing = await client._routing(job_id, refresh=True)
    return address_of(cluster, routing.owners[partition])


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def was_imported(probe_file: Path) -> bool:
    """True when some worker imported tests.integration.import_probe."""
    return probe_file.exists()


# -- 1, 2: job code ------------------------------------------------------------


@pytest.mark.parametrize("path", ["os:system", "subprocess:getoutput", "builtins:eval"])
async def test_row1_a_job_naming_system_functions_is_refused(client: Client, path: str) -> None:
    spec = JobSpec("evil", (Stage("run", "map", path), Stage("store", "sink")))
    with pytest.raises(PermissionDenied, match=r"cluster\.job_modules"):
        await client.submit(spec)
    assert all(j.spec.name != "evil" for j in await client.jobs())


async def test_row2_a_module_that_is_not_allowed_is_never_imported(
        cluster: LocalCluster, client: Client, probe_file: Path) -> None:
    spec = JobSpec("probe", (Stage("run", "map", "tests.integration.import_probe:anything"),
                             Stage("store", "sink")))
    with pytest.raises(PermissionDenied, match="nothing was imported"):
        await client.submit(spec)
    # Straight to a worker, as a member would deploy it: refused there too.
    async with rpc.open_channel(address_of(cluster, "worker-1")) as channel:
        await refused(worker_pb2_grpc.WorkerStub(channel).DeployJob(
            worker_pb2.DeployJobRequest(job_id="probe-00000000",
                                        spec=spec.with_defaults(PARTITIONS, 1000).to_proto()),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.PERMISSION_DENIED, "job_modules")
    assert not was_imported(probe_file)


# -- 3, 4: clients write only valid records to a job's sources -------------------


async def test_row3_clients_cannot_push_into_internal_channels(
        cluster: LocalCluster, client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    address = await owner_address(client, cluster, job_id)
    epoch = int(client._table.epoch)
    batch = codec.encode_batch(["injected injected"])
    hostile = [
        ({"task": 1, "channel": "t0/p0", "sequence": 2**62}, "task 0"),
        ({"task": 0, "channel": "t0/p0", "sequence": 1}, "src/<producer>"),
        ({"task": 0, "channel": "replay/src/x", "sequence": 1}, "src/<producer>"),
        ({"task": 0, "channel": "src/x", "sequence": 2**62}, "reserved"),
        ({"task": 0, "channel": "src/x", "sequence": 1, "root": 7}, "root"),
    ]
    async with stranger(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        for fields, text in hostile:
            await refused(stub.Push(worker_pb2.PushRequest(
                job_id=job_id, epoch=epoch,
                segments=[worker_pb2.Segment(partition=0, batch=batch, **fields)]),
                timeout=CALL_TIMEOUT_S), grpc.StatusCode.PERMISSION_DENIED, text)
        await refused(stub.Push(worker_pb2.PushRequest(
            job_id=job_id, epoch=epoch, sender="worker-1",
            segments=[worker_pb2.Segment(partition=0, channel="t0/p0", sequence=1,
                                         batch=batch)]),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.PERMISSION_DENIED, "sender")
        # A client's own source channel still works.
        await stub.Push(worker_pb2.PushRequest(
            job_id=job_id, epoch=epoch,
            segments=[worker_pb2.Segment(partition=0, channel="src/stranger", sequence=1,
                                         batch=codec.encode_batch(["hello"]))]),
            timeout=CALL_TIMEOUT_S)
    lines = wordcount.generate(2_000, seed=3)
    await client.send(job_id, lines)
    await client.drain(job_id, timeout_s=60)
    expected = wordcount.reference([*lines, "hello"])
    assert await client.results(job_id) == expected


async def test_row4_a_record_nested_too_deep_is_refused_at_ingest(
        cluster: LocalCluster, client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    with pytest.raises(InvalidArgument, match=f"nested more than {MAX_NESTING} levels"):
        await client.send(job_id, ["fine", nested(1_000)])
    deep = b"\x92\xc0\x91" + b"\x91" * 999 + b"\x01"  # [nil, [[[...1...]]]], 1,000 deep
    assert msgpack.unpackb(deep)[0] is None
    address = await owner_address(client, cluster, job_id)
    async with stranger(address) as channel:
        await refused(worker_pb2_grpc.WorkerStub(channel).Push(worker_pb2.PushRequest(
            job_id=job_id, epoch=int(client._table.epoch),
            segments=[worker_pb2.Segment(partition=0, channel="src/deep", sequence=1,
                                         batch=common_pb2.RecordBatch(
                                             encoding=common_pb2.PAYLOAD_ENCODING_MSGPACK_V1,
                                             count=1, payload=deep))]),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "nested more than")
    await client.send(job_id, ["still works"])
    await client.drain(job_id, timeout_s=60)
    assert await client.results(job_id) == {"still": 1, "works": 1}


# -- 5, 6: member calls and stored values ------------------------------------------


async def test_row5_strangers_cannot_register_replicate_or_write(
        cluster: LocalCluster, client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    await client.send(job_id, ["one two"])
    await client.drain(job_id, timeout_s=60)
    real = {m.member.node_id: m.member.address for m in (await client.status()).members}
    async with stranger(cluster.scheduler_address) as channel:
        await refused(scheduler_pb2_grpc.SchedulerStub(channel).Register(
            scheduler_pb2.RegisterRequest(node_id="worker-2",
                                          role=scheduler_pb2.MEMBER_ROLE_WORKER,
                                          address="127.0.0.1:1", incarnation="intruder"),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.UNAUTHENTICATED, "cluster secret")
    async with stranger(address_of(cluster, "worker-1")) as channel:
        await refused(worker_pb2_grpc.WorkerStub(channel).ReplicateMany(
            worker_pb2.ReplicateManyRequest(requests=[worker_pb2.ReplicateRequest(
                job_id=job_id, task=0, partition=0, epoch=2**63 - 1, primary="worker-2",
                reset=True)]),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.UNAUTHENTICATED)
    async with stranger(address_of(cluster, "state-1")) as channel:
        await refused(stateserver_pb2_grpc.StateServerStub(channel).WriteResults(
            stateserver_pb2.WriteResultsRequest(
                job_id=job_id, operator_id=f"{job_id}/t1/p0", epoch=2**62, version=2**62,
                rows=msgpack.packb([["one", "999999"]]), row_count=1),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.UNAUTHENTICATED)
    status = await client.status()
    assert {m.member.node_id: m.member.address for m in status.members} == real
    assert await client.results(job_id) == {"one": 1, "two": 1}


async def test_row6_a_result_value_that_is_not_json_is_not_stored(
        cluster: LocalCluster, client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    async with rpc.open_channel(address_of(cluster, "state-1")) as channel:
        await refused(stateserver_pb2_grpc.StateServerStub(channel).WriteResults(
            stateserver_pb2.WriteResultsRequest(
                job_id=job_id, operator_id=f"{job_id}/t1/p0", epoch=1, version=1,
                rows=msgpack.packb([["k", "{not json"]]), row_count=1),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "not valid JSON")
    assert await client.results(job_id) == {}


# -- 7-11: precise statuses ----------------------------------------------------------


def raw(channel: grpc.aio.Channel, method: str, stream: bool = False) -> Any:
    """A callable sending raw bytes to ``method`` (no encoding on our side)."""
    if stream:
        return channel.unary_stream(method, request_serializer=None,
                                    response_deserializer=None)
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


async def call_raw(channel: grpc.aio.Channel, method: str, payload: bytes,
                   stream: bool = False) -> grpc.StatusCode:
    """The status a method answers raw bytes with."""
    try:
        call = raw(channel, method, stream)(payload, timeout=CALL_TIMEOUT_S)
        if stream:
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_row7_corrupt_bytes_are_invalid_argument_without_a_traceback(
        cluster: LocalCluster) -> None:
    corrupt = b"\xff\xff\xff\xff\x0f"
    client_calls = [
        (cluster.scheduler_address, "/gridstream.v1.Scheduler/SubmitJob", False),
        (cluster.scheduler_address, "/gridstream.v1.Scheduler/GetJob", False),
        (address_of(cluster, "worker-1"), "/gridstream.v1.Worker/Push", False),
        (address_of(cluster, "state-1"), "/gridstream.v1.StateServer/ReadResults", True),
    ]
    for address, method, stream in client_calls:
        async with stranger(address) as channel:
            for _ in range(3):
                assert await call_raw(channel, method, corrupt, stream) == \
                    grpc.StatusCode.INVALID_ARGUMENT, method
    # A member call is authenticated before its body is decoded...
    async with stranger(cluster.scheduler_address) as channel:
        assert await call_raw(channel, "/gridstream.v1.Scheduler/Register", corrupt) == \
            grpc.StatusCode.UNAUTHENTICATED
    # ...and a member's corrupt request is refused like a client's.
    async with rpc.open_channel(cluster.scheduler_address) as channel:
        assert await call_raw(channel, "/gridstream.v1.Scheduler/Register", corrupt) == \
            grpc.StatusCode.INVALID_ARGUMENT
    for name in ("scheduler", "worker-1", "state-1"):
        text = cluster.logs(name, tail=2_000)
        assert "Traceback" not in text, text
        assert "ERROR" not in text, text
    assert cluster.logs("scheduler", 2_000).count("SubmitJob from") == 1  # rate-limited


async def test_row8_a_huge_job_id_gets_a_short_error(cluster: LocalCluster,
                                                     client: Client) -> None:
    huge = "j" * 100_000
    async with stranger(cluster.scheduler_address) as channel:
        details = await refused(scheduler_pb2_grpc.SchedulerStub(channel).GetJob(
            scheduler_pb2.GetJobRequest(job_id=huge), timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT, "100000 characters")
        assert len(details) < 400
    async with stranger(address_of(cluster, "worker-1")) as channel:
        details = await refused(worker_pb2_grpc.WorkerStub(channel).Push(
            worker_pb2.PushRequest(job_id=huge, segments=[worker_pb2.Segment(
                channel="src/x", sequence=1, batch=codec.encode_batch(["a"]))]),
            timeout=CALL_TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT)
        assert len(details) < 400


def deep_initial_job(initial_json: str, tracking_timeout_s: float = 0.0
                     ) -> scheduler_pb2.SubmitJobRequest:
    return scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="deep", tracking_timeout_s=tracking_timeout_s, stages=[
            common_pb2.StageSpec(name="count", kind=common_pb2.STAGE_KIND_REDUCE,
                                 function="gridstream.builtins:count",
                                 key="gridstream.builtins:identity", initial_json=initial_json),
            common_pb2.StageSpec(name="store", kind=common_pb2.STAGE_KIND_SINK)]))


async def test_row9_an_initial_value_nested_100k_deep_is_invalid(cluster: LocalCluster) -> None:
    async with stranger(cluster.scheduler_address) as channel:
        await refused(scheduler_pb2_grpc.SchedulerStub(channel).SubmitJob(
            deep_initial_job("[" * 100_000 + "]" * 100_000), timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT, "nested more than")


@pytest.mark.parametrize("seconds", [math.inf, -math.inf, math.nan, -1.0, 1e300])
async def test_row10_tracking_timeout_must_be_finite_and_bounded(
        cluster: LocalCluster, seconds: float) -> None:
    async with stranger(cluster.scheduler_address) as channel:
        await refused(scheduler_pb2_grpc.SchedulerStub(channel).SubmitJob(
            deep_initial_job("0", tracking_timeout_s=seconds), timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT, "tracking_timeout_s")


@pytest.mark.parametrize("job_id", ["../../etc", "jöb-ünïcode", "x" * 10_000, "a/b", ".."])
async def test_row11_deploy_refuses_ids_that_are_not_ids(cluster: LocalCluster,
                                                         job_id: str) -> None:
    """Even a member (the scheduler deploys) cannot install a job under an id
    that is not an id; a stranger is not even asked for one."""
    spec = wordcount.job().with_defaults(PARTITIONS, 1_000).to_proto()
    request = worker_pb2.DeployJobRequest(job_id=job_id, spec=spec)
    async with rpc.open_channel(address_of(cluster, "worker-1")) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        await refused(stub.DeployJob(request, timeout=CALL_TIMEOUT_S),
                      grpc.StatusCode.INVALID_ARGUMENT, "not a valid id")
        await refused(stub.GetTaskProgress(worker_pb2.GetTaskProgressRequest(job_id=job_id),
                                           timeout=CALL_TIMEOUT_S),
                      grpc.StatusCode.INVALID_ARGUMENT, "not a valid id")
    async with stranger(address_of(cluster, "worker-1")) as channel:
        await refused(worker_pb2_grpc.WorkerStub(channel).DeployJob(
            request, timeout=CALL_TIMEOUT_S), grpc.StatusCode.UNAUTHENTICATED)


# -- 12: the SDK ---------------------------------------------------------------------


async def test_row12_a_record_that_can_never_fit_fails_at_once(client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    started = time.monotonic()
    with pytest.raises(ResourceExhausted, match=r"max_batch_bytes") as info:
        await client.send(job_id, ["x" * (20 * 1024 * 1024)])
    assert time.monotonic() - started < 10
    assert "can never be sent" in str(info.value)
    assert info.value.failed_partitions and not info.value.pending_partitions


async def test_partial_failure_names_the_partitions_sent(client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    words = [f"w{i}" for i in range(40)]
    big = "y" * (20 * 1024 * 1024)
    keys = [*words, "big"]
    with pytest.raises(ResourceExhausted) as info:
        await client.send(job_id, [*words, big], keys=keys)
    error = info.value
    assert error.failed_partitions == (partition_for_key("big", PARTITIONS),)
    touched = {partition_for_key(k, PARTITIONS) for k in keys}
    assert set(error.sent_partitions) == touched - set(error.failed_partitions)
    assert not error.pending_partitions
    assert "partitions sent in full" in str(error)
    await client.drain(job_id, timeout_s=60)
    # The batch holding the big record was split: its other records went through.
    assert await client.results(job_id) == {w: 1 for w in words}


async def test_a_restart_safe_partial_failure_says_to_send_again(client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    with pytest.raises(ResourceExhausted, match="send the same records again") as info:
        await client.send(job_id, ["a", "y" * (20 * 1024 * 1024)], keys=["a", "big"],
                          producer="again", first_sequence=1)
    assert info.value.sent_partitions == (partition_for_key("a", PARTITIONS),)


async def test_restart_safe_unkeyed_sends_choose_the_same_partitions(
        cluster: LocalCluster) -> None:
    lines = [f"l{i} common" for i in range(300)]
    async with Client(cluster.scheduler_address, batch_size=50) as first:
        job_id = await first.submit(wordcount.job())
        await first.send(job_id, ["warm up"])  # moves this instance's own rotation
        await first.send(job_id, lines, producer="restartable", first_sequence=1 << 24)
    async with Client(cluster.scheduler_address, batch_size=50) as again:
        await again.send(job_id, lines, producer="restartable", first_sequence=1 << 24)
        await again.drain(job_id, timeout_s=60)
        results = await again.results(job_id)
    assert results == wordcount.reference(["warm up", *lines])


# -- 13, 14: secrets and metrics -------------------------------------------------------


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_row13_the_local_clusters_config_and_secret_are_owner_only(
        cluster: LocalCluster) -> None:
    assert mode(cluster.config_path) == 0o600
    assert mode(cluster.config.security.cluster_secret_file) == 0o600


def test_row13_certs_writes_keys_tokens_and_secret_owner_only(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gridstream.cli", "certs", "--out",
                             str(tmp_path / "certs")], capture_output=True, text=True,
                            cwd=REPO_ROOT, check=True, timeout=60)
    assert "cluster_secret_file" in result.stdout
    for name in ("ca-key.pem", "node-key.pem", "client-key.pem", "tokens.toml",
                 "cluster.secret"):
        assert mode(tmp_path / "certs" / name) == 0o600, name


def start_stateserver(tmp_path: Path, *extra: str, env: dict[str, str] | None = None
                      ) -> subprocess.Popen[bytes]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    secret = create_cluster_secret(tmp_path / "secret")
    return subprocess.Popen(
        [sys.executable, "-m", "services.stateserver", "--standalone", "--port", "0",
         "--data-dir", str(tmp_path / "data"), "--node-id", "state-m",
         "--scheduler", "127.0.0.1:1", "--ready-file", str(tmp_path / "ready.json"), *extra],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "GRIDSTREAM_SECURITY_CLUSTER_SECRET_FILE": str(secret),
             **(env or {})})


PLAINTEXT_NETWORK = {"GRIDSTREAM_SECURITY_PLAINTEXT_NETWORK": "true"}


async def ready_or_exit(process: subprocess.Popen[bytes], ready: Path,
                        timeout_s: float = 60.0) -> dict[str, Any] | None:
    """The fields of a service's ready file once it serves, or None once it exited."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(ready.exists):
        if process.poll() is not None:
            return None
        assert time.monotonic() < deadline, "the service neither started nor exited"
        await asyncio.sleep(0.05)
    fields: dict[str, Any] = json.loads(await asyncio.to_thread(ready.read_text))
    return fields


def stop(process: subprocess.Popen[bytes]) -> bytes:
    """Stops a service this test started (if it still runs); its output."""
    if process.poll() is None:
        process.terminate()
    output, _ = process.communicate(timeout=30)
    return output


def scrape(url: str) -> bytes:
    """The body of an HTTP GET."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        body: bytes = reply.read()
    return body


def non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        host = str(probe.getsockname()[0])
    return None if host.startswith("127.") or host == "0.0.0.0" else host


async def test_plaintext_binds_loopback_unless_the_network_is_trusted(tmp_path: Path) -> None:
    process = start_stateserver(tmp_path, "--host", "0.0.0.0")
    try:
        fields = await ready_or_exit(process, tmp_path / "ready.json")
        assert fields is None, f"served plaintext on {fields and fields['address']}"
    finally:
        output = stop(process)
    assert process.returncode != 0
    assert b"plaintext_network" in output


async def test_row14_metrics_bind_loopback_whatever_the_service_binds(tmp_path: Path) -> None:
    process = start_stateserver(tmp_path, "--host", "0.0.0.0", env=PLAINTEXT_NETWORK)
    try:
        fields = await ready_or_exit(process, tmp_path / "ready.json")
        assert fields is not None, stop(process)
        assert fields["address"].startswith("0.0.0.0:")
        host, port = fields["metrics"].rsplit(":", 1)
        assert host == "127.0.0.1", fields["metrics"]
        assert b"# HELP" in await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
        other = non_loopback_address()
        if other is not None:  # the machine's other interface does not serve them
            with pytest.raises(OSError):
                socket.create_connection((other, int(port)), timeout=5).close()
    finally:
        stop(process)
    docs = await asyncio.to_thread((REPO_ROOT / "docs" / "security.md").read_text)
    assert "/metrics" in docs and "metrics_host" in docs


async def test_no_process_restarted_or_died(cluster: LocalCluster) -> None:
    assert all(m.alive() and m.restarts == 0 for m in cluster.members.values())


def test_a_client_config_without_secret_is_not_a_member() -> None:
    assert rpc.member_secret(SecurityConfig(), own=False) is None


# -- the SDK's own retries ------------------------------------------------------------


async def test_a_push_with_an_unknown_outcome_is_pushed_again_with_its_sequence(
        tmp_path: Path) -> None:
    """A push that timed out may or may not have been appended: the client
    keeps it and pushes it again, with the same sequence, before its next
    batch to that partition, so neither batch is lost or doubled."""
    config = replace(Config(), cluster=ClusterConfig(window_size=500, partitions=2,
                                                     backup_count=1))
    async with LocalCluster(tmp_path, config, workers=2, state_servers=1) as local, \
            Client(local.scheduler_address, batch_size=100, send_timeout_s=1.0) as sdk:
        job_id = await sdk.submit(wordcount.job())
        routing = await sdk._routing(job_id, refresh=True)
        partition = list(routing.owners).index("worker-1")
        key = next(f"k{i}" for i in range(1000)
                   if partition_for_key(f"k{i}", 2) == partition)
        local.kill("worker-2", signal.SIGSTOP)  # worker-1's backup stops answering
        try:
            started = time.monotonic()
            with pytest.raises((Unavailable, ResourceExhausted, DeadlineExceeded)) as info:
                await sdk.send(job_id, ["first batch"], keys=[key])
            # send_timeout_s bounds the send: no push attempt outlives it (each
            # had its own 15 s deadline before, and this send took 14.7 s).
            assert time.monotonic() - started < 8.0
        finally:
            local.kill("worker-2", signal.SIGCONT)
        await local.wait_registered(timeout_s=60)
        sdk.send_timeout_s = 60.0  # the rest is no test of the deadline
        await sdk.send(job_id, ["second batch"], keys=[key])
        await sdk.drain(job_id, timeout_s=120)
        assert await sdk.results(job_id) == {"first": 1, "second": 1, "batch": 2}
        assert getattr(info.value, "pending_partitions", None) == (partition,)


async def test_the_sdk_refuses_producers_and_sequences_clients_may_not_use(
        cluster: LocalCluster, client: Client) -> None:
    with pytest.raises(InvalidArgument, match="producer_id"):
        Client(cluster.scheduler_address, producer_id="../t0")
    job_id = await client.submit(wordcount.job())
    with pytest.raises(InvalidArgument, match="producer"):
        await client.send(job_id, ["a"], producer="has space", first_sequence=1)
    with pytest.raises(InvalidArgument, match="first_sequence"):
        await client.send(job_id, ["a"], producer="p", first_sequence=2**62)
