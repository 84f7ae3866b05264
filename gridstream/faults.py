"""Fault-injection hooks for tests and chaos runs, off unless an environment
variable names them.

``GRIDSTREAM_CRASH_POINT=<node>:<point>:<n>`` makes the process whose node id
is ``<node>`` SIGKILL itself the ``n``-th time it reaches ``<point>``; with
``GRIDSTREAM_CRASH_ONCE_FILE=<path>`` it does so only if that file does not
exist yet (and creates it), so the restarted process runs on. Points:

- ``window_persist``: a window snapshot has been sent to the state server and
  its acknowledgement has not arrived (half-written as far as the worker knows).
- ``after_emit``: a delivery of processed batches' output was acknowledged
  downstream, and the window covering them is not yet written.

``GRIDSTREAM_FAULT_WRITE_DELAY_S=<seconds>`` makes a state server wait that
long before every write (a slow disk or an overloaded replica).

``GRIDSTREAM_FAULT_ACK_BEFORE_REPLICATE=1`` makes a worker acknowledge a batch
before its backups hold it: a deliberately broken build, which the history
checker must catch (lost records after a kill). Never set it outside tests.

``GRIDSTREAM_FAULT_DROP_REPORT=<node>:<n>`` makes that worker lose its n-th
tracking report on the way (it believes it was delivered): the root's tracker
must time it out and rebuild it, and nothing may be processed twice.

``GRIDSTREAM_FAULT_TASK_FAIL=<node>`` makes every task on that worker raise
when it processes a batch (a worker on which tasks cannot run): the tasks are
restarted, then their partitions must move to other workers.

The environment is read once, when the process starts (:data:`FAULTS`), never
on the per-batch path.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FaultPlan:
    """The faults this process was started with (all off by default)."""

    crash_node: str = ""
    crash_point: str = ""
    crash_nth: int = 0
    ack_before_replicate: bool = False
    write_delay_s: float = 0.0
    drop_report_node: str = ""
    drop_report_nth: int = 0
    fail_tasks_node: str = ""

    @classmethod
    def from_environment(cls) -> FaultPlan:
        """Reads the ``GRIDSTREAM_CRASH_POINT`` and ``GRIDSTREAM_FAULT_*`` variables."""
        node = point = ""
        nth = 0
        spec = os.environ.get("GRIDSTREAM_CRASH_POINT", "")
        if spec:
            try:
                node, point, nth_text = spec.split(":")
                nth = int(nth_text)
            except ValueError:
                node, point, nth = "", "", 0
        try:
            delay = max(0.0, float(os.environ.get("GRIDSTREAM_FAULT_WRITE_DELAY_S", "0")))
        except ValueError:
            delay = 0.0
        drop_node, drop_nth = "", 0
        drop = os.environ.get("GRIDSTREAM_FAULT_DROP_REPORT", "")
        if drop:
            try:
                drop_node, drop_text = drop.split(":")
                drop_nth = int(drop_text)
            except ValueError:
                drop_node, drop_nth = "", 0
        return cls(node, point, nth,
                   os.environ.get("GRIDSTREAM_FAULT_ACK_BEFORE_REPLICATE", "") == "1", delay,
                   drop_node, drop_nth, os.environ.get("GRIDSTREAM_FAULT_TASK_FAIL", ""))


FAULTS = FaultPlan.from_environment()
"""This process's faults, read once at start."""

_hits: dict[str, int] = {}


def crash_point(node_id: str, point: str) -> None:
    """SIGKILLs this process if its fault plan arms this point for this node."""
    if not FAULTS.crash_point or FAULTS.crash_node != node_id or FAULTS.crash_point != point:
        return
    target = FAULTS.crash_nth
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
    return FAULTS.write_delay_s


def tasks_fail(node_id: str) -> bool:
    """True when this worker's tasks must fail at every batch (see the module doc)."""
    return FAULTS.fail_tasks_node == node_id


_reports: dict[str, int] = {}


def drop_report(node_id: str) -> bool:
    """True when this tracking report must be lost on the way (see the module doc)."""
    if not FAULTS.drop_report_nth or FAULTS.drop_report_node != node_id:
        return False
    _reports[node_id] = _reports.get(node_id, 0) + 1
    return _reports[node_id] == FAULTS.drop_report_nth
