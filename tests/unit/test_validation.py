"""Limits on what callers send, job-module allowlists, config bounds and
private files: the pure logic beneath the servicers."""

from __future__ import annotations

import math
import os
import random
import stat
import sys
from pathlib import Path

import pytest

from gridstream.auth import create_cluster_secret, load_cluster_secret, write_private
from gridstream.config import ClusterConfig, Config, ConfigError, SecurityConfig, load_config
from gridstream.errors import InvalidArgument, PermissionDenied
from gridstream.jobspec import (
    DEFAULT_JOB_MODULES,
    JobSpec,
    Stage,
    check_allowed,
    from_mapping,
    module_allowed,
    resolve,
    validate,
)
from gridstream.v1 import common_pb2
from gridstream.validation import (
    MAX_NESTING,
    check_address,
    check_id,
    check_nesting,
    check_path_id,
    json_nesting_depth,
    nesting_depth,
    short,
)

reexported = os.getcwd
"""A function an allowed module imports from elsewhere: not to be handed out."""


def defined_here(value: object) -> object:
    """A function this module defines."""
    return value


def nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_ids_accept_what_gridstream_generates_and_refuse_paths() -> None:
    for good in ("wordcount-1a2b3c4d", "worker-1", "state-2", "0f" * 16):
        assert check_id(good, "id") == good
    for bad in ("../../etc", "a/b", "..", ".", "jöb", "x" * 129, "a b", "a\x00"):
        with pytest.raises(InvalidArgument, match="not a valid id"):
            check_id(bad, "id")
    assert check_path_id("job-1/t0/p3", "op") == "job-1/t0/p3"
    assert check_path_id("job-1/t0/p3@0a1b", "reporter") == "job-1/t0/p3@0a1b"
    for bad in ("src/../x", "src//x", "/x", "x/", "src/" + "y" * 300):
        with pytest.raises(InvalidArgument):
            check_path_id(bad, "channel")
    with pytest.raises(InvalidArgument, match="is empty"):
        check_id("", "job_id")
    assert check_id("", "node_id", required=False) == ""


def test_echoed_values_are_cut_short() -> None:
    message = ""
    try:
        check_id("z" * 100_000, "job_id")
    except InvalidArgument as exc:
        message = str(exc)
    assert "100000 characters" in message and len(message) < 300
    assert short("abc") == "'abc'"


def test_addresses() -> None:
    assert check_address("127.0.0.1:7400") == "127.0.0.1:7400"
    assert check_address("worker-1.svc:7600") == "worker-1.svc:7600"
    for bad in ("nohost", ":80", "h:99999", "h:p", "h:1/../x"):
        with pytest.raises(InvalidArgument):
            check_address(bad)


def test_nesting_is_measured_without_recursion() -> None:
    assert nesting_depth(1) == 0
    assert nesting_depth([1, {"a": [2]}]) == 3
    assert nesting_depth({("k",): 1}) == 2  # keys count too
    assert nesting_depth(nested(100_000)) == MAX_NESTING + 1  # gives up early
    check_nesting([nested(MAX_NESTING)], "record")
    with pytest.raises(InvalidArgument, match=r"record 1 is nested more than 100"):
        check_nesting(["ok", nested(MAX_NESTING + 1)], "record")
    assert json_nesting_depth('[1, {"a": "[[[["}]') == 2
    assert json_nesting_depth('"\\"[["') == 0
    assert json_nesting_depth("[" * 100_000) == MAX_NESTING + 1


class Text(str):
    """A str subclass: not one of the scalar types the fast checks know."""


def random_record(rng: random.Random, depth: int) -> object:
    """A record of about ``depth`` levels in one of the usual shapes."""
    scalars: list[object] = [1, 2.5, "text", None, True, b"raw", Text("sub")]
    if depth == 0:
        return rng.choice(scalars)
    shape = rng.choice(["list", "tuple", "dict", "dict-tuple-key"])
    items = [random_record(rng, depth - 1 if rng.random() < 0.5 else 0)
             for _ in range(rng.randint(0, 3))]
    if shape == "list":
        return items
    if shape == "tuple":
        return tuple(items)
    if shape == "dict":
        return {f"k{n}": item for n, item in enumerate(items)}
    return {("k", n): item for n, item in enumerate(items)}


def test_the_fast_nesting_checks_refuse_exactly_what_the_walk_refuses() -> None:
    # Batches of one shape (the fast checks' case) and mixed ones, against
    # the record-by-record walk: same verdict, same index named.
    rng = random.Random(7)
    for _ in range(3_000):
        depth = rng.choice([0, 1, 1, 1, 2, 3])
        batch = [random_record(rng, depth) for _ in range(rng.randint(0, 6))]
        if rng.random() < 0.5 and batch:
            kind = rng.choice([list, tuple, dict])
            batch = [kind(v) if isinstance(v, list | tuple) and kind is not dict
                     else {"a": v} if kind is dict else v for v in batch]
        limit = rng.choice([0, 1, 2, MAX_NESTING])
        too_deep = [i for i, v in enumerate(batch) if nesting_depth(v, limit) > limit]
        for values in (batch, tuple(batch)):
            if too_deep:
                with pytest.raises(InvalidArgument, match=rf"record {too_deep[0]} is nested"):
                    check_nesting(values, "record", limit)
            else:
                check_nesting(values, "record", limit)


def job_with(*stages: Stage, **fields: object) -> JobSpec:
    return JobSpec("j", (*stages, Stage("s", "sink")), **fields)  # type: ignore[arg-type]


def test_allowed_modules_are_matched_by_package() -> None:
    allowed = ("gridstream.examples", "mycompany.jobs")
    assert module_allowed("gridstream.examples", allowed)
    assert module_allowed("gridstream.examples.taxi", allowed)
    assert not module_allowed("gridstream.examplesx", allowed)
    assert not module_allowed("gridstream", allowed)
    assert not module_allowed("os", allowed)


@pytest.mark.parametrize("path", ["os:system", "subprocess:getoutput", "builtins:eval",
                                  "gridstream.jobspec:resolve"])
def test_a_module_outside_the_list_is_refused_before_import(path: str) -> None:
    with pytest.raises(PermissionDenied, match="nothing was imported"):
        check_allowed(job_with(Stage("a", "map", path)), DEFAULT_JOB_MODULES)
    with pytest.raises(PermissionDenied):
        resolve(path, "stage a", DEFAULT_JOB_MODULES)


def test_a_module_not_allowed_is_never_imported() -> None:
    name = "tests.unit.never_imported_module_xyz"
    with pytest.raises(PermissionDenied):
        resolve(f"{name}:f", "stage a", DEFAULT_JOB_MODULES)
    assert name not in sys.modules


def test_functions_must_be_defined_in_an_allowed_module() -> None:
    allowed = ("tests.unit.test_validation",)
    assert resolve(f"{__name__}:defined_here", "stage a", allowed) is defined_here
    with pytest.raises(PermissionDenied, match="is defined in"):
        resolve(f"{__name__}:reexported", "stage a", allowed)
    with pytest.raises(PermissionDenied, match="special attribute"):
        resolve(f"{__name__}:__class__", "stage a", allowed)


def test_numbers_of_a_job_are_finite_and_bounded() -> None:
    for bad in (math.inf, -math.inf, math.nan, -1.0, 1e9):
        with pytest.raises(InvalidArgument, match="tracking_timeout_s"):
            validate(job_with(Stage("a", "map", "m:f"), tracking_timeout_s=bad))
    with pytest.raises(InvalidArgument, match="window_size"):
        validate(job_with(Stage("a", "map", "m:f"), window_size=10**9))
    with pytest.raises(InvalidArgument, match="nested more than"):
        validate(job_with(Stage("r", "reduce", "m:f", key="m:k",
                                initial=nested(MAX_NESTING + 1))))
    with pytest.raises(InvalidArgument, match="tracking_timeout_s must be a number"):
        from_mapping({"job": {"tracking_timeout_s": "soon"},
                      "stages": [{"name": "s", "kind": "sink"}]})


def test_a_deep_or_huge_initial_json_is_refused_before_parsing() -> None:
    def spec(initial_json: str) -> common_pb2.JobSpec:
        return common_pb2.JobSpec(name="j", stages=[
            common_pb2.StageSpec(name="r", kind=common_pb2.STAGE_KIND_REDUCE, function="m:f",
                                 key="m:k", initial_json=initial_json),
            common_pb2.StageSpec(name="s", kind=common_pb2.STAGE_KIND_SINK)])

    with pytest.raises(InvalidArgument, match="nested more than"):
        JobSpec.from_proto(spec("[" * 100_000 + "]" * 100_000))
    with pytest.raises(InvalidArgument, match="bytes; at most"):
        JobSpec.from_proto(spec('"' + "x" * (2 * 1024 * 1024) + '"'))
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        JobSpec.from_proto(spec("{"))
    assert JobSpec.from_proto(spec("[[1]]")).stages[0].initial == [[1]]


def test_job_modules_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\njob_modules = ["gridstream.builtins", "mycompany.jobs"]\n')
    assert load_config(path, env={}).cluster.job_modules == (
        "gridstream.builtins", "mycompany.jobs")
    env = {"GRIDSTREAM_CLUSTER_JOB_MODULES": "a.b, c"}
    assert load_config(None, env=env).cluster.job_modules == ("a.b", "c")
    with pytest.raises(ConfigError, match="not a module"):
        load_config(None, env={"GRIDSTREAM_CLUSTER_JOB_MODULES": "../etc"})
    assert Config().cluster.job_modules == DEFAULT_JOB_MODULES


def test_config_floats_must_be_finite() -> None:
    with pytest.raises(ConfigError, match="tracking_timeout_s must be a finite number"):
        Config(cluster=ClusterConfig(tracking_timeout_s=math.inf)).validate()
    with pytest.raises(ConfigError, match="heartbeat_interval_s"):
        load_config(None, env={"GRIDSTREAM_CLUSTER_HEARTBEAT_INTERVAL_S": "inf"})


def test_services_need_member_credentials_and_loopback_without_tls(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cluster_secret_file must be set"):
        Config().check_service("127.0.0.1")
    secret = create_cluster_secret(tmp_path / "s")
    config = Config(security=SecurityConfig(cluster_secret_file=str(secret)))
    config.validate().check_service("127.0.0.1")
    config.check_service("localhost")
    with pytest.raises(ConfigError, match="plaintext_network"):
        config.check_service("0.0.0.0")
    Config(security=SecurityConfig(cluster_secret_file=str(secret), plaintext_network=True)
           ).check_service("0.0.0.0")


def test_secret_files_are_private(tmp_path: Path) -> None:
    secret = create_cluster_secret(tmp_path / "dir" / "cluster.secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(load_cluster_secret(secret)) >= 24
    secret.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        load_cluster_secret(secret)
    with pytest.raises(ConfigError, match="chmod 600"):
        Config(security=SecurityConfig(cluster_secret_file=str(secret))).validate()
    short_secret = tmp_path / "short"
    write_private(short_secret, "abc")
    with pytest.raises(ValueError, match="at least"):
        load_cluster_secret(short_secret)
    write_private(tmp_path / "private.toml", "x = 1\n")
    assert stat.S_IMODE((tmp_path / "private.toml").stat().st_mode) == 0o600
