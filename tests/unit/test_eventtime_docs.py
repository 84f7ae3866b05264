"""docs/eventtime.md's examples run as written (in one process, no cluster)
and give the results they assert."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_docs_examples import examples, run_document


async def test_the_event_time_guide_examples_run(tmp_path: Path) -> None:
    assert [e.kind for e in examples("docs/eventtime.md")] == ["file"] + ["script"] * 5
    outputs = await run_document("docs/eventtime.md", tmp_path)
    assert outputs[0].startswith("[('a', 0, [3, 1040])")
    assert outputs[1].endswith("windows, as the reference\n")
    assert outputs[2] == "[(1, 1), (1, 2), (2, 1), (2, 2), (3, 3)]\n"  # the windowed join
    assert outputs[3] == "50 devices, every trip once in event-time order\n"  # timers
    assert outputs[4] == "[('a', 0, [100, 10]), ('b', 0, [50, 200])]\n"  # process functions
