"""The worker's settings of Python's cyclic garbage collector.

Why: a worker allocates container objects (records decoded from a push, the
lists a stage builds, the segments it sends) by the million per second, and
almost all of them are freed by reference counting within a batch or two.
With CPython's default threshold the youngest generation is collected every
700 allocations: the collector then spends its time scanning batches still
in use and promotes records waiting in a queue to older generations, whose
collections scan them again. Collecting the youngest generation every
``worker.gc_young_threshold`` allocations instead (and the older ones
after 20 collections of the one below, not 10) frees the same garbage at a
lower cost. Measured with ``bench/throughput.py`` on the taxi job (1M
records, three interleaved pairs of three-round runs, 2-core machine),
CPU-seconds per million records, CPython's defaults against 50,000:
exactly_once 7.75, 7.51, 7.96 against 6.97, 7.68, 7.30; at_most_once 7.16,
7.38, 7.66 against 6.14, 6.51, 6.48. Garbage in reference cycles lives a
little longer, bounded by the threshold's allocations.

Keyed state is kept out of the older generations' scans separately
(``gc.freeze()``, :func:`services.worker.snapshots.freeze_grown_state`).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

OLDER_GENERATIONS_AFTER = 20
"""Collections of a generation before the next older one is collected too
(CPython's default is 10)."""


def tune_collector(young_threshold: int) -> tuple[int, int, int]:
    """Applies ``young_threshold`` (0 keeps CPython's defaults) and returns
    the thresholds now in force."""
    if young_threshold > 0:
        gc.set_threshold(young_threshold, OLDER_GENERATIONS_AFTER, OLDER_GENERATIONS_AFTER)
    thresholds = gc.get_threshold()
    log.debug("garbage collector thresholds %s", thresholds)
    return thresholds
