"""What every runner of the peer comparison shares: the user functions, the
command line, and the measurement each runner reports.

This module uses the standard library only, because it is imported by
interpreters that do not have gridstream's dependencies installed (the Bytewax
and Pathway virtual environments). For the same reason the user functions are
not imported from the ``gridstream`` package (whose ``__init__`` imports gRPC):
:func:`user_functions` compiles the very function definitions of
``gridstream/builtins.py`` and ``gridstream/examples/taxi.py`` from their
source, so every system runs the same code, not a copy that could drift.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

_SOURCES: dict[str, tuple[str, ...]] = {
    "gridstream/builtins.py": ("split_words", "count"),
    "gridstream/examples/taxi.py": ("parse_position", "device_of", "append_position"),
}


def user_functions() -> SimpleNamespace:
    """The jobs' user functions, compiled from gridstream's own source files.

    wordcount: ``split_words`` (flat_map) and ``count`` (reduce, initial 0);
    taxi: ``parse_position`` (map), ``device_of`` (key) and ``append_position``
    (reduce, initial ""). Only the named definitions are compiled, with the
    module-level imports they use (``json``, ``typing.Any``)."""
    namespace: dict[str, Any] = {"json": json, "Any": Any}
    for relative, names in _SOURCES.items():
        path = REPO_ROOT / relative
        tree = ast.parse(path.read_text(), filename=str(path))
        wanted = [node for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name in names]
        missing = set(names) - {node.name for node in wanted}
        if missing:
            raise SystemExit(f"{path}: no definition of {sorted(missing)}")
        module = ast.Module(body=[ast.ImportFrom("__future__", [ast.alias("annotations")], 0),
                                  *wanted], type_ignores=[])
        ast.fix_missing_locations(module)
        exec(compile(module, str(path), "exec"), namespace)
    return SimpleNamespace(**{name: namespace[name] for names in _SOURCES.values()
                              for name in names})


def seq_of(text: str) -> int:
    """The ``seq`` field of a taxi record, read without a JSON parse.

    Only systems without an ordered per-key fold need it (Pathway reduces a
    group as a set, so the track is folded in ``seq`` order); it is framework
    plumbing, not part of the user's computation. Records are written by
    ``json.dumps`` with ``seq`` last, which :func:`check_taxi_layout` asserts."""
    return int(text[text.rindex(":") + 1:-1])


def device_keys_of(texts: list[str]) -> list[str]:
    """The device of each taxi record, read without a JSON parse: the key a
    producer routes the record by (gridstream's client sends each record to
    its device's partition so a device's positions stay in order). One
    comprehension, no call per record: a function called per record cost the
    taxi runner's client a third more (0.30 against 0.22 CPU-seconds per
    million records)."""
    return [text[12:text.index('"', 12)] for text in texts]


def check_taxi_layout(line: str) -> None:
    """Fails unless :func:`seq_of` and :func:`device_keys_of` read ``line``
    exactly as a JSON parse does: a guard against a changed generator."""
    record = json.loads(line)
    if seq_of(line) != record["seq"] or device_keys_of([line]) != [record["device"]]:
        raise SystemExit(f"taxi record layout changed, cannot read its key and seq: {line!r}")


def arguments(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
              ) -> argparse.Namespace:
    """The command line every runner takes: the input file, the result file
    (a JSON object {key: value}) and the stats file (see :class:`Stats`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input", type=Path, required=True, help="data file, one record a line")
    parser.add_argument("--output", type=Path, required=True, help="result file (JSON object)")
    parser.add_argument("--stats", type=Path, required=True, help="stats file (JSON)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if not args.input.is_file():
        # Some sources read a missing file as an empty stream; fail instead.
        parser.error(f"no data file {args.input}")
    return args


def read_lines(path: Path) -> Generator[str, None, None]:
    """The data file's records, one a line, without line ends (the file is
    closed when the generator ends or is closed)."""
    with path.open() as lines:
        for line in lines:
            yield line.rstrip("\n")


def read_line_chunks(path: Path, count: int, block_chars: int = 1 << 22
                     ) -> Generator[list[str], None, None]:
    """The data file's records, one a line, without line ends, in lists of
    ``count`` (the last one shorter). The file is read in blocks of
    ``block_chars`` characters split at line ends, not line by line: per
    million taxi records 0.17 to 0.19 CPU-seconds against 0.22 to 0.26 for
    :func:`read_lines` cut into lists. A last line without a line end is a
    record too, as it is for :func:`read_lines`."""
    lines: list[str] = []
    carry = ""
    with path.open() as text:
        while block := text.read(block_chars):
            parts = (carry + block).split("\n")
            carry = parts.pop()
            lines.extend(parts)
            while len(lines) >= count:
                yield lines[:count]
                del lines[:count]
    if carry:
        lines.append(carry)
    while lines:
        yield lines[:count]
        del lines[:count]


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Writes a result as the JSON object every runner produces, so the driver
    checks all systems with one reader."""
    path.write_text(json.dumps(result))


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU of a live process and of its children it has waited
    for, from ``/proc/<pid>/stat`` (0.0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    # fields[11..14] are utime, stime, cutime, cstime (stat fields 14 to 17).
    ticks = sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_peak_rss(pid: int) -> int:
    """Peak resident set size (VmHWM) of a live process, in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def own_cpu_seconds() -> float:
    """CPU of this process (every thread) and of the children it waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def own_peak_rss() -> int:
    """Peak RSS of this process in bytes: its VmHWM, not ``ru_maxrss``, which
    Linux carries over an exec and so includes the parent's size at the fork."""
    return process_peak_rss(os.getpid())


@dataclass
class Stats:
    """What a runner measured over its timed window, which starts when the
    dataflow is built (after imports and set-up such as starting a cluster or
    initialising a recovery store) and ends once the result file is written.

    ``cpu_seconds`` counts every process of the system (all threads) over the
    window; ``peak_rss_bytes`` sums each process's peak RSS (for one process,
    exactly its peak; for several, an upper bound of their simultaneous peak)."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    processes: int = 1
    notes: dict[str, Any] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        """Writes the stats file the driver reads."""
        path.write_text(json.dumps(asdict(self)))


@contextmanager
def measured(stats_path: Path,
             other_pids: Callable[[], list[int]] = list) -> Iterator[Stats]:
    """Times the block and counts the CPU of this process and of
    ``other_pids()`` (a system's other processes, e.g. cluster members) over
    it, then writes the stats file. Nothing is written if the block raises."""
    pids = other_pids()
    cpu_before = own_cpu_seconds() + sum(process_cpu_seconds(pid) for pid in pids)
    started = time.perf_counter()
    stats = Stats()
    yield stats
    stats.seconds = time.perf_counter() - started
    stats.cpu_seconds = (own_cpu_seconds() + sum(process_cpu_seconds(pid) for pid in pids)
                         - cpu_before)
    stats.peak_rss_bytes = own_peak_rss() + sum(process_peak_rss(pid) for pid in pids)
    stats.processes = 1 + len(pids)
    stats.write(stats_path)
