"""The lab's client against guidellm's: the same server, the same synthetic load, both tools' numbers.

    python bench/guidellm_vs_bench_serve.py [--repeats 3] [--num-requests 64] [--concurrency 16]
    python bench/guidellm_vs_bench_serve.py --show bench/results/guidellm_vs_bench_serve.json

One `minilm serve --model docstrings` (continuous batching); each repeat runs, in turn (the
order alternating so that a drift of the machine falls on both),
  bench-serve  `python -m minilm bench-serve --endpoint /v1/chat/completions --workload random
               --random-input-len P --random-output-len O --ignore-eos --max-concurrency C`
  guidellm     `guidellm run` at concurrency C, synthetic prompts of P tokens, O output tokens
               (guidellm_result.guidellm_command: its tokenizer is the checkpoint's, no download)
Both send every request through the chat API with ignore_eos, so every answer has O tokens.

The table gives each metric as each tool reports it: the median of the repeats and their
range. Where the two define a metric alike (TTFT, mean ITL, output tok/s), the check says
whether their medians lie within the repeats' spread of each other. Where they differ,
`definitions` (printed under the table) says how; the lab's definitions are vLLM's, the ones
lessons 1-9 teach (minilm/metrics.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from minilm.client import bench_serve  # noqa: E402
from minilm.client.guidellm_result import guidellm_command, pick_benchmark  # noqa: E402
from minilm.client.process import ServerProcess  # noqa: E402
from minilm.model.loader import resolve_model_path  # noqa: E402

# (metric, unit, bench-serve's field, guidellm's metric and statistic, alike?)
METRICS = [
    ("TTFT mean", "ms", "mean_ttft_ms", ("time_to_first_token_ms", "mean"), True),
    ("TTFT p50", "ms", "median_ttft_ms", ("time_to_first_token_ms", "median"), True),
    ("ITL mean", "ms", "mean_itl_ms", ("inter_token_latency_ms", "mean"), True),
    ("ITL p50", "ms", "median_itl_ms", ("inter_token_latency_ms", "median"), False),
    ("ITL p99", "ms", "p99_itl_ms", ("inter_token_latency_ms", "p99"), False),
    ("TPOT mean", "ms", "mean_tpot_ms", ("time_per_output_token_ms", "mean"), False),
    ("output", "tok/s", "output_throughput", ("output_tokens_per_second", "mean"), True),
]
DEFINITIONS = {
    "TTFT": "both: from sending the request to the first chunk with a token (guidellm's "
    "percentiles take the value at the rank, vLLM's and numpy's interpolate)",
    "ITL": "bench-serve (vLLM, the lessons): every gap between two tokens of a request, pooled; "
    "guidellm: a request's mean gap (last - first) / (tokens - 1), weighted by tokens. The means "
    "agree; guidellm's p50 and p99 are of request means, so a stall between two tokens never shows",
    "TPOT": "bench-serve (vLLM, the lessons): (last - first token) / (tokens - 1), guidellm's ITL; "
    "guidellm's TPOT: (last token - sent) / tokens, the first token's wait included",
    "output": "bench-serve: output tokens / (first send to last answer); guidellm: output tokens "
    "over its measured window, completed requests",
}
COLUMNS = [
    report.Column("metric", "metric"),
    report.Column("bench-serve (row's unit)", "bench-serve", ".1f"),
    report.Column("range", "bench-serve range"),
    report.Column("guidellm (row's unit)", "guidellm", ".1f"),
    report.Column("range ", "guidellm range"),
    report.Column("defined alike", "alike"),
]


def run_bench_serve(url: str, args) -> dict:
    r = asyncio.run(
        bench_serve.run(
            url,
            "random",
            args.num_requests,
            max_concurrency=args.concurrency,
            ignore_eos=True,
            endpoint="/v1/chat/completions",
            random_input_len=args.prompt_tokens,
            random_output_len=args.output_tokens,
            quiet=True,
        )
    )
    assert r["failed"] == 0 and set(r["output_lens"]) == {args.output_tokens}, r["errors"]
    return {name: r[field] for name, _, field, _, _ in METRICS}


def run_guidellm(url: str, args, folder: Path, i: int) -> dict:
    path = folder / f"guidellm_{i}.json"
    command = guidellm_command(
        url,
        path,
        concurrency=args.concurrency,
        num_requests=args.num_requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        tokenizer=resolve_model_path("docstrings"),
    )
    subprocess.run(
        command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True, capture_output=True
    )
    b = pick_benchmark(json.loads(path.read_text()))
    done = b["requests"]["successful"]
    assert len(done) == args.num_requests and {q["output_tokens"] for q in done} == {
        args.output_tokens
    }
    summaries = {name: b["metrics"][m]["successful"] for name, _, _, (m, _), _ in METRICS}
    return {
        name: summaries[name].get(stat, summaries[name]["percentiles"].get(stat))
        for name, _, _, (_, stat), _ in METRICS
    }


def rows_and_checks(runs: dict[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    rows, checks = [], []
    for name, unit, _, _, alike in METRICS:
        row = {"metric": f"{name} ({unit})", "alike": "yes" if alike else "no"}
        spread = {}
        for tool, values in runs.items():
            v = [run[name] for run in values]
            row[tool], spread[tool] = float(np.median(v)), max(v) - min(v)
            row[f"{tool} range"] = f"{min(v):.1f}-{max(v):.1f}"
        rows.append(row)
        if alike:
            gap = abs(row["bench-serve"] - row["guidellm"])
            checks.append(
                report.check(
                    f"{name}: |bench-serve - guidellm| / the larger range",
                    gap / max(max(spread.values()), 1e-9),
                    "<=",
                    1.0,
                    difference=gap,
                )
            )
    return rows, checks


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"minilm serve --model docstrings, {c['num_requests']} requests at concurrency "
            f"{c['concurrency']}, {c['prompt_tokens']} prompt + {c['output_tokens']} output tokens "
            f"(chat API, ignore_eos), {c['repeats']} repeats: median [range]",
            f"guidellm {c.get('guidellm')}",
            f"load {c['loadavg_5min']:.1f}",
            report.about(c),
        )
    )
    report.print_table(res["rows"], COLUMNS)
    print()
    for metric, text in c["definitions"].items():
        print(f"{metric}: {text}")
    print()
    report.print_checks(res["checks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/guidellm_vs_bench_serve.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=64)
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    t_start = time.perf_counter()
    runs: dict[str, list[dict]] = {"bench-serve": [], "guidellm": []}
    folder = Path(tempfile.mkdtemp(prefix="guidellm-bench-"))
    # one torch thread: the server shares the machine's cores with both clients
    with ServerProcess(max_num_seqs=args.concurrency, cpu_threads=1) as server:
        warm = argparse.Namespace(**{**vars(args), "num_requests": args.concurrency})
        run_bench_serve(server.url, warm)  # the first steps of a fresh server are slower
        for i in range(args.repeats):
            tools = ("bench-serve", "guidellm") if i % 2 == 0 else ("guidellm", "bench-serve")
            for tool in tools:
                if tool == "bench-serve":
                    runs[tool].append(run_bench_serve(server.url, args))
                else:
                    runs[tool].append(run_guidellm(server.url, args, folder, i))
    rows, checks = rows_and_checks(runs)
    conditions = report.machine() | {
        "guidellm": version("guidellm"),
        "num_requests": args.num_requests,
        "concurrency": args.concurrency,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "repeats": args.repeats,
        "runs": runs,
        "definitions": DEFINITIONS,
        "loadavg_5min": os.getloadavg()[1],
        "bench_s": time.perf_counter() - t_start,
    }
    res = report.result("guidellm_vs_bench_serve", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}  ({conditions['bench_s']:.0f} s)")


if __name__ == "__main__":
    main()
