"""Speculative decoding on this CPU: output tok/s and TPOT with speculation off, n-gram and draft model.

    python bench/spec_decode.py [--repeats 3] [--out bench/results/spec_decode.json]
    python bench/spec_decode.py --show bench/results/spec_decode.json

The `docstrings` model (the target) completes held-out docstrings (the `docstrings`
workload preset: each stops at its EOS or max_tokens), one thread, greedy, measured clock.

1. choose   at batch 1, every proposer setting below against speculation off; the best
            n-gram and the best draft-model setting go on
2. batches  speculation off, best n-gram and best draft at max_num_seqs 1 to 64 (the
            workload has 2 x batch requests, at least 8): where does the gain end? Batch 1
            is measured again: the best of many noisy settings overstates its own speed
3. checks   greedy tokens identical to speculation off in every run; the better proposer
            gives at least 1.5x output tok/s at batch 1 in its second measurement (issue
            17's goal)
4. simulated Llama-3-8B on an H100 with a Llama-3.2-1B draft, k = 4, acceptance i.i.d. at
            alpha 0.5, 0.7, 0.9 (minilm/sim/spec_speedup.py): the same question at GPU scale,
            SIMULATED (cost model), B requests arriving together at max_num_seqs B

Each setting runs --repeats times, interleaved with the others (the machine may be shared:
the conditions record its load); a row keeps the median run. Why the gain ends: a verifying
step computes 1 + k tokens per sequence; at batch 1 that costs about what one token does (the
step is overhead- and weight-bound), at batch 16 the extra tokens cost real compute.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm import Engine, EngineConfig, make_workload, summarize  # noqa: E402
from minilm.sim import spec_speedup_table  # noqa: E402

SETTINGS = {  # name -> speculative_config (vLLM's keys)
    "off": None,
    **{
        f"ngram k={k} min={m}": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": m,
            "prompt_lookup_max": 5,
        }
        for m in (1, 2)
        for k in (2, 4, 6, 8)
    },
    **{
        f"draft k={k}": {
            "method": "draft_model",
            "model": "docstrings-draft",
            "num_speculative_tokens": k,
        }
        for k in (1, 2, 3)
    },
}
GOAL = 1.5  # issue 17: the better proposer's output tok/s at batch 1, over speculation off
BATCHES = (1, 2, 4, 8, 16, 32, 64)
SIM_ALPHAS, SIM_BATCHES = (0.5, 0.7, 0.9), (1, 8, 32, 64, 128, 256, 512, 1024)


def run(setting: str, batch: int, threads: int) -> tuple[dict, dict]:
    """(summarize()'s metrics, each request's output tokens) of one run."""
    engine = Engine(
        "docstrings",
        EngineConfig(max_num_seqs=batch, cpu_threads=threads, speculative_config=SETTINGS[setting]),
    )
    engine.add_workload(make_workload("docstrings", max(8, 2 * batch), seed=0))
    timeline = engine.run()
    return summarize(timeline), {r.request_id: r.output_ids for r in timeline.requests}


def measure(settings: list[str], batch: int, threads: int, repeats: int) -> list[dict]:
    """One row per setting: the median run's numbers, and whether its tokens match speculation off."""
    runs: dict[str, list] = {s: [] for s in settings}
    for _ in range(repeats):
        for s in settings:  # interleaved, so a slow minute of a shared machine hits every setting
            runs[s].append(run(s, batch, threads))
    base_tokens = runs["off"][0][1]
    rows = []
    for s in settings:
        metrics = sorted((m for m, _ in runs[s]), key=lambda m: m["output_tok_per_s"])
        m = metrics[len(metrics) // 2]
        rows.append(
            {
                "batch": batch,
                "setting": s,
                "output_tok_per_s": m["output_tok_per_s"],
                "tpot_p50": m["tpot_p50"],
                "acceptance_rate": m["spec_acceptance_rate"],
                "acceptance_length": m["spec_mean_acceptance_length"],
                "repeats_tok_per_s": [r["output_tok_per_s"] for r, _ in runs[s]],
                "same_tokens": all(tokens == base_tokens for _, tokens in runs[s]),
            }
        )
    off = next(r["output_tok_per_s"] for r in rows if r["setting"] == "off")
    for r in rows:
        r["speedup"] = r["output_tok_per_s"] / off
    return rows


def best(rows: list[dict], method: str) -> dict:
    return max((r for r in rows if r["setting"].startswith(method)), key=lambda r: r["speedup"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "spec_decode.json"))
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    torch.set_num_threads(args.threads)
    t0, load0 = time.time(), os.getloadavg()[0]
    print("batch 1, every setting ...", flush=True)
    rows = [r | {"stage": "choose"} for r in measure(list(SETTINGS), 1, args.threads, args.repeats)]
    chosen = ["off", best(rows, "ngram")["setting"], best(rows, "draft")["setting"]]
    for b in (
        BATCHES
    ):  # batch 1 again: the chosen settings' own runs, not the best of many (a biased max)
        print(f"batch {b}: {', '.join(chosen)} ...", flush=True)
        rows += [r | {"stage": "batches"} for r in measure(chosen, b, args.threads, args.repeats)]
    gain_ends = {
        s: next((r["batch"] for r in rows if r["setting"] == s and r["speedup"] < 1), None)
        for s in chosen[1:]
    }
    print("simulated H100 ...", flush=True)
    simulated = [
        r | {"stage": "simulated", "alpha": a}
        for a in SIM_ALPHAS
        for r in spec_speedup_table(acceptance=a, k=4, batch_sizes=SIM_BATCHES)
    ]
    again = [r for r in rows if r["stage"] == "batches" and r["batch"] == 1]
    better = max(best(again, "ngram"), best(again, "draft"), key=lambda r: r["speedup"])
    checks = [
        report.check(
            "greedy tokens identical to speculation off (all runs)",
            all(r["same_tokens"] for r in rows),
            "==",
            True,
        ),
        report.check(
            f"better proposer ({better['setting']}) at batch 1 (x)", better["speedup"], ">=", GOAL
        ),
    ]
    checks += [
        report.check(f"{s}: first batch without a gain (seqs)", b)
        for s, b in gain_ends.items()
        if b is not None
    ]
    sim_ends = {
        a: next((r["batch_size"] for r in simulated if r["alpha"] == a and r["speedup"] < 1), None)
        for a in SIM_ALPHAS
    }  # None: a gain at every batch tried
    checks += [
        report.check(f"SIMULATED alpha {a}: first batch without a gain (seqs)", b)
        for a, b in sim_ends.items()
        if b is not None
    ]
    conditions = report.machine() | {
        "target": "docstrings",
        "draft": "docstrings-draft",
        "workload": "docstrings (held-out, EOS or max_tokens)",
        "threads": args.threads,
        "repeats": args.repeats,
        "greedy": True,
        "clock": "measured",
        "loadavg_1min_start": load0,
        "loadavg_1min_end": os.getloadavg()[0],
        "bench_s": time.time() - t0,
    }
    conditions["simulated"] = {
        "model": "llama-3-8b",
        "device": "h100",
        "draft": "llama-3.2-1b",
        "k": 4,
        "prompt_len": 128,
        "max_tokens": 256,
        "policy": "continuous",
    }
    res = report.result("spec_decode", report.command_line(), conditions, rows + simulated, checks)
    report.write(args.out, res)
    show(res)
    print(f"JSON: {args.out}")


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"target {c['target']}, draft {c['draft']}; {c['workload']}; {c['threads']} thread(s), "
            f"median of {c['repeats']} runs; load {c['loadavg_1min_start']:.1f} -> "
            f"{c['loadavg_1min_end']:.1f}",
            report.about(c),
        )
    )
    columns = [
        report.Column("batch (seqs)", "batch", "d"),
        report.Column("setting", "setting"),
        report.Column("output (tok/s)", "output_tok_per_s", ".0f"),
        report.Column("vs off (x)", "speedup", ".2f"),
        report.Column("TPOT p50 (ms)", "tpot_p50", ".2f", 1e3),
        report.Column("drafts accepted (%)", "acceptance_rate", ".0%"),
        report.Column("tokens per verify (tokens)", "acceptance_length", ".2f"),
        report.Column("same tokens", "same_tokens"),
    ]
    report.print_table([r for r in res["rows"] if r["stage"] != "simulated"], columns)
    s = c["simulated"]
    print(
        f"\nSIMULATED (cost model, not measured): {s['model']} on an {s['device'].upper()}, {s['draft']} draft, "
        f"k = {s['k']}, acceptance i.i.d.; B requests of {s['prompt_len']} + {s['max_tokens']} tokens at once"
    )
    report.print_table(
        [r for r in res["rows"] if r["stage"] == "simulated"],
        [
            report.Column("alpha (share)", "alpha", ".1f"),
            report.Column("batch (seqs)", "batch_size", "d"),
            report.Column("off (tok/s)", "tok_per_s_off", ".0f"),
            report.Column("on (tok/s)", "tok_per_s_on", ".0f"),
            report.Column("on / off (x)", "speedup", ".2f"),
            report.Column("TPOT off (ms)", "tpot_ms_off", ".2f"),
            report.Column("TPOT on (ms)", "tpot_ms_on", ".2f"),
            report.Column("tokens per verify (tokens)", "mean_acceptance_length", ".2f"),
        ],
    )
    report.print_checks(res["checks"])


if __name__ == "__main__":
    main()
