"""Seed 001's experiment: word count. Each text line is a root record; stage 1
splits it into words; stage 2, keyed by word, counts them."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

from gridstream.builtins import split_words
from gridstream.jobspec import JobSpec, Stage

VOCABULARY = 5_000
WORDS_PER_LINE = 10


def _vocabulary(size: int, rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))))
    return sorted(words)


def generate(words: int, seed: int = 0, vocabulary: int = VOCABULARY,
             words_per_line: int = WORDS_PER_LINE) -> list[str]:
    """Deterministic lines of text holding ``words`` words in all, drawn with a
    Zipf-like skew as natural text is."""
    rng = random.Random(seed)
    vocab = _vocabulary(vocabulary, rng)
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]
    drawn = rng.choices(vocab, weights=weights, k=words)
    return [" ".join(drawn[i:i + words_per_line]) for i in range(0, words, words_per_line)]


def job(partitions: int = 0, window_size: int = 0, delivery: str = "exactly_once") -> JobSpec:
    """The wordcount job."""
    return JobSpec(
        name="wordcount",
        partitions=partitions,
        window_size=window_size,
        delivery=delivery,
        stages=(
            Stage("split", "flat_map", "gridstream.builtins:split_words"),
            Stage("count", "reduce", "gridstream.builtins:count",
                  key="gridstream.builtins:identity", initial=0),
            Stage("store", "sink"),
        ),
    )


def count_records(lines: list[str], batch_size: int) -> int:
    """How many records the job's ``count`` task receives when ``lines`` are
    sent unkeyed in batches of ``batch_size``: each sent batch's split sends
    every distinct word once, with its count (:mod:`gridstream.combiners`)."""
    return sum(len({w for line in lines[i:i + batch_size] for w in split_words(line)})
               for i in range(0, len(lines), batch_size))


def reference(lines: Iterable[str]) -> dict[str, int]:
    """The expected sink contents, computed in-process."""
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(line.lower().split())
    return dict(counts)
