"""The three policies on the real `tiny` model on this CPU: a table and JSON.

    python bench/cpu_policies.py [--out bench/results/cpu_policies.json]

Checks the issue's targets: on `mixed`, continuous output tokens/s >= 2.5x static;
on `long-prompt`, chunked p99 ITL >= 4x lower than continuous at <= 15% lower throughput.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from minilm import Engine, EngineConfig, make_workload, summarize
from minilm.workload import recommended_knobs

SCENARIOS = {
    # name: (preset, requests, knobs)
    "mixed": ("mixed", 96, dict(max_num_seqs=32)),
    "long-prompt": ("long-prompt", 48, dict(max_num_seqs=48)),
}
CHUNK_BUDGET = 192  # mixed; long-prompt uses its preset's recommended budget (workload.recommended_knobs)


def run(preset: str, n: int, policy: str, knobs: dict, seed: int, threads: int) -> dict:
    knobs = {"max_num_batched_tokens": CHUNK_BUDGET if policy == "chunked" else None, **knobs,
             **recommended_knobs(preset, n, policy)}
    cfg = EngineConfig(policy=policy, cpu_threads=threads, **knobs)
    engine = Engine("tiny", cfg)
    specs = make_workload(preset, n, seed=seed, vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.config.max_model_len, long_prompt_delay=0.15)
    engine.add_workload(specs, ignore_eos=True)
    t0 = time.perf_counter()
    tl = engine.run()
    m = summarize(tl) | {"max_num_batched_tokens": engine.config.max_num_batched_tokens}
    m["run_s"] = time.perf_counter() - t0
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/cpu_policies.json")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (EngineConfig.cpu_threads)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run("uniform", 4, "continuous", dict(max_num_seqs=4), 0, args.threads)  # warm up kernels and allocator
    results = {}
    print(f"tiny model, {args.threads} threads, {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print(f"{'workload':12} {'policy':10} {'out tok/s':>9} {'TTFT p50 (s)':>12} {'TTFT p99 (s)':>12} "
          f"{'ITL p50 (ms)':>12} {'ITL p99 (ms)':>12} {'ITL max (ms)':>12} {'batch':>5} {'padding':>7} {'steps':>5}")
    for name, (preset, n, knobs) in SCENARIOS.items():
        for policy in ("static", "continuous", "chunked"):
            m = run(preset, n, policy, knobs, args.seed, args.threads)
            results[f"{name}/{policy}"] = m
            print(f"{name:12} {policy:10} {m['output_tok_per_s']:9.0f} {m['ttft_p50']:12.3f} {m['ttft_p99']:12.3f} "
                  f"{m['itl_p50'] * 1e3:12.1f} {m['itl_p99'] * 1e3:12.1f} {m['itl_max'] * 1e3:12.1f} "
                  f"{m['mean_batch_size']:5.1f} {m['padding_fraction']:7.2f} {m['steps']:5d}")
    mixed_speedup = results["mixed/continuous"]["output_tok_per_s"] / results["mixed/static"]["output_tok_per_s"]
    lp_c, lp_k = results["long-prompt/continuous"], results["long-prompt/chunked"]
    itl_gain = lp_c["itl_p99"] / lp_k["itl_p99"]
    stall_gain = lp_c["itl_max"] / lp_k["itl_max"]
    tput_loss = 1 - lp_k["output_tok_per_s"] / lp_c["output_tok_per_s"]
    checks = {
        "mixed: continuous / static output tok/s": (mixed_speedup, ">= 2.5", mixed_speedup >= 2.5),
        "long-prompt: continuous / chunked p99 ITL": (itl_gain, ">= 4", itl_gain >= 4),
        "long-prompt: continuous / chunked max ITL (the stall)": (stall_gain, ">= 4", stall_gain >= 4),
        "long-prompt: chunked throughput loss vs continuous": (tput_loss, "<= 0.15", tput_loss <= 0.15),
    }
    print()
    for k, (v, target, ok) in checks.items():
        print(f"{k:52} {v:6.2f}  target {target:7}  {'PASS' if ok else 'FAIL'}")
    out = {"threads": args.threads, "chunk_budget": {name: results[f"{name}/chunked"]["max_num_batched_tokens"]
                                                     for name in SCENARIOS}, "results": results,
           "checks": {k: {"value": v, "target": t, "pass": ok} for k, (v, t, ok) in checks.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
