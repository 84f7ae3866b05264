"""A member that restarts faster than the detector convicts it still died: the
scheduler names the old incarnation's death in its events and counts it."""

from __future__ import annotations

from pathlib import Path

from gridstream.config import Config
from gridstream.v1 import scheduler_pb2
from services.scheduler.detector import PhiAccrualDetector
from services.scheduler.jobs import JobRegistry
from services.scheduler.main import detector_settings
from services.scheduler.membership import Membership
from services.scheduler.server import SchedulerCore

DEAD = scheduler_pb2.MEMBER_STATE_DEAD
ALIVE = scheduler_pb2.MEMBER_STATE_ALIVE


def register(incarnation: str) -> scheduler_pb2.RegisterRequest:
    return scheduler_pb2.RegisterRequest(node_id="worker-1",
                                         role=scheduler_pb2.MEMBER_ROLE_WORKER,
                                         address="127.0.0.1:7001", incarnation=incarnation)


async def test_a_new_incarnation_records_the_old_ones_death(tmp_path: Path) -> None:
    config = Config()
    registry = JobRegistry(tmp_path)
    await registry.open()
    try:
        core = SchedulerCore(config, registry,
                             Membership(PhiAccrualDetector(detector_settings(config))))
        await core.register(register("first"))
        await core.register(register("first"))  # a refresh changes nothing
        assert [(e.new_state, e.reason) for e in core.events] == [(ALIVE, "registered")]
        await core.register(register("second"))
        assert [(e.old_state, e.new_state, e.reason) for e in core.events] == [
            (0, ALIVE, "registered"), (ALIVE, DEAD, "restarted"), (DEAD, ALIVE, "registered")]
        assert core.detections == 1
        assert core.membership.members["worker-1"].incarnation == "second"
    finally:
        await registry.close()
