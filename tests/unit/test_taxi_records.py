"""taxi's records are written without json.dumps, and must still be exactly
the text json.dumps makes of them: the benches' data files, the demo and
every reference are made from them."""

from __future__ import annotations

import json

from gridstream.examples import taxi


def test_every_record_is_the_text_json_dumps_makes() -> None:
    records = list(taxi.generate(50_000)) + list(taxi.generate(200_000, devices=1, seed=3))
    assert records[0] == '{"device": "1000", "lat": 962, "lon": 497, "seq": 0}'
    parsed = [json.loads(text) for text in records]
    assert [json.dumps(record) for record in parsed] == records
    assert min(record["lat"] for record in parsed) < 0 < max(record["lon"] for record in parsed)
