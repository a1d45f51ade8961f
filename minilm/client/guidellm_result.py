"""guidellm's benchmark reports as the lab's timelines, and the command that makes one (lesson 9).

guidellm (the vLLM project's benchmark tool, 0.8) writes one JSON object per run
(`guidellm run ... --output kind=json,path=FILE`, its GenerativeBenchmarksReport, schema
version 2):

    metadata     version, guidellm_version
    config       the run's arguments: backend (target, model), profile, data, tokenizer
    benchmarks   one per strategy the run tried; a sweep, or `--override profile.streams 2,4`,
                 tries several. Each has
        config.strategy  type_ and its streams or rate; guidellm names it "concurrent@4",
                         "poisson@2.00", "throughput@unlimited", "synchronous"
        requests         successful, incomplete (cancelled when the benchmark ended), errored:
                         a list each, of which every request has
            info.timings   queued, request_start (sent), first_token_iteration,
                           last_token_iteration (unix s), token_iterations (chunks with tokens)
            info.error     why it failed
            prompt_tokens, output_tokens   the server's usage counts (output: the chunks' count
                                           when the server sent no usage)

What guidellm does not record is when each token between the first and the last came: its
ITL is a request's mean gap, (last - first) / (output_tokens - 1), and its ITL distribution
is of those means, weighted by tokens. The timeline spaces a request's tokens evenly between
its measured first and last (`meta["token_times"]` says so), so the views' TTFT, TPOT and
end-to-end latency are guidellm's own measurements and their ITL is guidellm's definition
of it; the gaps between two tokens, and their tail (lesson 7), only bench-serve records.

A request starts on the timeline when it was sent (request_start), as with vLLM's client:
queued -> request_start is guidellm's own queue (a worker, a free stream), not the server's.
Failed requests are marked as every client loader marks them (minilm/timeline.py): "error"
when no token came, "incomplete" when tokens came and then it stopped; the error says
which of guidellm's lists it came from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..timeline import ERROR, INCOMPLETE, RequestRecord, Timeline

STATUSES = ("successful", "incomplete", "errored")
EVENLY = "first and last token measured; guidellm records no time for those between: spaced evenly"


def is_guidellm_report(r: dict[str, Any]) -> bool:
    """Whether a result object is a guidellm report (its benchmarks hold the requests)."""
    return isinstance(r.get("benchmarks"), list) and "metadata" in r


def strategy_name(benchmark: dict[str, Any]) -> str:
    """The benchmark's strategy as guidellm prints it (guidellm/scheduler/strategies.py)."""
    s = benchmark["config"]["strategy"]
    kind = s["type_"]
    if kind == "concurrent":
        return f"concurrent@{s['streams']}"
    if kind == "throughput":
        return f"throughput@{s.get('max_concurrency') or 'unlimited'}"
    if kind in ("constant", "poisson"):
        return f"{kind}@{s['rate']:.2f}"
    if kind == "trace":
        return f"trace@{s['time_scale']:.2f}"
    return kind


def pick_benchmark(report: dict[str, Any], benchmark: int | str | None = None) -> dict[str, Any]:
    """One benchmark of a run: by index, by strategy name, or (None) the only one."""
    benchmarks = report["benchmarks"]
    names = [strategy_name(b) for b in benchmarks]
    listed = ", ".join(f"{i}: {n}" for i, n in enumerate(names))
    if not benchmarks:
        raise ValueError(
            "the guidellm report has no benchmarks (the run ended before one finished)"
        )
    if benchmark is None:
        if len(benchmarks) > 1:
            raise ValueError(
                f"the guidellm report has {len(benchmarks)} benchmarks ({listed}): pick one with "
                f"benchmark=INDEX or benchmark=NAME"
            )
        return benchmarks[0]
    if isinstance(benchmark, int) and not isinstance(benchmark, bool):
        if not 0 <= benchmark < len(benchmarks):
            raise ValueError(f"benchmark={benchmark}: the report has {listed}")
        return benchmarks[benchmark]
    if benchmark not in names:
        raise ValueError(f"benchmark={benchmark!r}: the report has {listed}")
    return benchmarks[names.index(benchmark)]


def asked_max_tokens(request: dict[str, Any]) -> int | None:
    """The max_tokens guidellm sent (its request_args body), when it kept them."""
    try:
        body = json.loads(request.get("request_args") or "{}").get("body") or {}
    except json.JSONDecodeError:
        return None
    return body.get("max_completion_tokens") or body.get("max_tokens")


def sent_at(request: dict[str, Any]) -> float:
    """When guidellm sent it (request_start; earlier marks for a request it never sent)."""
    timings = request["info"]["timings"]
    return next(timings[k] for k in ("request_start", "resolve_start", "queued") if timings.get(k))


def to_record(request: dict[str, Any], status: str, t0: float) -> RequestRecord:
    timings = request["info"]["timings"]
    first, last = timings.get("first_token_iteration"), timings.get("last_token_iteration")
    arrival = sent_at(request) - t0
    n = request.get("output_tokens") or timings.get("token_iterations") or 0
    if status != "successful":
        n = n if first is not None else 0
    times = (np.linspace(first, last, n) - t0).tolist() if first is not None and n else []
    error = ""
    if status == "successful":
        reason = "finished"
    else:
        reason = INCOMPLETE if times else ERROR
        error = f"guidellm {status}: {request['info'].get('error') or 'no message'}"
    return RequestRecord(
        request_id=str(request["request_id"]),
        arrival=float(arrival),
        prompt_len=int(request.get("prompt_tokens") or 0),
        max_tokens=int(asked_max_tokens(request) or n),
        t_scheduled=None,
        t_first_token=times[0] if times else None,
        token_times=times,
        t_finished=times[-1] if times else float(arrival),
        output_len=n,
        finish_reason=reason,
        preemptions=0,
        error=error,
    )


def report_to_timeline(
    report: dict[str, Any], benchmark: int | str | None = None, label: str | None = None
) -> Timeline:
    """A row per request of one benchmark, every status, in the order they were sent."""
    b = pick_benchmark(report, benchmark)
    listed = [(q, s) for s in STATUSES for q in b["requests"].get(s) or []]
    listed.sort(key=lambda qs: sent_at(qs[0]))
    t0 = sent_at(listed[0][0]) if listed else 0.0
    name = strategy_name(b)
    made = b.get("scheduler_metrics", {}).get("requests_made", {}).get("total")
    backend = report.get("config", {}).get("spec", {}).get("backend", {})
    meta = {
        "policy": label or f"guidellm {name}",
        "clock": "client",
        "model": backend.get("model") or None,
        "source": "guidellm report (client side)",
        "benchmark": name,
        "has_start_times": True,
        "duration": b.get("duration"),
        "token_times": EVENLY,
        "guidellm_version": report["metadata"].get("guidellm_version"),
    }
    if made is not None and made > len(listed):  # guidellm keeps a sample when asked to
        meta["sampled"] = f"the report holds {len(listed)} of the benchmark's {made} requests"
    return Timeline(steps=[], requests=[to_record(q, s, t0) for q, s in listed], meta=meta)


# ---- running guidellm ---------------------------------------------------------------------
def guidellm_command(
    target: str,
    output: str | Path,
    *,
    concurrency: int,
    num_requests: int,
    prompt_tokens: int,
    output_tokens: int,
    tokenizer: str | Path,
    endpoint: str = "/v1/chat/completions",
) -> list[str]:
    """`guidellm run` at a fixed concurrency, synthetic prompts of fixed lengths, into a JSON
    report. `tokenizer`: a local checkpoint directory (its tokenizer.json), so guidellm needs
    no download; run it with HF_HUB_OFFLINE=1 in its environment to make sure."""
    data = f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}"
    return [
        sys.executable,
        "-m",
        "guidellm",
        "run",
        "--backend",
        f"kind=openai_http,target={target},request_format={endpoint}",
        "--profile",
        f"kind=concurrent,streams={concurrency}",
        "--constraint",
        f"kind=max_requests,count={num_requests}",
        "--data",
        data,
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer}",
        "--output",
        f"kind=json,path={output}",
        "--disable-console",
    ]
