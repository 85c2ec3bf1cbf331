"""Prometheus metrics of the server, in a registry of its own (never the process default).

    fusegraph_requests_total{model,protocol,status}   requests answered (status: success | failure)
    fusegraph_request_failures_total{model,code}     failures by HTTP-style code (400, 404, 500, 503, 504)
    fusegraph_inflight_requests{model}               requests accepted and not yet answered
    fusegraph_queue_seconds{model}                   time a request waited before its batch ran
    fusegraph_compute_seconds{model}                 time a batch ran on its instance
    fusegraph_request_seconds{model,protocol}        end to end, decode to encode
    fusegraph_batch_size{model}                      rows per executed batch

Served as the text exposition format at ``/metrics``. Nothing here knows HTTP or a model.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("fusegraph_requests", "Inference requests answered",
                                ["model", "protocol", "status"], registry=r)
        self.failures = Counter("fusegraph_request_failures", "Inference requests failed, by code",
                                ["model", "code"], registry=r)
        self.inflight = Gauge("fusegraph_inflight_requests", "Inference requests in flight", ["model"], registry=r)
        self.queue = Histogram("fusegraph_queue_seconds", "Time waiting for a batch", ["model"],
                               buckets=_TIME_BUCKETS, registry=r)
        self.compute = Histogram("fusegraph_compute_seconds", "Time running a batch", ["model"],
                                 buckets=_TIME_BUCKETS, registry=r)
        self.latency = Histogram("fusegraph_request_seconds", "Time from request to response",
                                 ["model", "protocol"], buckets=_TIME_BUCKETS, registry=r)
        self.batch = Histogram("fusegraph_batch_size", "Rows per executed batch", ["model"],
                               buckets=_BATCH_BUCKETS, registry=r)

    # called by the batcher's workers
    def queued(self, model: str, seconds: float) -> None:
        self.queue.labels(model).observe(seconds)

    def computed(self, model: str, seconds: float, batch: int) -> None:
        self.compute.labels(model).observe(seconds)
        self.batch.labels(model).observe(batch)

    # called by the front ends
    def finished(self, model: str, protocol: str, seconds: float, code: int) -> None:
        self.requests.labels(model, protocol, "success" if code == 200 else "failure").inc()
        if code != 200:
            self.failures.labels(model, str(code)).inc()
        self.latency.labels(model, protocol).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
