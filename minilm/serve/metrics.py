"""Prometheus metrics under vLLM's names, so a dashboard made for vLLM reads the lab's server.

    vllm:num_requests_running          gauge      requests in the running batch
    vllm:num_requests_waiting          gauge      requests queued for a place in it
    vllm:kv_cache_usage_perc           gauge      KV blocks in use / all blocks (a fraction, 0-1, as vLLM's)
    vllm:prompt_tokens_total           counter    prompt tokens of requests that got their first token
    vllm:generation_tokens_total       counter    tokens sampled
    vllm:num_preemptions_total         counter    requests preempted (recompute)
    vllm:request_success_total         counter    finished requests, by finished_reason (stop, length, aborted)
    vllm:time_to_first_token_seconds   histogram  first token - arrival
    vllm:inter_token_latency_seconds   histogram  gaps between a request's tokens
    vllm:e2e_request_latency_seconds   histogram  finish - arrival
    vllm:request_queue_time_seconds    histogram  first scheduled - arrival

Every value comes from the engine's own records: where the engine runs, each step's
numbers are measured (engine_loop.py: `StepStats`) and sent to the HTTP side with the
step's tokens, which observes them here. Once every request has finished, the counters
equal sums over the timeline (tests/test_server.py checks). Each is labelled
`model_name`, like vLLM's. The histogram buckets are vLLM's.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .messages import StepStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()  # one per server: tests run several in one process
        self.model_name = model_name
        label, r = ["model_name"], self.registry
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", label, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", label, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.", label, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", label, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", label, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions.", label, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests.", label + ["finished_reason"],
                               registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", label,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", label,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", label,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Time waiting before first scheduled.",
                                    label, buckets=LATENCY_BUCKETS, registry=r)

    def observe(self, stats: StepStats) -> None:
        """One step's numbers (or an abort's: a finish and the gauges)."""
        m = self.model_name
        self.generation_tokens.labels(m).inc(stats.generation_tokens)
        self.prompt_tokens.labels(m).inc(stats.prompt_tokens)
        for name, values in ((self.ttft, stats.ttfts), (self.queue_time, stats.queue_times), (self.itl, stats.itls)):
            for v in values:
                name.labels(m).observe(v)
        for reason, e2e in stats.finished:
            self.success.labels(m, reason).inc()
            self.e2e.labels(m).observe(e2e)
        self.preemptions.labels(m).inc(stats.preemptions)
        self.running.labels(m).set(stats.running)
        self.waiting.labels(m).set(stats.waiting)
        self.kv_usage.labels(m).set(stats.kv_usage)

    def text(self) -> bytes:
        return generate_latest(self.registry)
