"""A local cluster of real processes: one scheduler, N workers, M state servers.

Used by ``gridstream up``, ``gridstream demo`` and the tests. Each member is a
separate Python process with its own log file; the cluster is ready when every
member has written its ready file and answers SERVING on the standard gRPC
health service. Processes are signalled only by the PIDs this object started.
Members exit when the process that started them dies, even by SIGKILL (on
Linux the kernel tells them; the death is that of the starting thread, so
start clusters from a thread that outlives them, as the event loop's does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gridstream import rpc
from gridstream.auth import create_cluster_secret, load_cluster_secret, write_private
from gridstream.config import Config, SecurityConfig
from gridstream.configtoml import to_toml
from gridstream.replicas import ReplicaClient
from gridstream.routing import RoutingView
from gridstream.service import PARENT_PID_ENV, RETIRED_EXIT_CODE
from gridstream.v1 import scheduler_pb2_grpc

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent

_PROCESS_SECRET = secrets.token_urlsafe(32)
"""The cluster secret of every local cluster this process starts without one
of its own: shared, so that the process can talk to all of them as a member."""


@dataclass
class MemberProcess:
    """One started process and what it needs to be started again."""

    name: str
    role: str
    argv: list[str]
    log_path: Path
    ready_file: Path
    process: subprocess.Popen[bytes] | None = None
    address: str = ""
    metrics_address: str = ""
    console_url: str = ""
    """The scheduler's web console (empty for other members, or when off)."""
    restarts: int = 0
    _log_handle: object | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """PID of the running process (0 when not running)."""
        return self.process.pid if self.process is not None else 0

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None


async def wait_healthy(address: str, timeout_s: float = 30.0, service: str = "",
                       security: SecurityConfig | None = None) -> None:
    """Waits until a gRPC server reports SERVING on the health service."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with rpc.open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                response = await stub.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1.0
                )
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            except grpc.aio.AioRpcError as exc:
                last = exc.code().name
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{address} not SERVING after {timeout_s:.0f}s (last: {last})")


class LocalCluster:
    """Starts, watches and stops the processes of a local cluster."""

    def __init__(
        self,
        run_dir: str | Path,
        config: Config | None = None,
        workers: int = 3,
        state_servers: int = 2,
        scheduler_port: int = 0,
        host: str = "127.0.0.1",
        extra_env: dict[str, str] | None = None,
        supervise: bool = False,
        restart_delay_s: float = 0.5,
    ) -> None:
        """``supervise`` restarts any member that exits on its own, after
        ``restart_delay_s`` (like systemd's ``Restart=always`` and ``RestartSec``);
        members stopped through :meth:`stop` are not restarted."""
        self.run_dir = Path(run_dir).resolve()
        self.config = config or Config()
        self.worker_count = workers
        self.state_server_count = state_servers
        self.scheduler_port = scheduler_port
        self.host = host
        self.extra_env = extra_env or {}
        self.members: dict[str, MemberProcess] = {}
        self.scheduler_address = ""
        self.config_path = self.run_dir / "cluster.toml"
        self.supervise = supervise
        self.restart_delay_s = restart_delay_s
        self.restart_log: list[tuple[str, float, float]] = []
        """(member, monotonic time its exit was noticed, monotonic time it was ready again)."""
        self._supervisor: asyncio.Task[None] | None = None
        self._paused: set[str] = set()
        self._stopping = False

    # -- process control ----------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p
        )
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Members stop when this process dies, even by SIGKILL (no orphans
        # holding the cluster's ports): see gridstream.service.exit_with_parent.
        env[PARENT_PID_ENV] = str(os.getpid())
        env.update(self.extra_env)
        return env

    def _spawn(self, member: MemberProcess) -> None:
        member.ready_file.unlink(missing_ok=True)
        member.log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(member.log_path, "ab")  # closed in _reap
        member._log_handle = handle
        member.process = subprocess.Popen(
            member.argv, stdout=handle, stderr=subprocess.STDOUT, env=self._env(),
            cwd=str(REPO_ROOT), start_new_session=True,
        )
        log.info("started %s (pid %d), log %s", member.name, member.process.pid, member.log_path)

    async def _await_ready(self, member: MemberProcess, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not member.ready_file.exists():
            if not member.alive():
                raise RuntimeError(
                    f"{member.name} exited with code "
                    f"{member.process.returncode if member.process else '?'} before it was "
                    f"ready; see {member.log_path}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{member.name} not ready after {timeout_s:.0f}s; "
                                   f"see {member.log_path}")
            await asyncio.sleep(0.05)
        ready = json.loads(member.ready_file.read_text())
        member.address = ready["address"]
        member.metrics_address = ready.get("metrics", "")
        member.console_url = ready.get("console", "")
        # A member killed right after writing its ready file must not keep
        # the caller (the supervisor above all) waiting out the health
        # check's deadline: its death ends the wait at once.
        health = asyncio.create_task(wait_healthy(
            member.address, max(1.0, deadline - time.monotonic()),
            security=self.config.security))
        try:
            while not health.done():
                if not member.alive():
                    raise RuntimeError(
                        f"{member.name} exited with code "
                        f"{member.process.returncode if member.process else '?'} before it "
                        f"was healthy; see {member.log_path}")
                await asyncio.wait({health}, timeout=0.05)
            health.result()
        finally:
            if not health.done():
                health.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await health

    def _member(self, name: str, role: str, argv: list[str]) -> MemberProcess:
        member = MemberProcess(
            name=name,
            role=role,
            argv=[sys.executable, "-m", f"services.{role}", "--config", str(self.config_path),
                  *argv, "--ready-file", str(self.run_dir / "ready" / f"{name}.json")],
            log_path=self.run_dir / "logs" / f"{name}.log",
            ready_file=self.run_dir / "ready" / f"{name}.json",
        )
        self.members[name] = member
        return member

    def _prepare_secret(self) -> None:
        """Gives the cluster a secret file (mode 0600) unless its config names
        one, and lets this process present it: members authenticate to one
        another with it, and whoever started the cluster holds it."""
        security = self.config.security
        if not security.cluster_secret_file:
            path = create_cluster_secret(self.run_dir / "cluster.secret", _PROCESS_SECRET)
            security = replace(security, cluster_secret_file=str(path))
            self.config = replace(self.config, security=security)
        rpc.hold_member_secret(load_cluster_secret(security.cluster_secret_file))

    def _write_config(self) -> None:
        """cluster.toml may hold tokens and names the secret: owner-only."""
        write_private(self.config_path, to_toml(self.config))

    async def start(self) -> LocalCluster:
        """Starts every process and waits until all are healthy."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_secret()
        console_port = self.config.scheduler.console_port
        if self.scheduler_port == 0 and console_port > 0:
            console_port = 0  # a free scheduler port, a free console port
        scheduler = self._member(
            "scheduler", "scheduler",
            ["--host", self.host, "--port", str(self.scheduler_port),
             "--data-dir", str(self.run_dir / "scheduler"),
             "--console-port", str(console_port)],
        )
        self._write_config()
        self._spawn(scheduler)
        await self._await_ready(scheduler)
        self.scheduler_address = scheduler.address
        # A restarted scheduler must come back on the same port: members know it.
        port = self.scheduler_address.rsplit(":", 1)[1]
        scheduler.argv[scheduler.argv.index("--port") + 1] = port
        if scheduler.console_url:  # and its console on the same one, for bookmarks
            bound = scheduler.console_url.rstrip("/").rsplit(":", 1)[1]
            scheduler.argv[scheduler.argv.index("--console-port") + 1] = bound
        self.config = replace(self.config, scheduler_address=self.scheduler_address)
        self._write_config()
        others = []
        for i in range(1, self.state_server_count + 1):
            others.append(self._member(
                f"state-{i}", "stateserver",
                ["--node-id", f"state-{i}", "--host", self.host, "--port", "0",
                 "--data-dir", str(self.run_dir / f"state-{i}"),
                 "--scheduler", self.scheduler_address],
            ))
        for i in range(1, self.worker_count + 1):
            others.append(self._member(
                f"worker-{i}", "worker",
                ["--node-id", f"worker-{i}", "--host", self.host, "--port", "0",
                 "--scheduler", self.scheduler_address],
            ))
        for member in others:
            self._spawn(member)
        await asyncio.gather(*(self._await_ready(m) for m in others))
        await self.wait_registered()
        if self.supervise:
            self._supervisor = asyncio.create_task(self._supervise(), name="supervisor")
        return self

    async def _supervise(self) -> None:
        """Restarts members that exit on their own (owned by this cluster,
        cancelled and awaited in :meth:`stop`)."""
        while True:
            await asyncio.sleep(0.05)
            for member in list(self.members.values()):
                if member.alive() or member.name in self._paused or self._stopping:
                    continue
                if member.process is not None and member.process.returncode == RETIRED_EXIT_CODE:
                    self._paused.add(member.name)  # it retired: like systemd, do not restart
                    log.info("%s retired; not restarting it", member.name)
                    continue
                noticed = time.monotonic()
                log.warning("%s exited with %s; restarting in %.1fs", member.name,
                            member.process.returncode if member.process else "?",
                            self.restart_delay_s)
                await asyncio.sleep(self.restart_delay_s)
                if self._stopping:
                    return
                try:
                    await self.restart(member.name)
                except Exception:
                    log.exception("restarting %s failed; will retry", member.name)
                    continue
                self.restart_log.append((member.name, noticed, time.monotonic()))

    async def add_state_server(self, join: bool = True) -> str:
        """Starts one more state server while the cluster runs; with ``join``
        it reports ready only after copying its share from its peers."""
        index = 1 + sum(1 for m in self.members.values() if m.role == "stateserver")
        name = f"state-{index}"
        member = self._member(
            name, "stateserver",
            ["--node-id", name, "--host", self.host, "--port", "0",
             "--data-dir", str(self.run_dir / name), "--scheduler", self.scheduler_address,
             *(["--join"] if join else [])],
        )
        self._spawn(member)
        await self._await_ready(member)
        return name

    async def wait_exit(self, name: str, timeout_s: float = 60.0) -> int:
        """Waits until a member's process exits on its own; its exit code."""
        member = self.members[name]
        assert member.process is not None
        deadline = time.monotonic() + timeout_s
        while member.process.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still running after {timeout_s:.0f}s; "
                                   f"see {member.log_path}")
            await asyncio.sleep(0.05)
        return member.process.returncode

    def hold(self, name: str) -> None:
        """Keeps the supervisor from restarting a member until :meth:`release`."""
        self._paused.add(name)

    def release(self, name: str) -> None:
        """Lets the supervisor restart a member again."""
        self._paused.discard(name)

    async def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Waits until the scheduler lists every started worker and state server."""
        from gridstream.client import Client  # local import: the SDK is optional here

        wanted = {n for n, m in self.members.items() if m.role != "scheduler" and m.alive()}
        deadline = time.monotonic() + timeout_s
        async with Client(self.scheduler_address, security=self.config.security) as client:
            while True:
                status = await client.status()
                alive = {m.member.node_id for m in status.members if m.member.state == 1}
                if wanted <= alive:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"members not registered: {sorted(wanted - alive)}")
                await asyncio.sleep(0.05)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Sends a signal to one member, by the PID this cluster started."""
        member = self.members[name]
        if member.process is None:
            raise RuntimeError(f"{name} is not running")
        pid = member.process.pid
        os.kill(pid, sig)
        return pid

    async def restart(self, name: str) -> None:
        """Starts a member again (same identity, new process) and waits until healthy."""
        member = self.members[name]
        if member.alive():
            raise RuntimeError(f"{name} is still running (pid {member.pid})")
        self._reap(member)
        member.restarts += 1
        self._spawn(member)
        await self._await_ready(member)

    def _reap(self, member: MemberProcess) -> None:
        if member.process is not None:
            with contextlib.suppress(Exception):
                member.process.wait(timeout=0)
        if member._log_handle is not None:
            with contextlib.suppress(Exception):
                member._log_handle.close()  # type: ignore[attr-defined]
            member._log_handle = None

    async def stop(self, timeout_s: float = 15.0) -> dict[str, int | None]:
        """SIGTERM to every member (workers first), then SIGKILL to stragglers.
        Returns each member's exit code."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        order = sorted(self.members.values(),
                       key=lambda m: {"worker": 0, "stateserver": 1, "scheduler": 2}[m.role])
        codes: dict[str, int | None] = {}
        for group in ("worker", "stateserver", "scheduler"):
            members = [m for m in order if m.role == group and m.alive()]
            for member in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member.pid, signal.SIGCONT)
                    os.kill(member.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for member in members:
                assert member.process is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(
                        member.process.wait, max(0.0, deadline - time.monotonic())
                    )
                if member.process.poll() is None:
                    log.warning("%s did not stop within %.0fs; killing", member.name, timeout_s)
                    member.process.kill()
                    member.process.wait()
        for member in order:
            codes[member.name] = member.process.returncode if member.process else None
            self._reap(member)
        return codes

    @property
    def console_url(self) -> str:
        """The web console's address ('' before start, or when it is off)."""
        scheduler = self.members.get("scheduler")
        return scheduler.console_url if scheduler is not None else ""

    @contextlib.asynccontextmanager
    async def state_client(self) -> AsyncIterator[ReplicaClient]:
        """The writer and reader of operators' state the workers use, on this
        cluster's state servers: for tests and benches that write or read
        state directly. Its channels are closed on exit."""
        pool = rpc.ChannelPool()
        routing = RoutingView(scheduler_pb2_grpc.SchedulerStub(pool.get(self.scheduler_address)),
                              self.config.cluster.virtual_nodes)
        await routing.refresh()
        client = ReplicaClient(routing, pool)
        try:
            yield client
        finally:
            await client.close()
            await pool.close()

    async def __aenter__(self) -> LocalCluster:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def logs(self, name: str, tail: int = 40) -> str:
        """The last lines of a member's log, for error messages."""
        path = self.members[name].log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:])
