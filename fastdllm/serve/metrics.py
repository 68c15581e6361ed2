"""Prometheus metrics of `fastdllm serve`, in a registry of their own (several servers or tests in
one process never share counters). Every method may be called from any thread."""

from __future__ import annotations

import threading

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .jobs import Finished

CONTENT_TYPE = CONTENT_TYPE_LATEST
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REQUEST_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter("fastdllm_requests", "HTTP requests answered, by endpoint and status",
                                 ["endpoint", "status"], registry=r)
        self._forward_seconds = Histogram("fastdllm_forward_seconds", "Latency of one batched forward (a step)",
                                          buckets=SECONDS, registry=r)
        self._batch_rows = Histogram("fastdllm_batch_rows", "Rows (requests) in one batched forward",
                                     buckets=ROWS, registry=r)
        self._forwards = Counter("fastdllm_forwards", "Batched forwards run", registry=r)
        self._answers = Counter("fastdllm_answers", "Answers finished, by finish reason", ["finish_reason"],
                                registry=r)
        self._prompt_tokens = Counter("fastdllm_prompt_tokens", "Prompt tokens of finished answers", registry=r)
        self._generated = Counter("fastdllm_generated_tokens", "Tokens generated (answers up to their end token)",
                                  registry=r)
        self._nfe = Counter("fastdllm_nfe", "Forwards spent on finished answers, each counted per answer (NFE)",
                            registry=r)
        self._committed = Counter("fastdllm_committed_positions",
                                  "Canvas positions committed for finished answers (end-of-text padding included)",
                                  registry=r)
        self._tokens_per_forward = Gauge("fastdllm_tokens_per_forward",
                                         "Answer tokens (up to their end token) per forward over all finished "
                                         "answers so far; committed positions per forward: "
                                         "fastdllm_committed_positions_total / fastdllm_nfe_total", registry=r)
        self._request_seconds = Histogram("fastdllm_request_seconds", "Time from submit to finish of an answer",
                                          buckets=REQUEST_SECONDS, registry=r)
        self._queued_seconds = Histogram("fastdllm_queued_seconds", "Time an answer waited before its first forward",
                                         buckets=REQUEST_SECONDS, registry=r)
        self._queue_depth = Gauge("fastdllm_queue_depth", "Jobs waiting for a place in the batch", registry=r)
        # the running ratio needs both totals updated together (two counters read apart could tear)
        self._lock = threading.Lock()
        self._nfe_total = self._generated_total = 0

    def request(self, endpoint: str, status: int) -> None:
        self._requests.labels(endpoint=endpoint, status=str(status)).inc()

    def forward(self, seconds: float, rows: int) -> None:
        self._forward_seconds.observe(seconds)
        self._batch_rows.observe(rows)
        self._forwards.inc()

    def finished(self, f: Finished) -> None:
        self._answers.labels(finish_reason=f.finish_reason).inc()
        self._prompt_tokens.inc(f.prompt_tokens)
        self._generated.inc(f.completion_tokens)
        self._nfe.inc(f.nfe)
        self._committed.inc(f.committed)
        self._request_seconds.observe(f.seconds)
        self._queued_seconds.observe(f.queued_seconds)
        with self._lock:
            self._nfe_total += f.nfe
            self._generated_total += f.completion_tokens
            self._tokens_per_forward.set(self._generated_total / max(self._nfe_total, 1))

    def queue_depth(self, n: int) -> None:
        self._queue_depth.set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
