"""Fault-injection hooks for tests and chaos runs, off unless an environment
variable names them.

``GRIDSTREAM_CRASH_POINT=<node>:<point>:<n>`` makes the process whose node id
is ``<node>`` SIGKILL itself the ``n``-th time it reaches ``<point>``; with
``GRIDSTREAM_CRASH_ONCE_FILE=<path>`` it does so only if that file does not
exist yet (and creates it), so the restarted process runs on. Points:

- ``window_persist``: a window snapshot has been sent to the state server and
  its acknowledgement has not arrived (half-written as far as the worker knows).
- ``after_emit``: a batch's output was acknowledged downstream, LatestSnapshot
  is not yet os=true.

``GRIDSTREAM_FAULT_WRITE_DELAY_S=<seconds>`` makes a state server wait that
long before every write (a slow disk or an overloaded replica).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_hits: dict[str, int] = {}


def crash_point(node_id: str, point: str) -> None:
    """SIGKILLs this process if the environment arms this point for this node."""
    spec = os.environ.get("GRIDSTREAM_CRASH_POINT")
    if not spec:
        return
    try:
        node, name, nth = spec.split(":")
        target = int(nth)
    except ValueError:
        return
    if node != node_id or name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] != target:
        return
    once = os.environ.get("GRIDSTREAM_CRASH_ONCE_FILE")
    if once:
        marker = Path(once)
        if marker.exists():
            return
        marker.write_text(f"{node_id} crashed at {point} #{target}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def write_delay_s() -> float:
    """Seconds a state server waits before each write (0 unless set)."""
    try:
        return max(0.0, float(os.environ.get("GRIDSTREAM_FAULT_WRITE_DELAY_S", "0")))
    except ValueError:
        return 0.0


_dropped: dict[str, int] = {}


def drop_batch(node_id: str, task: int) -> bool:
    """True when this batch must be lost inside the task (tests of tuple
    tracking): ``GRIDSTREAM_FAULT_DROP_BATCH=<node>:<task>:<n>`` loses the n-th
    batch task ``task`` takes on that node; the batch stays in the container,
    as a batch lost after it was taken would."""
    spec = os.environ.get("GRIDSTREAM_FAULT_DROP_BATCH")
    if not spec:
        return False
    try:
        node, task_text, nth = spec.split(":")
        wanted_task, target = int(task_text), int(nth)
    except ValueError:
        return False
    if node != node_id or wanted_task != task:
        return False
    _dropped[node] = _dropped.get(node, 0) + 1
    return _dropped[node] == target
