"""Prometheus metrics for every service.

Each service registers a collector that reads its live state when scraped, so
counting costs nothing on the data path. The endpoint is plain HTTP
(``/metrics``) on ``metrics_port`` of the service's config section: 0 picks a
free port (written to the ready file and logged), -1 turns it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class FunctionCollector(Collector):
    """Adapts a function returning metric families into a collector."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        """Called on every scrape."""
        return list(self._collect())


class _QuietHandler(WSGIRequestHandler):
    """Logs no line per scrape (a scrape every few seconds is routine)."""

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: see the class docstring."""


class MetricsServer:
    """The /metrics endpoint of one process, served by a thread of its own
    that sleeps until a scrape or a stop arrives.

    ``socketserver``'s ``serve_forever`` looks for a stop every
    ``poll_interval``: at 0.5 s (``prometheus_client``'s own server) every
    service's stop waited about 0.4 s for it; at 0.05 s every process woke
    20 times a second for nothing (an idle local cluster of six processes
    spent 80 to 81 ms of CPU a second, 73.5 with this thread). The thread
    here waits on the listening socket and a pipe that :meth:`stop` writes
    to, so it wakes for a scrape or for the stop, and the stop returns at
    once."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._wake_w = -1
        self.address = ""

    def start(self, host: str, port: int, collect: Callable[[], Iterable[Metric]]) -> str:
        """Serves ``collect``'s families; returns ``host:port`` ('' when off)."""
        if port < 0:
            return ""
        self.registry.register(FunctionCollector(collect))

        class Server(ThreadingWSGIServer):
            """The endpoint's server, on the address family of ``host``;
            ``handle_request`` never blocks (``timeout`` 0): the thread calls
            it only once the socket is readable."""

            timeout = 0.0

        family, _, _, _, bound = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                    flags=socket.AI_PASSIVE)[0]
        Server.address_family = family
        server = make_server(str(bound[0]), port, make_wsgi_app(self.registry), Server,
                             handler_class=_QuietHandler)
        wake_r, self._wake_w = os.pipe()
        self._server = server
        self._thread = threading.Thread(target=_serve_until_woken, args=(server, wake_r),
                                        name="metrics endpoint", daemon=True)
        self._thread.start()
        self.address = f"{host}:{server.server_port}"
        log.info("metrics on http://%s/metrics", self.address)
        return self.address

    def stop(self) -> None:
        """Stops serving and waits for the endpoint's thread."""
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        wake_w, self._wake_w = self._wake_w, -1
        if wake_w >= 0:
            with contextlib.suppress(OSError):  # the thread ended already: nobody to wake
                os.write(wake_w, b"x")
        if thread is not None:
            thread.join()
        if wake_w >= 0:
            os.close(wake_w)
        if server is not None:
            server.server_close()


def _serve_until_woken(server: ThreadingWSGIServer, wake_r: int) -> None:
    """The endpoint thread's body: handles each connection as it comes
    (``ThreadingWSGIServer`` answers it on a thread of its own) until
    ``wake_r`` becomes readable; then closes ``wake_r``. An error of the
    selector itself ends the endpoint, logged at ERROR (the service goes
    on; one scrape's error is ``handle_request``'s to report)."""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_READ)
            selector.register(wake_r, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fileobj == wake_r for key, _ in ready):
                    return
                server.handle_request()
    except Exception:
        log.exception("the metrics endpoint stopped serving")
    finally:
        os.close(wake_r)


__all__ = ["LATENCY_BUCKETS_S", "CounterMetricFamily", "GaugeMetricFamily", "Histogram",
           "HistogramMetricFamily", "Metric", "MetricsServer", "counter", "gauge", "histogram"]


def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    """A gauge family with labels."""
    return GaugeMetricFamily(name, doc, labels=labels)


def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    """A counter family with labels (name without the _total suffix)."""
    return CounterMetricFamily(name, doc, labels=labels)


LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                     60.0, 120.0, 300.0)
"""Upper bounds of the latency buckets, in seconds: from a few milliseconds
(a local cluster at rest) to minutes (a backlog after a recovery)."""


class Histogram:
    """Observations counted into fixed buckets, a batch at a time.

    ``observe(value, count)`` records ``count`` observations of one value
    with one bisect: a batch's records share their ingest time, so latency
    costs one call per batch on the data path, never one per record. Read at
    scrape time (from the metrics thread: a scrape may see a batch half
    counted, never a wrong total for long)."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Observations per bucket (not cumulative); the last is above every bound."""
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, count: int = 1) -> None:
        """Adds ``count`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count
        self.count += count

    def add(self, other: Histogram) -> None:
        """Adds another histogram's observations (same bounds) to this one."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum
        self.count += other.count


def histogram(name: str, doc: str, labels: list[str],
              series: Mapping[tuple[str, ...], Histogram]) -> HistogramMetricFamily:
    """A histogram family with one series per label values."""
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, observed in series.items():
        cumulative = list(accumulate(observed.counts))
        buckets = [(repr(float(bound)), float(n))
                   for bound, n in zip(observed.bounds, cumulative, strict=False)]
        buckets.append(("+Inf", float(cumulative[-1])))
        family.add_metric(list(values), buckets, observed.sum)
    return family
