"""The web console the scheduler serves: its JSON document, its page and
files, TLS and tokens, and — in a real headless Chromium — a worker killed
mid-stream shown dead and then recovered. Real processes on free loopback
ports; Chromium is the Debian package that `make setup` installs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio

from gridstream.certs import create_dev_certs
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config, SchedulerConfig, SecurityConfig
from gridstream.examples import wordcount
from gridstream.local import LocalCluster
from gridstream.watch import KINDS, Watcher
from tests.integration.conftest import small_config

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
_T = TypeVar("_T")


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """3 workers and 2 state servers under a supervisor (a killed member is
    started again, as by `gridstream up` or systemd)."""
    local = LocalCluster(tmp_path_factory.mktemp("console"), small_config(), workers=3,
                         state_servers=2, supervise=True, restart_delay_s=1.0)
    async with local:
        yield local


def fetch(url: str, headers: dict[str, str] | None = None,
          context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET without following redirects: (status, headers, body)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def state_of(cluster: LocalCluster) -> dict[str, Any]:
    """The console's JSON document."""
    status, _, body = await asyncio.to_thread(fetch, cluster.console_url + "api/state")
    assert status == 200, body
    document: dict[str, Any] = json.loads(body)
    return document


async def poll(what: str, check: Callable[[], Awaitable[_T | None]],
               timeout_s: float = 60.0) -> _T:
    """Calls ``check`` until it returns something, or fails at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout_s:.0f}s")
        await asyncio.sleep(0.5)


async def test_the_state_document_shows_members_ring_stages_and_roots(
        cluster: LocalCluster, tmp_path: Path) -> None:
    assert cluster.console_url.startswith("http://127.0.0.1:")
    async with Client(cluster.scheduler_address, batch_size=500) as client:
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, wordcount.generate(20_000, seed=5))
        await client.drain(job_id)

    async def sampled() -> dict[str, Any] | None:
        state = await state_of(cluster)
        jobs = [j for j in state["jobs"] if j["job_id"] == job_id]
        return state if jobs and jobs[0]["drained"] and jobs[0]["roots"]["finished"] else None

    state = await poll("the drained job in the console", sampled)
    members = {m["node_id"]: m for m in state["members"]}
    assert set(members) == {"worker-1", "worker-2", "worker-3", "state-1", "state-2"}
    assert all(m["state"] == "alive" and m["phi"] is not None for m in members.values())
    assert sum(m["partitions"] for m in members.values() if m["role"] == "worker") >= 8
    ring = next(r for r in state["ring"] if r["job_id"] == job_id)
    assert len(ring["owners"]) == 8 and set(ring["owners"]) <= set(members)
    job = next(j for j in state["jobs"] if j["job_id"] == job_id)
    assert [s["name"] for s in job["stages"]] == ["split", "count → store"]
    assert all(s["points"] and len(s["points"][-1]) == 4 for s in job["stages"])
    assert job["dead_letters"]["count"] == 0 and job["roots"]["pending"] == 0
    assert state["warnings"] == [] and state["phi_threshold"] > 0

    status, headers, page = await asyncio.to_thread(fetch, cluster.console_url)
    assert status == 200 and b"static/console.js" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name in ("console.js", "console.css"):
        status, _, body = await asyncio.to_thread(fetch, f"{cluster.console_url}static/{name}")
        assert status == 200 and body
    for bad in ("static/../server.py", "static/%2e%2e/server.py", "static/nope.js", "etc"):
        status, _, _ = await asyncio.to_thread(fetch, cluster.console_url + bad)
        assert status == 404, bad


async def test_the_scheduler_logs_and_exports_a_warning_once_per_episode(
        cluster: LocalCluster) -> None:
    """A job whose operator fails on some records: dead letters rising is a
    warning in the state document, in ClusterStatus (status --watch), in the
    log once, and in the metrics."""
    from gridstream.jobspec import JobSpec, Stage

    ops = "tests.integration.poison_ops"
    spec = JobSpec("poisoned", (Stage("parse", "map", f"{ops}:parse"),
                                Stage("sum", "reduce", f"{ops}:add", key=f"{ops}:parity",
                                      initial=0),
                                Stage("store", "sink")), partitions=4)
    async with Client(cluster.scheduler_address, batch_size=100) as client:
        job_id = await client.submit(spec)
        await client.send(job_id, [str(i) if i % 10 else "x" for i in range(2_000)])
        await client.drain(job_id)

        async def warned() -> dict[str, Any] | None:
            state = await state_of(cluster)
            return next((w for w in state["warnings"] if w["kind"] == "dead_letters_rising"
                         and w["job_id"] == job_id), None)

        warning = await poll("dead letters rising", warned, 30)
        assert f"gridstream dead-letters {job_id}" in warning["action"]
        assert "partitions" in warning["text"] and warning["partitions"]
        status = await client.status()
        assert any(w.kind == "dead_letters_rising" and w.job_id == job_id
                   for w in status.warnings)
        screen = await Watcher(client).render()  # gridstream status --watch
        assert "warnings:" in screen and f"gridstream dead-letters {job_id}" in screen

        async def letters() -> dict[str, Any] | None:
            state = await state_of(cluster)
            job = next(j for j in state["jobs"] if j["job_id"] == job_id)
            return job["dead_letters"] if job["dead_letters"]["letters"] else None

        dead = await poll("the dead letters in the console", letters, 30)
        assert dead["count"] == 200 and "ValueError" in dead["letters"][-1]["error"]
        metrics = await asyncio.to_thread(
            fetch, f"http://{cluster.members['scheduler'].metrics_address}/metrics")
        text = metrics[2].decode()
        assert 'gridstream_warnings{kind="dead_letters_rising"} 1.0' in text
        assert any(line.startswith("gridstream_warning_active{") and f'job="{job_id}"' in line
                   and 'kind="dead_letters_rising"' in line for line in text.splitlines())
        await client.cancel(job_id)
    lines = [line for line in cluster.logs("scheduler", tail=400).splitlines()
             if "WARNING" in line and "dead_letters_rising" in line and job_id in line]
    assert len(lines) == 1, lines


async def chromium(url: str, profile: Path, *args: str, timeout_s: float = 60.0) -> str:
    """Runs headless Chromium on ``url`` once; its stdout. Killed by PID at
    the deadline."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` as root (it installs the Debian "
                    "package chromium) or `apt-get install -y chromium`")
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
        "--virtual-time-budget=4000", *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        os.kill(process.pid, signal.SIGKILL)
        await process.wait()
        raise
    return out.decode()


@pytest.mark.slow
async def test_chromium_shows_a_killed_worker_and_its_recovery(
        cluster: LocalCluster, tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    async with Client(cluster.scheduler_address, batch_size=500) as client:
        job_id = await client.submit(wordcount.job())
        lines = wordcount.generate(1_500_000, seed=9)
        chunks = [lines[i:i + 1_000] for i in range(0, len(lines), 1_000)]
        sent = 0

        async def feed() -> None:
            """A steady stream (150 chunks, a pause between them), so records
            are in flight whenever the worker dies."""
            nonlocal sent
            for chunk in chunks:
                await client.send(job_id, chunk)
                sent += 1
                await asyncio.sleep(0.05)

        sending = asyncio.create_task(feed())
        try:
            async def flowing() -> bool | None:
                return True if sent >= 20 else None

            await poll("records flowing", flowing, 60)
            victim = cluster.members["worker-2"]
            killed_pid = victim.pid
            cluster.kill("worker-2", signal.SIGKILL)
            assert not sending.done(), "the records were all sent before the kill"

            async def recovered() -> str | None:
                dom = await chromium(cluster.console_url, profile, "--dump-dom")
                healthy = re.search(r'<li class="recovery" data-node="worker-2" '
                                    r'data-phase="healthy">(.*?)</li>', dom)
                return dom if healthy else None

            dom = await poll("worker-2's recovery on the page", recovered, 120)
            await sending
            await client.drain(job_id, timeout_s=120)
        finally:
            if not sending.done():
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
        assert victim.pid != killed_pid  # the supervisor started it again
    # The death: a membership change to dead, and the recovery's line from
    # the detection through resume to healthy.
    assert re.search(r'data-node="worker-2" data-new="dead">[^<]*worker-2: alive → '
                     r'(suspect|dead)', dom) or 'data-node="worker-2" data-new="dead"' in dom
    line = re.search(r'data-node="worker-2" data-phase="healthy">(.*?)</li>', dom)
    assert line is not None
    text = re.sub(r"<[^>]+>", "", line.group(1))
    assert "declared dead at" in text and "resumed +" in text and "healthy +" in text, text
    assert '<span id="connection" class="pill" data-ok="true">live</span>' in dom
    assert re.search(r'<tr data-node="worker-2" data-state="alive">', dom)
    shot = tmp_path / "console.png"
    await chromium(cluster.console_url, profile, f"--screenshot={shot}",
                   "--window-size=1400,1800", "--hide-scrollbars")
    assert shot.stat().st_size > 10_000
    print(f"console screenshot: {shot}")


# -- TLS and tokens ------------------------------------------------------------------

READ_TOKEN = "console-reader-token"
SEND_TOKEN = "console-sender-token"
ADMIN_TOKEN = "console-member-token"


@pytest_asyncio.fixture(scope="module")
async def secure(tmp_path_factory: pytest.TempPathFactory
                 ) -> AsyncIterator[tuple[LocalCluster, ssl.SSLContext]]:
    certs = tmp_path_factory.mktemp("console-certs")
    issued = create_dev_certs(certs, ["localhost", "127.0.0.1"])
    tokens = certs / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{ADMIN_TOKEN}" = ["admin"]\n"{READ_TOKEN}" = ["read"]\n'
                      f'"{SEND_TOKEN}" = ["send"]\n')
    security = SecurityConfig(tls=True, ca_file=str(issued["ca"].cert),
                              cert_file=str(issued["node"].cert),
                              key_file=str(issued["node"].key), tokens_file=str(tokens),
                              token=ADMIN_TOKEN)
    config = replace(Config(), cluster=ClusterConfig(partitions=4), security=security,
                     scheduler=SchedulerConfig(console_port=0))
    context = ssl.create_default_context(cafile=str(issued["ca"].cert))
    async with LocalCluster(tmp_path_factory.mktemp("console-secure"), config, workers=1,
                            state_servers=1) as local:
        yield local, context


async def test_with_tls_and_tokens_the_console_is_https_and_answers_401_without_a_token(
        secure: tuple[LocalCluster, ssl.SSLContext]) -> None:
    cluster, context = secure
    url = cluster.console_url
    assert url.startswith("https://127.0.0.1:"), url
    for path in ("", "api/state", "static/console.js"):
        status, headers, body = await asyncio.to_thread(fetch, url + path, None, context)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
        assert b"?token=" in body
    status, _, _ = await asyncio.to_thread(
        fetch, url + "api/state", {"Authorization": f"Bearer {SEND_TOKEN}"}, context)
    assert status == 401  # a token without the read right
    status, _, body = await asyncio.to_thread(
        fetch, url + "api/state", {"Authorization": f"Bearer {READ_TOKEN}"}, context)
    assert status == 200 and json.loads(body)["members"]
    status, headers, _ = await asyncio.to_thread(fetch, f"{url}?token={READ_TOKEN}", None,
                                                 context)
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "Secure" in cookie
    status, _, body = await asyncio.to_thread(
        fetch, url + "api/state", {"Cookie": cookie.split(";", 1)[0]}, context)
    assert status == 200 and json.loads(body)["epoch"] >= 1
    status, _, _ = await asyncio.to_thread(fetch, f"{url}?token=wrong", None, context)
    assert status == 401
    plain = url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        await asyncio.to_thread(fetch, plain + "api/state")


def test_chromium_is_installed_by_setup() -> None:
    """`make setup` installs it; a missing browser is a failure, not a skip."""
    assert shutil.which("chromium") or os.access(CHROMIUM, os.X_OK)


# -- the Prometheus alert rules ------------------------------------------------------

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "gridstream-alerts.yml"


def alert_rules(text: str) -> list[dict[str, str]]:
    """The rules of a Prometheus rule file, read structurally (PyYAML is not
    a dependency): each ``- alert:`` item with its expr, for, severity and
    summary; fails on a file that is not shaped as Prometheus expects."""
    lines = [line for line in text.splitlines() if line.strip() and
             not line.lstrip().startswith("#")]
    assert lines[0] == "groups:" and lines[1].lstrip().startswith("- name: "), lines[:2]
    assert all("\t" not in line for line in lines), "tabs in YAML"
    rules: list[dict[str, str]] = []
    for line in lines[2:]:
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().removeprefix("- ").partition(":")
        if line.strip().startswith("- alert:"):
            rules.append({"alert": value.strip(), "indent": str(indent)})
        elif rules and key in ("expr", "for", "severity", "summary"):
            rules[-1][key] = value.strip()
    return rules


async def test_the_alert_rules_name_metrics_the_cluster_exports(cluster: LocalCluster) -> None:
    rules = alert_rules(ALERTS.read_text())
    assert {r["alert"] for r in rules} >= {
        "GridstreamPartitionNotDraining", "GridstreamRootsTimingOut",
        "GridstreamDeadLettersRising", "GridstreamMemberSuspect"}
    assert len({r["indent"] for r in rules}) == 1, "rules at different depths"
    exported: set[str] = set()
    for name in ("scheduler", "worker-1", "state-1"):
        _, _, body = await asyncio.to_thread(
            fetch, f"http://{cluster.members[name].metrics_address}/metrics")
        for line in body.decode().splitlines():
            if line.startswith("# TYPE "):
                family, kind = line.split()[2:4]
                exported |= {family, f"{family}_total"} if kind == "counter" else {family}
    for rule in rules:
        assert rule.get("expr") and rule.get("severity") and rule.get("summary"), rule
        named = set(re.findall(r"\bgridstream_[a-z_]+", rule["expr"]))
        assert named, rule
        assert named <= exported, (rule["alert"], named - exported)
        for kind in re.findall(r'kind="([a-z_]+)"', rule["expr"]):
            assert kind in KINDS, (rule["alert"], kind)
