"""Prometheus metrics for every service.

Each service registers a collector that reads its live state when scraped, so
counting costs nothing on the data path. The endpoint is plain HTTP
(``/metrics``) on ``metrics_port`` of the service's config section: 0 picks a
free port (written to the ready file and logged), -1 turns it off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class FunctionCollector(Collector):
    """Adapts a function returning metric families into a collector."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        """Called on every scrape."""
        return list(self._collect())


class MetricsServer:
    """The /metrics endpoint of one process; stopped with the service."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: Any = None
        self.address = ""

    def start(self, host: str, port: int, collect: Callable[[], Iterable[Metric]]) -> str:
        """Serves ``collect``'s families; returns ``host:port`` ('' when off)."""
        if port < 0:
            return ""
        self.registry.register(FunctionCollector(collect))
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._server = server
        self.address = f"{host}:{server.server_port}"
        log.info("metrics on http://%s/metrics", self.address)
        return self.address

    def stop(self) -> None:
        """Stops serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


__all__ = ["CounterMetricFamily", "GaugeMetricFamily", "Metric", "MetricsServer", "counter",
           "gauge"]


def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    """A gauge family with labels."""
    return GaugeMetricFamily(name, doc, labels=labels)


def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    """A counter family with labels (name without the _total suffix)."""
    return CounterMetricFamily(name, doc, labels=labels)
