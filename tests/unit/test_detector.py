"""The phi-accrual detector against recorded heartbeat sequences."""

from __future__ import annotations

import random

from services.scheduler.detector import DetectorSettings, PhiAccrualDetector, Verdict

SETTINGS = DetectorSettings(interval_s=0.25, threshold=8.0, acceptable_pause_s=0.75,
                            min_std_s=0.05)


def regular(count: int, interval: float = 0.25, jitter: float = 0.02,
            seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += interval + rng.uniform(-jitter, jitter)
        out.append(t)
    return out


def detection_time(arrivals: list[float]) -> float:
    detector = PhiAccrualDetector(SETTINGS, max_tick_gap_s=10)
    for t in arrivals:
        detector.heartbeat("w", t)
        detector.tick(t)
    last = arrivals[-1]
    t = last
    while detector.tick(t)["w"][0] != Verdict.DEAD:
        t += 0.01
    return t - last


def test_kill_is_detected_within_one_and_a_half_seconds() -> None:
    elapsed = detection_time(regular(200))
    assert 1.0 < elapsed < 1.5, elapsed


def test_regular_heartbeats_never_raise_suspicion() -> None:
    detector = PhiAccrualDetector(SETTINGS)
    for t in regular(400, jitter=0.05):
        detector.heartbeat("w", t)
        verdict, phi = detector.tick(t + 0.2)["w"]
        assert verdict == Verdict.ALIVE and phi < 1.0


def test_a_pause_shorter_than_the_acceptable_pause_is_tolerated() -> None:
    detector = PhiAccrualDetector(SETTINGS)
    arrivals = regular(100)
    for t in arrivals:
        detector.heartbeat("w", t)
    assert detector.tick(arrivals[-1] + 0.8)["w"][0] == Verdict.ALIVE


def test_suspect_comes_before_dead() -> None:
    detector = PhiAccrualDetector(SETTINGS, max_tick_gap_s=10)
    arrivals = regular(100)
    for t in arrivals:
        detector.heartbeat("w", t)
    seen = []
    t = arrivals[-1]
    while not seen or seen[-1] != Verdict.DEAD:
        verdict = detector.tick(t)["w"][0]
        if not seen or seen[-1] != verdict:
            seen.append(verdict)
        t += 0.01
    assert seen == [Verdict.ALIVE, Verdict.SUSPECT, Verdict.DEAD]


def test_irregular_history_waits_longer() -> None:
    steady = detection_time(regular(200, jitter=0.01))
    jittery = detection_time(regular(200, jitter=0.2, seed=5))
    assert jittery > steady


def test_a_paused_detector_convicts_nobody() -> None:
    detector = PhiAccrualDetector(SETTINGS, max_tick_gap_s=1.0)
    arrivals = regular(50)
    for t in arrivals:
        detector.heartbeat("w", t)
        detector.tick(t)
    # The scheduler itself stalls for 5 s; on resume the member is not dead.
    resumed = arrivals[-1] + 5.0
    assert detector.tick(resumed)["w"][0] == Verdict.ALIVE
    # But if heartbeats really stopped, it is convicted on later ticks.
    t = resumed
    while detector.tick(t)["w"][0] != Verdict.DEAD:
        t += 0.05
        assert t - resumed < 2.0


def ticks(detector: PhiAccrualDetector, start: float, end: float) -> str:
    """Ticks every 100 ms (as the scheduler does) and returns the last verdict."""
    verdict = Verdict.ALIVE
    t = start
    while t <= end:
        verdict = detector.tick(t)["worker-1"][0]
        t = round(t + 0.1, 3)
    return verdict


def test_a_readmitted_member_is_not_judged_until_it_has_heartbeaten_again() -> None:
    # A scheduler restart: the member's heartbeats failed while the scheduler
    # was down, and its channel may take a few seconds to reconnect.
    detector = PhiAccrualDetector(DetectorSettings())
    detector.readmit("worker-1", now=100.0)
    assert ticks(detector, 100.0, 103.0) == Verdict.ALIVE  # silent, but bootstrapping
    for beat in (103.1, 103.35, 103.6):
        detector.heartbeat("worker-1", beat)
    # Bootstrap over: from now on phi is trusted, and silence convicts.
    assert ticks(detector, 103.6, 104.0) == Verdict.ALIVE
    assert ticks(detector, 104.1, 106.0) == Verdict.DEAD


def test_a_readmitted_member_that_never_heartbeats_is_declared_dead_after_the_grace() -> None:
    detector = PhiAccrualDetector(DetectorSettings(bootstrap_grace_s=15.0))
    detector.readmit("worker-1", now=0.0)
    assert ticks(detector, 0.0, 14.9) == Verdict.ALIVE
    assert ticks(detector, 15.0, 15.5) == Verdict.DEAD
