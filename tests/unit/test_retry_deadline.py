"""A retried operation's attempts never outlive the deadline its retries were
given: :meth:`gridstream.retry.Backoff.attempt_timeout` and
:func:`gridstream.retry.call_timeout` (a drain's calls).

Before, ``Client.send`` gave each push its own 15 s deadline whatever was left
of ``send_timeout_s``: a send with ``send_timeout_s=1.0`` to a partition whose
backup was paused raised after about 14.7 s.
"""

from __future__ import annotations

import time

import pytest

from gridstream import retry
from gridstream.retry import Backoff


def test_without_a_deadline_an_attempt_gets_its_cap() -> None:
    assert Backoff("x").attempt_timeout(15.0) == 15.0


def test_an_attempt_gets_what_is_left_when_that_is_less_than_its_cap() -> None:
    backoff = Backoff("x", deadline_s=2.0)
    left = backoff.attempt_timeout(15.0)
    assert 1.5 < left <= 2.0
    assert backoff.attempt_timeout(0.5) == 0.5  # the cap when it comes first


def test_an_attempt_with_no_time_left_gets_the_floor_and_the_next_wait_gives_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff("pushing", deadline_s=1.0)
    later = time.monotonic() + 5.0
    monkeypatch.setattr(retry.time, "monotonic", lambda: later)
    assert backoff.attempt_timeout(15.0) == retry.ATTEMPT_FLOOR_S
    assert backoff.expired


async def test_the_wait_after_a_late_attempt_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff("pushing", deadline_s=1.0)
    later = time.monotonic() + 5.0
    monkeypatch.setattr(retry.time, "monotonic", lambda: later)
    with pytest.raises(retry.RetryExhausted, match="pushing"):
        await backoff.wait(RuntimeError("refused"))


def test_a_call_before_a_deadline_gets_what_is_left_or_its_cap() -> None:
    assert retry.call_timeout(None, 10.0) == 10.0
    assert 2.5 < retry.call_timeout(time.monotonic() + 3.0, 10.0) <= 3.0
    assert retry.call_timeout(time.monotonic() + 30.0, 10.0) == 10.0
    assert retry.call_timeout(time.monotonic() - 1.0, 10.0) == retry.ATTEMPT_FLOOR_S
