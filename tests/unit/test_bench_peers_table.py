"""The peers table gives, per system, the medians over the rounds that
passed, the cores its processes kept busy, and gridstream's ratios paired by
round (bench/peers/__main__.py ``summarise`` and ``table``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from bench.machine import busy_cores

PEERS = Path(__file__).resolve().parents[2] / "bench" / "peers"


def peers_module() -> ModuleType:
    """``bench/peers/__main__.py``, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location("peers_main", PEERS / "__main__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_main"] = module
    spec.loader.exec_module(module)
    return module


def test_rows_hold_medians_cores_and_ratios_paired_by_round() -> None:
    peers = peers_module()
    order = [peers.System("gridstream exactly_once", "gridstream", True, "python",
                          lambda _w: "gridstream_run.py"),
             peers.System("gridstream at_most_once", "gridstream", False, "python",
                          lambda _w: "gridstream_run.py"),
             peers.System("Bytewax 1w recovery 1s", "Bytewax", True, "python",
                          lambda _w: "bytewax_taxi.py")]
    records = 1_000_000
    # (system, round, seconds, CPU-seconds); round 3 of Bytewax failed.
    timings = [("gridstream exactly_once", 1, 4.0, 6.0), ("gridstream exactly_once", 2, 3.0, 6.0),
               ("gridstream exactly_once", 3, 5.0, 6.0),
               ("gridstream at_most_once", 1, 5.0, 7.0), ("gridstream at_most_once", 2, 4.0, 7.0),
               ("gridstream at_most_once", 3, 5.0, 7.0),
               ("Bytewax 1w recovery 1s", 1, 8.0, 8.0), ("Bytewax 1w recovery 1s", 2, 8.0, 8.0)]
    runs = [peers.Run("taxi", system, number, records, ok=True, seconds=seconds,
                      cpu_seconds=cpu) for system, number, seconds, cpu in timings]
    runs.append(peers.Run("taxi", "Bytewax 1w recovery 1s", 3, records, ok=False,
                          failure="result differs"))
    rows = {row.system: row for row in peers.summarise(runs, order)}

    exactly = rows["gridstream exactly_once"]
    assert exactly.runs == 3
    assert exactly.rate == 250_000  # median of 250k, 333k, 200k
    assert exactly.cores == 1.5  # median of 1.5, 2.0, 1.2
    assert exactly.rate_ratio == 1.25  # per round 1.25, 1.33, 1.0
    assert exactly.against == "at_most_once"
    bytewax = rows["Bytewax 1w recovery 1s"]
    assert (bytewax.runs, bytewax.cores) == (2, 1.0)
    # gridstream over Bytewax in the rounds both passed: 2.0 and 2.67.
    assert bytewax.rate_ratio is not None and abs(bytewax.rate_ratio - 7 / 3) < 1e-9
    assert bytewax.against == "exactly_once"

    text = peers.table(list(rows.values()), {"taxi": records}, "header")
    lines = text.splitlines()
    columns = next(line for line in lines if line.startswith("system"))
    row = next(line for line in lines if line.startswith("gridstream exactly_once"))
    cores_end = columns.index("cores") + len("cores")
    assert row[cores_end - 4:cores_end] == "1.50"


def test_busy_cores_counts_the_time_not_idle_nor_waiting_for_io() -> None:
    before = [100, 0, 50, 1000, 10, 0, 0, 0, 0, 0]
    # 150 user, 50 system, 80 idle, 20 waiting for I/O: 200 of 300 busy.
    after = [250, 0, 100, 1080, 30, 0, 0, 0, 0, 0]
    assert abs(busy_cores(before, after, 2) - 4 / 3) < 1e-9
    assert busy_cores(before, before, 2) == 0.0


def test_runs_started_on_a_busy_machine_are_named_under_the_table(tmp_path: Path) -> None:
    peers = peers_module()
    order = [peers.System("plain Python", "plain Python", False, "python",
                          lambda _w: "plain.py")]
    runs = [peers.Run("taxi", "plain Python", number, 1_000, ok=True, seconds=1.0,
                      cpu_seconds=1.0, busy_before=busy)
            for number, busy in ((1, 0.02), (2, 1.04), (3, 0.9))]
    peers.report(runs, order, {"wordcount": 0, "taxi": 1_000}, "header", tmp_path, {})
    text = (tmp_path / "peers.txt").read_text()
    assert "BUSY MACHINE: 2 of 3 runs started with 0.90 to 1.04 cores busy" in text
    quiet = [peers.Run("taxi", "plain Python", 1, 1_000, ok=True, seconds=1.0,
                       cpu_seconds=1.0, busy_before=0.1)]
    peers.report(quiet, order, {"wordcount": 0, "taxi": 1_000}, "header", tmp_path, {})
    assert "BUSY" not in (tmp_path / "peers.txt").read_text()
