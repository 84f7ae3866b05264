"""gridstream: a stream-processing cluster with in-memory-grid fault tolerance.

The public face is small: the SDK (:class:`Client`, :class:`SyncClient`,
:class:`Producer` for a stream of records),
jobs (:class:`JobSpec`, :class:`Stage`), the typed answers of the SDK
(:mod:`gridstream.types`: enums and dataclasses) and the typed errors.
"""

from gridstream.client import Client
from gridstream.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    GridstreamError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    StaleEpoch,
    Unavailable,
)
from gridstream.jobspec import JobSpec, Stage, load_job_file
from gridstream.producer import Producer
from gridstream.sync import SyncClient
from gridstream.types import (
    ClusterStatus,
    ClusterWarning,
    DeadLetter,
    JobInfo,
    JobProgress,
    JobRouting,
    JobState,
    Member,
    MemberEvent,
    MemberRole,
    MemberState,
    MemberStatus,
    RoutingTable,
    TaskProgress,
)

__all__ = [
    "Client",
    "ClusterStatus",
    "ClusterWarning",
    "DeadLetter",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GridstreamError",
    "InvalidArgument",
    "JobInfo",
    "JobProgress",
    "JobRouting",
    "JobSpec",
    "JobState",
    "Member",
    "MemberEvent",
    "MemberRole",
    "MemberState",
    "MemberStatus",
    "NotFound",
    "Producer",
    "ResourceExhausted",
    "RoutingTable",
    "Stage",
    "StaleEpoch",
    "SyncClient",
    "TaskProgress",
    "Unavailable",
    "load_job_file",
]
