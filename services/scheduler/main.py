"""Entry point of the scheduler: ``python -m services.scheduler``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from dataclasses import replace

from gridstream import jobspec, rpc
from gridstream.config import Config, ConfigError, load_config
from gridstream.metrics import MetricsServer
from gridstream.service import ServiceHost, run_service, setup_logging, write_ready_file
from gridstream.v1 import scheduler_pb2_grpc
from services.scheduler.detector import DetectorSettings, PhiAccrualDetector
from services.scheduler.jobs import JobRegistry
from services.scheduler.membership import Membership
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
    config = replace(config, scheduler=section).validate()
    return config.check_service(config.scheduler.host)


def detector_settings(config: Config) -> DetectorSettings:
    """Detector parameters from the cluster config: a pause of three intervals
    is tolerated, sigma floored at a fifth of the interval."""
    interval = config.cluster.heartbeat_interval_s
    return DetectorSettings(interval_s=interval, threshold=config.cluster.phi_threshold,
                            acceptable_pause_s=3 * interval, min_std_s=interval / 5)


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
    try:
        async with asyncio.TaskGroup() as group:
            port = await host.start(config.scheduler.host, config.scheduler.port)
            address = f"{config.scheduler.host}:{port}"
            detector_task = group.create_task(core.detect_forever(), name="failure detector")
            log.info("scheduler serving on %s (pid %d), epoch %d, %d jobs, %d members",
                     address, os.getpid(), membership.epoch, len(registry.jobs),
                     len(membership.members))
            metrics_address = metrics.start(config.scheduler.metrics_host,
                                            config.scheduler.metrics_port, core.metrics)
            write_ready_file(ready_file, address=address, metrics=metrics_address)
            await stop.wait()
            log.info("scheduler draining")
            await host.stop(grace_s=3.0)
            detector_task.cancel()
    finally:
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
    run_service(lambda stop: serve(config, args.ready_file, stop))
