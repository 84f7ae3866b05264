"""Which jobs and operators exist, so a state server refuses writes for
anything else instead of storing orphans.

The state server keeps its own copy of the scheduler's routing table (the
same :class:`~gridstream.routing.RoutingView` workers use). An unknown job is
looked up once more before it is refused, because a job submitted a moment
ago may not be in our copy yet.
"""

from __future__ import annotations

import re

from gridstream.errors import InvalidArgument, NotFound
from gridstream.jobspec import JobSpec, plan_tasks
from gridstream.routing import RoutingView

_OPERATOR = re.compile(r"^(?P<job>.+)/t(?P<task>\d+)/p(?P<partition>\d+)$")


class JobDirectory:
    """Answers "may this operator of this job be written?" from the routing table."""

    def __init__(self, routing: RoutingView) -> None:
        self.routing = routing
        self._tasks: dict[str, int] = {}

    def _task_count(self, job_id: str) -> int | None:
        for job in self.routing.table.jobs:
            if job.job_id == job_id:
                if job_id not in self._tasks:
                    self._tasks[job_id] = len(plan_tasks(JobSpec.from_proto(job.spec)))
                return self._tasks[job_id]
        return None

    async def check(self, job_id: str, operator_id: str) -> None:
        """Raises NotFound for a job that is not running and InvalidArgument for
        an operator id that does not name one of its (task, partition) pairs."""
        match = _OPERATOR.match(operator_id)
        if match is None or match["job"] != job_id:
            raise InvalidArgument(
                f"operator_id {operator_id!r} is not of the form '{job_id}/t<task>/p<partition>'"
                " (gridstream.ids.operator_id); nothing stored")
        if job_id not in self.routing.owners:
            await self.routing.refresh(at_least=self.routing.epoch + 1)
        if job_id not in self.routing.owners:
            raise NotFound(f"unknown job {job_id!r}: it is not running (never submitted, "
                           "cancelled or failed); nothing stored")
        tasks = self._task_count(job_id) or 0
        partitions = self.routing.partitions(job_id)
        task, partition = int(match["task"]), int(match["partition"])
        if task >= tasks or partition >= partitions:
            raise NotFound(f"unknown operator {operator_id!r}: job {job_id} has tasks "
                           f"0..{tasks - 1} and partitions 0..{partitions - 1}; nothing stored")
