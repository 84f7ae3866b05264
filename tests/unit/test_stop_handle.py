"""Stopping a task whose first cancellation was lost (as Python 3.11's
asyncio.wait_for can lose one): the stopper cancels again instead of
waiting forever, and says so."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from services.worker import stopping
from services.worker.stopping import stop_handle


async def test_a_task_that_swallowed_a_cancel_is_cancelled_again(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(stopping, "STOP_GRACE_S", 0.05)
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)  # the first cancel is lost here
        swallowed.set()
        await asyncio.sleep(60)  # and it goes on, until cancelled again

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(stop_handle(task, "task j/t0/p0"), 5)
    assert swallowed.is_set() and task.cancelled()
    assert "task j/t0/p0 still runs" in caplog.text


async def test_a_task_that_failed_raises_its_error_to_the_stopper() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await stop_handle(task, "task j/t0/p0")
