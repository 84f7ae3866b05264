"""Results read from state over the wire, against a real state server
process: the two forms a reader may ask for (values as JSON text, or as
the state stores them) and what each chunk says it carries."""

from __future__ import annotations

import json
from typing import Any

import msgpack

from gridstream.ids import key_text
from gridstream.statewindows import state_messages
from gridstream.v1 import stateserver_pb2 as pb
from tests.integration.test_stateserver import (  # noqa: F401 - fixtures
    CALL_TIMEOUT_S,
    StateClient,
    state_client,
    state_server,
)


async def test_rows_from_state_come_as_json_or_as_stored_as_the_reader_asks(
        state_client: StateClient) -> None:  # noqa: F811 - the fixture imported above
    """A reader that asks for ``state_values_packed`` gets the rows read from
    state with each value's stored msgpack, in chunks marked
    ``values_packed``; written rows stay JSON text; a reader that does not
    ask gets JSON text throughout, as before the field."""
    job, op = "packed-job", "packed-job/t0/p0"
    track = "52.1,13.4;" * 500
    values: dict[Any, Any] = {"a": track, 7: {"n": [1, 2.5]}}
    [message] = await state_messages(job, op, 1, 1, None, b"header", [(msgpack.packb(
        [["track", msgpack.packb(k), msgpack.packb(v)] for k, v in values.items()]), 2)])
    reply = await state_client.stub.PutState(iter([message]), timeout=CALL_TIMEOUT_S)
    assert reply.created
    await state_client.stub.WriteResults(pb.WriteResultsRequest(
        job_id=job, operator_id="packed-job/t1/p0", rows=msgpack.packb([["w", "[1,2]"]]),
        row_count=1, dead_letters=msgpack.packb([]), dead_letter_count=0), timeout=CALL_TIMEOUT_S)

    async def read(packed: bool) -> list[tuple[bool, dict[str, Any]]]:
        request = pb.ReadResultsRequest(job_id=job, state_values_packed=packed, from_state=[
            pb.ResultsFromState(stage="track", key_prefix="out/")])
        return [(chunk.values_packed, {key: value for key, value, _ in msgpack.unpackb(
                    chunk.rows, strict_map_key=False)})
                async for chunk in state_client.stub.ReadResults(request,
                                                                 timeout=CALL_TIMEOUT_S)]

    int_key = "out/" + key_text(7)
    assert await read(False) == [
        (False, {"w": "[1,2]"}),
        (False, {"out/a": json.dumps(track), int_key: '{"n":[1,2.5]}'})]
    assert await read(True) == [
        (False, {"w": "[1,2]"}),
        (True, {"out/a": track, int_key: {"n": [1, 2.5]}})]
