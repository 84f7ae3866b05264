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
