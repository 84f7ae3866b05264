"""gridstream: a stream-processing cluster with in-memory-grid fault tolerance.

The public face is small: the SDK (:class:`Client`, :class:`SyncClient`),
jobs (:class:`JobSpec`, :class:`Stage`) and the typed errors.
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
from gridstream.sync import SyncClient

__all__ = [
    "Client",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GridstreamError",
    "InvalidArgument",
    "JobSpec",
    "NotFound",
    "ResourceExhausted",
    "Stage",
    "StaleEpoch",
    "SyncClient",
    "Unavailable",
    "load_job_file",
]
