"""taxi on Bytewax 0.21: the job's ``parse_position`` as a map, keyed by
``device_of``, then ``append_position`` folded per device from "" in arrival
order (``fold_final``: the device's track once the file is read).

One file is read by one worker, and each key's records travel one route to
their owner in order, so every track is in file order with any worker count.
Run by the Bytewax virtual environment's interpreter; ``--recovery-dir`` turns
SQLite recovery on (see ``bytewax_common``):

    python bench/peers/bytewax_taxi.py --input taxi.jsonl --output result.json \
        --stats stats.json [--workers 2] [--recovery-dir DIR --snapshot-interval 1]
"""

from __future__ import annotations

import bytewax.operators as op
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow
from bytewax_common import add_arguments, run, sink_to_file
from common import arguments, measured, user_functions


def main() -> None:
    """Builds and runs the dataflow inside the timed window."""
    args = arguments((__doc__ or "").split("\n\n")[0], add_arguments)
    fn = user_functions()
    sink_path = args.output.with_suffix(".sink")
    sink_path.unlink(missing_ok=True)
    with measured(args.stats) as stats:
        flow = Dataflow("taxi")
        lines = op.input("read", flow, FileSource(args.input))
        positions = op.map("parse", lines, fn.parse_position)
        keyed = op.key_on("device", positions, fn.device_of)
        tracks = op.fold_final("track", keyed, lambda: "", fn.append_position)
        sink_to_file("store", tracks, sink_path)
        run(flow, args, sink_path)
        stats.notes = {"workers": args.workers, "recovery": args.recovery_dir is not None}


if __name__ == "__main__":
    main()
