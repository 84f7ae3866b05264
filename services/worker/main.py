"""Entry point of a worker process: ``python -m services.worker``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from dataclasses import replace

from gridstream import jobspec, rpc
from gridstream.config import Config, ConfigError, load_config
from gridstream.member import MemberAgent
from gridstream.metrics import MetricsServer
from gridstream.routing import RoutingView
from gridstream.service import (
    ServiceHost,
    run_service,
    setup_logging,
    write_ready_file,
)
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2_grpc
from services.worker.collector import tune_collector
from services.worker.looplag import LoopLagMonitor
from services.worker.node import WorkerNode
from services.worker.peers import Channels
from services.worker.server import WorkerServicer

log = logging.getLogger("gridstream.worker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; each overrides the config file and environment."""
    parser = argparse.ArgumentParser(
        prog="gridstream worker",
        description="Run a worker: hosts JobContainers and JobOperators for the "
        "partitions the scheduler's ring gives it.",
    )
    parser.add_argument("--config", help="TOML config file (defaults apply without one)")
    parser.add_argument("--node-id", help="stable worker id, e.g. worker-1 (worker.node_id)")
    parser.add_argument("--host", help="interface to bind (worker.host)")
    parser.add_argument("--port", type=int, help="port to bind, 0 = any free port (worker.port)")
    parser.add_argument("--scheduler", help="scheduler host:port (scheduler_address)")
    parser.add_argument("--ready-file", help="write {address, pid} here once serving")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    """The config file plus flag overrides."""
    config = load_config(args.config)
    worker = config.worker
    if args.node_id:
        worker = replace(worker, node_id=args.node_id)
    if args.host:
        worker = replace(worker, host=args.host)
    if args.port is not None:
        worker = replace(worker, port=args.port)
    config = replace(config, worker=worker)
    if args.scheduler:
        config = replace(config, scheduler_address=args.scheduler)
    return config.validate().check_service(config.worker.host)


async def serve(config: Config, ready_file: str | None, stop: asyncio.Event) -> None:
    """Runs the worker until ``stop`` is set, then drains."""
    node_id = config.worker.node_id
    host = ServiceHost(["gridstream.v1.Worker"], config.security)
    metrics = MetricsServer()
    channels = Channels()
    scheduler_channel = channels.get(config.scheduler_address)
    routing = RoutingView(scheduler_pb2_grpc.SchedulerStub(scheduler_channel),
                          config.cluster.virtual_nodes)
    try:
        async with asyncio.TaskGroup() as group:
            node = WorkerNode(config, node_id, routing, channels, group)
            worker_pb2_grpc.add_WorkerServicer_to_server(
                WorkerServicer(node, config.worker.max_batch_bytes, host.streams), host.server
            )
            port = await host.start(config.worker.host, config.worker.port)
            address = f"{config.worker.advertise_host or config.worker.host}:{port}"
            agent = MemberAgent(config.scheduler_address, node_id,
                                scheduler_pb2.MEMBER_ROLE_WORKER, address, node.on_epoch,
                                node.fence, heartbeat_fields=node.heartbeat_fields,
                                loop_stall_limit_s=config.cluster.loop_stall_limit_s)
            agent_task = group.create_task(agent.run(), name="heartbeats")
            trackers_task = group.create_task(node.trackers.run(), name="trackers")
            lag = group.create_task(LoopLagMonitor(config.cluster.heartbeat_interval_s).run(),
                                    name="event loop lag")
            metrics_address = metrics.start(config.worker.metrics_host,
                                            config.worker.metrics_port, node.metrics)
            log.info("worker %s serving on %s (pid %d)", node_id, address, os.getpid())
            # Ready means it can be given work: registered, not only listening
            # (a supervisor or a test that waits for the file sees a member
            # the scheduler knows; a stop before that skips it).
            registered = group.create_task(agent.registered.wait(), name="first registration")
            stopping = group.create_task(stop.wait(), name="stop before registration")
            await asyncio.wait({registered, stopping}, return_when=asyncio.FIRST_COMPLETED)
            registered.cancel()
            stopping.cancel()
            if agent.registered.is_set():
                write_ready_file(ready_file, address=address, node_id=node_id,
                                 metrics=metrics_address)
            await stop.wait()
            log.info("worker %s draining", node_id)
            await host.stop(grace_s=5.0)
            agent_task.cancel()
            trackers_task.cancel()
            lag.cancel()
            await node.close()
            await agent.close()
    finally:
        metrics.stop()
        with contextlib.suppress(Exception):
            await channels.close()
    log.info("worker %s stopped", node_id)


def main(argv: list[str] | None = None) -> None:
    """Parses flags, loads config and runs the worker on uvloop."""
    args = parse_args(argv)
    try:
        config = build_config(args)
    except ConfigError as exc:
        raise SystemExit(f"gridstream worker: {exc}") from None
    setup_logging("worker", config.log_json, config.log_level, config.worker.node_id)
    rpc.configure_security(config.security)
    jobspec.allow_job_modules(config.cluster.job_modules)
    tune_collector(config.worker.gc_young_threshold)
    run_service(lambda stop: serve(config, args.ready_file, stop), config.cluster.stop_deadline_s)
