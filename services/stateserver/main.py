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
from collections.abc import Sequence
from pathlib import Path

from gridstream import rpc
from gridstream.config import Config, ConfigError, load_config
from gridstream.metrics import Metric, MetricsServer, counter, gauge
from gridstream.service import (
    MemberAgent,
    ServiceHost,
    run_service,
    setup_logging,
    write_ready_file,
)
from gridstream.v1 import scheduler_pb2, stateserver_pb2_grpc
from services.stateserver.server import StateServerServicer
from services.stateserver.store import SnapshotStore, StoreStats

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
        config.validate()
    except ConfigError as exc:
        parser.error(str(exc))
    if not 0 <= config.stateserver.port <= 65535:
        parser.error(f"--port {config.stateserver.port} is not a port number (0..65535)")
    return Options(config=config, ready_file=args.ready_file)


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


async def serve(options: Options, stop: asyncio.Event) -> None:
    """Runs the state server until ``stop`` is set, then drains and closes in order."""
    config = options.config
    settings = config.stateserver
    db_path = Path(settings.data_dir) / DB_FILE
    async with SnapshotStore(db_path, keep_windows=settings.keep_windows) as store:
        host = ServiceHost([SERVICE_NAME], config.security)
        stateserver_pb2_grpc.add_StateServerServicer_to_server(
            StateServerServicer(store), host.server
        )
        port = await host.start(settings.host, settings.port)
        address = f"{settings.advertise_host or settings.host}:{port}"
        agent = MemberAgent(
            config.scheduler_address, settings.node_id,
            scheduler_pb2.MEMBER_ROLE_STATE_SERVER, address,
        )
        figures = StoreFigures(store)
        metrics = MetricsServer()
        metrics_address = metrics.start(settings.host, settings.metrics_port, figures.metrics)
        stopped = False
        try:
            async with asyncio.TaskGroup() as tasks:
                agent_task = tasks.create_task(agent.run(), name="member-agent")
                figures_task = tasks.create_task(figures.refresh_forever(), name="figures")
                write_ready_file(options.ready_file, address=address, node_id=settings.node_id,
                                 metrics=metrics_address)
                log.info("state server %s serving on %s, data in %s, scheduler %s",
                         settings.node_id, address, db_path, config.scheduler_address)
                await stop.wait()
                log.info("stopping: draining in-flight calls (up to %.1f s)", STOP_GRACE_S)
                await host.stop(STOP_GRACE_S)
                stopped = True
                agent_task.cancel()
                figures_task.cancel()
        finally:
            if not stopped:
                await host.stop(0)
            metrics.stop()
            await agent.close()
        log.info("server stopped; committing queued writes and closing the store")
    log.info("state server %s stopped", settings.node_id)


def main(argv: Sequence[str] | None = None) -> None:
    """Parses flags, sets up logging and runs the state server until SIGTERM/SIGINT."""
    options = parse_args(argv)
    setup_logging(f"stateserver[{options.config.stateserver.node_id}]",
                  json_logs=options.config.log_json)

    async def service_main(stop: asyncio.Event) -> None:
        await serve(options, stop)

    rpc.configure_security(options.config.security)
    run_service(service_main)
