"""Deployment files: systemd units pass systemd-analyze verify; the container
image runs as non-root with a gRPC health check; the compose file has the
cluster's services; every deployment config names the cluster secret and
binds beyond loopback only over TLS (or says the network is trusted), and a
scheduler, a state server and a worker started with the shipped systemd
config and with the compose file's settings register with each other; no
secret or key is committed; the CLI prints the effective config and refuses a
bad one naming the key."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from gridstream.auth import create_cluster_secret
from gridstream.certs import create_dev_certs
from gridstream.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
GRIDSTREAM = [sys.executable, "-m", "gridstream.cli"]
CERTS = "/etc/gridstream/certs"
"""Where the deployment files keep the certificates and the cluster secret."""
CLUSTER_SERVICES = ("scheduler", "state-1", "state-2", "worker-1", "worker-2", "worker-3")


def render_units(target: Path) -> list[Path]:
    """Units with @PREFIX@ pointing at this checkout; templates instantiated."""
    rendered = []
    for unit in sorted(SYSTEMD.glob("*.service")):
        text = unit.read_text().replace("@PREFIX@", str(REPO))
        name = unit.name.replace("@.service", "@one.service")
        path = target / name
        path.write_text(text)
        rendered.append(path)
    return rendered


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_units_verify_cleanly(tmp_path: Path) -> None:
    units = render_units(tmp_path)
    assert [u.name for u in units] == ["gridstream-scheduler.service",
                                       "gridstream-stateserver@one.service",
                                       "gridstream-worker@one.service"]
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, units)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    unit = render_units(tmp_path)[0]
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=sometimes"))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, check=False)
    assert "restart specifier" in result.stderr


@pytest.mark.parametrize("unit", sorted(p.name for p in SYSTEMD.glob("*.service")))
def test_units_restart_drain_and_are_hardened(unit: str) -> None:
    text = (SYSTEMD / unit).read_text()
    for line in ("User=gridstream", "Restart=always", "KillSignal=SIGTERM",
                 "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "--config /etc/gridstream/gridstream.toml"):
        assert line in text, f"{unit} lacks {line}"
    if "@" in unit:
        assert "--node-id %i" in text


def test_container_image_is_multi_stage_non_root_with_health_check() -> None:
    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    assert text.count("FROM ") == 2 and "AS build" in text
    assert "USER gridstream" in text
    assert "HEALTHCHECK" in text and "gridstream health" in text
    assert "make setup" in text  # gRPC code generated at build, not copied in


def test_compose_has_the_cluster_and_an_optional_chaos_service() -> None:
    text = (REPO / "deploy" / "docker" / "compose.yaml").read_text()
    for service in ("scheduler:", "worker-1:", "worker-2:", "worker-3:", "state-1:",
                    "state-2:", "chaos:"):
        assert f"\n  {service}" in text, service
    assert 'profiles: ["chaos"]' in text
    assert text.count("ADVERTISE_HOST") == 5


def test_config_show_prints_every_key_with_overrides(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[cluster]\nwindow_size = 777\n")
    result = subprocess.run([*GRIDSTREAM, "config", "show", "--config", str(config)],
                            capture_output=True, text=True, check=True, cwd=REPO,
                            env={"GRIDSTREAM_CLUSTER_BACKUP_COUNT": "2", "PATH": "/usr/bin"})
    for line in ("window_size = 777", "backup_count = 2", "heartbeat_interval_s = 0.25",
                 "phi_threshold = 8.0", "replica_count = 2", "tracker_count = 2"):
        assert line in result.stdout


def test_a_bad_config_value_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[cluster]\nphi_threshold = -1\n")
    result = subprocess.run([*GRIDSTREAM, "config", "show", "--config", str(config)],
                            capture_output=True, text=True, check=False, cwd=REPO)
    assert result.returncode == 2
    assert "cluster.phi_threshold must be > 0" in result.stderr
    worker = subprocess.run([sys.executable, "-m", "services.worker", "--config", str(config)],
                            capture_output=True, text=True, check=False, cwd=REPO, timeout=30)
    assert worker.returncode != 0
    assert "cluster.phi_threshold" in worker.stderr


# -- the cluster secret and TLS in every deployment config ----------------------


def make_certs(tmp_path: Path) -> Path:
    """What `gridstream certs` makes: a dev CA, a node certificate for loopback
    and the cluster secret (0600)."""
    certs = tmp_path / "certs"
    create_dev_certs(certs, ["localhost", "127.0.0.1"])
    create_cluster_secret(certs / "cluster.secret")
    return certs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deploy_configs() -> list[Path]:
    return sorted(DEPLOY.rglob("*.toml"))


def render_config(config: Path, certs: Path, ports: Mapping[str, int]) -> str:
    """The shipped config with this machine's certificates, loopback names and
    free ports: what an operator installs, runnable here."""
    text = config.read_text().replace(CERTS, str(certs))
    text = re.sub(r'"host[A-Z]"', '"127.0.0.1"', text)
    text = re.sub(r'"host[A-Z]:(\d+)"',
                  lambda m: f'"127.0.0.1:{ports.get("scheduler", m.group(1))}"', text)
    for section, port in ports.items():
        text = re.sub(rf"(\[{section}\][^\[]*?\nport = )\d+", rf"\g<1>{port}", text)
    return text


def compose_services() -> dict[str, str]:
    """Each service's block of the compose file, by name."""
    text = COMPOSE.read_text().split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    parts = re.split(r"^  ([a-z0-9-]+):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def compose_env() -> dict[str, str]:
    """The environment every cluster service merges (`<<: *env`)."""
    block = COMPOSE.read_text().split("  environment: &env\n", 1)[1]
    env: dict[str, str] = {}
    for line in block.splitlines():
        if not line.startswith("    "):
            break
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(": ")
            env[key] = value.strip().strip('"')
    return env


def test_every_deployment_config_names_the_secret_and_binds_safely(tmp_path: Path) -> None:
    configs = deploy_configs()
    assert [c.relative_to(DEPLOY).as_posix() for c in configs] == ["systemd/gridstream.toml"]
    certs = make_certs(tmp_path)
    for config in configs:
        text = config.read_text()
        assert f'cluster_secret_file = "{CERTS}/cluster.secret"' in text, config
        assert "job_modules = [" in text, config
        rendered = tmp_path / config.name
        rendered.write_text(render_config(config, certs, {}))
        loaded = load_config(rendered, env={})
        assert loaded.security.cluster_secret_file == str(certs / "cluster.secret")
        assert loaded.security.tls or loaded.security.plaintext_network, config
        for host in (loaded.scheduler.host, loaded.worker.host, loaded.stateserver.host):
            loaded.check_service(host)  # raises ConfigError if a service would refuse


def test_the_systemd_units_read_the_config_that_names_the_secret() -> None:
    for unit in sorted(SYSTEMD.glob("*.service")):
        text = unit.read_text()
        assert "--config /etc/gridstream/gridstream.toml" in text, unit.name
        assert "UMask=0077" in text, unit.name
        assert "ReadWritePaths=/etc" not in text, unit.name  # config and secret stay read-only
    readme = (DEPLOY / "README.md").read_text()
    assert "deploy/systemd/gridstream.toml" in readme
    assert "install -m 0600 -o gridstream -g gridstream node-key.pem cluster.secret" in readme


def test_compose_makes_the_secret_once_and_every_service_uses_it() -> None:
    services = compose_services()
    assert set(services) == {"certs", *CLUSTER_SERVICES, "chaos"}
    env = compose_env()
    assert env["GRIDSTREAM_SECURITY_CLUSTER_SECRET_FILE"] == f"{CERTS}/cluster.secret"
    assert env["GRIDSTREAM_SECURITY_TLS"] == "true"
    assert env["GRIDSTREAM_SECURITY_REQUIRE_CLIENT_CERT"] == "true"
    assert "GRIDSTREAM_CLUSTER_JOB_MODULES" in env

    certs = services["certs"]
    assert f"gridstream certs --out {CERTS}" in certs
    hosts = re.search(r"--hosts (\S+)", certs)
    assert hosts is not None
    assert set(hosts.group(1).split(",")) >= {*CLUSTER_SERVICES, "127.0.0.1"}
    assert "[ -s /etc/gridstream/certs/cluster.secret ]" in certs  # never rotated under a cluster
    assert f"rm -f {CERTS}/ca-key.pem" in certs
    assert f'"certs:{CERTS}"' in certs and 'restart: "no"' in certs

    anchor = COMPOSE.read_text().split("\nservices:\n", 1)[0]
    assert "condition: service_completed_successfully" in anchor
    for name in CLUSTER_SERVICES:
        block = services[name]
        assert "<<: *env" in block, name
        assert f'"certs:{CERTS}:ro"' in block, name
        assert "depends_on:" not in block or "<<: *after-certs" in block, name
        assert '"--host", "0.0.0.0"' in block, name
    assert "127.0.0.1:7400:7400" in services["scheduler"]
    assert "environment: {}" in services["chaos"]  # its own loopback cluster and secret

    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert f"chown gridstream:gridstream /var/lib/gridstream {CERTS}" in dockerfile


@pytest.mark.parametrize("compose", [["docker", "compose"], ["docker-compose"]])
def test_compose_file_is_valid_for_compose(compose: list[str]) -> None:
    if shutil.which(compose[0]) is None:
        pytest.skip(f"{compose[0]} missing")
    probe = subprocess.run([*compose, "version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"{' '.join(compose)} missing")
    result = subprocess.run([*compose, "-f", str(COMPOSE), "--profile", "chaos", "config", "-q"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_no_secret_or_key_is_committed_under_deploy() -> None:
    for path in DEPLOY.rglob("*"):
        if not path.is_file():
            continue
        assert path.name not in ("cluster.secret", "tokens.toml", "cluster.toml"), path
        assert not path.name.endswith(("-key.pem", ".secret")), path
        assert "PRIVATE KEY-----" not in path.read_text(errors="replace"), path


# -- running the services with the shipped settings -----------------------------


@contextmanager
def services(tmp_path: Path, env: Mapping[str, str], config: Path | None,
             ports: Mapping[str, int]) -> Iterator[None]:
    """A scheduler, a state server and a worker bound to 0.0.0.0, each stopped
    by its own pid (SIGTERM) afterwards."""
    flags = ["--config", str(config)] if config else []
    scheduler = f"127.0.0.1:{ports['scheduler']}"
    commands = {
        "scheduler": ["scheduler", *flags, "--host", "0.0.0.0", "--port",
                      str(ports["scheduler"]), "--data-dir", str(tmp_path / "scheduler")],
        "state-1": ["stateserver", *flags, "--node-id", "state-1", "--host", "0.0.0.0",
                    "--port", str(ports["stateserver"]), "--scheduler", scheduler,
                    "--data-dir", str(tmp_path / "state-1")],
        "worker-1": ["worker", *flags, "--node-id", "worker-1", "--host", "0.0.0.0",
                     "--port", str(ports["worker"]), "--scheduler", scheduler],
    }
    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in commands.items():
            ready = tmp_path / f"{name}.ready"
            log = (tmp_path / f"{name}.log").open("wb")
            started[name] = subprocess.Popen([*GRIDSTREAM, *argv, "--ready-file", str(ready)],
                                             cwd=REPO, env=dict(env), stdout=log,
                                             stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 30
            while not ready.exists():
                log_text = (tmp_path / f"{name}.log").read_text(errors="replace")
                assert started[name].poll() is None, f"{name} exited: {log_text}"
                assert time.monotonic() < deadline, f"{name} not ready: {log_text}"
                time.sleep(0.05)
        yield
    finally:
        for process in reversed(list(started.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_registered(env: Mapping[str, str], config: Path | None, scheduler: str) -> str:
    flags = ["--config", str(config)] if config else []
    deadline = time.monotonic() + 20
    while True:
        result = subprocess.run([*GRIDSTREAM, "status", *flags, "--scheduler", scheduler],
                                capture_output=True, text=True, check=False, cwd=REPO,
                                env=dict(env), timeout=30)
        alive = {line.split()[0] for line in result.stdout.splitlines()
                 if len(line.split()) > 2 and line.split()[2] == "alive"}
        if {"state-1", "worker-1"} <= alive:
            return result.stdout
        assert time.monotonic() < deadline, result.stdout + result.stderr
        time.sleep(0.2)


def base_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items()
            if not key.startswith("GRIDSTREAM_")}


def test_the_shipped_systemd_config_runs_a_cluster_over_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    ports = {"scheduler": free_port(), "worker": free_port(), "stateserver": free_port()}
    config = tmp_path / "gridstream.toml"
    config.write_text(render_config(SYSTEMD / "gridstream.toml", certs, ports))
    env = base_env()
    with services(tmp_path, env, config, ports):
        wait_registered(env, config, f"127.0.0.1:{ports['scheduler']}")
        health = subprocess.run([*GRIDSTREAM, "health", f"127.0.0.1:{ports['worker']}",
                                 "--config", str(config)], capture_output=True, text=True,
                                check=False, cwd=REPO, env=env, timeout=30)
        assert health.returncode == 0, health.stderr
        # Without the CA's certificate a caller is turned away.
        plain = subprocess.run([*GRIDSTREAM, "health", f"127.0.0.1:{ports['scheduler']}",
                                "--timeout", "1"], capture_output=True, text=True,
                               check=False, cwd=REPO, env=env, timeout=30)
        assert plain.returncode != 0


def test_the_compose_settings_run_a_cluster_and_refuse_one_without_the_secret(
        tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    ports = {"scheduler": free_port(), "worker": free_port(), "stateserver": free_port()}
    env = base_env()
    env.update({key: value.replace(CERTS, str(certs)) for key, value in compose_env().items()})
    env["GRIDSTREAM_SCHEDULER_ADDRESS"] = f"127.0.0.1:{ports['scheduler']}"
    env["GRIDSTREAM_WORKER_ADVERTISE_HOST"] = "127.0.0.1"
    env["GRIDSTREAM_STATESERVER_ADVERTISE_HOST"] = "127.0.0.1"
    with services(tmp_path, env, None, ports):
        wait_registered(env, None, f"127.0.0.1:{ports['scheduler']}")
        # The image's HEALTHCHECK: `gridstream health $GRIDSTREAM_HEALTH_ADDRESS`.
        for port in ports.values():
            health = subprocess.run([*GRIDSTREAM, "health", f"127.0.0.1:{port}"],
                                    capture_output=True, text=True, check=False, cwd=REPO,
                                    env=env, timeout=30)
            assert health.returncode == 0, health.stderr

    without = {k: v for k, v in env.items() if k != "GRIDSTREAM_SECURITY_CLUSTER_SECRET_FILE"}
    refused = subprocess.run([*GRIDSTREAM, "scheduler", "--host", "0.0.0.0", "--port", "0",
                              "--data-dir", str(tmp_path / "refused")], capture_output=True,
                             text=True, check=False, cwd=REPO, env=without, timeout=30)
    assert refused.returncode != 0
    assert "security.cluster_secret_file must be set" in refused.stderr
