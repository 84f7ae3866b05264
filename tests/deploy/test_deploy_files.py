"""Deployment files checked statically: systemd units pass systemd-analyze
verify; the container image runs as non-root with a gRPC health check; the
compose file has the cluster's services; the CLI prints the effective config
and refuses a bad one naming the key."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
GRIDSTREAM = [sys.executable, "-m", "gridstream.cli"]


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
