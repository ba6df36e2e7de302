"""Prometheus metrics, one CollectorRegistry per app (so several apps in one process never collide).

- ``bait_http_requests_total{route,method,status}`` and ``bait_http_request_duration_seconds{route,method}``,
  labelled by the route template (``/v1/pools/{pool}``), never the raw path.
- ``bait_jobs{state}``: batches by status, read from the database at scrape time.
- ``bait_selection_seconds{strategy}``: selection time of finished batches, from
  ``batches.diagnostics["timings"]["total"]`` (written by the worker), read at scrape time.
- ``bait_batch_seconds{strategy}``: batch latency, request to success (``created_at`` -> ``finished_at``).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.store.models import Batch

log = logging.getLogger(__name__)

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SELECTION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# Finished batches read per scrape (newest first): keeps a scrape cheap on a long-lived database.
RECENT_BATCHES = 10_000


class Metrics:
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "bait_http_requests", "HTTP requests by route template, method and status",
            ["route", "method", "status"], registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "bait_http_request_duration_seconds", "HTTP request latency by route template and method",
            ["route", "method"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(DatabaseCollector(factory))
        # What /metrics serves when no BAIT_METRICS_TOKEN is set: this process's HTTP figures only; the
        # database figures (every tenant's batches) need the token.
        self.public_registry = CollectorRegistry(auto_describe=True)
        self.public_registry.register(self.requests)
        self.public_registry.register(self.latency)


def _histogram(
    name: str, doc: str, values_by_label: dict[str, list[float]], buckets: Sequence[float]
) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=["strategy"])
    for strategy, values in sorted(values_by_label.items()):
        values = sorted(values)
        cumulative = [(str(b), bisect.bisect_right(values, b)) for b in buckets]
        cumulative.append(("+Inf", len(values)))
        fam.add_metric([strategy], cumulative, sum_value=sum(values))
    return fam


class DatabaseCollector(Collector):
    """Gauges computed from the batches table each time /metrics is scraped."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def describe(self) -> Iterator[Metric]:
        return iter(())  # dynamic: not described up front (keeps registration free of database calls)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("bait_metrics_database_up", "1 if the database answered the metrics queries")
        try:
            with self.factory() as session:
                counts = dict(session.execute(select(Batch.status, func.count()).group_by(Batch.status)).all())
                finished = session.execute(
                    select(Batch.strategy, Batch.diagnostics, Batch.created_at, Batch.finished_at)
                    .where(Batch.status == "succeeded", Batch.finished_at.is_not(None))
                    .order_by(Batch.finished_at.desc())
                    .limit(RECENT_BATCHES)
                ).all()
        except Exception:  # a scrape must answer even when the database does not
            log.warning("metrics: database query failed", exc_info=True)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        jobs = GaugeMetricFamily("bait_jobs", "Selection jobs (batches) by state", labels=["state"])
        for state in sorted(set(JOB_STATES) | set(counts)):
            jobs.add_metric([state], float(counts.get(state, 0)))
        yield jobs
        selection: dict[str, list[float]] = defaultdict(list)
        latency: dict[str, list[float]] = defaultdict(list)
        for strategy, diagnostics, created_at, finished_at in finished:
            seconds = _timing(diagnostics)
            if seconds is not None:
                selection[strategy].append(seconds)
            latency[strategy].append(max(0.0, (finished_at - created_at).total_seconds()))
        yield _histogram(
            "bait_selection_seconds", "Selection time of succeeded batches (diagnostics timings total)",
            selection, SELECTION_BUCKETS,
        )  # fmt: skip
        yield _histogram("bait_batch_seconds", "Batch latency from request to success", latency, SELECTION_BUCKETS)


def _timing(diagnostics: Any) -> float | None:
    if not isinstance(diagnostics, dict):
        return None
    timings = diagnostics.get("timings")
    if not isinstance(timings, dict):
        return None
    total = timings.get("total")
    return float(total) if isinstance(total, int | float) else None


class MetricsMiddleware:
    """Counts every HTTP request by route template, method and status, and times it."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.latency.labels(template, method).observe(time.perf_counter() - start)
