"""gRPC plumbing shared by every process: channel options, deadlines, and the
mapping of exceptions to status codes inside servicers."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from gridstream.auth import MEMBER_METADATA, credential_interceptors, load_cluster_secret
from gridstream.config import SecurityConfig
from gridstream.errors import GridstreamError, Unavailable

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""gRPC's own message limit; gridstream checks smaller, configurable limits itself
so that callers get a message that says what to fix."""

HEARTBEAT_TIMEOUT_S = 0.5
"""Deadline of a heartbeat."""

CONTROL_TIMEOUT_S = 5.0
"""Deadline of a control call (register, routing table, deploy, progress)."""

DATA_TIMEOUT_S = 15.0
"""Deadline of a data call (push, snapshot, results)."""

STREAM_IDLE_S = DATA_TIMEOUT_S
"""Longest wait for the next message of a server stream (results, dead
letters, state). A stream has no deadline as a whole: a big answer that keeps
arriving is never cut off, however long it takes in all."""

_KEEPALIVE_MS = 10_000

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.http2.ping_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.enable_retries", 0),
]

SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", _KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]


_process_security: SecurityConfig = SecurityConfig()
_held_secret: str | None = None
_secrets: dict[str, str] = {}


def configure_security(security: SecurityConfig) -> None:
    """Sets the TLS and token settings every channel of this process uses
    (services call it once at start, from their config)."""
    global _process_security
    _process_security = security


def hold_member_secret(secret: str | None) -> None:
    """Makes this process present ``secret`` as a member on the channels it
    opens with its own settings when those name no secret file: the process
    that starts a local cluster (``gridstream up``, tests, benchmarks) holds
    that cluster's secret, as its members do."""
    global _held_secret
    _held_secret = secret


def member_secret(security: SecurityConfig, own: bool) -> str | None:
    """The cluster secret a channel presents: from ``cluster_secret_file``, or
    the held one for channels opened with this process's own settings."""
    path = security.cluster_secret_file
    if path:
        if path not in _secrets:
            _secrets[path] = load_cluster_secret(path)
        return _secrets[path]
    return _held_secret if own else None


def call_metadata(security: SecurityConfig, own: bool) -> tuple[tuple[str, str], ...]:
    """What every call on a channel with these settings presents: the cluster
    secret (:func:`member_secret`) and, over TLS, the bearer token (never in
    plaintext, where anyone on the path could read it; a service with
    tokens needs TLS). Added by the channel's interceptors
    (:func:`gridstream.auth.credential_interceptors`), by hand on
    bidirectional streams (:meth:`ChannelPool.metadata`) and on the blocking
    channel's calls (:func:`member_metadata`)."""
    secret = member_secret(security, own)
    pairs: tuple[tuple[str, str], ...] = ((MEMBER_METADATA, secret),) if secret else ()
    if security.tls and security.token:
        pairs += (("authorization", f"Bearer {security.token}"),)
    return pairs


def channel_credentials(security: SecurityConfig) -> grpc.ChannelCredentials:
    """TLS credentials, with a client certificate for mutual TLS. The bearer
    token is call metadata (:func:`call_metadata`), not call credentials."""
    return grpc.ssl_channel_credentials(
        root_certificates=Path(security.ca_file).read_bytes(),
        private_key=Path(security.key_file).read_bytes() if security.key_file else None,
        certificate_chain=Path(security.cert_file).read_bytes() if security.cert_file else None,
    )


def open_channel(address: str, security: SecurityConfig | None = None) -> grpc.aio.Channel:
    """A channel with gridstream's keepalive and size settings: TLS when the
    given (or this process's) security settings say so, plaintext otherwise;
    every call carries the cluster secret and the bearer token when the
    settings hold them (:func:`call_metadata`)."""
    own = security is None
    security = security or _process_security
    pairs = call_metadata(security, own)
    interceptors = credential_interceptors(pairs) if pairs else None
    if security.tls:
        return grpc.aio.secure_channel(address, channel_credentials(security),
                                       options=CHANNEL_OPTIONS, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS,
                                     interceptors=interceptors)


def open_blocking_channel(address: str) -> grpc.Channel:
    """A blocking (not asyncio) channel with this process's settings, for a
    thread that must not wait for the event loop (heartbeats). Its calls
    carry no interceptors: pass :func:`member_metadata` with each call."""
    security = _process_security
    if security.tls:
        return grpc.secure_channel(address, channel_credentials(security),
                                   options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def member_metadata() -> tuple[tuple[str, str], ...]:
    """The call metadata that presents this process's cluster secret and
    token (:func:`call_metadata`): what :func:`open_channel`'s interceptors
    add to each call."""
    return call_metadata(_process_security, own=True)


def server_credentials(security: SecurityConfig) -> grpc.ServerCredentials:
    """TLS for a server; with require_client_cert, mutual TLS."""
    return grpc.ssl_server_credentials(
        [(Path(security.key_file).read_bytes(), Path(security.cert_file).read_bytes())],
        root_certificates=Path(security.ca_file).read_bytes(),
        require_client_auth=security.require_client_cert,
    )


_StubT = TypeVar("_StubT")


class ChannelPool:
    """One channel per peer address, opened on first use and closed together:
    gRPC multiplexes every call to a peer over it. Stubs are kept per channel
    too (:meth:`stub`): building one makes a callable per method of the
    service, 15 to 25 µs, which a stub per call paid on every call."""

    def __init__(self, security: SecurityConfig | None = None) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, Callable[[grpc.aio.Channel], Any]], Any] = {}
        self._security = security

    def stub(self, address: str, make: Callable[[grpc.aio.Channel], _StubT]) -> _StubT:
        """The stub ``make`` builds (a generated ``...Stub`` class) on the
        channel to ``address``, built once per address and class."""
        stub = self._stubs.get((address, make))
        if stub is None:
            stub = self._stubs[(address, make)] = make(self.get(address))
        return stub

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What a bidirectional stream on these channels presents itself
        with (:func:`call_metadata`): the channels' interceptors add it to
        every other kind of call."""
        return call_metadata(self._security or _process_security,
                             own=self._security is None)

    def get(self, address: str) -> grpc.aio.Channel:
        """The channel to an address."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._security)
        return channel

    async def close(self) -> None:
        """Closes every channel."""
        channels, self._channels = self._channels, {}
        self._stubs = {}
        for channel in channels.values():
            await channel.close()


_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


def servicer_method(func: _F) -> _F:
    """Maps exceptions raised by a servicer method to gRPC statuses.

    GridstreamError keeps its code and message; anything else is logged with
    its traceback and answered INTERNAL with a short message of our own (the
    asyncio server would otherwise answer UNKNOWN and leak the exception).
    """

    @functools.wraps(func)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await func(self, request, context)
        except GridstreamError as exc:
            await context.abort(exc.code, str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("unhandled error in %s", func.__qualname__)
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error in {func.__name__}; see the service's log",
            )

    return wrapper  # type: ignore[return-value]


async def idle_stream(call: Any, what: str,
                      idle_s: float = STREAM_IDLE_S) -> AsyncIterator[Any]:
    """The messages of a server-streaming ``call`` (started without a
    deadline), failing with Unavailable when none arrives for ``idle_s``; the
    call is cancelled however the iteration ends."""
    messages = call.__aiter__()
    try:
        while True:
            try:
                message = await asyncio.wait_for(messages.__anext__(), idle_s)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise Unavailable(f"{what}: nothing arrived for {idle_s:.0f}s") from None
            yield message
    finally:
        call.cancel()


_RequestT = TypeVar("_RequestT")
_ResponseT = TypeVar("_ResponseT")


class StreamAnswers:
    """The server side of :mod:`gridstream.callstreams`: answers each request
    of a long-lived request/response stream in order, with the unary
    method's own handler (so a message is checked, applied and refused
    exactly as that call would be, and a refusal of the whole request ends
    the stream with the call's status).

    Such a stream lasts as long as its caller keeps it; a stopping server
    would wait its whole grace for them. :meth:`end_all` (called by the
    host as it stops) ends every one at once: a request in flight on one
    then fails for its caller as a call to a stopping peer does. A stream
    waiting for its next request is cancelled; one answering a request
    ends right after its answer is written. Cancelled while its answer was
    being written, the stream's status could not be sent (gRPC refuses a
    second send while one is in progress: GRPC_CALL_ERROR_TOO_MANY_OPERATIONS)
    and the server's stop waited its whole grace for it."""

    def __init__(self) -> None:
        self._open: set[asyncio.Task[Any]] = set()
        self._answering: set[asyncio.Task[Any]] = set()
        """Streams between taking a request and having written its answer."""
        self._ended = False

    async def answer_each(
        self, requests: AsyncIterator[_RequestT], context: grpc.aio.ServicerContext,
        answer: Callable[[_RequestT, grpc.aio.ServicerContext], Awaitable[_ResponseT]],
    ) -> None:
        """Writes ``answer(request)`` for each request, until the caller
        closes the stream (or the server stops)."""
        if self._ended:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            async for request in requests:
                self._answering.add(task)
                try:
                    await context.write(await answer(request, context))
                finally:
                    self._answering.discard(task)
                if self._ended:
                    break
        except asyncio.CancelledError:
            if not self._ended:
                raise
        finally:
            self._open.discard(task)
        if self._ended:
            # A cancelled handler alone leaves the call open (and the
            # server's stop waiting for it); a status ends it.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")

    def end_all(self) -> None:
        """Ends every open stream (at once, or once the answer it is writing
        is written) and refuses new ones."""
        self._ended = True
        for task in list(self._open - self._answering):
            task.cancel()
