"""Calls to a peer carried over one long-lived stream instead of a call each.

A gRPC unary call costs the two processes about 0.35 to 0.5 ms of CPU
however small it is (a call object, an HTTP/2 stream, metadata, the
asyncio glue on both sides); a message on an open bidirectional stream
costs about a third of that. The calls a worker makes all the time to the
same few peers (replications to its backup holders, tracking reports to the
tracker hosts) therefore go as messages on one stream per peer: each request
message is answered by one response message, in order, and the peer answers
it exactly as the unary method would (``ReplicateStream`` beside
``ReplicateMany``).

Callers keep the unary contract: :meth:`CallStreams.call` returns the
response or raises the :class:`grpc.aio.AioRpcError` the call would have
raised, with its own deadline. Whatever goes wrong with a stream (an error
status, a deadline, a cancelled caller, the peer going away) ends that
stream: a request left without its answer must not have the next request's
answer taken for it. The next call opens a new stream. A peer that does not
know the stream method (an older member) is called unary from then on.
Requests to one peer go one at a time (:class:`gridstream.peercalls.CoalescedCalls`
already sends one call per peer at a time, carrying all that waits). The
streams are calls on the process's :class:`gridstream.rpc.ChannelPool`,
which ends them with every other call when it closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc

from gridstream import rpc
from gridstream.peercalls import Outcome, Waiting, many_outcomes

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
ResultT = TypeVar("ResultT")


_NO_PEER_STATUS = frozenset({grpc.StatusCode.OK, grpc.StatusCode.CANCELLED,
                             grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
"""Final statuses of an ended stream that do not come from the peer's
answer: gRPC's own for a stream cut or cancelled on this side."""


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised with this status."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class CallStreams(Generic[RequestT, ResponseT]):
    """One process's calls of one method pair to its peers: a stream per
    peer address for ``stream_method``, with ``unary_method`` as the
    fallback for peers without it. ``make_stub`` is the generated stub
    class both methods belong to."""

    def __init__(self, channels: rpc.ChannelPool, make_stub: Callable[[grpc.aio.Channel], Any],
                 stream_method: str, unary_method: str) -> None:
        self._channels = channels
        self._make_stub = make_stub
        self._stream_method = stream_method
        self._unary_method = unary_method
        self._streams: dict[str, grpc.aio.StreamStreamCall] = {}
        self._turns: dict[str, asyncio.Lock] = {}
        self._unary_only: set[str] = set()
        self.opened = 0
        """Streams opened so far (one per peer, and one more after each failure)."""

    async def call(self, address: str, request: RequestT, timeout_s: float) -> ResponseT:
        """The peer's answer to ``request``, as the unary method's call with
        ``timeout_s`` would return it (or raise it)."""
        if address not in self._unary_only:
            turn = self._turns.setdefault(address, asyncio.Lock())
            async with turn:
                try:
                    async with asyncio.timeout(timeout_s):
                        return await self._exchange(address, request)
                except TimeoutError:
                    self._end(address)
                    raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"no answer on the {self._stream_method} stream within "
                                    f"{timeout_s:g} s") from None
                except grpc.aio.AioRpcError as exc:
                    self._end(address)
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    self._unary_only.add(address)  # a member without the stream: nothing done
                except asyncio.InvalidStateError:  # the new stream ended before its first answer
                    self._end(address)
                    raise rpc_error(grpc.StatusCode.UNAVAILABLE,
                                    f"the peer ended the {self._stream_method} stream at once "
                                    "(stopping, say)") from None
                except BaseException:  # cancelled mid-request: its answer must not be taken
                    self._end(address)
                    raise
        return await self._unary(address, request, timeout_s)

    async def _exchange(self, address: str, request: RequestT) -> ResponseT:
        """Writes ``request`` on the peer's stream and reads its answer. A
        stream kept from an earlier call that the write finds ended (the peer
        restarted) took nothing: the request goes on a new one. When only the
        read finds it ended (the write went out before the old stream's status
        reached this process), the call fails with that status, as a unary
        call to a restarting peer does, and the caller's retry goes on a new
        stream (``call`` drops the ended one)."""
        stream = self._streams.get(address)
        if stream is not None and not stream.done():
            try:
                await stream.write(request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                self._end(address)
                stream = None
        else:
            stream = None
        if stream is None:
            stream = self._open(address)
            try:
                await stream.write(request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                if isinstance(exc, grpc.aio.AioRpcError) and exc.code() != grpc.StatusCode.INTERNAL:
                    raise
                await self._raise_ended_status(stream, exc)
        response = await stream.read()
        if response is grpc.aio.EOF:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE,
                            f"the peer ended the {self._stream_method} stream")
        return response  # type: ignore[no-any-return]

    async def _raise_ended_status(self, stream: grpc.aio.StreamStreamCall,
                                  failed_write: BaseException) -> None:
        """Raises why a new stream ended before its first request could be
        written. The peer ended it at once: gRPC's write then raises
        InvalidStateError (ended before the write) or a local INTERNAL (ended
        while the request was on its way), not the peer's status. The peer's
        status says what happened: UNIMPLEMENTED from a member without the
        stream method (``call`` then goes unary), UNAUTHENTICATED, or
        UNAVAILABLE from a stopping server. Without one (the stream was cut),
        InvalidStateError, which ``call`` reports as UNAVAILABLE."""
        ended = await stream.code()
        if ended not in _NO_PEER_STATUS:
            raise rpc_error(ended, await stream.details()) from failed_write
        raise asyncio.InvalidStateError(str(failed_write)) from failed_write

    def _open(self, address: str) -> grpc.aio.StreamStreamCall:
        stub = self._channels.stub(address, self._make_stub)
        stream: grpc.aio.StreamStreamCall = getattr(stub, self._stream_method)(
            metadata=self._channels.metadata())
        self._streams[address] = stream
        self.opened += 1
        return stream

    def _end(self, address: str) -> None:
        stream = self._streams.pop(address, None)
        if stream is not None:
            stream.cancel()

    async def _unary(self, address: str, request: RequestT, timeout_s: float) -> ResponseT:
        stub = self._channels.stub(address, self._make_stub)
        response: ResponseT = await getattr(stub, self._unary_method)(request, timeout=timeout_s)
        return response


async def many_on_stream(streams: CallStreams[RequestT, Any], address: str, request: RequestT,
                         timeout_s: float, batch: list[Waiting[Any, ResultT]],
                         result: Callable[[Any], ResultT]) -> list[ResultT | Exception]:
    """The outcome of each of ``batch``'s requests, carried together as
    ``request`` (a "many" request whose answer has one ``outcomes`` entry
    per request) on the peer's stream: what a
    :class:`gridstream.peercalls.CoalescedCalls` sender returns."""
    async def reply() -> Sequence[Outcome]:
        response = await streams.call(address, request, timeout_s)
        outcomes: Sequence[Outcome] = response.outcomes
        return outcomes

    return await many_outcomes(batch, reply(), result)
