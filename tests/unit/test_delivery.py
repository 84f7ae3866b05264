"""The delivery pipeline (services/worker/delivery.py): batches queued while a
delivery is on its way go out together, in processing order, and a window
waiting for its batches' delivery waits until they are acknowledged."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from services.worker.delivery import DeliveryPipeline
from services.worker.edges import Outbound
from services.worker.peers import OutSegment


class _Destinations:
    """Stands in for the edges: records each deliver call, acknowledges when released."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.release = asyncio.Event()

    async def deliver(self, segments: list[OutSegment]) -> None:
        self.calls.append([s.sequence for s in segments])
        await self.release.wait()
        self.release.clear()


def segment(sequence: int) -> OutSegment:
    return OutSegment(1, 0, "t0/p0", sequence, [], [], previous_sequence=sequence - 1)


async def test_queued_batches_go_together_in_order_and_windows_wait_for_them() -> None:
    out = _Destinations()
    pipeline = DeliveryPipeline(cast(Outbound, cast(Any, out)), "worker-1")
    pipeline.reset(10)
    runner = asyncio.create_task(pipeline.run())
    try:
        await pipeline.submit(11, [segment(1)])
        await asyncio.sleep(0)  # the first delivery is on its way
        await pipeline.submit(12, [segment(2)])
        await pipeline.submit(13, [])  # a batch without output keeps its place
        await pipeline.submit(14, [segment(3), segment(4)])
        window = asyncio.create_task(pipeline.wait_delivered(14))
        await asyncio.sleep(0.01)
        assert not window.done() and pipeline.delivered_offset == 10
        assert pipeline.pending_segments == 4
        out.release.set()  # the first delivery is acknowledged
        await asyncio.sleep(0.01)
        assert pipeline.delivered_offset == 11 and not window.done()
        out.release.set()  # the rest, sent as one delivery
        await asyncio.wait_for(window, 1)
        assert out.calls == [[1], [2, 3, 4]]
        assert pipeline.delivered_offset == 14 and pipeline.pending_segments == 0
        await pipeline.submit(15, [])  # nothing on its way: done at once
        assert pipeline.delivered_offset == 15
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
