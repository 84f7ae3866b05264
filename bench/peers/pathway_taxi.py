"""taxi on Pathway 0.33: the job's ``parse_position`` applied per record,
keyed by ``device_of``, then ``append_position`` folded per device from "" in
record order.

A Pathway group is a set, not a sequence, so the order is carried by each
record's ``seq`` field (read with ``common.seq_of``, no second JSON parse): the
group gathers its positions with ``pw.reducers.tuple`` sorted by ``seq``
(``groupby(..., sort_by=...)``) and the user's ``append_position`` is folded
over them. Run by the Pathway virtual environment's interpreter;
``--persistence-dir`` turns filesystem persistence on (see ``pathway_common``):

    python bench/peers/pathway_taxi.py --input taxi.jsonl --output result.json \
        --stats stats.json [--persistence-dir DIR]
"""

from __future__ import annotations

import functools
from typing import Any

import pathway as pw
from common import arguments, measured, seq_of, user_functions
from pathway_common import add_arguments, run


def main() -> None:
    """Builds and runs the program inside the timed window."""
    args = arguments((__doc__ or "").split("\n\n")[0], add_arguments)
    fn = user_functions()

    def track(positions: tuple[Any, ...]) -> str:
        """The user's ``append_position`` folded over a device's positions."""
        return str(functools.reduce(fn.append_position, positions, ""))

    with measured(args.stats) as stats:
        lines = pw.io.plaintext.read(args.input, mode="static")
        parsed = lines.select(
            position=pw.apply_with_type(fn.parse_position, list[str], pw.this.data),
            seq=pw.apply_with_type(seq_of, int, pw.this.data),
        )
        keyed = parsed.select(pw.this.position, pw.this.seq,
                              device=pw.apply_with_type(fn.device_of, str, pw.this.position))
        grouped = keyed.groupby(pw.this.device, sort_by=pw.this.seq).reduce(
            key=pw.this.device, positions=pw.reducers.tuple(pw.this.position))
        tracks = grouped.select(pw.this.key,
                                value=pw.apply_with_type(track, str, pw.this.positions))
        run(tracks, args)
        stats.notes = {"persistence": args.persistence_dir is not None}


if __name__ == "__main__":
    main()
