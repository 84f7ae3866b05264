"""Every log line of a service names its node, in text and in JSON, and the
configured level decides what is written."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from gridstream.service import setup_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    """Puts pytest's own root handlers and level back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_and_json_lines_carry_the_node_id_and_the_level_filters(
        restore_root: None, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("worker", json_logs=False, level="warning", node_id="worker-7")
    logging.getLogger("gridstream.x").info("hidden at WARNING")
    logging.getLogger("gridstream.x").warning("shown")
    text = capsys.readouterr().err.splitlines()
    assert len(text) == 1 and " worker-7 WARNING gridstream.x: shown" in text[0], text

    setup_logging("stateserver", json_logs=True, level="DEBUG", node_id="state-2")
    logging.getLogger("gridstream.y").debug("routing table epoch 3")
    entry = json.loads(capsys.readouterr().err)
    assert entry["node"] == "state-2" and entry["level"] == "DEBUG", entry

    setup_logging("scheduler", json_logs=True)
    logging.getLogger("gridstream.z").info("up")
    assert json.loads(capsys.readouterr().err)["node"] == "scheduler"
