"""Stopping a task for certain.

Why a module of its own: every owner of a task (a worker's job runtimes, a
restarted task's supervisor) must be able to stop it and know it has ended,
and asyncio does not promise that one ``cancel()`` ends a task.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

STOP_GRACE_S = 2.0
"""How long a cancelled task may take to end before it is cancelled again."""


async def stop_handle(handle: asyncio.Task[Any], what: str) -> None:
    """Cancels a task and returns once it has ended. A cancellation can be
    lost (Python 3.11's ``wait_for`` swallows one that lands as what it waits
    for completes), which would leave the task running and its stopper, and
    every sync behind it, waiting forever; so the cancel is repeated until
    the task ends, with a warning when it had to be."""
    waited = 0.0
    while not handle.done():
        handle.cancel()
        await asyncio.wait({handle}, timeout=STOP_GRACE_S)
        waited += STOP_GRACE_S
        if not handle.done():
            log.warning("%s still runs %.0fs after it was cancelled; cancelling it again",
                        what, waited)
    if not handle.cancelled():
        error = handle.exception()  # what awaiting it would have raised
        if error is not None:
            raise error
