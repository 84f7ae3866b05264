"""The one command-line tool: ``gridstream <command>``.

Service commands (scheduler, worker, stateserver) replace this process with
the service's own entry point, so their flags and ``--help`` are the
service's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import grpc

from gridstream.config import (
    Config,
    ConfigError,
    SecurityConfig,
    load_config,
    load_config_with_origins,
)
from gridstream.configtoml import to_toml
from gridstream.errors import GridstreamError

SERVICES = {"scheduler": "services.scheduler", "worker": "services.worker",
            "stateserver": "services.stateserver"}
STATE_NAMES = {0: "gone", 1: "alive", 2: "suspect", 3: "dead", 4: "leaving"}
ROLE_NAMES = {0: "?", 1: "worker", 2: "stateserver"}
JOB_STATES = {0: "?", 1: "running", 2: "cancelled", 3: "failed"}


def _scheduler_address(args: argparse.Namespace) -> str:
    if getattr(args, "scheduler", None):
        return str(args.scheduler)
    return load_config(getattr(args, "config", None)).scheduler_address


def _security(args: argparse.Namespace) -> SecurityConfig:
    return load_config(getattr(args, "config", None)).security


def worker_environment(config: Config, environ: dict[str, str]) -> dict[str, str]:
    """The environment a worker starts in: ``worker.python_paths`` (made
    absolute) in front of ``PYTHONPATH``, so jobs can name a user package
    that is not installed where the worker runs (systemd units and container
    images start workers through ``gridstream worker``, which applies it)."""
    paths = [str(Path(p).resolve()) for p in config.worker.python_paths]
    if not paths:
        return environ
    old = environ.get("PYTHONPATH", "")
    return {**environ, "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])])}


def _config_flag(argv: list[str]) -> str | None:
    """The ``--config FILE`` among a service's flags, if any."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", help="scheduler host:port (default: scheduler_address "
                        "from the config, 127.0.0.1:7400)")
    parser.add_argument("--config", help="TOML config file")


def _metrics_column(args: argparse.Namespace) -> dict[str, str]:
    """Metrics addresses of a local cluster's members (its ready files), if any."""
    from gridstream.cli_commands import metrics_by_address

    return metrics_by_address(args.run_dir) if getattr(args, "run_dir", None) else {}


async def _watch(args: argparse.Namespace) -> int:
    """Live view: members, per-stage throughput and queue depth, recent changes,
    and early warnings, refreshed every ``--interval`` seconds."""
    from gridstream.client import Client
    from gridstream.watch import Watcher

    async with Client(_scheduler_address(args), security=_security(args)) as client:
        watcher = Watcher(client)
        while True:
            print("\033[2J\033[H" + await watcher.render(), flush=True)
            await asyncio.sleep(args.interval)


async def _status(args: argparse.Namespace) -> int:
    from gridstream.client import Client

    if args.watch:
        return await _watch(args)
    async with Client(_scheduler_address(args), security=_security(args)) as client:
        status = await client.status()
        metrics = _metrics_column(args)
        print(f"epoch {status.epoch}")
        scheduler = client.scheduler_address
        if scheduler in metrics:
            print(f"scheduler {scheduler}, metrics http://{metrics[scheduler]}/metrics")
        print(f"{'member':<14}{'role':<13}{'state':<9}{'address':<22}{'partitions':>10}"
              f"{'heartbeat age':>15}{'phi':>7}{'loop lag':>10}{'snapshots':>11}{'snapshot MB':>13}"
              + ("  metrics" if metrics else ""))
        for m in status.members:
            stored = (f"{m.snapshots:>11}{m.snapshot_bytes / 1e6:>13.2f}"
                      if m.member.role == 2 else f"{'':>24}")
            where = f"  {metrics.get(m.member.address, '-'):<22}" if metrics else ""
            print(f"{m.member.node_id:<14}{ROLE_NAMES.get(m.member.role, '?'):<13}"
                  f"{STATE_NAMES.get(m.member.state, '?'):<9}{m.member.address:<22}"
                  f"{m.partitions_owned:>10}{m.last_heartbeat_age_s:>14.2f}s{m.phi:>7.2f}"
                  f"{m.loop_lag_s:>9.2f}s"
                  f"{stored}{where}".rstrip())
        if status.events:
            print("\nrecent membership changes:")
            for e in list(status.events)[-10:]:
                when = time.strftime("%H:%M:%S", time.localtime(e.at))
                print(f"  {when} {e.node_id}: {STATE_NAMES.get(e.old_state, 'new')} -> "
                      f"{STATE_NAMES.get(e.new_state, '?')} ({e.reason or 'detector'}, "
                      f"phi {e.phi:.1f}, epoch {e.epoch})")
        print(f"\n{'job':<28}{'state':<11}{'partitions':>10}  error")
        for job in status.jobs:
            print(f"{job.job_id:<28}{JOB_STATES.get(job.state, '?'):<11}"
                  f"{job.spec.partitions:>10}  {job.error}")
        if args.job:
            progress = await client.progress_message(args.job)
            print(f"\njob {args.job}: drained={progress.drained}"
                  + ("" if progress.drained else f" (holding: {progress.holding})"))
            print(f"{'task':>4}{'part':>5}{'node':>11}{'in':>11}{'done':>11}{'out':>11}"
                  f"{'queued':>9}{'windows':>8}{'dead':>6}{'roots':>7}{'failed':>7}"
                  f"{'lost':>6}{'restarts':>9}")
            for t in sorted(progress.tasks, key=lambda t: (t.task, t.partition)):
                print(f"{t.task:>4}{t.partition:>5}{t.node_id:>11}{t.records_in:>11}"
                      f"{t.records_processed:>11}{t.records_out:>11}{t.queue_records:>9}"
                      f"{t.windows_persisted:>8}{t.dead_letters:>6}{t.roots_pending:>7}"
                      f"{t.roots_failed:>7}{t.batches_lost:>6}{t.restarts:>9}")
        from gridstream.watch import warning_lines

        # The scheduler's own warnings, as status --watch and the console show them.
        warnings = warning_lines(status.warnings, args.job)
        scope = f" (job {args.job} and the cluster)" if args.job else ""
        print(f"\nwarnings{scope}:" if warnings else f"\nno warnings{scope}")
        for warning in warnings:
            print(f"  ! {warning}")
    return 0


async def _health(args: argparse.Namespace) -> int:
    from gridstream.cli_commands import run_health

    return await run_health(args, _scheduler_address(args), _security(args))


async def _dead_letters(args: argparse.Namespace) -> int:
    from gridstream.cli_commands import run_dead_letters

    return await run_dead_letters(args, _scheduler_address(args), _security(args))


async def _certs(args: argparse.Namespace) -> int:
    import secrets

    from gridstream.auth import create_cluster_secret, write_private
    from gridstream.certs import create_dev_certs

    out = Path(args.out)
    issued = create_dev_certs(out, [h.strip() for h in args.hosts.split(",") if h.strip()])
    member, user = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    tokens = out / "tokens.toml"
    write_private(tokens, f'[tokens]\n"{member}" = ["admin"]\n'
                  f'"{user}" = ["submit", "send", "read"]\n')
    secret = create_cluster_secret(out / "cluster.secret")
    print(f"""wrote a CA, a node and a client certificate, {tokens} and the cluster
secret {secret} to {out} (keys, tokens and secret readable by their owner only).
Members' config (plaintext members need only cluster_secret_file, and bind
loopback unless plaintext_network = true):

[security]
tls = true
ca_file = "{issued['ca'].cert.resolve()}"
cert_file = "{issued['node'].cert.resolve()}"
key_file = "{issued['node'].key.resolve()}"
tokens_file = "{tokens.resolve()}"
token = "{member}"
cluster_secret_file = "{secret.resolve()}"

Clients' config (gridstream status/submit --config, or Client(security=...)):

[security]
tls = true
ca_file = "{issued['ca'].cert.resolve()}"
cert_file = "{issued['client'].cert.resolve()}"
key_file = "{issued['client'].key.resolve()}"
token = "{user}"
""")
    return 0


async def _submit(args: argparse.Namespace) -> int:
    from gridstream.client import Client

    async with Client(_scheduler_address(args), security=_security(args)) as client:
        job_id = await client.submit(args.job_file)
    print(job_id)
    return 0


async def _results(args: argparse.Namespace) -> int:
    import json

    from gridstream.client import Client

    async with Client(_scheduler_address(args), security=_security(args)) as client:
        rows = await client.results(args.job_id, sink=args.sink)
    if not rows:
        # Like `kubectl get` with nothing to list: say so on stderr, exit 0 (an
        # empty table is a state, not a failure), nothing for a pipe to read.
        print(f"job {args.job_id} has no results yet (its sink has stored no rows; "
              f"`gridstream status --job {args.job_id}` shows its progress)", file=sys.stderr)
        return 0
    for key in sorted(rows)[: args.limit or None]:
        print(f"{key}\t{json.dumps(rows[key])}")
    return 0


async def _send(args: argparse.Namespace) -> int:
    from gridstream.cli_commands import run_send

    return await run_send(args, _scheduler_address(args), _security(args))


async def _cancel(args: argparse.Namespace) -> int:
    from gridstream.client import Client

    async with Client(_scheduler_address(args), security=_security(args)) as client:
        info = await client.cancel(args.job_id)
    print(f"{info.job_id}: {JOB_STATES.get(info.state, '?')}")
    return 0


async def _demo(args: argparse.Namespace) -> int:
    from gridstream.demo import run_demo

    if args.name == "spark-taxi":
        from spark_bridge.demo import run_spark_taxi

        spark_report = await run_spark_taxi(records=args.records or 20_000,
                                            run_dir=args.run_dir)
        print(spark_report.table())
        return 0 if spark_report.match else 1

    config = load_config(args.config)
    os.environ.update(worker_environment(config, dict(os.environ)))  # for its workers
    report = await run_demo(args.name, args.records, args.workers, args.state_servers,
                            args.run_dir, config)
    print(report.summary())
    return 0 if report.match else 1


async def _up(args: argparse.Namespace) -> int:
    from gridstream.local import LocalCluster

    config = load_config(args.config)
    os.environ.update(worker_environment(config, dict(os.environ)))  # for its workers
    port = args.port if args.port is not None else int(config.scheduler_address.rsplit(":", 1)[1])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: terminal closed
        loop.add_signal_handler(sig, stop.set)
    cluster = LocalCluster(args.run_dir, config, args.workers, args.state_servers, port,
                           supervise=True, restart_delay_s=args.restart_delay)
    async with cluster:
        print(f"gridstream cluster up: scheduler {cluster.scheduler_address}; members "
              f"authenticate with {cluster.config.security.cluster_secret_file}, admin "
              f"commands take --config {cluster.config_path}")
        for member in cluster.members.values():
            metrics = (f"http://{member.metrics_address}/metrics" if member.metrics_address
                       else "off")
            print(f"  {member.name:<12} pid {member.pid:<8} {member.address:<22} "
                  f"metrics {metrics:<40} log {member.log_path}")
        if cluster.console_url:
            needs = (" (needs a token with the read right: add ?token=TOKEN once)"
                     if cluster.config.security.tokens_file else "")
            print(f"  {'console':<12} {cluster.console_url}{needs}")
        print("Ctrl-C (or SIGTERM, SIGHUP) stops it gracefully; if this process is killed, "
              "its members stop too.", flush=True)
        await stop.wait()
        print("stopping...", flush=True)
    return 0


async def _trackers(args: argparse.Namespace) -> int:
    from gridstream.client import Client

    async with Client(_scheduler_address(args), security=_security(args)) as client:
        epoch = await client.set_tracker_count(args.count)
    print(f"{args.count} trackers from epoch {epoch}")
    return 0


async def _retire(args: argparse.Namespace) -> int:
    from gridstream.client import Client

    async with Client(_scheduler_address(args), security=_security(args)) as client:
        epoch = await client.retire_state_server(args.node_id)
    print(f"{args.node_id} is retiring (epoch {epoch}): it hands its share to the other "
          "replicas and then exits; follow it with `gridstream status`")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(
        prog="gridstream",
        description="gridstream: stream processing with in-memory-grid fault tolerance.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run a local cluster (scheduler, workers, state servers)",
                        description="Start a local cluster of separate processes and keep it "
                        "running until Ctrl-C.")
    up.add_argument("--config", help="TOML config file")
    up.add_argument("--workers", type=int, default=3, help="number of workers (default 3)")
    up.add_argument("--state-servers", type=int, default=2,
                    help="number of state servers (default 2)")
    up.add_argument("--port", type=int, help="scheduler port (default: from scheduler_address)")
    up.add_argument("--restart-delay", type=float, default=1.0,
                    help="seconds before a member that exited is restarted (default 1)")
    up.add_argument("--run-dir", default=".gridstream/local",
                    help="directory for logs, ready files and data (default .gridstream/local)")
    up.set_defaults(run=_up)

    for name, module in SERVICES.items():
        service = sub.add_parser(name, help=f"run a {name} process (see `gridstream {name} "
                                 "--help`)", add_help=False)
        service.add_argument("args", nargs=argparse.REMAINDER)
        service.set_defaults(module=module)

    status = sub.add_parser("status", help="show members, ring shares and jobs")
    _add_client_flags(status)
    status.add_argument("--job", help="also show per-task progress of this job")
    status.add_argument("--watch", action="store_true",
                        help="refresh a live view with throughput, queues and warnings")
    status.add_argument("--run-dir", default=".gridstream/local",
                        help="run directory of a `gridstream up` cluster, whose ready files "
                        "give the members' metrics addresses (default .gridstream/local)")
    status.add_argument("--interval", type=float, default=1.0,
                        help="seconds between refreshes with --watch (default 1)")
    status.set_defaults(run=_status)

    health = sub.add_parser(
        "health", help="check the whole cluster (or one service) with the gRPC health protocol",
        description="Without ADDRESS: the scheduler and every member it lists, one line each; "
        "exit 0 when all serve, 1 when any does not, 2 when the scheduler cannot be reached. "
        "With ADDRESS: that service only (container health checks).")
    health.add_argument("address", nargs="?", help="host:port of one gridstream service")
    health.add_argument("--timeout", type=float, default=3.0,
                        help="seconds to wait for each answer (default 3)")
    _add_client_flags(health)
    health.set_defaults(run=_health)

    certs = sub.add_parser("certs", help="create a local CA, certificates and tokens for a "
                           "dev cluster with mutual TLS")
    certs.add_argument("--out", default=".gridstream/certs", help="directory to write into")
    certs.add_argument("--hosts", default="localhost,127.0.0.1",
                       help="comma-separated names and addresses the node certificate covers")
    certs.set_defaults(run=_certs)

    submit = sub.add_parser("submit", help="submit a job file (TOML); prints the job id")
    _add_client_flags(submit)
    submit.add_argument("job_file", help="path of the job's TOML file")
    submit.set_defaults(run=_submit)

    results = sub.add_parser("results", help="print a job's sink table")
    _add_client_flags(results)
    results.add_argument("job_id")
    results.add_argument("--limit", type=int, default=0, help="print at most this many rows")
    results.add_argument("--sink", default=None,
                         help="one sink's rows, without the sink's prefix (a job with several "
                              "sinks stores each row under <sink>/<key>)")
    results.set_defaults(run=_results)

    dead = sub.add_parser(
        "dead-letters", help="print a job's dead letters as JSON lines",
        description="One JSON object per line: id, stage, record (as the worker described "
        "it) and error (the exception's type and message). Nothing on stdout (and a note "
        "on stderr) when the job has none.")
    _add_client_flags(dead)
    dead.add_argument("job_id")
    dead.add_argument("--limit", type=int, default=0, help="print at most this many")
    dead.set_defaults(run=_dead_letters)

    retire = sub.add_parser(
        "retire", help="retire a state server (also `gridstream stateserver retire NODE`)",
        description="Take a state server out of the write ring; it hands its share to the "
        "other replicas, every snapshot keeping R copies throughout, then exits.")
    _add_client_flags(retire)
    retire.add_argument("node_id", help="node id of the state server, as `gridstream status` "
                        "lists it")
    retire.set_defaults(run=_retire)

    trackers = sub.add_parser(
        "trackers", help="change the number of tuple trackers while jobs run",
        description="Set how many trackers hold the XOR tracking records; only the roots "
        "whose tracker changes on the ring are rebuilt on their new tracker.")
    _add_client_flags(trackers)
    trackers.add_argument("count", type=int, help="new number of trackers (1..4096)")
    trackers.set_defaults(run=_trackers)

    send = sub.add_parser(
        "send", help="send the records of a JSON-lines or CSV file to a job",
        description="Reads FILE (JSON lines, one record per line; or CSV, each row a record "
        "of strings by the header; '-' is stdin) and sends its records in batches. With "
        "--key-field, each record is sent with that field as its key: one key's records go "
        "to one partition and are processed in the file's order, and the key stays on the "
        "record to the sink (the row of a latest sink). Without it, batches are spread over "
        "the partitions and no order between them is kept. FILE may be a directory of "
        "JSON-lines, CSV and Parquet files: they are sent exactly once, in name order, "
        "with a durable cursor (--cursor), across kills of this command; --follow keeps "
        "sending new files as they arrive (gridstream.filesource).")
    _add_client_flags(send)
    send.add_argument("job_id")
    send.add_argument("file", help="JSON-lines or CSV file, - for stdin, or a directory")
    send.add_argument("--key-field", help="field of each record to key it by (str or int)")
    send.add_argument("--format", choices=["jsonl", "csv", "parquet"],
                      help="file format (default: by extension: .csv, .parquet, else jsonl)")
    send.add_argument("--follow", action="store_true",
                      help="a directory: keep sending files that arrive (until SIGTERM/Ctrl-C)")
    send.add_argument("--cursor", help="a directory: the cursor file (default "
                      "DIR/.gridstream-cursor-<job>.json); keep it to resume exactly once")
    send.add_argument("--chunk-records", type=int, default=5_000,
                      help="a directory: records per chunk recorded in the cursor")
    send.add_argument("--batch-size", type=int, default=5_000,
                      help="records per batch (default 5000)")
    send.set_defaults(run=_send)

    cancel = sub.add_parser("cancel", help="cancel a job and delete its state")
    _add_client_flags(cancel)
    cancel.add_argument("job_id")
    cancel.set_defaults(run=_cancel)

    demo = sub.add_parser("demo", help="run a demo on a fresh local cluster and check it",
                          description="Start a local cluster, run the example, compare with an "
                          "in-process reference; exit 1 on any difference.")
    demo.add_argument("name", choices=["taxi", "wordcount", "clicks", "trips", "spark-taxi"])
    demo.add_argument("--records", type=int,
                      help="input size (taxi: records, default 200000; wordcount: words, "
                      "default 300000; clicks: clicks, default 100000, their files under "
                      "<run dir>/files; spark-taxi: records, default 20000)")
    demo.add_argument("--workers", type=int, default=3)
    demo.add_argument("--state-servers", type=int, default=2)
    demo.add_argument("--run-dir", help="directory for logs and data (default: a temp dir)")
    demo.add_argument("--config", help="TOML config file")
    demo.set_defaults(run=_demo)

    chaos = sub.add_parser("chaos", help="kill or pause workers during a job; check results",
                           add_help=False)
    chaos.add_argument("args", nargs=argparse.REMAINDER)
    chaos.set_defaults(chaos=True)

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the effective configuration as TOML")
    show.add_argument("--config", help="TOML config file")
    show.add_argument("--origin", action="store_true",
                      help="after each value, say whether it came from the file, the "
                      "environment or the default")
    show.set_defaults(run=None, show=True)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``gridstream``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["stateserver", "retire"]:
        argv = ["retire", *argv[2:]]
    if argv and argv[0] in SERVICES:
        environ = dict(os.environ)
        if argv[0] == "worker":
            try:
                environ = worker_environment(load_config(_config_flag(argv[1:])), environ)
            except ConfigError:
                pass  # the worker itself reports the bad config
        os.execve(sys.executable, [sys.executable, "-m", SERVICES[argv[0]], *argv[1:]], environ)
    if argv and argv[0] == "chaos":
        from gridstream.chaos import main as chaos_main

        sys.exit(chaos_main(argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "show", False):
            config, origins = load_config_with_origins(args.config)
            print(to_toml(config, origins if args.origin else None), end="")
            sys.exit(0)
        import uvloop

        try:
            code = uvloop.run(_run(args))
        except KeyboardInterrupt:
            code = 130
    except ConfigError as exc:
        print(f"gridstream: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)


async def _run(args: argparse.Namespace) -> int:
    """Runs a command; a failed call is one line on stderr, never a traceback,
    and says "cannot reach the scheduler" when the cluster is down (exit 2)."""
    from gridstream.cli_commands import UNREACHABLE_EXIT_CODE, describe_failure

    try:
        code: int = await args.run(args)
        return code
    except (GridstreamError, grpc.aio.AioRpcError) as exc:
        address = _scheduler_address(args) if args.run is not _up else ""
        print(f"gridstream: {await describe_failure(exc, address, _security(args))}",
              file=sys.stderr)
        return UNREACHABLE_EXIT_CODE


if __name__ == "__main__":
    main()


