"""The door's `/metrics`: Prometheus's text format, by the Prometheus client library, in a registry of
the door's own (several doors in one process keep their counts apart).

- `rlcore_door_requests_total{endpoint, status}`: requests answered;
- `rlcore_door_prompt_tokens_total`, `rlcore_door_generation_tokens_total`: tokens read and generated;
- `rlcore_door_request_seconds{endpoint}`: request latency, to the last byte of the answer;
- `rlcore_door_time_to_first_token_seconds`: a streamed answer's first text;
- `rlcore_door_queue_depth`: generation calls waiting for the engine;
- `rlcore_door_running_sequences`: sequences the engine's running batch decodes now;
- `rlcore_engine_steps_total`, `rlcore_engine_step_sequences_total`: decode steps of the running batch
  and the sequences they held (their ratio: the mean batch size).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from .batching import BatchingEngine

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _EngineSteps(Collector):
    """The batching engine's step counts, read when scraped."""

    def __init__(self, batching: BatchingEngine):
        self.batching = batching

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "rlcore_engine_steps", "Decode steps of the engine's running batch", value=self.batching.steps
        )
        yield CounterMetricFamily(
            "rlcore_engine_step_sequences", "Sequences the running batch held, summed over its steps",
            value=self.batching.step_rows,
        )  # fmt: skip


class DoorMetrics:
    """What the door counts, and its text for `/metrics`."""

    def __init__(self, batching: BatchingEngine):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rlcore_door_requests", "Requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("rlcore_door_prompt_tokens", "Prompt tokens of the requests served", registry=r)
        self.generation_tokens = Counter("rlcore_door_generation_tokens", "Tokens generated", registry=r)
        self.latency = Histogram(
            "rlcore_door_request_seconds", "Request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.first_token = Histogram(
            "rlcore_door_time_to_first_token_seconds", "A streamed answer's first text", buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        Gauge("rlcore_door_queue_depth", "Generation calls waiting for the engine", registry=r).set_function(
            batching.queue_depth
        )
        Gauge("rlcore_door_running_sequences", "Sequences the running batch decodes", registry=r).set_function(
            batching.running_rows
        )
        r.register(_EngineSteps(batching))

    def answered(self, endpoint: str, status: int, seconds: float, response: Any = None) -> None:
        """A request was answered with `status` after `seconds` (`response`: its JSON, for usage)."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)
        usage = response.get("usage") if isinstance(response, dict) else None
        if usage:  # chat and text completions' names, or the Responses API's
            self.prompt_tokens.inc(usage.get("prompt_tokens", usage.get("input_tokens", 0)))
            self.generation_tokens.inc(usage.get("completion_tokens", usage.get("output_tokens", 0)))

    def text(self) -> bytes:
        return generate_latest(self.registry)
