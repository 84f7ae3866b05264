"""The peer comparison's gridstream runner reads its data file in blocks and
keys taxi records in one pass: the chunks and keys must be exactly what a
line-by-line read and a JSON parse of each record give, or the runner would
send other records than the peers read."""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "peers"))

from common import device_keys_of, read_line_chunks, read_lines

from gridstream.examples import taxi


def line_by_line(path: Path, count: int) -> list[list[str]]:
    """The reference: :func:`read_lines` cut into lists of ``count``."""
    records = read_lines(path)
    chunks = []
    while chunk := list(itertools.islice(records, count)):
        chunks.append(chunk)
    return chunks


@pytest.mark.parametrize("ending", ["\n", ""])
@pytest.mark.parametrize("block_chars", [1, 7, 64, 1 << 22])
@pytest.mark.parametrize("count", [1, 3, 1000])
def test_block_reading_gives_the_lines_a_line_by_line_read_gives(
        tmp_path: Path, ending: str, block_chars: int, count: int) -> None:
    rng = random.Random(block_chars * 31 + count)
    lines = ["".join(rng.choice("ab c\"{}") for _ in range(rng.randrange(0, 40)))
             for _ in range(257)]
    path = tmp_path / "data.txt"
    path.write_text("\n".join(lines) + ending)
    chunks = list(read_line_chunks(path, count, block_chars))
    assert chunks == line_by_line(path, count)
    assert [line for chunk in chunks for line in chunk] == lines
    assert all(len(chunk) == count for chunk in chunks[:-1])


def test_an_empty_file_gives_no_chunk(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("")
    assert list(read_line_chunks(path, 10)) == []


def test_taxi_keys_without_a_json_parse_are_the_parsed_devices() -> None:
    records = list(taxi.generate(5000, devices=97, seed=3))
    assert device_keys_of(records) == [json.loads(text)["device"] for text in records]
    assert len(set(device_keys_of(records))) == 97
