"""Test a gridstream job the way the project tests itself: in one process.

    from gridstream.testing import TestSource, run_local

    def test_counts() -> None:
        result = run_local(my_flow(), TestSource(["a b", "a"]))
        assert result.results("counts") == {"a": 2, "b": 1}

:func:`run_local` runs the whole graph (branches, unions, several sinks)
with the workers' own operators and shuffle, so keys, per-key order, keyed
state, params, sink modes and dead letters are the cluster's. See
``docs/dataflow.md``.
"""

from gridstream.testing._runner import LocalResult, TestSink, TestSource, run_local

__all__ = ["LocalResult", "TestSink", "TestSource", "run_local"]
