"""The /metrics endpoint of a service: served on a thread of its own, and
stopped with the service, thread and socket, without waiting for a poll;
between scrapes its thread sleeps (it used to wake 20 times a second).

Before, ``prometheus_client``'s server thread looked for a stop every 0.5 s,
and every service's stop waited for it (a worker's whole stop took 0.56 s, of
which its own work was 0.12 s; every test cluster paid it once per member).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gridstream import metrics
from gridstream.metrics import MetricsServer, gauge


def families() -> list[metrics.Metric]:
    family = gauge("gridstream_test_value", "A value for the test.", ["node"])
    family.add_metric(["n1"], 7.0)
    return [family]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_the_endpoint_serves_until_stopped_and_its_thread_ends_with_it() -> None:
    server = MetricsServer()
    address = server.start("127.0.0.1", 0, families)
    assert 'gridstream_test_value{node="n1"} 7.0' in scrape(address)
    served_by = [t for t in threading.enumerate() if t.name == "metrics endpoint"]
    assert len(served_by) == 1
    server.stop()
    assert not served_by[0].is_alive()
    with pytest.raises(urllib.error.URLError):
        scrape(address)
    server.stop()  # a second stop is harmless


def test_a_negative_port_serves_nothing() -> None:
    server = MetricsServer()
    assert server.start("127.0.0.1", -1, families) == ""
    server.stop()


def test_an_ipv6_host_is_served_on_its_own_family() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server = MetricsServer()
    try:
        address = server.start("::1", 0, families)
    except OSError:
        pytest.skip("::1 cannot be bound here")
    try:
        port = address.rsplit(":", 1)[1]
        assert "gridstream_test_value" in scrape(f"[::1]:{port}")
    finally:
        server.stop()


def _voluntary_switches(native_id: int) -> int:
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("voluntary_ctxt_switches:")))


def test_the_endpoint_thread_sleeps_between_scrapes() -> None:
    """A thread that polls for a stop (every 0.05 s, as before) switches out
    about ten times in half a second; one waiting for a scrape or a stop
    does not switch at all, however loaded the machine."""
    server = MetricsServer()
    address = server.start("127.0.0.1", 0, families)
    try:
        thread = next(t for t in threading.enumerate() if t.name == "metrics endpoint")
        assert thread.native_id is not None
        if not Path(f"/proc/self/task/{thread.native_id}/status").exists():
            pytest.skip("no /proc task status on this system")
        for _ in range(3):  # it serves scrape after scrape
            assert 'gridstream_test_value{node="n1"} 7.0' in scrape(address)
        before = _voluntary_switches(thread.native_id)
        time.sleep(0.5)
        assert _voluntary_switches(thread.native_id) - before <= 1
    finally:
        server.stop()
    assert not thread.is_alive()


def test_a_stop_after_the_endpoint_thread_ended_is_harmless() -> None:
    """Its thread can end before the stop (an error of its selector, logged):
    the stop's wake-up then finds the pipe's reading end closed, and must
    not raise (it raised BrokenPipeError)."""
    server = MetricsServer()
    server.start("127.0.0.1", 0, families)
    thread = next(t for t in threading.enumerate() if t.name == "metrics endpoint")
    os.write(server._wake_w, b"x")  # ends the thread as its own failure would
    thread.join(5)
    assert not thread.is_alive()
    server.stop()
