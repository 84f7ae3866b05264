"""The routing table: members and, for every running job, the owner of each
partition on the ring of live workers. Rebuilt once per epoch."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gridstream.ring import HashRing, assign_partitions
from gridstream.v1 import scheduler_pb2
from services.scheduler.jobs import JobRecord
from services.scheduler.membership import Membership


class RoutingTables:
    """Builds and caches the table of the current epoch."""

    def __init__(self, virtual_nodes: int) -> None:
        self.virtual_nodes = virtual_nodes
        self._cached: tuple[int, int, scheduler_pb2.RoutingTable] | None = None

    def build(self, membership: Membership, jobs: list[JobRecord], version: int,
              avoid: Mapping[str, Mapping[int, Collection[str]]] | None = None,
              ) -> scheduler_pb2.RoutingTable:
        """The table at the current epoch. Jobs appear with empty owners when no
        worker is alive. ``version`` changes when the job list changes;
        ``avoid`` (job -> partition -> workers its task kept failing on) only
        changes with a new epoch."""
        if self._cached and self._cached[:2] == (membership.epoch, version):
            return self._cached[2]
        workers = [m.node_id for m in membership.live(scheduler_pb2.MEMBER_ROLE_WORKER)]
        ring = HashRing(workers, self.virtual_nodes)
        table = scheduler_pb2.RoutingTable(epoch=membership.epoch)
        for record in membership.members.values():
            table.members.append(scheduler_pb2.Member(
                node_id=record.node_id, role=record.role,  # type: ignore[arg-type]
                address=record.address, state=record.state,  # type: ignore[arg-type]
                incarnation=record.incarnation))
        for job in jobs:
            owners = (assign_partitions(ring, job.job_id, job.spec.partitions,
                                        avoid=(avoid or {}).get(job.job_id))
                      if workers else [])
            table.jobs.append(scheduler_pb2.JobRouting(
                job_id=job.job_id, partitions=job.spec.partitions, owners=owners,
                spec=job.spec.to_proto(), created_epoch=job.created_epoch))
        self._cached = (membership.epoch, version, table)
        return table
