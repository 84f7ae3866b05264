"""A dataflow graph on a real cluster (fan-out, keyed and unkeyed unions,
several sinks of both modes) gives the local runner's results, sink by sink."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gridstream.client import Client
from gridstream.errors import InvalidArgument
from gridstream.examples import wordcount
from gridstream.testing import TestSource, run_local
from tests.integration import graph_ops

pytestmark = [pytest.mark.integration]


def _values(rows: dict[str, Any]) -> list[str]:
    """An append sink's records, in an order of their own (row keys name
    batches, which differ between producers)."""
    return sorted(json.dumps(v, sort_keys=True) for v in rows.values())


async def test_a_graph_job_gives_the_local_runners_results(client: Client) -> None:
    users, lines = graph_ops.lines(6_000)
    flow = graph_ops.clicks()
    job_id = await client.submit(flow.job())
    for start in range(0, len(lines), 1_500):  # several sends: windows close between
        await client.send(job_id, lines[start:start + 1_500], keys=users[start:start + 1_500])
    await client.drain(job_id, timeout_s=120.0)
    local = run_local(flow, TestSource(lines, keys=users, batch_size=1_000))
    assert await client.results(job_id, sink="spent") == local.results("spent")
    assert await client.results(job_id, sink="touched") == local.results("touched")
    for append in ("raw", "labelled"):
        got = _values(await client.results(job_id, sink=append))
        assert got == _values(local.results(append)), append
    assert len(local.results("raw")) == 6_000 - 62  # every parsed click, once
    every = await client.results(job_id)  # unfiltered: each row under its sink's name
    assert {key.split("/", 1)[0] for key in every} == {"raw", "spent", "touched", "labelled"}
    assert len(every) == sum(len(local.results(s)) for s in local.sinks)
    dead = sorted((d.stage, d.error, json.dumps(d.record)) for d in
                  await client.dead_letters(job_id))
    assert dead == sorted((d.stage, d.error, json.dumps(d.record))
                          for d in local.dead_letters)
    assert len(dead) == 62
    with pytest.raises(InvalidArgument, match="raw, spent, touched, labelled"):
        await client.results(job_id, sink="nope")
    await client.cancel(job_id)


async def test_a_single_sink_job_reads_as_before(client: Client) -> None:
    text = ["a b a", "b c"] * 50
    job_id = await client.submit(wordcount.job())
    await client.send(job_id, text)
    await client.drain(job_id, timeout_s=60.0)
    rows = await client.results(job_id)
    assert rows == wordcount.reference(text)
    assert await client.results(job_id, sink="store") == rows
    await client.cancel(job_id)
