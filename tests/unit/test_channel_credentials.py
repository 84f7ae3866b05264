"""A channel presents its bearer token as call metadata on every kind of call,
over TLS only, and never through a Python metadata plugin: gRPC calls and
destroys such a plugin on its own threads with the GIL, and a channel
closed meanwhile froze the whole process (gridstream/auth.py,
``credential_interceptors``).

The server is a real TLS gRPC server on loopback that records the metadata
each call arrived with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gridstream import rpc
from gridstream.certs import create_dev_certs
from gridstream.config import SecurityConfig

TOKEN = "token-for-tests"
UNARY = "/gridstream.test.Echo/Call"
BIDI = "/gridstream.test.Echo/Chat"


class Recorded:
    """The ``authorization`` header of each call the server answered."""

    def __init__(self) -> None:
        self.headers: list[str | None] = []

    def note(self, context: grpc.aio.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata() or ())
        self.headers.append(metadata.get("authorization"))


async def serving(recorded: Recorded, security: SecurityConfig | None
                  ) -> tuple[grpc.aio.Server, str]:
    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        recorded.note(context)
        return request

    async def chat(requests: AsyncIterator[bytes],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        recorded.note(context)
        async for request in requests:
            yield request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "gridstream.test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call),
                                 "Chat": grpc.stream_stream_rpc_method_handler(chat)})])
    if security is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", rpc.server_credentials(security))
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Any]:
    return create_dev_certs(tmp_path, ["localhost", "127.0.0.1"])


def tls(certs: dict[str, Any], who: str) -> SecurityConfig:
    return SecurityConfig(tls=True, ca_file=str(certs["ca"].cert),
                          cert_file=str(certs[who].cert), key_file=str(certs[who].key),
                          token=TOKEN)


@pytest.fixture
def no_metadata_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any Python metadata plugin (``grpc.access_token_call_credentials``,
    ``grpc.metadata_call_credentials``) fails the test."""
    from grpc import _plugin_wrapping

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a Python metadata plugin was made for a channel")

    monkeypatch.setattr(_plugin_wrapping, "metadata_plugin_call_credentials", refuse)


async def calls_on(address: str, security: SecurityConfig) -> None:
    """One unary call and one bidirectional stream on a pool's channel."""
    pool = rpc.ChannelPool(security)
    try:
        channel = pool.get(address)
        assert await channel.unary_unary(UNARY)(b"one", timeout=10) == b"one"
        stream = channel.stream_stream(BIDI)(metadata=pool.metadata(), timeout=10)
        await stream.write(b"two")
        assert await stream.read() == b"two"
        await stream.done_writing()
        assert await stream.read() is grpc.aio.EOF
    finally:
        await pool.close()


@pytest.mark.usefixtures("no_metadata_plugins")
async def test_the_token_goes_on_every_kind_of_call_over_tls(certs: dict[str, Any]) -> None:
    recorded = Recorded()
    server, address = await serving(recorded, tls(certs, "node"))
    try:
        await calls_on(address, tls(certs, "client"))
    finally:
        await server.stop(None)
    assert recorded.headers == [f"Bearer {TOKEN}"] * 2


async def test_the_token_never_goes_in_plaintext() -> None:
    recorded = Recorded()
    server, address = await serving(recorded, None)
    try:
        await calls_on(address, SecurityConfig(token=TOKEN))
    finally:
        await server.stop(None)
    assert recorded.headers == [None, None]
