"""CallGuard builds a method's guarded handler once per kind of caller
(gridstream/auth.py): the guard costs a dictionary lookup per call, not a new
handler with its closures, and a member's handler is never served to a client."""

from __future__ import annotations

from typing import Any

import grpc

from gridstream.auth import MEMBER_METADATA, CallGuard

SECRET = "s3cret"
PUSH = "/gridstream.v1.Worker/Push"
REPLICATE = "/gridstream.v1.Worker/ReplicateMany"


class Details(grpc.HandlerCallDetails):  # type: ignore[misc]
    """What the server knows of a call before its body: method and metadata."""

    def __init__(self, method: str, member: bool) -> None:
        self.method = method
        self.invocation_metadata = ((MEMBER_METADATA, SECRET),) if member else ()


async def behaviour(request: Any, context: Any) -> Any:
    return request


HANDLERS = {method: grpc.unary_unary_rpc_method_handler(behaviour)
            for method in (PUSH, REPLICATE)}


async def guarded(guard: CallGuard, method: str, member: bool) -> grpc.RpcMethodHandler:
    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return HANDLERS[details.method]
    return await guard.intercept_service(continuation, Details(method, member))


async def test_a_guarded_handler_is_built_once_per_method_and_kind_of_caller() -> None:
    guard = CallGuard(SECRET, None)
    member_push = await guarded(guard, PUSH, member=True)
    client_push = await guarded(guard, PUSH, member=False)
    assert member_push is not HANDLERS[PUSH] and client_push is not HANDLERS[PUSH]
    assert await guarded(guard, PUSH, member=True) is member_push
    assert await guarded(guard, PUSH, member=False) is client_push
    assert client_push is not member_push  # the member flag is part of the handler
    assert await guarded(guard, REPLICATE, member=True) is not member_push


async def test_a_refused_call_is_never_served_a_cached_handler() -> None:
    guard = CallGuard(SECRET, None)
    member_replicate = await guarded(guard, REPLICATE, member=True)
    refused = await guarded(guard, REPLICATE, member=False)  # a member call without the secret
    assert refused is not member_replicate
    assert refused.request_deserializer(b"anything") is None  # the body is never decoded
