"""One typed configuration for every gridstream process, loaded from TOML.

Every key has a documented default, so an empty file (or none) runs a local
cluster on loopback. Environment variables override the file:
``GRIDSTREAM_<SECTION>_<KEY>`` (e.g. ``GRIDSTREAM_CLUSTER_WINDOW_SIZE=5000``).
A bad value fails at start with a message naming the key, and so does a
``GRIDSTREAM_*`` variable that names no setting (a misspelled override would
otherwise be ignored silently): the message names the nearest known name.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints


class ConfigError(ValueError):
    """A configuration file or override names an unknown key or a bad value."""


@dataclass(frozen=True)
class ClusterConfig:
    """Settings every member must agree on."""

    window_size: int = 50_000
    """Records per window snapshot (the seed's W): less replay after a
    failure against more snapshot writes. A tracked task also closes one
    every ``tracking_flush_s``: W bounds a fast task's replay, the timer sets
    a slower one's cadence (docs/benchmarks.md, "Snapshot cadence")."""

    partitions: int = 12
    """Default number of partitions of a job; fixed for the job's life."""

    virtual_nodes: int = 100
    """Positions of each worker on the partition ring; more positions give a
    more even share at the cost of a larger ring."""

    heartbeat_interval_s: float = 0.25
    """How often members send heartbeats to the scheduler."""

    phi_threshold: float = 8.0
    """Phi-accrual suspicion level at which a member is declared dead."""

    loop_stall_limit_s: float = 5.0
    """Heartbeats come from a thread of their own, so a member whose event
    loop is busy is not declared dead; a loop that has not run for this long
    stops them, so that the work of a stuck member moves elsewhere."""

    stop_deadline_s: float = 15.0
    """A member still draining this long after a stop was asked logs what it
    still runs and exits 75 (a crash, recovered from as from a kill): a stop
    never hangs on peers that are gone. Below systemd's TimeoutStopSec."""

    backup_count: int = 1
    """Ring successors holding a copy of each JobContainer append."""

    replica_count: int = 2
    """R: state servers holding a copy of each operator's snapshots and rows
    (capped at the number of state servers; published in the routing table)."""

    write_quorum: int = 0
    """W: replicas that must acknowledge a snapshot or row write before it
    counts; 0 means a majority of replica_count."""

    tracker_count: int = 2
    """Trackers over which XOR tuple-tracking records are spread (hosted by
    the workers; change it while running with `gridstream trackers N`)."""

    tracker_virtual_positions: int = 64
    """Positions of each tracker on the 32-bit tracker ring."""

    tracking_timeout_s: float = 30.0
    """Seconds after which a root whose tuple tree is incomplete is declared
    failed and its lost batches are processed again (jobs may override)."""

    task_restarts_before_move: int = 3
    """A task restarted this many times after errors on one worker has its
    partition moved to another worker (from its snapshot and log), and the
    worker is avoided for it until it restarts. A task failing on every
    worker keeps its last owner and is named in the job's progress."""

    tracking_flush_s: float = 1.0
    """A task whose tracking reports wait for a durable window closes it after
    at most this long, even before W records: trees complete, and a busy task
    snapshots, about this often (a drain asks for such closes at once)."""

    job_modules: tuple[str, ...] = ("gridstream.builtins", "gridstream.examples")
    """Modules (or packages, with all below them) whose functions jobs may name,
    checked before any import at submit and at deploy: submitters run these
    modules' code on every worker, so list only modules you trust (e.g.
    ``["gridstream.builtins", "mycompany.jobs"]``; environment: comma-separated)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Where the scheduler listens and keeps its job registry."""

    host: str = "127.0.0.1"
    """Interface to bind."""

    port: int = 7400
    """Port to bind; 0 picks a free one (printed and written to the ready file)."""

    data_dir: str = ".gridstream/scheduler"
    """Directory of the scheduler's SQLite job registry."""

    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0 picks a free one, -1 turns it off."""

    metrics_host: str = "127.0.0.1"
    """Interface of /metrics. Loopback by default: the endpoint is plain HTTP
    without authentication and shows job ids and member names, so expose it
    (``0.0.0.0``) only where the network itself is trusted, or scrape it
    through a local agent or an authenticating proxy."""

    console_port: int = 7401
    """Port of the web console (docs/console.md), served by the scheduler on
    ``host``: HTTPS with the member certificate when security.tls is on, and
    asking for a token with the read right when security.tokens_file is set.
    Next to the default scheduler port; 0 picks a free one (logged, and
    written to the ready file), -1 turns the console off. A local cluster
    whose scheduler takes a free port takes a free console port too."""


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs its JobContainers and JobOperators."""

    node_id: str = "worker-1"
    """Stable identity; a restarted worker uses the same id to get its share back."""

    host: str = "127.0.0.1"
    """Interface to bind."""

    advertise_host: str = ""
    """Host name others use to reach this worker; empty means ``host``. Set it
    when binding 0.0.0.0 (containers: the service name)."""

    port: int = 0
    """Port to bind; 0 picks a free one."""

    queue_max_records: int = 200_000
    """Records a JobContainer holds before senders are made to wait (backpressure)."""

    max_batch_bytes: int = 8 * 1024 * 1024
    """Largest Push request accepted; bigger ones get RESOURCE_EXHAUSTED."""

    output_batch_records: int = 5_000
    """Records per batch a task sends downstream."""

    results_linger_s: float = 0.1
    """A task writes the result rows it produced between two windows at most
    this often (rows go at once with a window), stretched up to 8 times while
    row writes are slow (services/worker/snapshots.py, stretched_linger).
    Results are readable up to that much later; a drain has them written at
    once. 0 writes after every batch, one write per state server each."""

    push_timeout_s: float = 10.0
    """Deadline of a Push to another worker, including waiting for queue space."""

    gc_young_threshold: int = 50_000
    """Allocations between two collections of the youngest generation of the
    worker's cyclic garbage collector (CPython's default: 700; why and what
    it saves: services/worker/collector.py). 0 keeps CPython's defaults."""

    max_record_attempts: int = 1
    """Attempts at a record whose operator raises before it goes to the dead-letter table."""

    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0 picks a free one, -1 turns it off."""

    metrics_host: str = "127.0.0.1"
    """Interface of /metrics. Loopback by default: the endpoint is plain HTTP
    without authentication and shows job ids and member names, so expose it
    (``0.0.0.0``) only where the network itself is trusted, or scrape it
    through a local agent or an authenticating proxy."""

    python_paths: tuple[str, ...] = ()
    """Directories put in front of the worker's import path (``PYTHONPATH``)
    when ``gridstream worker`` or ``gridstream up`` starts it, so jobs can name
    a user package that is not installed in the worker's environment (list
    its modules in cluster.job_modules too). Relative paths are taken from the
    directory the command runs in. Empty: the environment's own path only
    (environment: comma-separated)."""


@dataclass(frozen=True)
class StateServerConfig:
    """Where a state server listens and stores snapshots and results."""

    node_id: str = "state-1"
    """Stable identity of this state server."""

    host: str = "127.0.0.1"
    """Interface to bind."""

    advertise_host: str = ""
    """Host name others use to reach this state server; empty means ``host``."""

    port: int = 0
    """Port to bind; 0 picks a free one."""

    data_dir: str = ".gridstream/state"
    """Directory of the SQLite database (WAL mode)."""

    keep_windows: int = 2
    """Window snapshots kept per operator; older ones are deleted."""

    sync_interval_s: float = 2.0
    """How often a replica compares its holdings with its peers' and copies
    what it lacks (also at once after every membership change)."""

    cleanup_interval_s: float = 30.0
    """How often a replica deletes the state of cancelled or failed jobs and
    the copies it held for a replica that has caught up since."""

    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0 picks a free one, -1 turns it off."""

    metrics_host: str = "127.0.0.1"
    """Interface of /metrics. Loopback by default: the endpoint is plain HTTP
    without authentication and shows job ids and member names, so expose it
    (``0.0.0.0``) only where the network itself is trusted, or scrape it
    through a local agent or an authenticating proxy."""


@dataclass(frozen=True)
class SecurityConfig:
    """TLS, mutual TLS and bearer tokens; all off by default (plaintext loopback)."""

    tls: bool = False
    """Serve and call over TLS. Needs ca_file, cert_file and key_file."""

    ca_file: str = ""
    """PEM bundle of the CA that signs every member's (and client's) certificate."""

    cert_file: str = ""
    """PEM certificate of this process (server, and client for mutual TLS)."""

    key_file: str = ""
    """PEM private key of cert_file."""

    require_client_cert: bool = True
    """With tls: refuse callers without a certificate signed by ca_file (mutual TLS)."""

    tokens_file: str = ""
    """Services: TOML file mapping bearer tokens to rights, ``[tokens] "<token>" =
    ["submit", "send", "read"]`` (or ``["admin"]``: everything, as members need).
    Empty: no token checks. Needs tls."""

    token: str = ""
    """Bearer token this process sends on its calls (members: an admin token)."""

    cluster_secret_file: str = ""
    """File holding the cluster secret (mode 0600), which members present on
    every call they make to one another (registration, heartbeats, deploy,
    replication, log fetch, tracking, snapshot and result writes); a caller
    without it (or, with tokens_file, without an admin token) is refused.
    Services need it unless tokens_file is set; ``gridstream up`` and
    ``gridstream certs`` create one. Clients leave it empty (an operator's
    admin commands may set it)."""

    plaintext_network: bool = False
    """Let a service without tls bind an interface other than loopback.
    Off by default: plaintext carries tokens and records readable by anyone
    on the path; turn it on only inside a network you trust."""


@dataclass(frozen=True)
class Config:
    """The whole configuration of a gridstream process."""

    scheduler_address: str = "127.0.0.1:7400"
    """``host:port`` of the scheduler, for workers, state servers and clients."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Settings shared by the whole cluster."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Scheduler settings."""

    worker: WorkerConfig = field(default_factory=WorkerConfig)
    """Worker settings."""

    stateserver: StateServerConfig = field(default_factory=StateServerConfig)
    """State-server settings."""

    security: SecurityConfig = field(default_factory=SecurityConfig)
    """TLS and token settings."""

    log_json: bool = False
    """Log one JSON object per line instead of plain text."""

    log_level: str = "INFO"
    """Lowest level a service logs: DEBUG, INFO, WARNING or ERROR. INFO names
    starts, stops, deploys and recoveries; DEBUG adds every routing table."""

    def validate(self) -> Config:
        """Checks value ranges, so a bad value fails at start and names its key."""
        for key, value in _floats(self):
            if not math.isfinite(value):
                raise ConfigError(f"config key {key} must be a finite number, not {value}")
        checks: list[tuple[str, bool, str]] = [
            ("cluster.window_size", self.cluster.window_size >= 1, "must be >= 1"),
            ("cluster.partitions", 1 <= self.cluster.partitions <= 4096, "must be 1..4096"),
            ("cluster.virtual_nodes", self.cluster.virtual_nodes >= 1, "must be >= 1"),
            ("cluster.heartbeat_interval_s", self.cluster.heartbeat_interval_s > 0, "must be > 0"),
            ("cluster.phi_threshold", self.cluster.phi_threshold > 0, "must be > 0"),
            ("cluster.loop_stall_limit_s",
             self.cluster.loop_stall_limit_s > 3 * self.cluster.heartbeat_interval_s,
             "must be more than 3 x cluster.heartbeat_interval_s"),
            ("cluster.stop_deadline_s", self.cluster.stop_deadline_s > 0, "must be > 0"),
            ("cluster.backup_count", self.cluster.backup_count >= 0, "must be >= 0"),
            ("cluster.replica_count", self.cluster.replica_count >= 1, "must be >= 1"),
            ("worker.queue_max_records", self.worker.queue_max_records >= 1, "must be >= 1"),
            ("worker.max_batch_bytes", self.worker.max_batch_bytes >= 1024, "must be >= 1024"),
            ("worker.output_batch_records", self.worker.output_batch_records >= 1, "must be >= 1"),
            ("worker.results_linger_s", 0 <= self.worker.results_linger_s <= 10,
             "must be between 0 and 10"),
            ("worker.gc_young_threshold",
             self.worker.gc_young_threshold == 0
             or 700 <= self.worker.gc_young_threshold <= 10_000_000,
             "must be 0 (Python's defaults) or between 700 and 10000000"),
            ("worker.push_timeout_s", self.worker.push_timeout_s > 0, "must be > 0"),
            ("worker.max_record_attempts", self.worker.max_record_attempts >= 1, "must be >= 1"),
            ("scheduler.console_port", -1 <= self.scheduler.console_port <= 65535,
             "must be -1 (off), 0 (any free port) or a port number"),
            ("stateserver.keep_windows", self.stateserver.keep_windows >= 1, "must be >= 1"),
            ("cluster.tracker_count", 1 <= self.cluster.tracker_count <= 4096, "must be 1..4096"),
            ("cluster.task_restarts_before_move",
             1 <= self.cluster.task_restarts_before_move <= 1_000_000, "must be 1..1000000"),
            ("cluster.tracker_virtual_positions", self.cluster.tracker_virtual_positions >= 1,
             "must be >= 1"),
            ("cluster.tracking_timeout_s", self.cluster.tracking_timeout_s > 0, "must be > 0"),
            ("cluster.tracking_flush_s", self.cluster.tracking_flush_s > 0, "must be > 0"),
            ("cluster.write_quorum",
             0 <= self.cluster.write_quorum <= self.cluster.replica_count,
             "must be 0 (majority) or between 1 and cluster.replica_count"),
            ("stateserver.sync_interval_s", self.stateserver.sync_interval_s > 0, "must be > 0"),
            ("stateserver.cleanup_interval_s", self.stateserver.cleanup_interval_s > 0,
             "must be > 0"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ConfigError(f"config key {key} {why}")
        for module in self.cluster.job_modules:
            if not _MODULE_NAME.match(module):
                raise ConfigError(f"config key cluster.job_modules: {module!r} is not a module "
                                  "or package name (e.g. 'mycompany.jobs')")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(f"config key log_level: {self.log_level!r} is not one of "
                              f"{', '.join(LOG_LEVELS)}")
        if ":" not in self.scheduler_address:
            raise ConfigError("config key scheduler_address must be host:port")
        security = self.security
        if security.tls:
            for key in ("ca_file", "cert_file", "key_file"):
                value = getattr(security, key)
                if not value:
                    raise ConfigError(f"config key security.{key} must be set when "
                                      "security.tls is true")
                if not Path(value).is_file():
                    raise ConfigError(f"config key security.{key}: {value} does not exist")
        if security.cluster_secret_file:
            _check_secret_file(security.cluster_secret_file)
        if security.tokens_file:
            if not security.tls:
                raise ConfigError("config key security.tokens_file needs security.tls = true "
                                  "(tokens must not cross the network in plaintext)")
            if not Path(security.tokens_file).is_file():
                raise ConfigError(f"config key security.tokens_file: {security.tokens_file} "
                                  "does not exist")
        return self

    def check_service(self, host: str) -> Config:
        """What a service needs beyond :meth:`validate`: member credentials
        (:meth:`check_member_credentials`) and, without TLS, a loopback
        interface unless security.plaintext_network allows another."""
        self.check_member_credentials()
        check_bind(self.security, host)
        return self

    def check_member_credentials(self) -> Config:
        """For services: members must authenticate to one another in every mode,
        so a service needs the cluster secret unless bearer tokens (with an
        admin token) are configured."""
        if not self.security.cluster_secret_file and not self.security.tokens_file:
            raise ConfigError(
                "config key security.cluster_secret_file must be set (members authenticate "
                "to one another with it); create one with `gridstream certs` or use the "
                "cluster.toml that `gridstream up` writes")
        return self


def check_bind(security: SecurityConfig, host: str) -> None:
    """Refuses plaintext on a non-loopback interface unless
    security.plaintext_network allows it: plaintext would show tokens, the
    cluster secret and records to the network."""
    if not security.tls and not security.plaintext_network and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve plaintext on {host}: bind 127.0.0.1, turn on "
            "security.tls, or set security.plaintext_network = true for a network you "
            "trust")


def is_loopback(host: str) -> bool:
    """True for an interface only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""Values of log_level (any case)."""

ENV_PREFIX = "GRIDSTREAM_"

OTHER_ENV_NAMES = frozenset({
    "GRIDSTREAM_CRASH_POINT", "GRIDSTREAM_CRASH_ONCE_FILE", "GRIDSTREAM_HEALTH_ADDRESS",
    "GRIDSTREAM_PARENT_PID",
})
"""Variables that are not settings but are read elsewhere: the fault hooks
(gridstream.faults), the container health check's address (deploy/docker) and
the parent a local cluster's member exits with (gridstream.service)."""

OTHER_ENV_PREFIXES = ("GRIDSTREAM_FAULT_", "GRIDSTREAM_TEST_")
"""Families of variables read elsewhere: fault hooks and test probes."""

_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _floats(config: Config) -> list[tuple[str, float]]:
    """Every float-valued key with its value, to refuse inf and NaN everywhere."""
    found: list[tuple[str, float]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            for sub in dataclasses.fields(value):
                item = getattr(value, sub.name)
                if isinstance(item, float):
                    found.append((f"{f.name}.{sub.name}", item))
    return found


def _check_secret_file(path: str) -> None:
    """A secret must exist and be readable by its owner only."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"config key security.cluster_secret_file: {path} does not "
                          "exist") from None
    if mode & 0o077:
        raise ConfigError(f"config key security.cluster_secret_file: {path} is readable by "
                          f"others (mode {mode & 0o777:o}); chmod 600 it")


_T = TypeVar("_T")


def _coerce(key: str, raw: Any, kind: Any) -> Any:
    """Converts a TOML or environment value to the field's type, or names the key."""
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if kind is str:
            if not isinstance(raw, str | int | float):
                raise ValueError(raw)
            return str(raw)
        if kind == tuple[str, ...]:
            if isinstance(raw, str):
                return tuple(part.strip() for part in raw.split(",") if part.strip())
            if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
                raise ValueError(raw)
            return tuple(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"config key {key}: {raw!r} is not a valid {_kind_name(kind)}") from None
    raise ConfigError(f"config key {key}: unsupported type")


def _kind_name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or "list of strings"


def env_name(key: str) -> str:
    """The environment variable that overrides a dotted config key."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def _build(cls: type[_T], prefix: str, table: Mapping[str, Any], env: Mapping[str, str],
           origins: dict[str, str]) -> _T:
    """Builds one config dataclass from a TOML table plus environment
    overrides, noting in ``origins`` where each key's value came from."""
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for name in table:
        if name not in known:
            where = f"{prefix}.{name}" if prefix else name
            raise ConfigError(f"unknown config key {where}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f"{prefix}.{f.name}" if prefix else f.name
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            sub = table.get(f.name, {})
            if not isinstance(sub, Mapping):
                raise ConfigError(f"config key {key} must be a table")
            values[f.name] = _build(kind, f.name, sub, env, origins)  # type: ignore[arg-type]
            continue
        variable = env_name(key)
        if variable in env:
            values[f.name] = _coerce(f"{key} (from ${variable})", env[variable], kind)
            origins[key] = f"environment ${variable}"
        elif f.name in table:
            values[f.name] = _coerce(key, table[f.name], kind)
            origins[key] = "file"
        else:
            origins[key] = "default"
    return cls(**values)


def config_keys() -> list[str]:
    """Every dotted key of the configuration, in file order."""
    keys: list[str] = []
    for f in dataclasses.fields(Config):
        value = getattr(Config(), f.name)
        if dataclasses.is_dataclass(value):
            keys += [f"{f.name}.{sub.name}" for sub in dataclasses.fields(value)]
        else:
            keys.append(f.name)
    return keys


def check_environment(env: Mapping[str, str]) -> None:
    """Refuses a ``GRIDSTREAM_*`` variable that names no setting and none of
    the variables read elsewhere, naming the nearest known one: a typo in an
    override must not leave the default in force unnoticed."""
    settings = {env_name(key) for key in config_keys()}
    known = settings | OTHER_ENV_NAMES
    for name in sorted(env):
        if (not name.startswith(ENV_PREFIX) or name in known
                or name.startswith(OTHER_ENV_PREFIXES)):
            continue
        nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.0)
        hint = f"; did you mean ${nearest[0]}?" if nearest else ""
        raise ConfigError(f"unknown environment variable ${name}: no setting has that "
                          f"name{hint} (settings: GRIDSTREAM_<SECTION>_<KEY>, see "
                          "`gridstream config show`)")


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Loads the configuration: defaults, then the TOML file, then environment overrides."""
    return load_config_with_origins(path, env)[0]


def load_config_with_origins(path: str | Path | None = None,
                             env: Mapping[str, str] | None = None
                             ) -> tuple[Config, dict[str, str]]:
    """:func:`load_config`, plus where each dotted key's value came from:
    ``"file"``, ``"environment $NAME"`` or ``"default"`` (for ``gridstream
    config show --origin``)."""
    environment = os.environ if env is None else env
    check_environment(environment)
    table: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                table = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    origins: dict[str, str] = {}
    config = _build(Config, "", table, environment, origins).validate()
    return config, origins
