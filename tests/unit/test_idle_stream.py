"""A server stream has no whole-call deadline, only a bound on the wait for
its next message: a big answer that keeps arriving is never cut off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gridstream.errors import Unavailable
from gridstream.rpc import idle_stream


class StandInCall:
    """The two things idle_stream uses of a gRPC stream call."""

    def __init__(self, gaps_s: list[float]) -> None:
        self.gaps_s = gaps_s
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[int]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[int]:
        for index, gap in enumerate(self.gaps_s):
            await asyncio.sleep(gap)
            yield index

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_long_stream_that_keeps_arriving_is_read_whole() -> None:
    call = StandInCall([0.05] * 8)  # 0.4 s in all, never 0.1 s without a message
    got = [m async for m in idle_stream(call, "reading", idle_s=0.1)]
    assert got == list(range(8)) and call.cancelled


async def test_a_stalled_stream_fails_clearly() -> None:
    call = StandInCall([0.01, 0.01, 1.0])
    got: list[int] = []
    with pytest.raises(Unavailable, match="reading: nothing arrived for"):
        async for message in idle_stream(call, "reading", idle_s=0.1):
            got.append(message)
    assert got == [0, 1] and call.cancelled
