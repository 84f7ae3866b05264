"""The SDK's answers as plain Python: enums and frozen dataclasses.

:class:`gridstream.Client` returns these instead of protobuf messages, so a
job's state prints as ``JobState.RUNNING`` rather than ``1``, an editor
completes field names, and results compare, copy and pickle like any
dataclass. They keep the protocol's field names (``job.state``,
``progress.tasks[0].records_in``, ``status.members[0].member.node_id``), and the
enums are ``IntEnum`` whose values are the protocol's, so code written
against the messages keeps working (``job.state ==
common_pb2.JOB_STATE_RUNNING`` still holds). Repeated fields are lists; a
job's spec is the :class:`gridstream.JobSpec` one submits.

The ``from_proto`` functions convert at the SDK's edge; nothing below the
SDK uses these types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gridstream.deadletters import decode_error, decode_record
from gridstream.errors import InvalidArgument
from gridstream.jobspec import DELIVERY_NAMES, JobSpec
from gridstream.v1 import common_pb2, scheduler_pb2

_E = TypeVar("_E", bound="ProtoEnum")


class ProtoEnum(enum.IntEnum):
    """An enum of the protocol: an int equal to the wire value, printed by name.

    A value this SDK does not know (from a newer cluster) becomes a member
    named ``UNKNOWN_<value>`` instead of an error, so an older client can still
    read a newer cluster's status."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    # An __eq__ of its own (int's) keeps mypy's strict equality from calling a
    # comparison with the protocol's constants (``state == common_pb2.X``)
    # non-overlapping: the point of these enums is that it holds.
    def __eq__(self, other: object) -> bool:
        return int(self) == other

    def __ne__(self, other: object) -> bool:
        return int(self) != other

    __hash__ = int.__hash__

    def __format__(self, spec: str) -> str:
        # Numeric format specs (``:d``, ``:>3d``) keep working; anything else
        # formats the name.
        if spec and spec[-1] in "bdnoxX":
            return int.__format__(int(self), spec)
        return format(str(self), spec)

    @property
    def label(self) -> str:
        """The name in lower case (``running``), for tables and messages."""
        return self.name.lower()

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            member = int.__new__(cls, value)
            member._name_ = f"UNKNOWN_{value}"
            member._value_ = value
            return member
        return None

    @classmethod
    def of(cls: type[_E], value: int) -> _E:
        """The member of a wire value (an unknown one included)."""
        return cls(int(value))


class JobState(ProtoEnum):
    """The life of a job (``common.proto`` JobState)."""

    UNSPECIFIED = common_pb2.JOB_STATE_UNSPECIFIED
    RUNNING = common_pb2.JOB_STATE_RUNNING
    CANCELLED = common_pb2.JOB_STATE_CANCELLED
    FAILED = common_pb2.JOB_STATE_FAILED


class MemberRole(ProtoEnum):
    """What a cluster member is (``scheduler.proto`` MemberRole)."""

    UNSPECIFIED = scheduler_pb2.MEMBER_ROLE_UNSPECIFIED
    WORKER = scheduler_pb2.MEMBER_ROLE_WORKER
    STATE_SERVER = scheduler_pb2.MEMBER_ROLE_STATE_SERVER


class MemberState(ProtoEnum):
    """The scheduler's view of a member (``scheduler.proto`` MemberState);
    UNSPECIFIED is a member that left on purpose (``gone``)."""

    UNSPECIFIED = scheduler_pb2.MEMBER_STATE_UNSPECIFIED
    ALIVE = scheduler_pb2.MEMBER_STATE_ALIVE
    SUSPECT = scheduler_pb2.MEMBER_STATE_SUSPECT
    DEAD = scheduler_pb2.MEMBER_STATE_DEAD
    LEAVING = scheduler_pb2.MEMBER_STATE_LEAVING


def _spec(message: common_pb2.JobSpec) -> JobSpec:
    """The submitted spec. One this SDK cannot parse (a newer cluster's stage
    kind) keeps its name and sizes without stages, so a status stays readable."""
    try:
        return JobSpec.from_proto(message)
    except InvalidArgument:
        return JobSpec(message.name, (), message.partitions,
                       DELIVERY_NAMES.get(message.delivery, "unknown"), message.window_size,
                       tracking_timeout_s=message.tracking_timeout_s)


@dataclass(frozen=True)
class JobInfo:
    """A job as the scheduler knows it: what :meth:`Client.job`, ``jobs`` and
    ``cancel`` return."""

    job_id: str
    spec: JobSpec
    """The job as submitted, with the cluster's defaults filled in."""
    state: JobState
    error: str = ""
    """Why the job failed, when ``state`` is FAILED."""
    submitted_at: float = 0.0
    """Wall-clock time of submission (seconds since the Unix epoch)."""

    @classmethod
    def from_proto(cls, message: common_pb2.JobInfo) -> JobInfo:
        """Converts the scheduler's message."""
        return cls(message.job_id, _spec(message.spec), JobState.of(message.state),
                   message.error, message.submitted_at)


@dataclass(frozen=True)
class TaskProgress:
    """Counters of one task of one partition; each field is documented on
    ``TaskProgress`` in ``protos/gridstream/v1/common.proto``."""

    task: int = 0
    partition: int = 0
    records_in: int = 0
    records_processed: int = 0
    records_out: int = 0
    queue_batches: int = 0
    queue_records: int = 0
    outbound_pending: int = 0
    windows_persisted: int = 0
    persist_pending: int = 0
    dead_letters: int = 0
    node_id: str = ""
    replicated_epoch: int = 0
    roots_pending: int = 0
    roots_finished: int = 0
    roots_failed: int = 0
    batches_replayed: int = 0
    records_replayed: int = 0
    invocations: int = 0
    batches_lost: int = 0
    losses: list[str] = field(default_factory=list)
    restarts: int = 0
    last_error: str = ""
    roots_abandoned: int = 0

    @classmethod
    def from_proto(cls, message: common_pb2.TaskProgress) -> TaskProgress:
        """Converts one task's counters."""
        fields: dict[str, Any] = {name: getattr(message, name) for name in _TASK_FIELDS}
        fields["losses"] = list(message.losses)
        return cls(**fields)


_TASK_FIELDS = tuple(TaskProgress.__dataclass_fields__)


@dataclass(frozen=True)
class JobProgress:
    """A job's progress: what :meth:`Client.progress` and ``drain`` return."""

    job_id: str
    tasks: list[TaskProgress]
    """One entry per (task, partition)."""
    drained: bool
    """Every record accepted so far is processed and its results are durable."""
    epoch: int = 0
    holding: str = ""
    """What holds the drain, when not drained."""
    losses: list[str] = field(default_factory=list)
    """Ranges known lost (never expected; see docs/recovery.md)."""
    moved: list[str] = field(default_factory=list)
    """Tasks moved off a worker where they kept failing."""

    @classmethod
    def from_proto(cls, message: scheduler_pb2.JobProgress) -> JobProgress:
        """Converts the scheduler's report."""
        return cls(message.job_id, [TaskProgress.from_proto(t) for t in message.tasks],
                   message.drained, message.epoch, message.holding, list(message.losses),
                   list(message.moved))


@dataclass(frozen=True)
class Member:
    """A member of the cluster: a worker or a state server."""

    node_id: str
    role: MemberRole
    address: str
    state: MemberState
    incarnation: str = ""

    @classmethod
    def from_proto(cls, message: scheduler_pb2.Member) -> Member:
        """Converts one member."""
        return cls(message.node_id, MemberRole.of(message.role), message.address,
                   MemberState.of(message.state), message.incarnation)


@dataclass(frozen=True)
class MemberStatus:
    """A member with the scheduler's figures about it."""

    member: Member
    partitions_owned: int = 0
    last_heartbeat_age_s: float = 0.0
    phi: float = 0.0
    """The failure detector's suspicion (phi accrual)."""
    snapshots: int = 0
    snapshot_bytes: int = 0
    loop_lag_s: float = 0.0
    """Worst lateness of its event loop reported in about the last 10 s: a
    busy member keeps beating (heartbeats have a thread of their own), and
    this says how busy it has been."""

    @classmethod
    def from_proto(cls, message: scheduler_pb2.MemberStatus) -> MemberStatus:
        """Converts one member's status."""
        return cls(Member.from_proto(message.member), message.partitions_owned,
                   message.last_heartbeat_age_s, message.phi, message.snapshots,
                   message.snapshot_bytes, message.loop_lag_ms / 1000)


@dataclass(frozen=True)
class MemberEvent:
    """A change of a member's state (failures and recoveries)."""

    node_id: str
    old_state: MemberState
    new_state: MemberState
    phi: float = 0.0
    at: float = 0.0
    """Wall-clock time (seconds since the Unix epoch)."""
    epoch: int = 0
    reason: str = ""

    @classmethod
    def from_proto(cls, message: scheduler_pb2.MemberEvent) -> MemberEvent:
        """Converts one event."""
        return cls(message.node_id, MemberState.of(message.old_state),
                   MemberState.of(message.new_state), message.phi, message.at,
                   message.epoch, message.reason)


@dataclass(frozen=True)
class ClusterWarning:
    """Something an operator should look at, with what to do about it, as
    the scheduler's monitor raised it."""

    kind: str
    """``partition_not_draining``, ``roots_timing_out``, ``dead_letters_rising``,
    ``member_suspect``, ..."""
    job_id: str = ""
    task: int = -1
    """The task concerned, -1 for a whole job or a member."""
    partitions: list[int] = field(default_factory=list)
    node_id: str = ""
    text: str = ""
    """What is wrong, in one line."""
    action: str = ""
    """What to do about it."""
    since: float = 0.0
    """Wall-clock time the episode began (seconds since the Unix epoch)."""

    @classmethod
    def from_proto(cls, message: Any) -> ClusterWarning:
        """Converts one warning of a ClusterStatus."""
        return cls(str(message.kind), str(message.job_id), int(message.task),
                   [int(p) for p in message.partitions], str(message.node_id),
                   str(message.text), str(message.action), float(message.since))


@dataclass(frozen=True)
class ClusterStatus:
    """Members, jobs and recent membership changes: :meth:`Client.status`."""

    epoch: int
    members: list[MemberStatus]
    jobs: list[JobInfo]
    events: list[MemberEvent]
    """The most recent member state changes, oldest first."""
    warnings: list[ClusterWarning] = field(default_factory=list)
    """Warnings active now (from a scheduler that computes them)."""

    @classmethod
    def from_proto(cls, message: scheduler_pb2.ClusterStatus) -> ClusterStatus:
        """Converts the scheduler's status."""
        return cls(message.epoch, [MemberStatus.from_proto(m) for m in message.members],
                   [JobInfo.from_proto(j) for j in message.jobs],
                   [MemberEvent.from_proto(e) for e in message.events],
                   [ClusterWarning.from_proto(w) for w in getattr(message, "warnings", ())])


@dataclass(frozen=True)
class JobRouting:
    """Where a job's partitions live."""

    job_id: str
    partitions: int
    owners: list[str]
    """Node id of the owner of each partition, by partition number."""
    spec: JobSpec

    @classmethod
    def from_proto(cls, message: scheduler_pb2.JobRouting) -> JobRouting:
        """Converts one job's routing."""
        return cls(message.job_id, message.partitions, list(message.owners),
                   _spec(message.spec))


@dataclass(frozen=True)
class RoutingTable:
    """The scheduler's routing table: :meth:`Client.routing_table`."""

    epoch: int
    members: list[Member]
    jobs: list[JobRouting]
    state_replicas: int = 0
    state_write_quorum: int = 0
    tracker_count: int = 0
    tracker_virtual_positions: int = 0
    tracking_timeout_s: float = 0.0

    @classmethod
    def from_proto(cls, message: scheduler_pb2.RoutingTable) -> RoutingTable:
        """Converts the scheduler's table."""
        return cls(message.epoch, [Member.from_proto(m) for m in message.members],
                   [JobRouting.from_proto(j) for j in message.jobs], message.state_replicas,
                   message.state_write_quorum, message.tracker_count,
                   message.tracker_virtual_positions, message.tracking_timeout_s)


@dataclass(frozen=True)
class DeadLetter:
    """A record an operator raised on, with the error and its traceback:
    what :meth:`Client.dead_letters` returns (``gridstream dead-letters``
    prints the same fields as JSON lines)."""

    id: str
    """Stable across replays: ``<batch>:<stage>:<index>``."""
    stage: str
    """The stage the record failed in."""
    record: Any
    """The record's value as JSON when it is representable (``record_format``
    ``json``), else its Python repr, cut (``repr``)."""
    record_format: str
    key: Any = None
    """The record's key in a keyed stage (JSON), else None."""
    error: str = ""
    """``Type: message`` of the exception."""
    traceback: str = ""
    """The exception's traceback (its innermost frames), empty when none was kept."""

    @classmethod
    def from_stored(cls, entry_id: str, stage: str, record: str, error: str) -> DeadLetter:
        """Parses a dead letter as the state servers store it
        (:mod:`gridstream.deadletters`)."""
        key, value, kind = decode_record(record)
        message, trace = decode_error(error)
        return cls(entry_id, stage, value, kind, key, message, trace)

    def to_json(self) -> dict[str, Any]:
        """The fields as one JSON object (a line of ``gridstream dead-letters``)."""
        return {"id": self.id, "stage": self.stage, "key": self.key, "record": self.record,
                "record_format": self.record_format, "error": self.error,
                "traceback": self.traceback}


__all__ = [
    "ClusterStatus",
    "ClusterWarning",
    "DeadLetter",
    "JobInfo",
    "JobProgress",
    "JobRouting",
    "JobState",
    "Member",
    "MemberEvent",
    "MemberRole",
    "MemberState",
    "MemberStatus",
    "ProtoEnum",
    "RoutingTable",
    "TaskProgress",
]
