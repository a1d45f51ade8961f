"""The three policies on the real `tiny` model on this CPU: a table and JSON.

    python bench/cpu_policies.py [--out bench/results/cpu_policies.json]
    python bench/cpu_policies.py --show bench/results/cpu_policies.json   # print a saved result

Checks the issue's targets: on `mixed`, continuous output tokens/s >= 2.5x static;
on `long-prompt`, chunked p99 ITL >= 4x lower than continuous at <= 15% lower throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install needed

from bench import report  # noqa: E402
from minilm import Engine, EngineConfig, make_workload, summarize  # noqa: E402
from minilm.workload import recommended_knobs  # noqa: E402

SCENARIOS = {
    # name: (preset, requests, knobs)
    "mixed": ("mixed", 96, dict(max_num_seqs=32)),
    "long-prompt": ("long-prompt", 48, dict(max_num_seqs=48)),
}
CHUNK_BUDGET = (
    192  # mixed; long-prompt uses its preset's recommended budget (workload.recommended_knobs)
)


def run(preset: str, n: int, policy: str, knobs: dict, seed: int, threads: int) -> dict:
    knobs = {
        "max_num_batched_tokens": CHUNK_BUDGET if policy == "chunked" else None,
        **knobs,
        **recommended_knobs(preset, n, policy),
    }
    cfg = EngineConfig(policy=policy, cpu_threads=threads, **knobs)
    engine = Engine("tiny", cfg)
    specs = make_workload(
        preset,
        n,
        seed=seed,
        vocab_size=engine.model_config.vocab_size,
        max_model_len=engine.config.max_model_len,
        long_prompt_delay=0.15,
    )
    engine.add_workload(specs, ignore_eos=True)
    t0 = time.perf_counter()
    tl = engine.run()
    m = summarize(tl) | {"max_num_batched_tokens": engine.config.max_num_batched_tokens}
    m["run_s"] = time.perf_counter() - t0
    return m


COLUMNS = [
    report.Column("workload", "workload"),
    report.Column("policy", "policy"),
    report.Column("out (tok/s)", "output_tok_per_s", ".0f"),
    report.Column("TTFT p50 (s)", "ttft_p50", ".3f"),
    report.Column("TTFT p99 (s)", "ttft_p99", ".3f"),
    report.Column("ITL p50 (ms)", "itl_p50", ".1f", 1e3),
    report.Column("ITL p99 (ms)", "itl_p99", ".1f", 1e3),
    report.Column("ITL max (ms)", "itl_max", ".1f", 1e3),
    report.Column("batch (seqs)", "mean_batch_size", ".1f"),
    report.Column("padding (fraction)", "padding_fraction", ".2f"),
    report.Column("steps (count)", "steps", "d"),
]


def checks(rows: list[dict]) -> list[dict]:
    """The issue's targets, from the rows."""
    results = {f"{r['workload']}/{r['policy']}": r for r in rows}
    mixed_speedup = (
        results["mixed/continuous"]["output_tok_per_s"]
        / results["mixed/static"]["output_tok_per_s"]
    )
    lp_c, lp_k = results["long-prompt/continuous"], results["long-prompt/chunked"]
    itl_gain = lp_c["itl_p99"] / lp_k["itl_p99"]
    stall_gain = lp_c["itl_max"] / lp_k["itl_max"]
    tput_loss = 1 - lp_k["output_tok_per_s"] / lp_c["output_tok_per_s"]
    return [
        report.check("mixed: continuous / static output tok/s", mixed_speedup, ">=", 2.5),
        report.check("long-prompt: continuous / chunked p99 ITL", itl_gain, ">=", 4),
        report.check("long-prompt: continuous / chunked max ITL (the stall)", stall_gain, ">=", 4),
        report.check("long-prompt: chunked throughput loss vs continuous", tput_loss, "<=", 0.15),
    ]


def show(res: dict) -> None:
    c = res["conditions"]
    print(report.joined(f"tiny model, {c['threads']} thread(s)", report.about(c), sep=", "))
    report.print_table(res["rows"], COLUMNS)
    print()
    report.print_checks(res["checks"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/cpu_policies.json")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (EngineConfig.cpu_threads)"
    )
    ap.add_argument("--seed", type=int, default=0)
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    run(
        "uniform", 4, "continuous", dict(max_num_seqs=4), 0, args.threads
    )  # warm up kernels and allocator
    rows = []
    for name, (preset, n, knobs) in SCENARIOS.items():
        for policy in ("static", "continuous", "chunked"):
            m = run(preset, n, policy, knobs, args.seed, args.threads)
            rows.append({"workload": name, **m})
            print(f"{name} {policy}: {m['output_tok_per_s']:.0f} out tok/s", flush=True)
    conditions = report.machine() | {
        "threads": args.threads,
        "seed": args.seed,
        "scenarios": {
            name: {"preset": preset, "requests": n, **knobs}
            for name, (preset, n, knobs) in SCENARIOS.items()
        },
        "chunk_budget": {
            r["workload"]: r["max_num_batched_tokens"] for r in rows if r["policy"] == "chunked"
        },
    }
    res = report.result("cpu_policies", report.command_line(), conditions, rows, checks(rows))
    report.write(args.out, res)
    print()
    show(res)
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
