"""Prometheus metrics of one app: request counts and latency, and jobs by status (read at scrape)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from store.states import JobStatus
from tunebox.calibration import CalibrationReport, calibration


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


class CalibrationCollector(Collector):
    """Each box's planned-against-measured ratios (tunebox/calibration.py), read at scrape."""

    def __init__(self, report: Callable[[], CalibrationReport]) -> None:
        self._report = report

    def collect(self) -> Iterator[Metric]:
        try:
            boxes = self._report().boxes
        except Exception:  # as above: a scrape never fails on the database
            return
        jobs = GaugeMetricFamily("tunebox_calibration_jobs", "Succeeded jobs a box's calibration reads",
                                 labels=["host"])
        factor = GaugeMetricFamily("tunebox_calibration_step_time_factor",
                                   "Step-time factor plans for a box apply (learned from its jobs)",
                                   labels=["host"])
        memory = GaugeMetricFamily("tunebox_calibration_gpu_memory_correction",
                                   "Scale of the allocator slack and CUDA context plans for a box apply "
                                   "(learned from its jobs)", labels=["host"])
        ratios = {
            name: GaugeMetricFamily(f"tunebox_calibration_{name}_ratio", text, labels=["host", "stat"])
            for name, text in (("step_time", "Measured over planned step time of a box's jobs"),
                               ("gpu_peak", "Measured over planned GPU peak of a box's jobs"),
                               ("host_peak", "Measured over planned host RSS peak of a box's jobs"))
        }
        for box in boxes:
            jobs.add_metric([box.host], box.jobs)
            if box.step_time_factor is not None:
                factor.add_metric([box.host], box.step_time_factor)
            if box.gpu_memory_correction is not None:
                memory.add_metric([box.host], box.gpu_memory_correction)
            for name, spread in (("step_time", box.step_time), ("gpu_peak", box.gpu_peak),
                                 ("host_peak", box.host_peak)):
                for stat in ("median", "low", "high", "median_abs_error"):
                    value = getattr(spread, stat)
                    if value is not None:
                        ratios[name].add_metric([box.host, stat], value)
        yield jobs
        yield factor
        yield memory
        yield from ratios.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())


def calibration_reader(sessions: sessionmaker[Session]) -> Callable[[], CalibrationReport]:
    def read() -> CalibrationReport:
        with sessions() as session:
            return calibration(session)

    return read
