"""A module no test cluster lets jobs name: importing it leaves a trace.

If a worker ever imports it (the top-level code of a module named by a job
runs at import), it appends its pid to the file named by
``GRIDSTREAM_TEST_IMPORT_PROBE``; the hostile-input tests check that file
stays absent.
"""

from __future__ import annotations

import os

_PROBE = os.environ.get("GRIDSTREAM_TEST_IMPORT_PROBE", "")
if _PROBE:
    with open(_PROBE, "a") as _trace:
        _trace.write(f"{os.getpid()}\n")


def anything(value: object) -> object:
    """A callable for a stage to name."""
    return value
