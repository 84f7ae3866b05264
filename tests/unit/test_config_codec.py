"""Configuration loading and the batch payload codec."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridstream import codec
from gridstream.config import Config, ConfigError, load_config
from gridstream.configtoml import to_toml
from gridstream.v1 import common_pb2


def test_defaults_without_a_file() -> None:
    config = load_config(None, env={})
    assert config == Config()
    assert config.cluster.window_size == 50_000


def test_file_then_environment_override(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[cluster]\nwindow_size = 500\n[worker]\nnode_id = 'w9'\n")
    config = load_config(path, env={"GRIDSTREAM_CLUSTER_WINDOW_SIZE": "700"})
    assert config.cluster.window_size == 700
    assert config.worker.node_id == "w9"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[cluster]\nwindow_size = 0\n", {}, "cluster.window_size must be >= 1"),
        ("[cluster]\nwindow_sise = 5\n", {}, "unknown config key cluster.window_sise"),
        ("[cluster]\nwindow_size = 'big'\n", {}, "cluster.window_size: 'big' is not a valid int"),
        ("", {"GRIDSTREAM_CLUSTER_PHI_THRESHOLD": "x"}, "GRIDSTREAM_CLUSTER_PHI_THRESHOLD"),
        ("[nonsense]\n", {}, "unknown config key nonsense"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, env: dict[str, str],
                                 message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env)
    assert message in str(info.value)


def test_to_toml_round_trips(tmp_path: Path) -> None:
    config = load_config(None, env={"GRIDSTREAM_CLUSTER_PARTITIONS": "24"})
    path = tmp_path / "c.toml"
    path.write_text(to_toml(config))
    assert load_config(path, env={}) == config


def test_batch_round_trip_with_and_without_keys() -> None:
    values = [{"a": 1}, "x", 3.5, None, [1, 2], b"raw"]
    assert codec.decode_batch(codec.encode_batch(values)) == (None, values)
    keys = ["k1", 2, b"k3", "k4", "k5", "k6"]
    assert codec.decode_batch(codec.encode_batch(values, keys)) == (keys, values)


def test_malformed_payloads_are_refused_with_reasons() -> None:
    good = codec.encode_batch([1, 2])
    bad_count = common_pb2.RecordBatch(encoding=good.encoding, count=5, payload=good.payload)
    with pytest.raises(codec.PayloadError, match="header says 5 records"):
        codec.decode_batch(bad_count)
    garbage = common_pb2.RecordBatch(encoding=good.encoding, count=1, payload=b"\xc1\xff")
    with pytest.raises(codec.PayloadError, match="not valid msgpack"):
        codec.decode_batch(garbage)
    unknown = common_pb2.RecordBatch(encoding=0, count=2, payload=good.payload)
    with pytest.raises(codec.PayloadError, match="unknown payload encoding"):
        codec.decode_batch(unknown)
    with pytest.raises(codec.PayloadError, match="msgpack-serialisable"):
        codec.encode_batch([object()])
