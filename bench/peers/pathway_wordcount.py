"""wordcount on Pathway 0.33: the job's ``split_words`` applied per line and
flattened into one row per word, then ``count`` folded per word from 0 by a
``pw.reducers.stateful_single`` reducer (the input is insert-only), so the
user's reduce runs as it does on every other system rather than Pathway's
native ``pw.reducers.count``.

Run by the Pathway virtual environment's interpreter; ``--persistence-dir``
turns filesystem persistence on (see ``pathway_common``):

    python bench/peers/pathway_wordcount.py --input words.txt --output result.json \
        --stats stats.json [--persistence-dir DIR]
"""

from __future__ import annotations

from typing import Any

import pathway as pw
from common import arguments, measured, user_functions
from pathway_common import add_arguments, run


def main() -> None:
    """Builds and runs the program inside the timed window."""
    args = arguments((__doc__ or "").split("\n\n")[0], add_arguments)
    fn = user_functions()

    @pw.reducers.stateful_single  # type: ignore[untyped-decorator]
    def counted(state: int | None, word: Any) -> int:
        """The user's ``count``, with Pathway's empty state (None) as 0."""
        return int(fn.count(0 if state is None else state, word))

    with measured(args.stats) as stats:
        lines = pw.io.plaintext.read(args.input, mode="static")
        words = lines.select(
            word=pw.apply_with_type(fn.split_words, list[str], pw.this.data)
        ).flatten(pw.this.word)
        counts = words.groupby(pw.this.word).reduce(key=pw.this.word,
                                                    value=counted(pw.this.word))
        run(counts, args)
        stats.notes = {"persistence": args.persistence_dir is not None}


if __name__ == "__main__":
    main()
