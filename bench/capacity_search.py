"""How long a capacity search takes (minilm/sim/search.py), and what it finds.

    python bench/capacity_search.py [--num-requests 200] [--sample 2 --sample-requests 10000]
    python bench/capacity_search.py --show bench/results/capacity_search.json

The space: Llama-3-8B on H100, A100, L40S or L4, TP 1 or 2, 1, 2 or 4 colocated replicas or
1P1D / 1P3D, continuous batching or chunked prefill (token budget 2,048 or 8,192), a
least-outstanding or a round-robin router: 216 deployments. The ask: 40 req/s of `mixed` with
>= 90% of requests within TTFT 500 ms and TPOT 20 ms. Every deployment's capacity is found by
bisection (to 5%) with `--num-requests` requests a run, in local processes (all cores).

The goal (issue 27): >= 200 deployments at 10,000 requests a run in under 10 minutes. A run's
time grows with its requests, so `--sample` deployments (evenly spaced through the space) are
searched again at `--sample-requests`; the time the whole space would take at that count is
estimated from them: the full search's runs, times the sample's seconds a simulated request,
over the cores. Every capacity is SIMULATED; GPU prices are assumptions (search.GPU_PRICES).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm.sim.search import (  # noqa: E402
    GPU_PRICES,
    Ask,
    cheapest,
    deployment_space,
    rank,
    search,
)

GOAL_S, GOAL_DEPLOYMENTS, GOAL_REQUESTS = 600.0, 200, 10_000
SPACE = dict(
    devices=("h100", "a100", "l40s", "l4"),
    tps=(1, 2),
    layouts=("1", "2", "4", "1:1", "1:3"),
    policies=("continuous", "chunked"),
    max_num_seqs=(128,),
    budgets=(2048, 8192),
    routers=("least_outstanding", "round_robin"),
)


def timed_search(ask: Ask, space, workers, ray) -> tuple[list[dict], float]:
    start = time.perf_counter()
    caps = search(ask, space, workers, ray)
    return rank(ask, caps), time.perf_counter() - start


def simulated_requests(rows: list[dict], num_requests: int) -> int:
    return sum(r["runs"] for r in rows) * num_requests


COLUMNS = [
    report.Column("rank (count)", "rank", "d"),
    report.Column("deployment", "deployment"),
    report.Column("GPUs (count)", "gpus", "d"),
    report.Column("cost ($/h)", "usd_per_hour", ".2f"),
    report.Column("capacity (req/s)", "goodput_req_per_s", ".1f"),
    report.Column("at ceiling", "capped"),
    report.Column("meets", "meets"),
    report.Column("at load ($/M output tok)", "usd_per_mtok_at_load", ".3f"),
    report.Column("at capacity ($/M output tok)", "usd_per_mtok_at_capacity", ".3f"),
    report.Column("runs (count)", "runs", "d"),
    report.Column("wall (s)", "wall_s", ".1f"),
]


def show(res: dict, top: int = 15) -> None:
    c = res["conditions"]
    a = c["args"]
    print(
        report.joined(
            f"SIMULATED capacity of {c['deployments']} deployments of {a['model']} on {a['workload']}: "
            f">= 90% within TTFT {a['ttft_slo'] * 1000:.0f} ms, TPOT {a['tpot_slo'] * 1000:.0f} ms; "
            f"load {a['load']} req/s; {c['workers']} workers"
            + (f" on Ray ({a['ray']})" if a["ray"] else ""),
            "prices ASSUMED ($/GPU-hour): "
            + ", ".join(f"{k} {v:.2f}" for k, v in c["prices"].items()),
            report.about(c),
        )
    )
    for phase in ("full", "sample"):
        rows = [r for r in res["rows"] if r["phase"] == phase]
        n = rows[0]["num_requests"] if rows else 0
        print(f"\n{phase}: {len(rows)} deployments, {n} requests a run" + (
            f" (the first {top} of the ranking)" if phase == "full" and len(rows) > top else ""
        ))  # fmt: skip
        report.print_table(rows[:top] if phase == "full" else rows, COLUMNS)
    print()
    report.print_checks(res["checks"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--workload", default="mixed")
    p.add_argument("--load", type=float, default=40.0, help="req/s")
    p.add_argument("--ttft-slo", type=float, default=0.5)
    p.add_argument("--tpot-slo", type=float, default=0.02)
    p.add_argument("--num-requests", type=int, default=200, help="requests a run, full space")
    p.add_argument("--sample", type=int, default=2, help="deployments searched again at ...")
    p.add_argument("--sample-requests", type=int, default=GOAL_REQUESTS)
    p.add_argument("--workers", type=int, default=None, help="local processes (default: cores)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS")
    p.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "capacity_search.json"
    )
    report.add_show_option(p)
    args = p.parse_args()
    if args.show:
        return show(report.load(args.show))
    space = deployment_space(**SPACE)

    def ask(n: int) -> Ask:
        return Ask(args.model, args.workload, args.load, args.ttft_slo, args.tpot_slo, n)

    full, full_s = timed_search(ask(args.num_requests), space, args.workers, args.ray)
    print(
        f"full: {len(space)} deployments x {args.num_requests} requests: {full_s:.1f} s", flush=True
    )
    step = max(1, len(space) // max(1, args.sample))
    sampled = space[::step][: args.sample]
    sample, sample_s = timed_search(ask(args.sample_requests), sampled, args.workers, args.ray)
    print(f"sample: {len(sampled)} x {args.sample_requests} requests: {sample_s:.1f} s", flush=True)
    rows = [r | {"phase": "full", "num_requests": args.num_requests} for r in full]
    rows += [r | {"phase": "sample", "num_requests": args.sample_requests} for r in sample]
    workers = args.workers or os.cpu_count() or 1
    # seconds a simulated request costs at the goal's run length (one core), from the sample;
    # the whole space at that length: the full search's runs x that, spread over the workers
    per_request = sum(r["wall_s"] for r in sample) / simulated_requests(
        sample, args.sample_requests
    )
    estimate = simulated_requests(full, args.sample_requests) * per_request / workers
    best = cheapest(full)
    conditions = report.machine() | {
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "show")},
        "space": SPACE,
        "deployments": len(space),
        "workers": workers,
        "prices": GPU_PRICES,
        "load_1min": os.getloadavg()[0],
        "cheapest": best["deployment"] if best else None,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    full_runs = sum(r["runs"] for r in full)
    checks = [
        report.check(
            "every request of every run served once", all(r["all_served"] for r in rows), "==", True
        ),
        report.check("deployments searched (count)", len(space), ">=", GOAL_DEPLOYMENTS),
        report.check(f"full search, {args.num_requests} requests a run (s)", full_s),
        report.check("full search: runs (count)", full_runs),
        report.check(
            f"sample: {len(sampled)} deployments, {args.sample_requests} requests a run (s)",
            sample_s,
        ),
        report.check("simulated requests a core-second (count)", 1 / per_request),
        report.check(
            f"estimated: {len(space)} deployments x {args.sample_requests} requests a run (s)",
            estimate,
            "<",
            GOAL_S,
        ),
    ]
    res = report.result("capacity_search", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
