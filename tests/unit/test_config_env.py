"""Environment overrides: a misspelled GRIDSTREAM_* variable is an error
naming the nearest setting, the variables read outside the config (fault
hooks, test probes, the container health address) are not, and every value
can say whether it came from the file, the environment or the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridstream.config import ConfigError, load_config, load_config_with_origins
from gridstream.configtoml import to_toml


def test_a_misspelled_variable_is_an_error_naming_the_nearest_setting() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"GRIDSTREAM_CLUSTER_WINDOWSIZE": "500"})
    message = str(caught.value)
    assert "$GRIDSTREAM_CLUSTER_WINDOWSIZE" in message
    assert "did you mean $GRIDSTREAM_CLUSTER_WINDOW_SIZE?" in message


@pytest.mark.parametrize("name", [
    "GRIDSTREAM_CRASH_POINT", "GRIDSTREAM_CRASH_ONCE_FILE", "GRIDSTREAM_FAULT_TASK_FAIL",
    "GRIDSTREAM_FAULT_WRITE_DELAY_S", "GRIDSTREAM_FAULT_SOMETHING_NEW",
    "GRIDSTREAM_TEST_IMPORT_PROBE", "GRIDSTREAM_HEALTH_ADDRESS", "GRIDSTREAM_PARENT_PID",
    "GRIDSTREAM_LOG_LEVEL", "GRIDSTREAM_SCHEDULER_ADDRESS",
    "GRIDSTREAM_SECURITY_CLUSTER_SECRET_FILE",
])
def test_variables_read_elsewhere_and_settings_are_known(name: str) -> None:
    value = {"GRIDSTREAM_LOG_LEVEL": "debug", "GRIDSTREAM_SCHEDULER_ADDRESS": "h:1",
             "GRIDSTREAM_SECURITY_CLUSTER_SECRET_FILE": ""}.get(name, "x")
    load_config(None, env={name: value, "PATH": "/bin", "GRIDSTREAMX": "not ours"})


def test_every_value_names_its_origin(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[cluster]\nwindow_size = 500\npartitions = 6\n")
    config, origins = load_config_with_origins(
        path, env={"GRIDSTREAM_CLUSTER_PARTITIONS": "9"})
    assert config.cluster.partitions == 9
    assert origins["cluster.window_size"] == "file"
    assert origins["cluster.partitions"] == "environment $GRIDSTREAM_CLUSTER_PARTITIONS"
    assert origins["worker.node_id"] == "default"
    assert origins["log_level"] == "default"
    text = to_toml(config, origins)
    assert "window_size = 500  # file\n" in text
    assert "partitions = 9  # environment $GRIDSTREAM_CLUSTER_PARTITIONS\n" in text
    assert 'log_level = "INFO"  # default\n' in text


def test_log_level_is_checked_and_any_case() -> None:
    assert load_config(None, env={"GRIDSTREAM_LOG_LEVEL": "debug"}).log_level == "debug"
    with pytest.raises(ConfigError, match="log_level"):
        load_config(None, env={"GRIDSTREAM_LOG_LEVEL": "chatty"})
