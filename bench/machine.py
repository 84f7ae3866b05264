"""How busy the whole machine is, from ``/proc/stat``: a bench checks that
nothing but what it measures is running (a stray busy loop once cost
gridstream's taxi runs a fifth of their rate, docs/benchmarks.md).

Standard library only: the peers driver and the latency bench import it.
"""

from __future__ import annotations

import os
import time

IDLE_LIMIT_CORES = 0.25
"""Cores busy with something other than the measured processes above which
a bench says its figures measure that load too."""


def machine_cpu_times() -> list[int]:
    """The numbers of ``/proc/stat``'s ``cpu`` line, in clock ticks: user,
    nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice."""
    with open("/proc/stat") as stat:
        return [int(n) for n in stat.readline().split()[1:]]


def busy_cores(before: list[int], after: list[int], cores: int) -> float:
    """Cores busy between two :func:`machine_cpu_times` readings: the share
    of the time neither idle nor waiting for I/O, times the cores."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent[:8])
    if total <= 0:
        return 0.0
    return (total - spent[3] - spent[4]) / total * cores


def machine_busy_cores(seconds: float) -> float:
    """Cores busy on the whole machine over the next ``seconds``."""
    before = machine_cpu_times()
    time.sleep(seconds)
    return busy_cores(before, machine_cpu_times(), os.cpu_count() or 1)
