"""Entry point of a state server process: ``python -m services.stateserver``.

Order matters for durability. On start: open the store, then serve, then tell
the supervisor (ready file) and the scheduler (MemberAgent). On SIGTERM: stop
taking calls (health NOT_SERVING, let in-flight calls finish), stop the agent,
then commit whatever is queued and close the store, so no acknowledged write
is lost and none is cut in half.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from gridstream import rpc
from gridstream.config import Config, ConfigError, load_config
from gridstream.member import MemberAgent
from gridstream.metrics import Metric, MetricsServer, counter, gauge
from gridstream.routing import RoutingView
from gridstream.service import (
    RETIRED_EXIT_CODE,
    ServiceHost,
    run_service,
    setup_logging,
    write_ready_file,
)
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc, stateserver_pb2_grpc
from services.stateserver.directory import JobDirectory
from services.stateserver.layout import OlderLayout, StoreStats
from services.stateserver.server import StateServerServicer
from services.stateserver.store import SnapshotStore
from services.stateserver.sync import ReplicaSync

log = logging.getLogger(__name__)

SERVICE_NAME = "gridstream.v1.StateServer"
"""Full gRPC name of the service, as health checks and reflection know it."""

DB_FILE = "state.sqlite3"
"""Name of the database file inside the data directory."""

STOP_GRACE_S = 5.0
"""How long in-flight calls may run after SIGTERM before they are cancelled."""



@dataclasses.dataclass(frozen=True)
class Options:
    """The configuration plus the flags that only make sense on the command line."""

    config: Config
    ready_file: str | None
    join: bool = False
    standalone: bool = False


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Reads the flags; they override the config file and GRIDSTREAM_* variables."""
    parser = argparse.ArgumentParser(
        prog="python -m services.stateserver",
        description="Run a gridstream state server: durable window snapshots, job results "
        "and dead letters in SQLite (WAL). Settings come from the config file, then "
        "GRIDSTREAM_* environment variables, then these flags.",
    )
    parser.add_argument("--config", metavar="PATH", help="TOML config file (default: none, "
                        "built-in defaults)")
    parser.add_argument("--node-id", metavar="ID", help="stable identity of this state server "
                        "(stateserver.node_id)")
    parser.add_argument("--host", metavar="H", help="interface to bind (stateserver.host)")
    parser.add_argument("--port", metavar="N", type=int, help="port to bind; 0 picks a free "
                        "one, written to the ready file (stateserver.port)")
    parser.add_argument("--data-dir", metavar="DIR", help="directory of the SQLite database; "
                        "created if missing (stateserver.data_dir)")
    parser.add_argument("--ready-file", metavar="FILE", help="write {pid, address, node_id} "
                        "as JSON here once serving")
    parser.add_argument("--scheduler", metavar="HOST:PORT", help="scheduler to register with "
                        "(scheduler_address); the state server serves even while it is down")
    parser.add_argument("--join", action="store_true", help="join a running group: copy this "
                        "server's share from its peers before reporting ready")
    parser.add_argument("--standalone", action="store_true", help="serve without a cluster: "
                        "accept any job id, no replication or catch-up (tests, embedding)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        overrides = {
            name: value
            for name, value in (
                ("node_id", args.node_id), ("host", args.host), ("port", args.port),
                ("data_dir", args.data_dir),
            )
            if value is not None
        }
        config = dataclasses.replace(
            config, stateserver=dataclasses.replace(config.stateserver, **overrides)
        )
        if args.scheduler is not None:
            config = dataclasses.replace(config, scheduler_address=args.scheduler)
        config.validate().check_service(config.stateserver.host)
    except ConfigError as exc:
        parser.error(str(exc))
    if not 0 <= config.stateserver.port <= 65535:
        parser.error(f"--port {config.stateserver.port} is not a port number (0..65535)")
    if args.join and args.standalone:
        parser.error("--join and --standalone exclude each other: a standalone server has "
                     "no group to join")
    return Options(config=config, ready_file=args.ready_file, join=args.join,
                   standalone=args.standalone)


class StoreFigures:
    """The store's figures, refreshed in the background so that a metrics
    scrape (served from another thread) never touches the database."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.latest: StoreStats | None = None

    async def refresh_forever(self, interval_s: float = 1.0) -> None:
        """Refreshes until cancelled (owned by the service's TaskGroup)."""
        while True:
            try:
                self.latest = await self.store.stats()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("reading store figures failed", exc_info=True)
            await asyncio.sleep(interval_s)

    def metrics(self) -> list[Metric]:
        """Snapshot count and bytes, commits and writes, for Prometheus."""
        stats = self.latest
        snapshots = gauge("gridstream_snapshots_stored", "Window snapshots held", [])
        size = gauge("gridstream_snapshot_bytes", "Bytes of window snapshots held", [])
        commits = counter("gridstream_store_commits", "SQLite transactions committed", [])
        writes = counter("gridstream_store_writes", "Writes committed (many per transaction)",
                         [])
        if stats is not None:
            snapshots.add_metric([], stats.snapshots)
            size.add_metric([], stats.snapshot_bytes)
            commits.add_metric([], stats.commits)
            writes.add_metric([], stats.writes)
        return [snapshots, size, commits, writes]


async def serve(options: Options, stop: asyncio.Event) -> bool:
    """Runs the state server until ``stop`` is set, then drains and closes in
    order. Returns True when it stopped because it retired."""
    config = options.config
    settings = config.stateserver
    db_path = Path(settings.data_dir) / DB_FILE
    retired = False

    def on_retired() -> None:
        nonlocal retired
        retired = True
        stop.set()

    async with SnapshotStore(db_path, keep_windows=settings.keep_windows) as store:
        scheduler_channel = rpc.open_channel(config.scheduler_address)
        scheduler = scheduler_pb2_grpc.SchedulerStub(scheduler_channel)
        routing = RoutingView(scheduler, config.cluster.virtual_nodes)
        channels = rpc.ChannelPool()
        host = ServiceHost([SERVICE_NAME], config.security)
        stateserver_pb2_grpc.add_StateServerServicer_to_server(
            StateServerServicer(store, directory=None if options.standalone
                                else JobDirectory(routing)),
            host.server,
        )
        port = await host.start(settings.host, settings.port)
        address = f"{settings.advertise_host or settings.host}:{port}"
        figures = StoreFigures(store)
        sync: ReplicaSync | None = None

        async def on_epoch(epoch: int) -> None:
            if sync is not None and epoch > routing.epoch:
                sync.notify()

        async def on_fence() -> None:
            # A heartbeat answered "register again" while this server
            # deregisters on retirement: rejoining would list a retired
            # server as a member again. Heartbeats wait here until shutdown
            # (or until the deregistration failed and will be retried).
            if sync is not None:
                await sync.staying.wait()

        def heartbeat_fields() -> dict[str, int]:
            stats = figures.latest
            if stats is None:
                return {}
            return {"snapshots": stats.snapshots, "snapshot_bytes": stats.snapshot_bytes}

        agent = MemberAgent(
            config.scheduler_address, settings.node_id,
            scheduler_pb2.MEMBER_ROLE_STATE_SERVER, address, on_epoch=on_epoch,
            on_fence=on_fence, heartbeat_fields=heartbeat_fields,
            loop_stall_limit_s=config.cluster.loop_stall_limit_s,
        )
        if not options.standalone:
            sync = ReplicaSync(
                settings.node_id, store, routing, scheduler, channels,
                settings.sync_interval_s, settings.cleanup_interval_s,
                lambda: agent.incarnation, on_retired,
            )
        metrics = MetricsServer()
        metrics_address = metrics.start(settings.metrics_host, settings.metrics_port,
                                        figures.metrics)
        stopped = False
        try:
            async with asyncio.TaskGroup() as tasks:
                background = [tasks.create_task(figures.refresh_forever(), name="figures")]
                if not options.standalone:
                    background.append(tasks.create_task(agent.run(), name="member-agent"))
                if sync is not None:
                    background.append(tasks.create_task(sync.run(), name="replica-sync"))
                    if options.join:
                        log.info("joining: copying this server's share from its peers")
                        await _wait_either(sync.caught_up, stop)
                write_ready_file(options.ready_file, address=address, node_id=settings.node_id,
                                 metrics=metrics_address)
                log.info("state server %s serving on %s, data in %s, scheduler %s%s",
                         settings.node_id, address, db_path, config.scheduler_address,
                         " (standalone)" if options.standalone else "")
                await stop.wait()
                log.info("stopping: draining in-flight calls (up to %.1f s)", STOP_GRACE_S)
                await host.stop(STOP_GRACE_S)
                stopped = True
                for task in background:
                    task.cancel()
        finally:
            if not stopped:
                await host.stop(0)
            metrics.stop()
            await agent.close()
            await channels.close()
            await scheduler_channel.close()
        log.info("server stopped; committing queued writes and closing the store")
    log.info("state server %s stopped%s", settings.node_id, " (retired)" if retired else "")
    return retired


async def _wait_either(event: asyncio.Event, stop: asyncio.Event) -> None:
    """Waits until ``event`` or ``stop`` is set, owning both waits."""
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Parses flags, sets up logging and runs the state server until SIGTERM/SIGINT."""
    options = parse_args(argv)
    setup_logging("stateserver", options.config.log_json, options.config.log_level,
                  options.config.stateserver.node_id)

    retired = False

    async def service_main(stop: asyncio.Event) -> None:
        nonlocal retired
        retired = await serve(options, stop)

    rpc.configure_security(options.config.security)
    try:
        run_service(service_main, options.config.cluster.stop_deadline_s)
    except OlderLayout as exc:  # an operator's fix, not a crash: one line, exit 2
        log.error("%s", exc)
        sys.exit(2)
    if retired:
        sys.exit(RETIRED_EXIT_CODE)
