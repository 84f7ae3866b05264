"""What every gridstream service process shares: the gRPC server with health
checking and reflection, logging, signal handling and the ready file that
supervisors wait on (registration and heartbeats: :mod:`gridstream.member`)."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gridstream import rpc
from gridstream.auth import CallGuard, load_cluster_secret, load_tokens
from gridstream.config import ClusterConfig, ConfigError, SecurityConfig, check_bind

log = logging.getLogger(__name__)


RETIRED_EXIT_CODE = 10
"""Exit status of a member that retired and left the cluster: supervisors must
not restart it (systemd: ``RestartPreventExitStatus=10``)."""


class NodeIdFilter(logging.Filter):
    """Stamps every record with the node id of this process, so lines from
    many members merged by a log shipper still say which member wrote them."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        """Adds ``record.node_id``; never drops a record."""
        record.node_id = self.node_id
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        """Renders one record as a JSON object."""
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "node": getattr(record, "node_id", ""),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(name: str, json_logs: bool = False, level: int | str = logging.INFO,
                  node_id: str = "") -> None:
    """Configures the root logger of a service process: ``name`` is the role
    (``worker``), ``node_id`` this member's id (default: the role), ``level``
    the config's log_level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(NodeIdFilter(node_id or name))
    if json_logs:
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(node_id)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)


class ServiceHost:
    """A grpc.aio server with the standard health service and reflection.

    Every call passes :class:`gridstream.auth.CallGuard` first: member calls
    need the cluster secret (or an admin token), client calls a token with
    the right one when the cluster has tokens, and a body that does not
    decode is refused before any servicer sees it. Health is SERVING only
    between :meth:`start` and :meth:`stop`, so supervisors and tests wait on
    it instead of sleeping.
    """

    def __init__(self, service_names: list[str], security: SecurityConfig | None = None) -> None:
        self.security = security or SecurityConfig()
        tokens = load_tokens(self.security.tokens_file) if self.security.tokens_file else None
        secret = None
        if self.security.cluster_secret_file:
            try:
                secret = load_cluster_secret(self.security.cluster_secret_file)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"config key security.cluster_secret_file: {exc}") from None
        self.server = grpc.aio.server(options=rpc.SERVER_OPTIONS,
                                      interceptors=[CallGuard(secret, tokens)])
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        self._service_names = service_names
        self.streams = rpc.StreamAnswers()
        """The servicers' long-lived request/response streams, ended by :meth:`stop`."""
        reflection.enable_server_reflection(
            [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Binds and starts; returns the bound port (useful with port 0).
        Without TLS, only a loopback interface unless security.plaintext_network
        says otherwise: plaintext would show tokens and records to the network."""
        check_bind(self.security, host)
        if self.security.tls:
            self.port = self.server.add_secure_port(
                f"{host}:{port}", rpc.server_credentials(self.security))
        else:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot bind {host}:{port}; is the port in use?")
        await self.server.start()
        for name in ["", *self._service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def stop(self, grace_s: float = 5.0) -> None:
        """Reports NOT_SERVING, ends the long-lived streams (:attr:`streams`),
        then lets in-flight calls finish for up to ``grace_s``."""
        for name in ["", *self._service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.streams.end_all()
        await self.server.stop(grace_s)


def write_ready_file(path: str | None, **fields: Any) -> None:
    """Atomically writes the ready file (address, pid) a supervisor waits for."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **fields}))
    tmp.replace(target)


PARENT_PID_ENV = "GRIDSTREAM_PARENT_PID"
"""Set by a supervisor (``gridstream up``) that wants its members to exit
with it: the PID of that supervisor."""

_PR_SET_PDEATHSIG = 1


def exit_with_parent() -> int:
    """Makes this process get SIGTERM (and so drain and stop) when the
    supervisor named by ``GRIDSTREAM_PARENT_PID`` dies, even by SIGKILL, so a
    killed ``gridstream up`` leaves no orphans holding its ports. Linux:
    prctl(PR_SET_PDEATHSIG), then a check that the parent did not die before
    it; elsewhere :func:`watch_parent` polls. Returns the parent's PID (0 when
    no supervisor asked for it)."""
    try:
        parent = int(os.environ.get(PARENT_PID_ENV, "0"))
    except ValueError:
        return 0
    if parent <= 0:
        return 0
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); polling the parent "
                        "instead", ctypes.get_errno())
    if os.getppid() != parent:  # it died before the request above took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return parent


async def watch_parent(parent: int, stop: asyncio.Event, interval_s: float = 0.5) -> None:
    """Sets ``stop`` once this process's parent is no longer ``parent`` (it
    died and the process was handed to init): the portable fallback of
    PR_SET_PDEATHSIG, and a second line of defence on Linux."""
    while True:
        await asyncio.sleep(interval_s)
        if os.getppid() != parent:
            break
    log.info("supervisor (pid %d) is gone; stopping", parent)
    stop.set()


STOP_OVERDUE_EXIT_CODE = 75
"""Exit status of a member that did not finish draining within its stop
deadline (``cluster.stop_deadline_s``): it was asked to stop, so a
supervisor restarts it as after any failure."""


class StopDeadline:
    """Ends a process whose drain outlives its deadline. A drain waits on
    peers and state servers (last writes, handoffs); with them gone, some
    wait could last forever and the process would neither serve nor exit.
    Armed when the stop is asked for; a thread of its own, so a blocked event
    loop cannot hold it back. On expiry it logs an ERROR naming the asyncio
    tasks still running, dumps every thread's stack to stderr and exits with
    :data:`STOP_OVERDUE_EXIT_CODE`."""

    def __init__(self, deadline_s: float, loop: asyncio.AbstractEventLoop) -> None:
        self.deadline_s = deadline_s
        self._loop = loop
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        """Starts the countdown (once)."""
        if self._timer is None:
            self._timer = threading.Timer(self.deadline_s, self._overdue)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        """The drain finished: no countdown any more."""
        if self._timer is not None:
            self._timer.cancel()

    def _running(self) -> str:
        for _ in range(3):  # the loop's thread may change the task set meanwhile
            try:
                names = sorted(t.get_name() for t in asyncio.all_tasks(self._loop)
                               if not t.done())
            except RuntimeError:
                continue
            return ", ".join(names[:30]) + (f" and {len(names) - 30} more"
                                           if len(names) > 30 else "")
        return "(could not be listed)"

    def _overdue(self) -> None:
        log.error("did not finish draining within cluster.stop_deadline_s=%.0fs of the stop; "
                  "still running: %s; exiting with status %d (stacks follow on stderr)",
                  self.deadline_s, self._running(), STOP_OVERDUE_EXIT_CODE)
        faulthandler.dump_traceback(all_threads=True)
        logging.shutdown()
        os._exit(STOP_OVERDUE_EXIT_CODE)


async def _arm_when_asked(stop: asyncio.Event, deadline: StopDeadline) -> None:
    await stop.wait()
    deadline.arm()


def run_service(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
                stop_deadline_s: float = ClusterConfig.stop_deadline_s) -> None:
    """Runs a service's ``main(stop_event)`` on uvloop; SIGTERM, SIGINT and
    SIGHUP set the event so the service drains gracefully instead of dying
    mid-write, and so does the death of a supervisor that asked for it
    (:func:`exit_with_parent`). A drain that outlives ``stop_deadline_s``
    ends the process (:class:`StopDeadline`)."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        deadline = StopDeadline(stop_deadline_s, loop)
        helpers = [asyncio.create_task(_arm_when_asked(stop, deadline), name="stop deadline")]
        parent = exit_with_parent()
        if parent:
            helpers.append(asyncio.create_task(watch_parent(parent, stop), name="parent watch"))
        try:
            await main(stop)
        finally:
            deadline.disarm()
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(runner())
