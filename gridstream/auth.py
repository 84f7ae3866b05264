"""Who may call what, decided by a server interceptor before any servicer runs
and before the request body is decoded.

Two kinds of callers:

* **Members** (scheduler, workers, state servers, and an operator holding the
  member configuration) present the *cluster secret* in the
  ``x-gridstream-member`` metadata on every call, or, on a cluster with
  bearer tokens, an ``admin`` token. Member calls (registration, heartbeats,
  deploy, replication, log fetch, tracking, snapshot and result writes, ...)
  need one of them in every mode, plaintext included.
* **Clients** need nothing more on a cluster without tokens; with
  ``tokens_file`` they need a token with the right the method needs:
  ``submit`` (submit and cancel jobs), ``send`` (push records), ``read``
  (jobs, progress, status, routing table, results).

The standard health and reflection services are open, so supervisors and
probes keep working. A request whose bytes are not a valid message is answered
INVALID_ARGUMENT with a rate-limited warning in the log, never a traceback;
one that decodes is checked field by field (ids, finite and bounded numbers)
before any servicer runs, whoever sent it.
"""

from __future__ import annotations

import contextvars
import hmac
import inspect
import logging
import os
import secrets
import stat
import time
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from gridstream.errors import InvalidArgument
from gridstream.validation import check_request

log = logging.getLogger(__name__)

RIGHTS = ("submit", "send", "read", "admin")

MEMBER_METADATA = "x-gridstream-member"
"""Metadata key carrying the cluster secret on members' calls."""

_NEEDS: dict[str, str] = {
    "/gridstream.v1.Scheduler/SubmitJob": "submit",
    "/gridstream.v1.Scheduler/CancelJob": "submit",
    "/gridstream.v1.Worker/Push": "send",
    "/gridstream.v1.Scheduler/GetJob": "read",
    "/gridstream.v1.Scheduler/ListJobs": "read",
    "/gridstream.v1.Scheduler/GetJobProgress": "read",
    "/gridstream.v1.Scheduler/GetClusterStatus": "read",
    "/gridstream.v1.Scheduler/GetRoutingTable": "read",
    "/gridstream.v1.StateServer/ReadResults": "read",
    "/gridstream.v1.StateServer/ReadDeadLetters": "read",
}
_OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
_CHECKED_PREFIX = "/gridstream.v1."
"""Requests of gridstream's own services are checked field by field."""

caller_is_member: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "caller_is_member", default=False)
"""True inside a servicer call made by an authenticated member (set by
:class:`CallGuard`); servicers use it to keep clients out of internal
channels."""


def needed_right(method: str) -> str | None:
    """The right a method needs; None for open services; admin for member calls."""
    if method.startswith(_OPEN_PREFIXES):
        return None
    return _NEEDS.get(method, "admin")


def load_tokens(path: str | Path) -> dict[str, frozenset[str]]:
    """Reads ``[tokens] "<token>" = ["right", ...]``; raises ValueError naming
    what is wrong."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    tokens = data.get("tokens")
    if not isinstance(tokens, dict) or not tokens:
        raise ValueError(f"{path}: needs a [tokens] table of token = [rights]")
    out: dict[str, frozenset[str]] = {}
    for token, rights in tokens.items():
        if not isinstance(rights, list) or not all(r in RIGHTS for r in rights):
            raise ValueError(f"{path}: rights of a token must be a list drawn from "
                             f"{', '.join(RIGHTS)}")
        out[token] = frozenset(rights)
    return out


# -- secrets on disk -------------------------------------------------------------

MIN_SECRET_CHARS = 24
"""Shortest cluster secret accepted."""


def write_private(path: Path, text: str) -> None:
    """Writes a file only its owner can read, created with mode 0600 (never
    readable by others, not even for an instant) and replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    tmp.replace(path)


def create_cluster_secret(path: Path, secret: str | None = None) -> Path:
    """Writes a cluster secret (a fresh random one unless given), mode 0600."""
    write_private(path, (secret or secrets.token_urlsafe(32)) + "\n")
    return path


def load_cluster_secret(path: str | Path) -> str:
    """Reads a cluster secret; raises ValueError if the file is readable by
    others or the secret is too short."""
    mode = os.stat(path).st_mode
    if stat.S_IMODE(mode) & 0o077:
        raise ValueError(f"{path} is readable by others (mode {stat.S_IMODE(mode):o}); "
                         "chmod 600 it")
    secret = Path(path).read_text().strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{path}: the cluster secret must be at least {MIN_SECRET_CHARS} "
                         "characters")
    return secret


# -- the server side -------------------------------------------------------------


class _Undecodable:
    """Stands in for a request whose bytes did not decode."""

    def __init__(self, size: int, error: str) -> None:
        self.size = size
        self.error = error


class _WarnEvery:
    """At most one warning per ``interval_s`` per key; counts the ones held back."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, key: str, message: str, *args: Any) -> None:
        """Logs now, or counts the warning until the interval has passed."""
        now = time.monotonic()
        if now - self._last.get(key, -self.interval_s) < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        if held:
            message += f" ({held} more since the last warning)"
        log.warning(message, *args)


_corrupt_warnings = _WarnEvery()


class CallGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call before its body is decoded, and turns a body
    that does not decode into INVALID_ARGUMENT.

    ``secret`` is the cluster secret members present; ``tokens`` (None when
    the cluster has no tokens file) maps bearer tokens to rights. Refused
    calls never run and never decode their request.
    """

    def __init__(self, secret: str | None, tokens: dict[str, frozenset[str]] | None) -> None:
        self.secret = secret.encode() if secret else None
        self.tokens = tokens
        self._guarded: dict[tuple[str, bool], tuple[grpc.RpcMethodHandler,
                                                     grpc.RpcMethodHandler]] = {}
        """(method, member) -> (the servicer's handler, its guarded form):
        built once per method and kind of caller, not on every call."""

    def _is_member(self, metadata: dict[str, Any]) -> bool:
        presented = metadata.get(MEMBER_METADATA)
        if self.secret is not None and isinstance(presented, str) and hmac.compare_digest(
                presented.encode(), self.secret):
            return True
        if self.tokens is not None:
            return "admin" in self.tokens.get(_bearer(metadata), frozenset())
        return False

    def _refusal(self, method: str, right: str, member: bool,
                 metadata: dict[str, Any]) -> tuple[grpc.StatusCode, str] | None:
        if member:
            return None
        if self.tokens is None:
            if right != "admin":
                return None
            return (grpc.StatusCode.UNAUTHENTICATED,
                    f"{method} is a member call: it needs the cluster secret "
                    "(security.cluster_secret_file) or an admin token")
        rights = self.tokens.get(_bearer(metadata))
        if rights is None:
            return (grpc.StatusCode.UNAUTHENTICATED,
                    "missing or unknown bearer token; set security.token (SDK: "
                    "Client(..., security=...)) to a token the cluster knows")
        if right not in rights and "admin" not in rights:
            return (grpc.StatusCode.PERMISSION_DENIED,
                    f"this token lacks the '{right}' right needed by {method}")
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        right = needed_right(method)
        if right is None:
            return handler if method.startswith("/grpc.reflection.") else self._guard(
                handler, method, False)
        metadata = {key: value for key, value in handler_call_details.invocation_metadata or ()}
        member = self._is_member(metadata)
        refusal = self._refusal(method, right, member, metadata)
        if refusal is not None:
            return _deny(handler, *refusal)
        return self._guard(handler, method, member)

    def _guard(self, handler: grpc.RpcMethodHandler, method: str,
               member: bool) -> grpc.RpcMethodHandler:
        """:func:`_guarded` of ``handler``, made once per method and kind of
        caller (a handler's guarded form depends on nothing else)."""
        cached = self._guarded.get((method, member))
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = _guarded(handler, method, member)
        self._guarded[(method, member)] = (handler, guarded)
        return guarded


def _bearer(metadata: dict[str, Any]) -> str:
    header = str(metadata.get("authorization", ""))
    return header[7:] if header.lower().startswith("bearer ") else ""


def _ignore_body(data: bytes) -> None:
    """The deserializer of a refused call: its bytes are never decoded."""
    return None


def _deny(handler: grpc.RpcMethodHandler, code: grpc.StatusCode,
          message: str) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    kwargs = {"request_deserializer": _ignore_body,
              "response_serializer": handler.response_serializer}
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)


def _guarded(handler: grpc.RpcMethodHandler, method: str,
             member: bool) -> grpc.RpcMethodHandler:
    """The handler with a deserializer that cannot raise and a behaviour that
    answers INVALID_ARGUMENT for a request (or a streamed request message)
    that did not decode or whose fields break
    :func:`gridstream.validation.check_request` (ids, bounded and finite
    numbers: for members' calls too, so no servicer can forget a field), and
    that runs the servicer with :data:`caller_is_member` set."""
    decode = handler.request_deserializer
    checked_fields = method.startswith(_CHECKED_PREFIX)

    def safe_decode(data: bytes) -> Any:
        if decode is None:
            return data
        try:
            return decode(data)
        except Exception as exc:  # protobuf raises DecodeError, RecursionError, ...
            return _Undecodable(len(data), type(exc).__name__)

    async def refuse_undecodable(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, _Undecodable):
            peer = context.peer() or "?"
            _corrupt_warnings.warn(method, "refused %s from %s: %d bytes that are not a valid "
                                   "request (%s)", method, peer, request.size, request.error)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request is not a valid {method.rsplit('/', 1)[-1]} message "
                f"({request.size} bytes); nothing was done")
        if checked_fields:
            try:
                check_request(request)
            except InvalidArgument as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def finish(result: Any, context: grpc.aio.ServicerContext) -> Any:
        if inspect.isasyncgen(result):
            async for item in result:
                await context.write(item)
            return None
        return await result

    kwargs = {"request_deserializer": safe_decode,
              "response_serializer": handler.response_serializer}
    if handler.request_streaming:
        behaviour = handler.stream_unary or handler.stream_stream

        async def run_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async def checked() -> Any:
                async for request in requests:
                    await refuse_undecodable(request, context)
                    yield request

            caller_is_member.set(member)
            return await finish(behaviour(checked(), context), context)

        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(run_stream, **kwargs)
        return grpc.stream_stream_rpc_method_handler(run_stream, **kwargs)

    unary = handler.unary_stream or handler.unary_unary

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse_undecodable(request, context)
        caller_is_member.set(member)
        return await finish(unary(request, context), context)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(run, **kwargs)
    return grpc.unary_unary_rpc_method_handler(run, **kwargs)


# -- the client side -------------------------------------------------------------


def _with_metadata(details: grpc.aio.ClientCallDetails,
                   pairs: tuple[tuple[str, str], ...]) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    for key, value in pairs:
        metadata.add(key, value)
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                      details.credentials, details.wait_for_ready)


class _UnaryCallMetadata(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds the channel's credentials metadata to every unary call."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any,
                                    request: Any) -> Any:
        """Unary calls carry the metadata."""
        return await continuation(_with_metadata(client_call_details, self.pairs), request)


class _StreamCallMetadata(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds the channel's credentials metadata to every server-streaming call."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any,
                                     request: Any) -> Any:
        """Server-streaming calls carry the metadata."""
        return await continuation(_with_metadata(client_call_details, self.pairs), request)


class _ClientStreamCallMetadata(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    """Adds the channel's credentials metadata to every client-streaming call."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs

    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any,
                                     request_iterator: Any) -> Any:
        """Client-streaming calls carry the metadata."""
        return await continuation(_with_metadata(client_call_details, self.pairs),
                                  request_iterator)


def credential_interceptors(pairs: tuple[tuple[str, str], ...]
                            ) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors that present ``pairs`` (the cluster secret, the
    bearer token: :func:`gridstream.rpc.call_metadata`) on every call (one
    per call kind: a channel files each interceptor under one kind only).

    The bearer token goes as plain metadata, not as gRPC call credentials:
    ``grpc.access_token_call_credentials`` is a Python metadata plugin, which
    gRPC's own threads call and destroy while holding the GIL; a channel
    closed meanwhile (its close holds the GIL and waits for those threads)
    froze the whole process (seen in ``Client.close`` after a refused TLS
    handshake, grpcio 1.85.1).

    Bidirectional streams are left out: they carry the pairs as metadata of
    their own (:func:`gridstream.rpc.ChannelPool.metadata`), because an
    intercepted stream finishes in ways a plain one does not (a write to a
    finished one is an ``InvalidStateError``, and a cancelled wait on one
    can hang), and costs more per message (gridstream/callstreams.py)."""
    return [_UnaryCallMetadata(pairs), _StreamCallMetadata(pairs),
            _ClientStreamCallMetadata(pairs)]
