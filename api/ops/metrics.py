"""Prometheus metrics of one app: request counts and latency, and jobs by status (read at scrape)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from store.states import JobStatus


class ApiMetrics:
    def __init__(self, job_counts: Callable[[], dict[str, int]]) -> None:
        # one registry per app, so apps built side by side (tests) keep their own numbers
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tunebox_http_requests", "HTTP requests handled",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("tunebox_http_request_duration_seconds", "Time to handle a request",
                                 ["method", "route"], registry=self.registry,
                                 buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
        self.registry.register(_JobsCollector(job_counts))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)


class _JobsCollector(Collector):
    def __init__(self, job_counts: Callable[[], dict[str, int]]) -> None:
        self._job_counts = job_counts

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("tunebox_jobs", "Jobs in the database by status", labels=["status"])
        try:
            counts = self._job_counts()
        except Exception:  # a scrape must not fail because the database is down; /readyz says so
            return
        for status in JobStatus:
            family.add_metric([status.value], counts.get(status.value, 0))
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())
