"""wordcount on Bytewax 0.21: the job's ``split_words`` as a flat_map, then
``count`` folded per word from 0 (``fold_final``: the word's count once the
file is read).

Run by the Bytewax virtual environment's interpreter; ``--recovery-dir`` turns
SQLite recovery on (see ``bytewax_common``):

    python bench/peers/bytewax_wordcount.py --input words.txt --output result.json \
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
        flow = Dataflow("wordcount")
        lines = op.input("read", flow, FileSource(args.input))
        words = op.flat_map("split", lines, fn.split_words)
        keyed = op.key_on("word", words, lambda word: word)
        counts = op.fold_final("count", keyed, lambda: 0, fn.count)
        sink_to_file("store", counts, sink_path)
        run(flow, args, sink_path)
        stats.notes = {"workers": args.workers, "recovery": args.recovery_dir is not None}


if __name__ == "__main__":
    main()
