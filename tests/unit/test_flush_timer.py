"""The flush timer's cadence: checking every half ``tracking_flush_s`` at
shared clock boundaries, it closes a busy task's window once per
``tracking_flush_s``, not once per 1.5 of it."""

from __future__ import annotations

from services.worker.tasks import window_is_due

FLUSH_S = 1.0


def closes(checks: int, closed_after_check_s: float) -> list[int]:
    """The checks (numbered from 1) at which the timer closes a window, over
    ``checks`` checks every half flush, each close landing
    ``closed_after_check_s`` after its check (the task closes it on its next
    turn); the first window closed at check 0."""
    step = FLUSH_S / 2
    last_close = closed_after_check_s
    closed = []
    for check in range(1, checks + 1):
        now = check * step
        if window_is_due(now - last_close, FLUSH_S):
            closed.append(check)
            last_close = now + closed_after_check_s
    return closed


def test_a_busy_task_closes_a_window_every_flush_interval() -> None:
    # Closes land a few milliseconds after their check: every second check.
    assert closes(8, 0.004) == [2, 4, 6, 8]
    # Even a close that took most of a step to land.
    assert closes(8, 0.2) == [2, 4, 6, 8]


def test_never_two_windows_one_check_apart() -> None:
    assert not window_is_due(FLUSH_S / 2, FLUSH_S)
    assert window_is_due(FLUSH_S - 0.004, FLUSH_S)
