"""One plain Python process: the floor every engine is measured against.

Reads the data file and applies the jobs' user functions record by record,
with a dict as the keyed state, exactly as the jobs define them: wordcount
splits each line (``split_words``) and folds ``count`` per word from 0; taxi
parses each record (``parse_position``), keys it (``device_of``) and folds
``append_position`` per device from "". No fault tolerance, no parallelism.

    python bench/peers/plain.py --workload taxi --input taxi.jsonl \
        --output result.json --stats stats.json
"""

from __future__ import annotations

import argparse
from typing import Any

from common import arguments, measured, read_lines, user_functions, write_result


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=("wordcount", "taxi"), required=True)


def main() -> None:
    """Runs one workload and writes its result and stats."""
    args = arguments((__doc__ or "").split("\n\n")[0], _extra)
    fn = user_functions()
    with measured(args.stats):
        state: dict[str, Any] = {}
        if args.workload == "wordcount":
            for line in read_lines(args.input):
                for word in fn.split_words(line):
                    state[word] = fn.count(state.get(word, 0), word)
        else:
            for text in read_lines(args.input):
                position = fn.parse_position(text)
                device = fn.device_of(position)
                state[device] = fn.append_position(state.get(device, ""), position)
        write_result(args.output, state)


if __name__ == "__main__":
    main()
