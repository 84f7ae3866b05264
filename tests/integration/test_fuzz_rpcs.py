"""Property-based fuzzing of every RPC of every service: random bytes, and
random well-formed messages, from a stranger and (bytes that do not decode)
from a member. No answer may be UNKNOWN or INTERNAL, no process may restart,
and a small job must still give the reference result afterwards."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message as pb_message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gridstream import rpc
from gridstream.client import Client
from gridstream.examples import wordcount
from gridstream.local import LocalCluster
from gridstream.v1 import scheduler_pb2, stateserver_pb2, worker_pb2

pytestmark = pytest.mark.integration

FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Method:
    """One RPC: where it is served and what it takes."""

    role: str
    path: str
    request: type[pb_message.Message]
    client_streaming: bool
    server_streaming: bool


def all_methods() -> list[Method]:
    """Every method of the three gridstream services, from their descriptors."""
    methods = []
    for role, module, name in (("scheduler", scheduler_pb2, "Scheduler"),
                               ("worker", worker_pb2, "Worker"),
                               ("state", stateserver_pb2, "StateServer")):
        service = module.DESCRIPTOR.services_by_name[name]
        for method in service.methods:
            methods.append(Method(role, f"/{service.full_name}/{method.name}",
                                  GetMessageClass(method.input_type), method.client_streaming,
                                  method.server_streaming))
    return methods


METHODS = all_methods()


def address(cluster: LocalCluster, role: str) -> str:
    name = {"scheduler": "scheduler", "worker": "worker-1", "state": "state-1"}[role]
    return cluster.members[name].address


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    pb_descriptor.FieldDescriptor.TYPE_STRING: st.one_of(
        st.text(max_size=40), st.sampled_from(["", "..", "../../etc", "src/x", "t0/p0",
                                                "worker-1", "x" * 5000])),
    pb_descriptor.FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
    pb_descriptor.FieldDescriptor.TYPE_BOOL: st.booleans(),
    pb_descriptor.FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    pb_descriptor.FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True,
                                                        allow_infinity=True),
    pb_descriptor.FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    pb_descriptor.FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    pb_descriptor.FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    pb_descriptor.FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
}


@st.composite
def messages(draw: st.DrawFn, cls: type[pb_message.Message], depth: int = 0) -> bytes:
    """A well-formed message of ``cls`` with random field values, serialised."""
    message = cls()
    for field in cls.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None:
            if depth >= 2 or field.message_type.GetOptions().map_entry:
                continue
            sub = GetMessageClass(field.message_type)
            payloads = draw(st.lists(messages(sub, depth + 1), max_size=2)) \
                if field.is_repeated else [draw(messages(sub, depth + 1))]
            for payload in payloads:
                target = getattr(message, field.name)
                (target.add() if field.is_repeated else target
                 ).MergeFromString(payload)
            continue
        if field.enum_type is not None:
            value: Any = draw(st.integers(0, 8))
        else:
            value = draw(_SCALARS.get(field.type, st.none()))
            if value is None:
                continue
        if field.is_repeated:
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message.SerializeToString()


def parses(cls: type[pb_message.Message], data: bytes) -> bool:
    try:
        cls.FromString(data)
    except Exception:
        return False
    return True


async def status_of(channel: grpc.aio.Channel, method: Method, payload: bytes
                    ) -> grpc.StatusCode:
    """What the service answers ``payload`` (raw bytes) with."""
    try:
        if method.client_streaming:
            stream_unary = channel.stream_unary(method.path, request_serializer=None,
                                                response_deserializer=None)
            await stream_unary(iter([payload]), timeout=CALL_TIMEOUT_S)
        elif method.server_streaming:
            unary_stream = channel.unary_stream(method.path, request_serializer=None,
                                                response_deserializer=None)
            async for _ in unary_stream(payload, timeout=CALL_TIMEOUT_S):
                pass
        else:
            unary = channel.unary_unary(method.path, request_serializer=None,
                                        response_deserializer=None)
            await unary(payload, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def call(cluster: LocalCluster, method: Method, payload: bytes, member: bool) -> grpc.StatusCode:
    """One call on a fresh loop and channel (hypothesis drives a plain function)."""

    async def run() -> grpc.StatusCode:
        target = address(cluster, method.role)
        channel = rpc.open_channel(target) if member else grpc.aio.insecure_channel(target)
        async with channel:
            return await status_of(channel, method, payload)

    return asyncio.run(run())


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(method=st.sampled_from(METHODS), payload=st.binary(max_size=200))
def test_random_bytes_from_a_stranger(cluster: LocalCluster, method: Method,
                                      payload: bytes) -> None:
    code = call(cluster, method, payload, member=False)
    assert code not in FORBIDDEN, (method.path, payload, code)


@FUZZ
@given(method=st.sampled_from(METHODS), payload=st.binary(min_size=1, max_size=200))
def test_undecodable_bytes_from_a_member(cluster: LocalCluster, method: Method,
                                         payload: bytes) -> None:
    assume(not parses(method.request, payload))
    code = call(cluster, method, payload, member=True)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (method.path, payload, code)


@FUZZ
@given(data=st.data(), method=st.sampled_from(METHODS))
def test_random_well_formed_messages_from_a_stranger(cluster: LocalCluster, data: st.DataObject,
                                                     method: Method) -> None:
    payload = data.draw(messages(method.request))
    code = call(cluster, method, payload, member=False)
    assert code not in FORBIDDEN, (method.path, method.request.FromString(payload), code)


MEMBER_POWERS = {"/gridstream.v1.Scheduler/Register", "/gridstream.v1.Scheduler/SetTrackerCount"}
"""Calls a member may legitimately make to change the cluster (admit a member at
any address, resize the trackers): fuzzing them as a member would change the
cluster on purpose, not find a fault."""

MEMBER_METHODS = [m for m in METHODS if m.path not in MEMBER_POWERS]


@FUZZ
@given(data=st.data(), method=st.sampled_from(MEMBER_METHODS))
def test_random_well_formed_messages_from_a_member(cluster: LocalCluster, data: st.DataObject,
                                                   method: Method) -> None:
    """Past authentication: every field check and servicer sees the message."""
    payload = data.draw(messages(method.request))
    code = call(cluster, method, payload, member=True)
    assert code not in FORBIDDEN, (method.path, method.request.FromString(payload), code)


async def test_after_the_fuzzing_nothing_restarted_and_a_job_gives_the_reference(
        cluster: LocalCluster) -> None:
    assert all(m.alive() and m.restarts == 0 for m in cluster.members.values())
    lines = wordcount.generate(3_000, seed=11)
    async with Client(cluster.scheduler_address, batch_size=500) as client:
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, lines)
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
    for name in cluster.members:
        assert "Traceback" not in cluster.logs(name, tail=5_000), name
