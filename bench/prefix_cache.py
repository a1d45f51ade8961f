"""Prefix caching on the real `tiny` model on this CPU, off vs on, in one run: a table and JSON.

    python bench/prefix_cache.py [--out bench/results/prefix_cache.json]
    python bench/prefix_cache.py --show bench/results/prefix_cache.json   # print a saved result

Workload: `shared-prefix`, 64 requests, seed 0: 4 system prompts of 256-511 tokens, each
request one of them plus a user turn of 8-32 tokens, 16-64 output tokens (--ignore-eos).
Targets (issue 12): with caching, output tokens/s at least 1.5x higher and TTFT p50 at
least 3x lower; the hit rate is printed. Simulated Llama-3-8B/H100 rows run the same
workload (the same token counts) through the cost model, for reference: on an H100 a
430-token prefill riding along with 16 decodes adds less than half a decode step, so
there caching buys less at these prompt lengths (lesson 8 shows longer ones).

Two measurements, because the two targets measure different things and no single run
carries both fairly:

  throughput  every request queued at t=0 (what vLLM's offline throughput benchmark
              does): the engine is the bottleneck, so output tokens/s is its capacity.
              TTFT in such a run is mostly time spent behind earlier requests: it grows
              with the number of requests and says little about a request's own latency.
  latency     Poisson arrivals at `--load` (0.5) times the capacity the engine *without*
              caching just measured, the same arrival times for both runs: neither queue
              grows without bound, so TTFT p50 is the wait for a step plus the request's
              own prefill, which caching shortens. Output tokens/s in this run is just the
              arrival rate for both, so it is not compared.

Why these knobs:

  max_num_seqs=16, the engine's default: the KV cache holds 16 full-length sequences,
      far more than either run uses, so caching wins here by computing fewer tokens, not
      by fitting more requests into memory (it does that too: lesson 8, section 5).
  64 requests: each of the 4 system prompts is computed once per run (the misses no
      cache avoids), so the hit rate (0.89) is near the 0.94 of a long-running server (2,000
      requests of the same preset), and a p50 over 64 requests is stable.
  policy continuous, the lab's default: a prompt runs whole in one step, so the runs
      differ only in the tokens that caching skips.
  load 0.5: busy enough that requests share steps, far enough from saturation that the
      uncached engine's queue stays short (its TTFT would otherwise measure the queue).
  `--repeats` (3) pairs of runs, caching off then on right after it, and the pair with the
      median gain: the machine is shared, and a pair run back to back sees about the same
      load; every pair's gain is in the JSON, to show the spread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install needed

from bench import report  # noqa: E402
from minilm import Engine, EngineConfig, make_workload, summarize  # noqa: E402
from minilm.sim import simulated_engine  # noqa: E402

WORKLOAD = "shared-prefix"
LLAMA3_VOCAB = 128256
TARGETS = {
    "output tok/s, on / off (all queued at t=0)": 1.5,
    "TTFT p50, off / on (Poisson arrivals)": 3.0,
}


def workload(n: int, seed: int, vocab_size: int, rate: float | None) -> list:
    return make_workload(WORKLOAD, n, seed=seed, vocab_size=vocab_size, rate=rate)


def run_cpu(specs: list, caching: bool, args) -> dict:
    cfg = EngineConfig(
        policy=args.policy,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=caching,
        cpu_threads=args.threads,
        record_kv_blocks=False,
    )
    engine = Engine("tiny", cfg)
    engine.add_workload(specs, ignore_eos=True)
    t0 = time.perf_counter()
    m = summarize(engine.run())
    m["run_s"] = time.perf_counter() - t0
    return m


def gain(phase: str, off: dict, on: dict) -> float:
    """How many times better caching is: output tokens/s for throughput, TTFT p50 for latency."""
    if phase == "throughput":
        return on["output_tok_per_s"] / off["output_tok_per_s"]
    return off["ttft_p50"] / on["ttft_p50"]


def median_pair(pairs: list[tuple[dict, dict]], phase: str) -> dict:
    """{False: off run, True: on run, "gain", "gains"} for the pair with the median gain."""
    gains = [gain(phase, off, on) for off, on in pairs]
    k = sorted(range(len(pairs)), key=gains.__getitem__)[len(pairs) // 2]
    return {False: pairs[k][0], True: pairs[k][1], "gain": gains[k], "gains": gains}


def measured(specs: list, phase: str, args) -> dict:
    """`args.repeats` pairs of runs, caching off then on right after it: each pair shares the
    machine's load of the moment, and the pair with the median gain is kept."""
    return median_pair(
        [(run_cpu(specs, False, args), run_cpu(specs, True, args)) for _ in range(args.repeats)],
        phase,
    )


def simulated(specs: list, phase: str, args) -> dict:
    return median_pair(
        [(run_simulated(specs, False, args), run_simulated(specs, True, args))], phase
    )


def run_simulated(specs: list, caching: bool, args) -> dict:
    engine = simulated_engine(
        "llama-3-8b",
        "h100",
        policy=args.policy,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=caching,
        record_kv_blocks=False,
    )
    engine.add_workload(specs)
    return summarize(engine.run())


def measure(run, vocab_size: int, args) -> dict:
    """Both measurements on one clock: {"throughput" | "latency": {caching: metrics}, ...}.
    `run(specs, phase, args)` runs a workload off and on (`measured` or `simulated`)."""
    offline = run(workload(args.num_requests, args.seed, vocab_size, None), "throughput", args)
    capacity = (
        offline[False]["requests"] / offline[False]["wall_s"]
    )  # req/s the uncached engine sustains
    rate = args.load * capacity
    online = run(workload(args.num_requests, args.seed, vocab_size, rate), "latency", args)
    return {"throughput": offline, "latency": online, "rate": rate, "capacity": capacity}


def row(name: str, clock: str, rate: float | None, m: dict) -> dict:
    return {
        "run": name,
        "clock": clock,
        "arrivals": "all at t=0" if rate is None else f"{rate:.1f} req/s",
        "hit rate (%)": 100 * m["prefix_cache_hit_rate"],
        "out tok/s": m["output_tok_per_s"],
        "TTFT p50 (ms)": 1e3 * m["ttft_p50"],
        "TTFT p99 (ms)": 1e3 * m["ttft_p99"],
        "ITL p50 (ms)": 1e3 * m["itl_p50"],
        "span (s)": m["wall_s"],
    }


COLUMNS = [
    report.Column("run", "run"),
    report.Column("clock", "clock"),
    report.Column("arrivals", "arrivals"),
    report.Column("hit rate (%)", "hit rate (%)", ".1f"),
    report.Column("out (tok/s)", "out tok/s", ".0f"),
    report.Column("TTFT p50 (ms)", "TTFT p50 (ms)", ".1f"),
    report.Column("TTFT p99 (ms)", "TTFT p99 (ms)", ".1f"),
    report.Column("ITL p50 (ms)", "ITL p50 (ms)", ".1f"),
    report.Column("span (s)", "span (s)", ".2f"),
]


def table_rows(clock: str, label: str, res: dict) -> list[dict]:
    rows = []
    for phase, rate in (("throughput", None), ("latency", res["rate"])):
        for caching in (False, True):
            name = f"{label} {'on ' if caching else 'off'}"
            rows.append(row(name, clock, rate, res[phase][caching]))
    return rows


def ratios(res: dict) -> dict[str, float]:
    return dict(zip(TARGETS, (res["throughput"]["gain"], res["latency"]["gain"])))


def checks(cpu: dict, sim: dict) -> list[dict]:
    """The issue's targets are for the CPU run; the simulated gains are for reference (no target)."""
    out = [
        report.check(f"tiny/CPU: {what}", value, ">=", TARGETS[what], pairs=res["gains"])
        for (what, value), res in zip(ratios(cpu).items(), (cpu["throughput"], cpu["latency"]))
    ]
    return out + [
        report.check(f"llama-3-8b/H100 (simulated): {what}", value)
        for what, value in ratios(sim).items()
    ]


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"{c['workload']}, {c['num_requests']} requests, seed {c['seed']}, policy {c['policy']}, max_num_seqs "
            f"{c['max_num_seqs']}; latency runs at {c['load']:g} x the uncached capacity; CPU: tiny model, "
            f"{c['threads']} thread(s), median of {c['repeats']} pairs",
            f"load average {c['loadavg_5min']:.1f} over the last 5 min at the end (other work on the machine slows "
            f"every run)",
            report.about(c),
        )
    )
    report.print_table(res["rows"], COLUMNS)
    print()
    report.print_checks(res["checks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/prefix_cache.json")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--policy", default="continuous")
    ap.add_argument(
        "--load", type=float, default=0.5, help="arrival rate as a share of the uncached capacity"
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="pairs of runs (off, on); the median pair is kept"
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (EngineConfig.cpu_threads)"
    )
    ap.add_argument("--seed", type=int, default=0)
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    t_start = time.perf_counter()
    run_cpu(workload(4, 1, 512, None), False, args)  # warm up kernels and the allocator

    n, seed = args.num_requests, args.seed
    cpu = measure(measured, 512, args)  # the tiny model's vocabulary
    sim = measure(simulated, LLAMA3_VOCAB, args)

    rows = table_rows("measured", "tiny/CPU", cpu) + table_rows("simulated", "llama-3-8b/H100", sim)
    conditions = report.machine() | {
        "workload": WORKLOAD,
        "num_requests": n,
        "seed": seed,
        "policy": args.policy,
        "max_num_seqs": args.max_num_seqs,
        "load": args.load,
        "repeats": args.repeats,
        "threads": args.threads,
        "loadavg_5min": os.getloadavg()[1],
        "cpu": {"capacity_req_per_s": cpu["capacity"], "rate": cpu["rate"]},
        "simulated": {"capacity_req_per_s": sim["capacity"], "rate": sim["rate"]},
        "bench_s": time.perf_counter() - t_start,
    }
    res = report.result("prefix_cache", report.command_line(), conditions, rows, checks(cpu, sim))
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}  ({conditions['bench_s']:.0f} s)")


if __name__ == "__main__":
    main()
