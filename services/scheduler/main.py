"""Entry point of the scheduler: ``python -m services.scheduler``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import replace

from gridstream import jobspec, rpc
from gridstream.config import Config, ConfigError, load_config
from gridstream.console import ConsoleServer
from gridstream.metrics import MetricsServer
from gridstream.service import ServiceHost, run_service, setup_logging, write_ready_file
from gridstream.v1 import scheduler_pb2_grpc
from services.scheduler.console_view import DEFAULT_WINDOW_S, console_state
from services.scheduler.detector import DetectorSettings, PhiAccrualDetector
from services.scheduler.jobs import JobRegistry
from services.scheduler.membership import Membership
from services.scheduler.monitor import Monitor
from services.scheduler.server import SchedulerCore, SchedulerServicer

log = logging.getLogger("gridstream.scheduler")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; each overrides the config file and environment."""
    parser = argparse.ArgumentParser(
        prog="gridstream scheduler",
        description="Run the scheduler: membership, failure detection, the partition ring "
        "and the job registry.",
    )
    parser.add_argument("--config", help="TOML config file (defaults apply without one)")
    parser.add_argument("--host", help="interface to bind (scheduler.host)")
    parser.add_argument("--port", type=int, help="port, 0 = any free port (scheduler.port)")
    parser.add_argument("--data-dir", help="directory of the job registry (scheduler.data_dir)")
    parser.add_argument("--console-port", type=int,
                        help="port of the web console, 0 = any free port, -1 = off "
                        "(scheduler.console_port)")
    parser.add_argument("--ready-file", help="write {address, pid} here once serving")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    """The config file plus flag overrides."""
    config = load_config(args.config)
    section = config.scheduler
    if args.host:
        section = replace(section, host=args.host)
    if args.port is not None:
        section = replace(section, port=args.port)
    if args.data_dir:
        section = replace(section, data_dir=args.data_dir)
    if args.console_port is not None:
        section = replace(section, console_port=args.console_port)
    config = replace(config, scheduler=section).validate()
    return config.check_service(config.scheduler.host)


def detector_settings(config: Config) -> DetectorSettings:
    """Detector parameters from the cluster config: a pause of three intervals
    is tolerated, sigma floored at a fifth of the interval."""
    interval = config.cluster.heartbeat_interval_s
    return DetectorSettings(interval_s=interval, threshold=config.cluster.phi_threshold,
                            acceptable_pause_s=3 * interval, min_std_s=interval / 5)


def self_address(config: Config, port: int) -> str:
    """How the scheduler's monitor calls its own cluster (dead letters): the
    configured scheduler_address when it names this port (a TLS certificate
    covers that name), else the bound interface (loopback for a wildcard)."""
    if config.scheduler_address.rsplit(":", 1)[1] == str(port):
        return config.scheduler_address
    host = config.scheduler.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def window_of(query: Mapping[str, list[str]]) -> float:
    """The console's ``?window=SECONDS`` (60..600), else the default."""
    try:
        asked = float(query.get("window", [""])[0])
    except ValueError:
        return DEFAULT_WINDOW_S
    return min(600.0, max(60.0, asked)) if asked == asked else DEFAULT_WINDOW_S


async def serve(config: Config, ready_file: str | None, stop: asyncio.Event) -> None:
    """Runs the scheduler until ``stop`` is set, then drains."""
    registry = JobRegistry(config.scheduler.data_dir)
    await registry.open()
    settings = detector_settings(config)
    detector = PhiAccrualDetector(settings, max_tick_gap_s=max(1.0, 4 * settings.interval_s))
    membership = Membership(detector, epoch=await registry.load_epoch() + 1)
    now = time.monotonic()
    for node_id, role, address, incarnation in await registry.load_members():
        membership.restore(node_id, role, address, incarnation, now)
    core = SchedulerCore(config, registry, membership)
    await registry.save_epoch(membership.epoch)
    host = ServiceHost(["gridstream.v1.Scheduler"], config.security)
    metrics = MetricsServer()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerServicer(core), host.server)
    console: ConsoleServer | None = None
    try:
        async with asyncio.TaskGroup() as group:
            port = await host.start(config.scheduler.host, config.scheduler.port)
            address = f"{config.scheduler.host}:{port}"
            detector_task = group.create_task(core.detect_forever(), name="failure detector")
            monitor = Monitor(core, self_address(config, port))
            monitor_task = group.create_task(monitor.run(), name="monitor")
            log.info("scheduler serving on %s (pid %d), epoch %d, %d jobs, %d members",
                     address, os.getpid(), membership.epoch, len(registry.jobs),
                     len(membership.members))
            metrics_address = metrics.start(config.scheduler.metrics_host,
                                            config.scheduler.metrics_port,
                                            lambda: [*core.metrics(), *monitor.metrics()])
            console_url = ""
            if config.scheduler.console_port >= 0:
                console = ConsoleServer(lambda query: console_state(monitor, window_of(query)),
                                        config.security)
                try:
                    console_url = await console.start(config.scheduler.host,
                                                      config.scheduler.console_port)
                except OSError as exc:
                    raise ConfigError(
                        f"cannot serve the console on {config.scheduler.host}:"
                        f"{config.scheduler.console_port} ({exc.strerror or exc}); set "
                        "scheduler.console_port (0 = any free port, -1 = off)") from None
                log.info("console on %s", console_url)
            write_ready_file(ready_file, address=address, metrics=metrics_address,
                             console=console_url)
            await stop.wait()
            log.info("scheduler draining")
            if console is not None:
                await console.stop()
            await host.stop(grace_s=3.0)
            detector_task.cancel()
            monitor_task.cancel()
    finally:
        if console is not None:
            await console.stop()
        metrics.stop()
        await core.close()
        await registry.close()
    log.info("scheduler stopped")


def main(argv: list[str] | None = None) -> None:
    """Parses flags, loads config and runs the scheduler on uvloop."""
    args = parse_args(argv)
    try:
        config = build_config(args)
    except ConfigError as exc:
        raise SystemExit(f"gridstream scheduler: {exc}") from None
    setup_logging("scheduler", config.log_json, config.log_level)
    rpc.configure_security(config.security)
    jobspec.allow_job_modules(config.cluster.job_modules)
    try:
        run_service(lambda stop: serve(config, args.ready_file, stop),
                    config.cluster.stop_deadline_s)
    except ConfigError as exc:
        raise SystemExit(f"gridstream scheduler: {exc}") from None
