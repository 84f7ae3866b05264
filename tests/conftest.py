"""A watchdog for every test: a test process stuck where Python cannot run is
ended, with every thread's stack on stderr, instead of holding the suite
until CI's limit.

pytest-timeout (``timeout`` in pyproject.toml) fails a test that runs too
long, but it needs the interpreter to run its alarm: a process frozen in C
code that holds the GIL (a gRPC channel's close deadlocked that way,
gridstream/auth.py ``credential_interceptors``) ran on for 20 minutes past it.
:func:`faulthandler.dump_traceback_later` runs in a C thread that needs no
GIL: it prints the stacks and exits the process, which pytest-xdist reports
as a crashed test (the suite fails, naming it) and replaces. The cluster
processes a test started exit with it (``gridstream.service.exit_with_parent``).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator

import pytest

WATCHDOG_S = float(os.environ.get("GRIDSTREAM_TEST_WATCHDOG_S", "900"))
"""Longer than pytest-timeout's 300 s per phase, which handles every hang
Python itself can see; a test's setup, run and teardown together.
``GRIDSTREAM_TEST_WATCHDOG_S`` overrides it (the watchdog's own test)."""


_stderr_fd: int | None = None
"""A copy of the process's stderr taken before a test's output is captured:
the stacks must reach the log, not a capture file the exit throws away."""


def pytest_configure(config: pytest.Config) -> None:
    """Keeps a copy of stderr for the watchdog's stacks."""
    global _stderr_fd
    _stderr_fd = os.dup(sys.__stderr__.fileno() if sys.__stderr__ else 2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Closes the copy of stderr."""
    global _stderr_fd
    if _stderr_fd is not None:
        os.close(_stderr_fd)
        _stderr_fd = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Arms the watchdog for the test's setup, call and teardown."""
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True,
                                      file=2 if _stderr_fd is None else _stderr_fd)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
