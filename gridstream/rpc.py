"""gRPC plumbing shared by every process: channel options, deadlines, and the
mapping of exceptions to status codes inside servicers."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gridstream.errors import GridstreamError

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


def open_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel with gridstream's keepalive and size settings."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


class ChannelPool:
    """One channel per peer address, opened on first use and closed together:
    gRPC multiplexes every call to a peer over it."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        """The channel to an address."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address)
        return channel

    async def close(self) -> None:
        """Closes every channel."""
        channels, self._channels = self._channels, {}
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
