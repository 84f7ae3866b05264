"""Job specs: parsing, validation messages, task planning, wire round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridstream.errors import InvalidArgument
from gridstream.examples import taxi, wordcount
from gridstream.jobspec import (
    JobSpec,
    Stage,
    check_imports,
    from_mapping,
    load_job_file,
    plan_tasks,
)

REPO = Path(__file__).resolve().parents[2]


def test_example_job_files_load_and_match_the_sdk_builders() -> None:
    assert load_job_file(REPO / "examples" / "taxi.toml").stages == taxi.job().stages
    assert load_job_file(REPO / "examples" / "wordcount.toml").stages == wordcount.job().stages


def test_round_trip_through_the_wire_form() -> None:
    spec = taxi.job(partitions=7, window_size=123, delivery="at_least_once")
    assert JobSpec.from_proto(spec.to_proto()) == spec


def test_tasks_are_cut_at_keyed_stages() -> None:
    tasks = plan_tasks(taxi.job())
    assert [[s.name for s in t] for t in tasks] == [["parse"], ["track", "store"]]
    first_keyed = JobSpec("j", (Stage("r", "reduce", "m:f", key="m:k"), Stage("s", "sink")))
    assert [[s.name for s in t] for t in plan_tasks(first_keyed)] == [[], ["r", "s"]]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"stages": []}, "one or more [[stages]]"),
        ({"stages": [{"name": "a", "kind": "map", "function": "m:f"}]}, "must be a sink"),
        ({"stages": [{"name": "a", "kind": "sink"}, {"name": "b", "kind": "sink"}]},
         "sink must be the last"),
        ({"stages": [{"name": "a", "kind": "explode", "function": "m:f"},
                     {"name": "s", "kind": "sink"}]}, "unknown kind 'explode'"),
        ({"stages": [{"name": "a", "kind": "map", "function": "not a path"},
                     {"name": "s", "kind": "sink"}]}, "must be an import path"),
        ({"stages": [{"name": "a", "kind": "reduce", "function": "m:f"},
                     {"name": "s", "kind": "sink"}]}, "needs key ="),
        ({"stages": [{"name": "a", "kind": "map", "function": "m:f", "key": "m:k"},
                     {"name": "s", "kind": "sink"}]}, "only reduce and stateful"),
        ({"stages": [{"name": "a", "kind": "map", "function": "m:f"},
                     {"name": "a", "kind": "sink"}]}, "duplicate stage name"),
        ({"job": {"name": "x", "colour": "red"}, "stages": [{"name": "s", "kind": "sink"}]},
         "unknown keys in [job]: colour"),
        ({"job": {"name": "x", "delivery": "twice"}, "stages": [{"name": "s", "kind": "sink"}]},
         "delivery must be one of"),
    ],
)
def test_malformed_jobs_name_what_to_fix(document: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument, match=None) as info:
        from_mapping(document, "job.toml")
    assert message in str(info.value)


def test_bad_toml_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[job\nname=")
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        load_job_file(path)
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_job_file(tmp_path / "missing.toml")


def test_unresolvable_import_paths_are_named() -> None:
    missing_module = JobSpec("j", (Stage("a", "map", "gridstream.examples.no_such_module_xyz:f"),
                                   Stage("s", "sink")))
    with pytest.raises(InvalidArgument,
                       match=r"cannot import module 'gridstream\.examples\.no_such_module_xyz'"):
        check_imports(missing_module)
    missing_attr = JobSpec("j", (Stage("a", "map", "gridstream.builtins:nope"), Stage("s", "sink")))
    with pytest.raises(InvalidArgument, match="has no attribute 'nope'"):
        check_imports(missing_attr)
    check_imports(taxi.job())
