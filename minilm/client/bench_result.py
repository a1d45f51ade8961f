"""`vllm bench serve` result files: make them, print them, and turn them into timelines
(`result_to_timeline` also reads guidellm's reports: guidellm_result.py).

The file is one JSON object (what `vllm bench serve --save-result --save-detailed`
writes), so a run of `python -m minilm bench-serve` and a run of vLLM's own client read
the same way:

    summary      duration (s), completed, failed, total_input_tokens, total_output_tokens,
                 request_throughput (req/s), output_throughput and total_token_throughput
                 (tok/s), mean_/median_/std_/p99_ of ttft, tpot, itl, e2el (ms)
    per request  input_lens, output_lens, ttfts (s), itls (a list of gaps in s),
                 start_times (the client's perf_counter when it sent the request),
                 generated_texts, errors ("" when it succeeded)

The lab adds `request_ids` and `finish_reasons` (lists like the others) and its run
settings; readers of vLLM's format ignore them.

`result_to_timeline` makes the client's view of a run a `Timeline`: a row per request,
waiting from when it was sent until its first token, then decoding with a tick per token.
It has requests and no engine steps (the client cannot see them), and the Gantt, CDF and
comparison views draw it like any timeline. `replay_specs` turns the same requests
(lengths, start times) into a workload, so the simulator can show what an engine would
have done with them (`simulate_result`).

Failed requests: vLLM's client marks a request failed (RequestFuncOutput.success False) when
the server answers with an error status, when the stream ends before any token, or when an
exception breaks it (a refused connection, a reset, a timeout); `errors` holds the reason (the
HTTP reason or the traceback, "" only for an error status without one), `output_lens` 0, and
`ttfts`/`itls` whatever came before it broke (0 and [] when nothing did). The timeline marks
them as every client loader does (minilm/timeline.py): "error" when no token came,
"incomplete" when tokens came and then it broke; their tokens stay on the row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from ..timeline import ERROR, INCOMPLETE, RequestRecord, Timeline
from ..workload import RequestSpec
from .guidellm_result import is_guidellm_report, report_to_timeline

PER_REQUEST = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "start_times",
    "generated_texts",
    "errors",
)
PERCENTILES = (50, 90, 99)


@dataclass
class RequestOutput:
    """What the client saw of one request (vLLM's RequestFuncOutput, plus its id and finish reason)."""

    request_id: str = ""
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0  # s from sending to the last chunk
    output_tokens: int = 0
    ttft: float = 0.0  # s from sending to the first chunk with a token
    itl: list[float] = field(default_factory=list)  # s between consecutive token chunks
    prompt_len: int = 0
    error: str = ""
    start_time: float = 0.0  # time.perf_counter() when sent
    finish_reason: str | None = None


def stats_ms(values: list[float], name: str) -> dict[str, float]:
    """vLLM's mean/median/std/pNN fields of one metric, in ms (0 when there is no value, as vLLM)."""
    v = np.asarray(values or [0.0], dtype=float) * 1000
    out = {
        f"mean_{name}_ms": float(v.mean()),
        f"median_{name}_ms": float(np.median(v)),
        f"std_{name}_ms": float(v.std()),
    }
    out |= {f"p{p}_{name}_ms": float(np.percentile(v, p)) for p in PERCENTILES}
    return out


def token_times(first: float, itl: list[float]) -> np.ndarray:
    """When each of a request's tokens came: the first at `first`, each next one an inter-token gap later."""
    return first + np.concatenate([[0.0], np.cumsum(itl)])


def peak_output_per_s(outputs: list[RequestOutput]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests: the busiest one-second bucket."""
    ok = [o for o in outputs if o.success]
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    n = int(np.ceil(max(o.start_time + o.latency for o in ok) - t0)) + 1
    tokens, running = np.zeros(n), np.zeros(n)
    for o in ok:
        times = token_times(o.start_time + o.ttft, o.itl)
        np.add.at(tokens, (times - t0).astype(int).clip(0, n - 1), 1)
        running[int(o.start_time - t0) : int(o.start_time + o.latency - t0) + 1] += 1
    return float(tokens.max()), int(running.max())


def make_result(
    outputs: list[RequestOutput], duration: float, settings: dict[str, Any]
) -> dict[str, Any]:
    """The result object, in vLLM's format (detailed: with the per-request lists)."""
    ok = [o for o in outputs if o.success]
    output_lens = [o.output_tokens if o.success else 0 for o in outputs]
    total_in, total_out = sum(o.prompt_len for o in ok), sum(output_lens)
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    peak, concurrent = peak_output_per_s(outputs)
    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai",
        **settings,
        "duration": duration,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
        "request_ids": [o.request_id for o in outputs],
        "finish_reasons": [o.finish_reason for o in outputs],
        "max_output_tokens_per_s": peak,
        "max_concurrent_requests": concurrent,
    }
    for name, values in (
        ("ttft", [o.ttft for o in ok]),
        ("tpot", tpots),
        ("itl", [g for o in ok for g in o.itl]),
        ("e2el", [o.latency for o in ok]),
    ):
        result |= stats_ms(values, name)
    return result


def print_result(r: dict[str, Any]) -> None:
    """vLLM's summary table."""

    def line(label, value, fmt="{:<10}"):
        print(("{:<40} " + fmt).format(label, value))

    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    line("Successful requests:", r["completed"])
    line("Failed requests:", r["failed"])
    if r.get("max_concurrency") is not None:
        line("Maximum request concurrency:", r["max_concurrency"])
    if r.get("request_rate") not in (None, "inf"):
        line("Request rate configured (RPS):", r["request_rate"], "{:<10.2f}")
    line("Benchmark duration (s):", r["duration"], "{:<10.2f}")
    line("Total input tokens:", r["total_input_tokens"])
    line("Total generated tokens:", r["total_output_tokens"])
    line("Request throughput (req/s):", r["request_throughput"], "{:<10.2f}")
    line("Output token throughput (tok/s):", r["output_throughput"], "{:<10.2f}")
    line("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"], "{:<10.2f}")
    line("Peak concurrent requests:", r["max_concurrent_requests"], "{:<10.2f}")
    line("Total Token throughput (tok/s):", r["total_token_throughput"], "{:<10.2f}")
    for name, short, header in (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2el", "E2EL", "End-to-end Latency"),
    ):
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        line(f"Mean {short} (ms):", r[f"mean_{name}_ms"], "{:<10.2f}")
        line(f"Median {short} (ms):", r[f"median_{name}_ms"], "{:<10.2f}")
        for p in PERCENTILES:
            if f"p{p}_{name}_ms" in r and p != 50:
                line(f"P{p} {short} (ms):", r[f"p{p}_{name}_ms"], "{:<10.2f}")
    print("=" * 50)


def save_result(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result))
    return path


def read_json(path_or_dict) -> dict[str, Any]:
    return (
        path_or_dict
        if isinstance(path_or_dict, dict)
        else json.loads(Path(path_or_dict).read_text())
    )


def load_result(path_or_dict) -> dict[str, Any]:
    """A result file (ours or vLLM's, detailed), checked for the per-request lists the views need."""
    r = read_json(path_or_dict)
    if is_guidellm_report(r):
        raise ValueError(
            "this is a guidellm report, not vLLM's result format: read it with result_to_timeline "
            "(or widgets.load_bench_result)"
        )
    missing = [k for k in ("input_lens", "output_lens", "ttfts", "itls") if k not in r]
    if missing:
        raise ValueError(
            f"result file has no {', '.join(missing)}: save it with per-request data "
            f"(vLLM: --save-result --save-detailed; minilm bench-serve: --save)"
        )
    n = len(r["ttfts"])
    bad = [k for k in PER_REQUEST if k in r and len(r[k]) != n]
    if bad:
        raise ValueError(f"result file: {', '.join(bad)} must have one entry per request ({n})")
    return r


# ---- the client's view as a timeline ------------------------------------------------------
def result_to_timeline(
    result, label: str | None = None, benchmark: int | str | None = None
) -> Timeline:
    """The client's timeline of a result file or object, whichever tool wrote it: vLLM's result
    format (`vllm bench serve`, `minilm bench-serve`) or a guidellm report, told apart here and
    only here. `benchmark`: which of a guidellm run's benchmarks, by index or strategy name
    ("concurrent@4"; guidellm_result.py); a vLLM file holds one run."""
    r = read_json(result)
    if is_guidellm_report(r):
        return report_to_timeline(r, benchmark, label)
    if benchmark is not None:
        raise ValueError(f"benchmark={benchmark!r}: a vLLM result file holds one run, not several")
    return vllm_to_timeline(r, label)


def vllm_to_timeline(result, label: str | None = None) -> Timeline:
    """A row per request: sent (arrival) -> first token -> a token per chunk -> last chunk.
    Without `start_times` (older vLLM files) every request starts at 0 and `meta` says so.
    A failed request keeps its row, its error and the tokens it got before it broke (output_len
    counts those); it ends at its last token, or where it was sent when none came."""
    r = load_result(result)
    n = len(r["ttfts"])
    starts = r.get("start_times")
    t0 = min(starts) if starts else 0.0
    ids = r.get("request_ids") or [f"r{i}" for i in range(n)]
    reasons = r.get("finish_reasons") or [None] * n
    errors = r.get("errors") or [""] * n
    requests = []
    for i in range(n):
        arrival = (starts[i] - t0) if starts else 0.0
        got_token = r["ttfts"][i] > 0 or bool(
            r["itls"][i]
        )  # a success always has: its first chunk set ttft
        failed = (
            bool(errors[i]) or not got_token and r["output_lens"][i] == 0
        )  # "": an error status without reason
        times = (
            token_times(arrival + r["ttfts"][i], r["itls"][i]).tolist()
            if got_token or not failed
            else []
        )
        if failed:
            reason, output_len = (INCOMPLETE if times else ERROR), len(times)
            error = (
                errors[i]
                or "failed without a message (an error status with no reason, or no token came)"
            )
        else:
            reason, output_len, error = reasons[i] or "finished", int(r["output_lens"][i]), ""
        requests.append(
            RequestRecord(
                request_id=str(ids[i]),
                arrival=float(arrival),
                prompt_len=int(r["input_lens"][i]),
                max_tokens=int(r["output_lens"][i]),
                t_scheduled=None,
                t_first_token=times[0] if times else None,
                token_times=times,
                t_finished=times[-1] if times else float(arrival),
                output_len=output_len,
                finish_reason=reason,
                preemptions=0,
                error=str(error),
            )
        )
    meta = {
        "policy": label or r.get("label") or r.get("backend", "client"),
        "clock": "client",
        "model": r.get("model_id"),
        "source": "bench result (client side)",
        "has_start_times": bool(starts),
        "duration": r.get("duration"),
    }
    return Timeline(steps=[], requests=requests, meta=meta)


def engine_view(engine_tl: Timeline, client_tl: Timeline) -> Timeline:
    """The server's timeline (`serve --timeline`) cut to the requests of a client's run and put on
    the client's time axis: both start when the first request was sent. The ids match because
    bench-serve sends them as X-Request-Id."""
    ids = {r.request_id for r in client_tl.requests}
    mine = [r for r in engine_tl.requests if r.request_id in ids]
    if not mine:
        raise ValueError(
            "no request of the client's run is on this engine timeline (different run or ids)"
        )
    first = min(client_tl.requests, key=lambda r: r.arrival)
    t0 = next(r.arrival for r in mine if r.request_id == first.request_id) - first.arrival
    start, end = min(r.arrival for r in mine), max(r.t_finished for r in mine)
    steps = []
    for s in engine_tl.steps:
        if s.t_end >= start and s.t_start <= end:
            steps.append(
                replace(
                    s,
                    step=len(steps),
                    t_start=s.t_start - t0,
                    t_end=s.t_end - t0,
                    items=[i for i in s.items if i.request_id in ids],
                    kv_blocks=None,
                )
            )
    requests = [
        replace(
            r,
            arrival=r.arrival - t0,
            t_scheduled=r.t_scheduled - t0 if r.t_scheduled is not None else None,
            t_first_token=r.t_first_token - t0 if r.t_first_token is not None else None,
            token_times=[t - t0 for t in r.token_times],
            t_finished=r.t_finished - t0,
        )
        for r in mine
    ]
    return Timeline(steps, requests, {**engine_tl.meta, "source": "engine side of a client's run"})


def replay_specs(result_or_timeline, token_id: int = 0) -> list[RequestSpec]:
    """The requests of a run as a workload: same prompt lengths (placeholder tokens), output
    lengths as max_tokens, arrivals at their start times (replay with ignore_eos=True).

    A request that broke after some tokens ("incomplete") is replayed up to the tokens it got:
    the server did prefill it and decode those, load the other requests waited behind, and
    what it would have written after is unknown. One that got no token ("error") is left out:
    the file cannot tell whether the server did any work for it (a refused connection or a
    400 costs nothing, a timeout in the queue does), and a prompt the server refused as too
    long would make the simulator refuse the whole replay. `simulate_result` says how many."""
    tl = (
        result_or_timeline
        if isinstance(result_or_timeline, Timeline)
        else result_to_timeline(result_or_timeline)
    )
    return [
        RequestSpec(r.request_id, [token_id] * r.prompt_len, r.output_len, r.arrival)
        for r in tl.requests
        if r.finish_reason != ERROR and r.output_len > 0
    ]


def simulate_result(
    result_or_timeline,
    model: str = "llama-3-8b",
    device: str = "h100",
    policy: str = "continuous",
    **knobs,
) -> Timeline:
    """What the simulated `model` on `device` would have done with the same requests (simulated clock);
    `meta["replay_left_out"]` counts the requests of the run it did not replay (`replay_specs`)."""
    from ..sim.executor import simulated_engine

    tl = (
        result_or_timeline
        if isinstance(result_or_timeline, Timeline)
        else result_to_timeline(result_or_timeline)
    )
    specs = replay_specs(tl)
    engine = simulated_engine(model, device, policy=policy, **knobs)
    engine.add_workload(specs, ignore_eos=True)
    sim = engine.run()
    sim.meta["replay_left_out"] = len(tl.requests) - len(specs)
    return sim
