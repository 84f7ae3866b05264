"""The console's HTTP server treats every caller as untrusted: garbage,
oversized heads, a slow trickle, other methods, path traversal and a flood of
connections each get a clear 4xx (or 503) or are closed after a timeout, and
afterwards the scheduler still answers gRPC and the console still serves
``/api/state``. A real scheduler on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.console.server import (
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    MAX_TARGET_BYTES,
    REQUEST_TIMEOUT_S,
)
from gridstream.local import LocalCluster
from tests.integration.conftest import small_config

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """A scheduler with one worker and one state server."""
    local = LocalCluster(tmp_path_factory.mktemp("console-hostile"), small_config(), workers=1,
                         state_servers=1)
    async with local:
        yield local


def where(cluster: LocalCluster) -> tuple[str, int]:
    """The console's host and port."""
    url = urlsplit(cluster.console_url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


async def exchange(cluster: LocalCluster, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Sends ``data`` on a fresh connection and reads until the server closes it."""
    reader, writer = await asyncio.open_connection(*where(cluster))
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    """The status code of a raw HTTP answer."""
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


async def still_serving(cluster: LocalCluster) -> None:
    """The scheduler answers gRPC and the console its state document."""
    async with Client(cluster.scheduler_address) as client:
        status = await client.status()
    assert {m.member.node_id for m in status.members} >= {"worker-1", "state-1"}
    answer = await exchange(cluster, b"GET /api/state HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 200
    document = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert {m["node_id"] for m in document["members"]} >= {"worker-1", "state-1"}


@pytest.mark.parametrize(("request_bytes", "expected"), [
    (b"\x00\xff\x13garbage\xfe\r\n\r\n", 400),
    (b"GET\r\n\r\n", 400),
    (b"GET / SPDY/9\r\n\r\n", 400),
    (b"G\x00T / HTTP/1.1\r\n\r\n", 400),
    (b"GET //[::1 HTTP/1.1\r\n\r\n", 400),  # urlsplit refuses it
    (b"GET /api/state?" + b"&".join(b"a=%d" % i for i in range(100)) + b" HTTP/1.1\r\n\r\n",
     400),
    (b"POST /api/state HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
    (b"PUT / HTTP/1.1\r\n\r\n", 405),
    (b"DELETE /api/state HTTP/1.1\r\n\r\n", 405),
    (b"BREW /pot HTTP/1.1\r\n\r\n", 405),
    (b"GET /static/../server.py HTTP/1.1\r\n\r\n", 404),
    (b"GET /static/%2e%2e/server.py HTTP/1.1\r\n\r\n", 404),
    (b"GET /static/..%2fserver.py HTTP/1.1\r\n\r\n", 404),
    (b"GET /static//etc/passwd HTTP/1.1\r\n\r\n", 404),
    (b"GET /../../../../etc/passwd HTTP/1.1\r\n\r\n", 404),
    (b"GET /static/__init__.py HTTP/1.1\r\n\r\n", 404),
    (b"GET /" + b"a" * (MAX_TARGET_BYTES + 10) + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"b" * (MAX_HEADER_BYTES + 10) + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 3000 + b"\r\n", 431),
])
async def test_a_malformed_request_gets_a_clear_4xx(
        cluster: LocalCluster, request_bytes: bytes, expected: int) -> None:
    answer = await exchange(cluster, request_bytes)
    assert status_of(answer) == expected, answer[:300]
    assert b"root:" not in answer and b"import " not in answer  # nothing leaked
    await still_serving(cluster)


async def test_head_answers_headers_only(cluster: LocalCluster) -> None:
    answer = await exchange(cluster, b"HEAD /api/state HTTP/1.1\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) == 200 and b"Content-Length: " in head and body == b""


async def test_a_slow_trickle_is_answered_408_and_does_not_stall_the_console(
        cluster: LocalCluster) -> None:
    reader, writer = await asyncio.open_connection(*where(cluster))
    started = time.monotonic()
    writer.write(b"GET /api/state HTTP/1.1\r\n")
    await writer.drain()

    async def trickle() -> None:
        while True:  # one header byte every 200 ms: never a whole head
            await asyncio.sleep(0.2)
            writer.write(b"X")
            await writer.drain()

    dripping = asyncio.create_task(trickle())
    try:
        # While it drips, the console and the scheduler answer others at once.
        await still_serving(cluster)
        assert time.monotonic() - started < REQUEST_TIMEOUT_S
        answer = await asyncio.wait_for(reader.read(), REQUEST_TIMEOUT_S + 5)
    finally:
        dripping.cancel()
        writer.close()
    elapsed = time.monotonic() - started
    assert status_of(answer) == 408, answer[:200]
    assert REQUEST_TIMEOUT_S - 0.5 <= elapsed <= REQUEST_TIMEOUT_S + 3, elapsed
    await still_serving(cluster)


async def test_a_caller_that_sends_nothing_is_closed_after_the_timeout(
        cluster: LocalCluster) -> None:
    reader, writer = await asyncio.open_connection(*where(cluster))
    try:
        answer = await asyncio.wait_for(reader.read(), REQUEST_TIMEOUT_S + 5)
    finally:
        writer.close()
    assert status_of(answer) == 408


async def test_a_flood_of_idle_connections_gets_503_beyond_the_limit(
        cluster: LocalCluster) -> None:
    host, port = where(cluster)
    opened = [await asyncio.open_connection(host, port) for _ in range(MAX_CONNECTIONS)]
    try:
        # Every idle one holds a slot (the server has accepted them all) ...
        deadline = time.monotonic() + 10
        while True:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /api/state HTTP/1.1\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            if status_of(answer) == 503:
                break
            assert time.monotonic() < deadline, "no 503 with every slot held"
            await asyncio.sleep(0.05)
        assert b"Retry-After: 1" in answer
        # ... and the scheduler's gRPC side is not held up by them.
        async with Client(cluster.scheduler_address) as client:
            assert (await client.status()).members
    finally:
        for _, writer in opened:
            writer.close()
    # Once they are gone, the console serves again.
    deadline = time.monotonic() + 10
    while True:
        try:
            answer = await exchange(cluster, b"GET /api/state HTTP/1.1\r\n\r\n")
        except ConnectionError as exc:  # closed before the answer was read: retry
            answer = str(exc).encode()
        if answer.startswith(b"HTTP/1.1 ") and status_of(answer) == 200:
            break
        assert time.monotonic() < deadline, answer[:200]
        await asyncio.sleep(0.1)
    await still_serving(cluster)

