"""Bearer-token authentication and per-token rights, checked by a server
interceptor before any servicer runs.

Rights: ``submit`` (submit and cancel jobs), ``send`` (push records), ``read``
(jobs, progress, status, routing table, results) and ``admin`` (everything,
including the calls members make to one another). The standard health and
reflection services need no token, so supervisors and probes keep working.
"""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

RIGHTS = ("submit", "send", "read", "admin")

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


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without a known token (UNAUTHENTICATED) or without the
    right the method needs (PERMISSION_DENIED); nothing runs for them."""

    def __init__(self, tokens: dict[str, frozenset[str]]) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        right = needed_right(method)
        if right is None or handler is None:
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        header = str(metadata.get("authorization", ""))
        token = header[7:] if header.lower().startswith("bearer ") else ""
        rights = self.tokens.get(token)
        if rights is None:
            return _deny(handler, grpc.StatusCode.UNAUTHENTICATED,
                         "missing or unknown bearer token; set security.token (SDK: "
                         "Client(..., security=...)) to a token the cluster knows")
        if right not in rights and "admin" not in rights:
            return _deny(handler, grpc.StatusCode.PERMISSION_DENIED,
                         f"this token lacks the '{right}' right needed by {method}")
        return handler


def _deny(handler: grpc.RpcMethodHandler, code: grpc.StatusCode,
          message: str) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
