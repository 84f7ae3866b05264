"""Typed errors shared by services and the SDK.

A service raises one of these; the gRPC layer turns it into a status code
with the message unchanged; the SDK turns the status back into the same type.
Every message says what to fix.
"""

from __future__ import annotations

import grpc


class GridstreamError(Exception):
    """Base of every gridstream error; ``code`` is the gRPC status it travels as.

    When ``Client.send`` fails, the error also says what became of each
    partition: ``sent_partitions`` were acknowledged in full,
    ``pending_partitions`` hold a batch whose outcome is unknown (the client
    pushes it again, with the same sequence, before anything else on its next
    send to the job, or on ``Client.flush``; do not send those records again
    yourself), and ``failed_partitions`` were refused (nothing of their
    unsent batches was appended; fix and send those records again).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    sent_partitions: tuple[int, ...] = ()
    pending_partitions: tuple[int, ...] = ()
    failed_partitions: tuple[int, ...] = ()


class InvalidArgument(GridstreamError):
    """The request is malformed (bad job spec, bad payload, bad import path)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(GridstreamError):
    """The request names a job, operator or member the cluster does not know."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(GridstreamError):
    """The request is valid but the cluster is not in a state to take it."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class StaleEpoch(FailedPrecondition):
    """The sender routed with an old routing table; refresh it and retry."""

    def __init__(self, message: str, epoch: int = 0) -> None:
        super().__init__(message)
        self.epoch = epoch


class ResourceExhausted(GridstreamError):
    """Too big, or too much at once: split the batch or retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(GridstreamError):
    """A service cannot be reached; retrying later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(GridstreamError):
    """A call did not finish in time; its outcome is unknown (writes are idempotent)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class PermissionDenied(GridstreamError):
    """The caller lacks the right to make this call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class DataLoss(GridstreamError):
    """Stored data failed its checksum; the copy is not served."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(GridstreamError):
    """The call carried no known bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


class Internal(GridstreamError):
    """A bug in gridstream; the message says where to look."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[GridstreamError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        PermissionDenied,
        DataLoss,
        Unauthenticated,
        Internal,
    )
}

STALE_EPOCH_PREFIX = "stale epoch"

BATCH_TOO_LARGE = "exceeds worker.max_batch_bytes"
"""Part of the message of a push refused for its size: retrying the same
batch can never succeed (the SDK splits it, or fails naming the limit)."""


def from_rpc_error(error: grpc.aio.AioRpcError, what: str = "") -> GridstreamError:
    """The typed error for a failed call, keeping the server's message."""
    code = error.code()
    return from_status(code, error.details() or code.name, what)


_STATUS_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


def status_number(error: GridstreamError) -> int:
    """The number of an error's gRPC status code, for a reply that carries
    the outcomes of several operations (0 is OK)."""
    return int(error.code.value[0])


def from_status(code: grpc.StatusCode | int, details: str, what: str = "") -> GridstreamError:
    """The typed error for a status code and its details: of a failed call,
    or of one operation answered inside a reply (:func:`status_number`)."""
    if isinstance(code, int):
        code = _STATUS_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    message = f"{what}: {details}" if what else details
    if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(STALE_EPOCH_PREFIX):
        epoch = 0
        for word in details.replace(";", " ").split():
            if word.isdigit():
                epoch = int(word)
                break
        return StaleEpoch(message, epoch)
    cls = _BY_CODE.get(code, GridstreamError)
    return cls(message)


def innermost_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (the error itself otherwise)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe_error(exc: BaseException) -> str:
    """The innermost error of an exception (group), in one short line."""
    exc = innermost_error(exc)
    try:
        return f"{type(exc).__name__}: {exc}"[:500]
    except Exception:  # an exception whose __str__ fails
        return type(exc).__name__
