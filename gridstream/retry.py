"""The one retry-with-backoff helper of gridstream.

Every loop that tries an operation again after a transient failure goes
through :class:`Backoff`, so delays, caps and deadlines behave the same
everywhere and are tuned in one place. It never waits forever unless the
caller says so: give ``deadline_s`` and :meth:`Backoff.wait` raises
:class:`RetryExhausted` once the time is up, naming what was being retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

ATTEMPT_FLOOR_S = 0.05
"""The shortest deadline :func:`call_timeout` gives a call (one made with no
time left fails at once, and the caller's next deadline check gives up)."""


def call_timeout(deadline: float | None, cap_s: float) -> float:
    """The deadline to give one call made before ``deadline`` (a
    ``time.monotonic()`` moment; None: none): ``cap_s``, or what is left
    until ``deadline`` when that comes first, and at least
    :data:`ATTEMPT_FLOOR_S`."""
    if deadline is None:
        return cap_s
    return max(ATTEMPT_FLOOR_S, min(cap_s, deadline - time.monotonic()))


class RetryExhausted(Exception):
    """The deadline of a retried operation passed; ``last`` is its last error."""

    def __init__(self, what: str, attempts: int, last: BaseException | None) -> None:
        super().__init__(f"{what}: gave up after {attempts} attempts"
                         + (f" (last error: {last})" if last is not None else ""))
        self.what = what
        self.attempts = attempts
        self.last = last


class Backoff:
    """Exponential delays between attempts: ``first_s``, doubling, capped at
    ``max_s``; optionally bounded by ``deadline_s`` from creation.

    Use it as ``backoff = Backoff(...); while True: try ...; except ...:
    await backoff.wait(exc)``, or through :func:`retry`.
    """

    def __init__(self, what: str, first_s: float = 0.05, max_s: float = 1.0,
                 deadline_s: float | None = None) -> None:
        self.what = what
        self.first_s = first_s
        self.max_s = max_s
        self.delay_s = first_s
        self.attempts = 0
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts from the first delay."""
        self.delay_s = self.first_s
        self.attempts = 0

    def attempt_timeout(self, cap_s: float) -> float:
        """The deadline of the next attempt (:func:`call_timeout` of the
        retries' deadline), so an attempt never outlives the time its caller
        was promised."""
        return call_timeout(self.deadline, cap_s)

    @property
    def expired(self) -> bool:
        """Whether the deadline (if any) has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    async def wait(self, error: BaseException | None = None,
                   wake: asyncio.Event | None = None) -> None:
        """Sleeps before the next attempt; raises RetryExhausted when the next
        attempt would start after the deadline. With ``wake``, the sleep ends
        early when the event is set (something changed that is worth trying
        again at once, e.g. the membership)."""
        self.attempts += 1
        delay = self.delay_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise RetryExhausted(self.what, self.attempts, error)
            delay = min(delay, left)
        if wake is None:
            await asyncio.sleep(delay)
        else:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a
            # cancellation that lands as the wake is set, and the retrying
            # task would go on after its owner cancelled it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await wake.wait()
        self.delay_s = min(self.delay_s * 2, self.max_s)


async def retry(
    what: str,
    call: Callable[[], Awaitable[T]],
    retry_on: tuple[type[BaseException], ...],
    *,
    first_s: float = 0.05,
    max_s: float = 1.0,
    deadline_s: float | None = None,
    on_error: Callable[[BaseException, int], None] | None = None,
) -> T:
    """Calls ``call`` until it returns, retrying the errors in ``retry_on``
    with :class:`Backoff`; other errors (and cancellation) pass through.
    ``on_error`` sees each retried error and the attempt number (for logs)."""
    backoff = Backoff(what, first_s, max_s, deadline_s)
    while True:
        try:
            return await call()
        except retry_on as exc:
            if on_error is not None:
                on_error(exc, backoff.attempts + 1)
            await backoff.wait(exc)
