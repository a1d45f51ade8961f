"""Serving metrics, computed from a timeline alone.

TTFT   time to first token: first token's time - arrival (includes queueing)
ITL    inter-token latency: gaps between consecutive tokens of one request; `itl_max` is
       the longest gap of the run and `itl_worst_p99` the p99 over requests of each one's
       longest gap: a prefill that stalls the decodes shows there, however rare
TPOT   time per output token after the first: (finish - first token) / (output - 1)
e2e    finish - arrival

Every latency is over the requests that completed: one that failed (a client's run, lesson 9:
finish_reason "error" or "incomplete", minilm/timeline.py) has no finish to measure, and a
broken stream's last gap is not an inter-token latency. `summarize` counts them instead
(`failed`, and of those `incomplete`), as `vllm bench serve` reports its "Failed requests".

Goodput: two definitions share the name.
request goodput   one run's requests that met every SLO (TTFT and TPOT limits), per
                  second of the run: what `vllm bench serve --goodput` reports as
                  "request goodput" (`request_goodput`; summarize's `goodput_req_per_s`)
DistServe goodput the highest request rate at which at least a target share of requests
                  (DistServe's example: 90%) meets the SLOs (Zhong et al., OSDI 2024): a
                  property of a deployment, found by running it at several rates
                  (`distserve_goodput`, lesson 7)

KV figures, per step (StepRecord) and over a run; a block in several block tables (prefix
caching, lesson 8) is one block, and its tokens are counted once:
kv_blocks_total      the cache's blocks; slots: kv_blocks_total * block_size
kv_blocks_used       blocks not free (vLLM's KV usage): those some request holds (lesson 4's
                     first-fit pool counts its holes too); allocated slots: times block_size
kv_tokens_stored     allocated slots holding a token after the step: a request's tokens, a
                     static row's padding; not a draft the target rejected
kv_unused_slots      allocated slots holding none: allocated - kv_tokens_stored (a sequence's
                     last block; reserved or static KV not written yet; a draft model's lookahead)
kv_cached_free       free blocks, not among the used ones, that keep a cached prefix
peak_kv_blocks       the most blocks used at once; kv_unused_slots_mean: unused slots per step
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from .timeline import CACHED, INCOMPLETE, ITEM_KINDS, RequestRecord, StepItem, StepRecord, Timeline

# A decode's draft tokens (speculative decoding, lesson 10), split by what the target did with them:
# counted inside its `decode` tokens on the timeline, shown apart by steps_df and the views
DRAFT_KINDS = ("accepted", "rejected")


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def completed_requests(tl: Timeline) -> list[RequestRecord]:
    """The requests that did not fail: the ones every latency is measured over."""
    return [r for r in tl.requests if not r.failed]


def ttfts(tl: Timeline) -> list[float]:
    return [
        r.t_first_token - r.arrival for r in completed_requests(tl) if r.t_first_token is not None
    ]


def _gaps(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """The gaps between consecutive tokens of every completed request, in order, and where
    each request's gaps begin; numpy, over all the run's token times at once (millions)."""
    times = [r.token_times for r in completed_requests(tl) if len(r.token_times) > 1]
    lens = np.fromiter(map(len, times), int, len(times))
    gaps = np.diff(np.fromiter(chain.from_iterable(times), float, int(lens.sum())))
    ends = np.cumsum(lens)  # past each request's last token
    keep = np.ones(len(gaps), bool)
    keep[ends[:-1] - 1] = False  # from one request's last token to the next one's first
    return gaps[keep], ends - lens - np.arange(len(lens))


def aggregate(tl: Timeline) -> bool:
    """Recorded with record="aggregate" (minilm/record.py): totals, no token times."""
    return tl.meta.get("record") == "aggregate"


def gap_counts(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """record="aggregate": the run's inter-token gaps as (values, how many times each): each
    step's own gap (its t_end - the previous step's) weighed by its `num_follow`, then the
    timeline's other_gaps, once each. The same multiset `_gaps` gives a full timeline."""
    steps, other = tl.steps, np.asarray(tl.other_gaps, float)
    ends = np.fromiter((s.t_end for s in steps), float, len(steps))
    follows = np.fromiter((s.num_follow for s in steps), int, len(steps))
    values = np.concatenate([np.diff(ends), other])
    counts = np.concatenate([follows[1:], np.ones(len(other), int)])
    return values[counts > 0], counts[counts > 0]


def weighted_percentiles(values: np.ndarray, counts: np.ndarray, qs) -> list[float]:
    """np.percentile(np.repeat(values, counts), qs), its default (linear) method step by step,
    bit for bit, without making the repeated array (tens of millions of gaps)."""
    order = np.argsort(values, kind="stable")
    v, ends = values[order], np.cumsum(counts[order])  # sorted rank k: v[first end > k]
    n = int(ends[-1]) if len(ends) else 0
    if n == 0:
        return [float("nan")] * len(qs)
    virtual = (n - 1) * np.true_divide(np.asarray(qs, float), 100)  # numpy's virtual index
    prev, last = np.floor(virtual), virtual >= n - 1
    lo = np.where(last, n - 1, prev).astype(np.intp)
    hi = np.where(last, n - 1, prev + 1).astype(np.intp)
    gamma = virtual - np.where(last, -1, prev)  # numpy's (moot where last: a == b)
    a, b = v[np.searchsorted(ends, lo, side="right")], v[np.searchsorted(ends, hi, side="right")]
    d = b - a  # numpy's lerp: from the nearer end
    return np.where(gamma >= 0.5, b - d * (1 - gamma), a + d * gamma).tolist()


def itls(tl: Timeline) -> list[float]:
    """Every gap between consecutive tokens of a request (record="aggregate": the same gaps,
    in step order, not request by request)."""
    if aggregate(tl):
        return np.repeat(*gap_counts(tl)).tolist()
    return _gaps(tl)[0].tolist()


def worst_itls(tl: Timeline) -> list[float]:
    """Each request's longest gap between two of its tokens."""
    if aggregate(tl):
        return [r.worst_gap for r in completed_requests(tl) if r.worst_gap is not None]
    gaps, starts = _gaps(tl)
    return np.maximum.reduceat(gaps, starts).tolist() if len(starts) else []


def tpot(r) -> float:
    """One request's time per output token after the first (0 with a single token, as vLLM's benchmark)."""
    return (r.t_finished - r.t_first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0


def tpots(tl: Timeline) -> list[float]:
    return [
        tpot(r) for r in completed_requests(tl) if r.output_len > 1 and r.t_finished is not None
    ]


def e2e_latencies(tl: Timeline) -> list[float]:
    return [r.t_finished - r.arrival for r in completed_requests(tl) if r.t_finished is not None]


def meets_slo(r, ttft_slo: float | None, tpot_slo: float | None) -> bool:
    """Whether one request kept both promises (a limit of None is no limit); a failed one kept none."""
    if r.t_first_token is None or r.failed:
        return False
    ok_ttft = ttft_slo is None or r.t_first_token - r.arrival <= ttft_slo
    return ok_ttft and (tpot_slo is None or tpot(r) <= tpot_slo)


def run_span(tl: Timeline) -> float:
    """Seconds from the first arrival to the run's end: its last step, or (a client's view,
    which has no steps) its last request's end."""
    end = (
        max(s.t_end for s in tl.steps)
        if tl.steps
        else max((r.t_finished for r in tl.requests if r.t_finished is not None), default=None)
    )
    return end - min(r.arrival for r in tl.requests) if end is not None and tl.requests else 0.0


def slo_attainment(tl: Timeline, ttft_slo: float | None, tpot_slo: float | None) -> float:
    """The share of the run's requests that met both SLO limits."""
    return (
        sum(meets_slo(r, ttft_slo, tpot_slo) for r in tl.requests) / len(tl.requests)
        if tl.requests
        else 0.0
    )


def request_goodput(tl: Timeline, ttft_slo: float | None, tpot_slo: float | None) -> float:
    """Requests that met both SLO limits, per second of the run (vLLM's "request goodput").
    It can never exceed the rate at which requests arrived: it measures one run at one
    load, not how much load the deployment can take (that is `distserve_goodput`)."""
    span = run_span(tl)
    return sum(meets_slo(r, ttft_slo, tpot_slo) for r in tl.requests) / span if span else 0.0


def distserve_goodput(
    runs_by_rate: dict[float, Timeline],
    ttft_slo: float | None,
    tpot_slo: float | None,
    target: float = 0.9,
) -> float:
    """DistServe's goodput from runs of one deployment at several request rates: the highest
    rate whose run kept at least `target` SLO attainment (0.0 when none did). It is only as
    fine as the rates tried, and it trusts each run: where attainment does not fall as the
    rate rises (a noisy measurement), try more rates, or more requests per rate."""
    return max(
        (
            rate
            for rate, tl in runs_by_rate.items()
            if slo_attainment(tl, ttft_slo, tpot_slo) >= target
        ),
        default=0.0,
    )


def kv_unused_slots(s: StepRecord, block_size: int) -> int:
    """KV slots of a step's used blocks that hold no token: allocated (kv_blocks_used *
    block_size) minus those holding one (kv_tokens_stored); never below 0, sharing or not."""
    return s.kv_blocks_used * block_size - s.kv_tokens_stored


def summarize(
    tl: Timeline, ttft_slo: float | None = None, tpot_slo: float | None = None
) -> dict[str, Any]:
    """Everything `compare` prints, as one flat dict (times in seconds)."""
    steps = tl.steps
    span = run_span(tl)
    done = completed_requests(
        tl
    )  # tokens and latencies of the requests that completed (vLLM's totals count only those)
    out_tokens = sum(r.output_len for r in done)
    prompt_tokens = sum(r.prompt_len for r in done)
    computed = padding = drafts = accepted = verifies = 0
    batch_sizes = []  # requests doing real (non-padding) work in each step
    if aggregate(tl):  # AggregateSteps (minilm/record.py): counted as they ran
        sums = [s.sums for s in steps]
        computed = sum(t.prefill + t.decode + t.padding for t in sums)
        padding, batch_sizes = sum(t.padding for t in sums), [t.batch_size for t in sums]
        drafts, accepted = sum(t.num_draft for t in sums), sum(t.num_accepted for t in sums)
        verifies = sum(t.num_verifies for t in sums)
    else:
        for s in steps:
            n, items = s.bulk_decodes()  # a simulated step's decodes counted, not made
            real, computed = set(), computed + n
            for i in items:
                if i.num_draft:  # a decode that verified drafts (speculative decoding, lesson 10)
                    drafts, accepted, verifies = (
                        drafts + i.num_draft,
                        accepted + i.num_accepted,
                        verifies + 1,
                    )
                if i.kind == "padding":
                    padding += i.num_tokens
                elif i.kind == CACHED:
                    continue
                else:
                    real.add(i.request_id)
                computed += i.num_tokens
            batch_sizes.append(len(real) + n)
    m: dict[str, Any] = {
        "policy": tl.meta.get("policy"),
        "clock": tl.meta.get("clock"),
        "requests": len(tl.requests),
        "failed": len(tl.requests)
        - len(done),  # vLLM's "Failed requests"; left out of every latency below
        "incomplete": sum(
            r.finish_reason == INCOMPLETE for r in tl.requests
        ),  # of those, the ones cut off
        "steps": len(steps),
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "wall_s": span,
        "output_tok_per_s": out_tokens / span if span else 0.0,
        "total_tok_per_s": (out_tokens + prompt_tokens) / span if span else 0.0,
        "padding_fraction": padding / computed if computed else 0.0,
        "mean_batch_size": float(np.mean(batch_sizes)) if batch_sizes else 0.0,
        "peak_kv_blocks": max((s.kv_blocks_used for s in steps), default=0),
        "kv_blocks_total": steps[0].kv_blocks_total if steps else 0,
        "kv_unused_slots_mean": float(
            np.mean([kv_unused_slots(s, tl.meta.get("block_size", 1)) for s in steps])
        )
        if steps
        else 0.0,
        "preemptions": sum(r.preemptions for r in tl.requests),
        # vLLM's prefix cache hit rate: prompt tokens found cached / prompt tokens
        "prefix_cache_hit_rate": sum(r.num_cached_tokens for r in done) / prompt_tokens
        if prompt_tokens
        else 0.0,
        # vLLM's spec-decode metrics: drafts the target agreed with, and tokens a verifying step kept
        # (its accepted drafts and its own token): "mean acceptance length"
        "spec_draft_tokens": drafts,
        "spec_acceptance_rate": accepted / drafts if drafts else None,
        "spec_mean_acceptance_length": 1 + accepted / verifies if verifies else None,
    }
    if aggregate(tl):  # no token times: the gaps counted, each request's worst kept
        gaps, worst = gap_counts(tl), worst_itls(tl)
    else:
        gaps, starts = _gaps(tl)
        worst = np.maximum.reduceat(gaps, starts).tolist() if len(starts) else []  # worst_itls
    for name, values in (
        ("ttft", ttfts(tl)),
        ("itl", gaps),
        ("tpot", tpots(tl)),
        ("e2e", e2e_latencies(tl)),
    ):
        # the three in one pass over the values (np.percentile partitions them once)
        if isinstance(values, tuple):  # (values, counts)
            qs = weighted_percentiles(*values, (50, 90, 99))
        else:
            qs = np.percentile(values, (50, 90, 99)).tolist() if len(values) else [float("nan")] * 3
        m.update((f"{name}_p{q}", x) for q, x in zip((50, 90, 99), qs))
    m["itl_max"] = max(worst, default=float("nan"))
    m["itl_worst_p99"] = percentile(worst, 99)
    if ttft_slo is not None or tpot_slo is not None:
        m["slo_attainment"] = slo_attainment(tl, ttft_slo, tpot_slo)
        m["goodput_req_per_s"] = request_goodput(tl, ttft_slo, tpot_slo)  # vLLM's request goodput
    return m


# ---- the one metrics table: the CLI's `compare`, the widgets, the lessons and the demo ------
@dataclass(frozen=True)
class Column:
    """One column of the metrics table: a `summarize` key, its header with the unit, the factor
    that turns the key's unit (seconds, fractions) into the header's, and the decimals shown."""

    key: str
    header: str
    scale: float = 1.0
    digits: int = 0

    def value(self, m: dict) -> float | None:
        v = m.get(self.key)
        return None if v is None else round(v * self.scale, self.digits)


METRIC_COLUMNS = [
    Column("requests", "requests"),
    Column("output_tokens", "out tokens"),
    Column("wall_s", "time (s)", 1, 2),
    Column("output_tok_per_s", "out tok/s"),
    Column("ttft_p50", "TTFT p50 (ms)", 1e3, 1),
    Column("ttft_p99", "TTFT p99 (ms)", 1e3, 1),
    Column("itl_p50", "ITL p50 (ms)", 1e3, 1),
    Column("itl_p99", "ITL p99 (ms)", 1e3, 1),
    Column("itl_worst_p99", "worst gap p99 (ms)", 1e3, 1),
    Column("itl_max", "ITL max (ms)", 1e3, 1),
    Column("max_num_batched_tokens", "budget (tokens)"),
    Column("mean_batch_size", "batch (seqs)", 1, 1),
    Column("padding_fraction", "padding (%)", 100),
    Column("peak_kv_blocks", "peak KV (blocks)"),
    Column("preemptions", "preempted"),
]
PREFIX_HIT = Column("prefix_cache_hit_rate", "prefix hit (%)", 100)
SPECULATION = [
    Column("spec_acceptance_rate", "drafts accepted (%)", 100),  # lesson 10
    Column("spec_mean_acceptance_length", "tokens per verify", 1, 2),
]
# a client's run with failed requests (lesson 9): how many the latencies leave out, next to the requests
FAILURES = [Column("failed", "failed"), Column("incomplete", "of which incomplete")]


def table_columns(rows: list[dict]) -> list[Column]:
    """The columns for these summaries: the failed requests only where some run had any, the prefix
    hit rate only where some run had caching hits, speculation's only where some run verified drafts."""
    failures = FAILURES if any(r.get("failed") for r in rows) else []
    return (
        METRIC_COLUMNS[:1]
        + failures
        + METRIC_COLUMNS[1:]
        + ([PREFIX_HIT] if any(r.get(PREFIX_HIT.key) for r in rows) else [])
        + (SPECULATION if any(r.get("spec_draft_tokens") for r in rows) else [])
    )


def metrics_frame(summaries: dict[str, dict]) -> pd.DataFrame:
    """A row per named `summarize` result (with the run's `max_num_batched_tokens` added, which
    summarize leaves out: it is a knob, not a measurement), in the table's units and rounding,
    numeric columns (counts as integers), headers with their units."""
    columns = table_columns(list(summaries.values()))
    df = pd.DataFrame(
        {c.header: [c.value(m) for m in summaries.values()] for c in columns},
        index=pd.Index(list(summaries), name="run"),
    )
    for c in columns:
        df[c.header] = df[c.header].astype("Int64" if c.digits == 0 else "float64")
    return df


def metrics_text(summaries: dict[str, dict]) -> str:
    """The same table as text: a header line, then a line per run, columns right-aligned."""
    columns = table_columns(list(summaries.values()))
    header = ["run", *(c.header for c in columns)]
    cells = [
        [
            name,
            *("-" if (v := c.value(m)) is None or v != v else f"{v:.{c.digits}f}" for c in columns),
        ]
        for name, m in summaries.items()
    ]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    lines = [header] + cells
    return "\n".join(
        "  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))])
        for row in lines
    )


# ---- the timeline as tables (pandas) -------------------------------------------------------
def steps_df(tl: Timeline) -> pd.DataFrame:
    """A row per step: its record's numbers, its duration, its tokens by kind, its batch size.
    With speculation, `draft_tokens` of its decode tokens were drafts, `accepted_tokens` of them
    the target kept, `rejected_tokens` it threw away; `verify_time` is the model's time without
    the drafting (model_time - draft_time)."""
    # the record's own numbers by name: asdict would deep-copy every item and block table first
    # (a 1,000-request run: 500k items, 1.3 s) only for them to be dropped
    numbers = [
        f.name for f in fields(StepRecord) if f.name not in ("items", "kv_blocks", "kv_cached_free")
    ]
    rows = []
    for s in tl.steps:
        row = {name: getattr(s, name) for name in numbers}
        row["duration"] = s.duration
        row["verify_time"] = s.model_time - s.draft_time
        for kind in (*ITEM_KINDS, CACHED):
            row[f"{kind}_tokens"] = s.tokens(kind)
        row["num_tokens"] = s.tokens()
        row["draft_tokens"] = sum(i.num_draft for i in s.items)
        row["accepted_tokens"] = sum(i.num_accepted for i in s.items)
        row["rejected_tokens"] = row["draft_tokens"] - row["accepted_tokens"]
        row["batch_size"] = len({i.request_id for i in s.items if i.kind in ("prefill", "decode")})
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["step", "t_start", "t_end"])


def items_df(tl: Timeline) -> pd.DataFrame:
    """A row per step item (request, kind, tokens, context, drafts, accepted), with its step's times."""
    rows = [
        {"step": s.step, "t_start": s.t_start, "t_end": s.t_end, **asdict(i)}
        for s in tl.steps
        for i in s.items
    ]
    empty = ["step", "t_start", "t_end", *(f.name for f in fields(StepItem))]
    return pd.DataFrame(rows, columns=None if rows else empty)


def requests_df(tl: Timeline) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in tl.requests])
