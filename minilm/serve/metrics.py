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

With speculative decoding (lesson 10), vLLM V1's counters, only then:

    vllm:spec_decode_num_drafts                   counter  verifications: a request's drafts checked in one step
    vllm:spec_decode_num_draft_tokens             counter  draft tokens verified
    vllm:spec_decode_num_accepted_tokens          counter  of those, the ones the target kept
    vllm:spec_decode_num_accepted_tokens_per_pos  counter  verifications that kept the draft at `position` (0..k-1)

so that acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted /
drafts (summarize's spec_acceptance_rate and spec_mean_acceptance_length), and the share of
verifications that got as far as position i = per_pos{position=i} / drafts.

Every value comes from the engine's own records: where the engine runs, each step's
numbers are measured (engine_loop.py: `StepStats`) and sent to the HTTP side with the
step's tokens, which observes them here. Once every request has finished, the counters
equal sums over the timeline (tests/test_server.py checks). Each is labelled
`model_name` and `engine` (the engine core's index, "0" to "N-1" under
`--data-parallel-size N`), like vLLM V1's; every core's series exist from the start, at 0.
The histogram buckets are vLLM's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..spec_decode import SpeculativeConfig
from .messages import StepStats

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class ServerMetrics:
    def __init__(self, model_name: str, speculative_config=None, engines: int = 1):
        """`speculative_config`: the engine's (EngineConfig's value); None: no spec-decode counters.
        `engines`: the engine cores (--data-parallel-size)."""
        self.registry = CollectorRegistry()  # one per server: tests run several in one process
        self.model_name = model_name
        speculative = SpeculativeConfig.of(speculative_config)
        label, r = ["model_name", "engine"], self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch.", label, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", label, registry=r
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.", label, registry=r
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens processed.", label, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated.", label, registry=r
        )
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions.", label, registry=r)
        self.success = Counter(
            "vllm:request_success", "Finished requests.", label + ["finished_reason"], registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            label,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency.",
            label,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            label,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Time waiting before first scheduled.",
            label,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.spec_decode = (
            SpecDecodeMetrics(model_name, speculative.num_speculative_tokens, r)
            if speculative
            else None
        )
        for engine in map(str, range(engines)):  # every core's series, at 0 before its first step
            for metric in (
                self.running,
                self.waiting,
                self.kv_usage,
                self.prompt_tokens,
                self.generation_tokens,
                self.preemptions,
                self.ttft,
                self.itl,
                self.e2e,
                self.queue_time,
            ):
                metric.labels(model_name, engine)
            if self.spec_decode is not None:
                self.spec_decode.observe([], engine)

    def observe(self, stats: StepStats, engine: str = "0") -> None:
        """One step's numbers (or an abort's: a finish and the gauges) from engine core `engine`."""
        m = self.model_name, engine
        self.generation_tokens.labels(*m).inc(stats.generation_tokens)
        self.prompt_tokens.labels(*m).inc(stats.prompt_tokens)
        for name, values in (
            (self.ttft, stats.ttfts),
            (self.queue_time, stats.queue_times),
            (self.itl, stats.itls),
        ):
            for v in values:
                name.labels(*m).observe(v)
        for reason, e2e in stats.finished:
            self.success.labels(*m, reason).inc()
            self.e2e.labels(*m).observe(e2e)
        self.preemptions.labels(*m).inc(stats.preemptions)
        self.running.labels(*m).set(stats.running)
        self.waiting.labels(*m).set(stats.waiting)
        self.kv_usage.labels(*m).set(stats.kv_usage)
        if self.spec_decode is not None:
            self.spec_decode.observe(stats.drafts, engine)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class SpecDecodeMetrics:
    """vLLM V1's speculative-decoding counters; every position's counter exists from the start (at 0)."""

    def __init__(self, model_name: str, num_speculative_tokens: int, registry: CollectorRegistry):
        label = ["model_name", "engine"]
        self.model_name, self.num_speculative_tokens = model_name, num_speculative_tokens
        self.drafts = Counter(
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            label,
            registry=registry,
        )
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", label, registry=registry
        )
        self.accepted_tokens = Counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            label,
            registry=registry,
        )
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            label + ["position"],
            registry=registry,
        )

    def observe(self, drafts: list[tuple[int, int]], engine: str = "0") -> None:
        """One step's verifications: (draft tokens, accepted) of each request that had drafts.
        Acceptance stops at the first rejection, so `accepted` drafts means positions 0..accepted-1."""
        m = self.model_name, engine
        per_pos = [self.per_pos.labels(*m, str(i)) for i in range(self.num_speculative_tokens)]
        for counter in (self.drafts, self.draft_tokens, self.accepted_tokens):
            counter.labels(*m)  # the series exist before the first verification
        for num_draft, num_accepted in drafts:
            self.drafts.labels(*m).inc()
            self.draft_tokens.labels(*m).inc(num_draft)
            self.accepted_tokens.labels(*m).inc(num_accepted)
            for counter in per_pos[:num_accepted]:
                counter.inc()
