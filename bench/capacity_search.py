"""How long a capacity search takes (minilm/sim/search.py), and what it finds.

    python bench/capacity_search.py [--num-requests 200] [--sample 3 --sample-requests 10000]
    python bench/capacity_search.py --num-requests 10000 --sample 0     # the real thing
    python bench/capacity_search.py --show bench/results/capacity_search.json

The space: Llama-3-8B on H100, A100, L40S or L4, TP 1 or 2, 1, 2 or 4 colocated replicas or
1P1D / 1P3D, continuous batching or chunked prefill (token budget 2,048 or 8,192), a
least-outstanding or a round-robin router: 216 deployments. The ask: 40 req/s of `mixed` with
>= 90% of requests within TTFT 500 ms and TPOT 20 ms. Every deployment's capacity is found by
bisection (to 5%) with `--num-requests` requests a run, in local processes (all cores), with
the search's shortcuts (early verdicts, a start from the cost model's estimate or a sibling's
capacity, the TPOT bound, alike deployments once); `--plain` searches the space again without
them, for the runs and requests they save.

The goal (issue 27): >= 200 deployments at 10,000 requests a run in under 10 minutes. The
search's tasks are families (the same GPUs in the same layout: search.measure_family), so
`--sample` whole families, evenly spaced among those that need a run (not every member ruled
out by the TPOT bound), are searched again at `--sample-requests`. The estimate for the whole
space at that count: the sample's mean core-seconds a family (the runs it actually took, the
requests it actually simulated) times the families that need runs, over the workers. Every
capacity is SIMULATED; GPU prices are assumptions (search.GPU_PRICES).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
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


def taken(rows: list[dict]) -> tuple[int, int]:
    """Runs and simulated requests the search actually took (a copy of an alike deployment's
    answer took none)."""
    own = [r for r in rows if not r["same_as"]]
    return sum(r["runs"] for r in own), sum(r["simulated_requests"] for r in own)


COLUMNS = [
    report.Column("rank (count)", "rank", "d"),
    report.Column("deployment", "deployment"),
    report.Column("GPUs (count)", "gpus", "d"),
    report.Column("cost ($/h)", "usd_per_hour", ".2f"),
    report.Column("capacity (req/s)", "goodput_req_per_s", ".1f"),
    report.Column("at ceiling", "capped"),
    report.Column("meets", "meets"),
    report.Column("at load ($/M output tok)", "usd_per_mtok_at_load", ".3f"),
    report.Column("estimate (req/s)", "estimate_req_per_s", ".1f"),
    report.Column("runs (count)", "runs", "d"),
    report.Column("simulated (requests)", "simulated_requests", "d"),
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
    for phase in ("full", "plain", "sample"):
        rows = [r for r in res["rows"] if r["phase"] == phase]
        if not rows:
            continue
        n = rows[0]["num_requests"]
        print(f"\n{phase}: {len(rows)} deployments, {n} requests a run" + (
            f" (the first {top} of the ranking)" if phase != "sample" and len(rows) > top else ""
        ))  # fmt: skip
        report.print_table(rows[:top] if phase != "sample" else rows, COLUMNS)
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
    p.add_argument("--sample", type=int, default=3, help="families searched again at ...")
    p.add_argument("--sample-requests", type=int, default=GOAL_REQUESTS)
    p.add_argument("--plain", action="store_true", help="and the space without the shortcuts")
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
    runs, simulated = taken(full)
    print(f"full: {len(space)} x {args.num_requests} requests: {full_s:.1f} s, {runs} runs, "
          f"{simulated} requests simulated", flush=True)  # fmt: skip
    rows = [r | {"phase": "full", "num_requests": args.num_requests} for r in full]
    workers = args.workers or os.cpu_count() or 1
    checks = [
        report.check("deployments searched (count)", len(space), ">=", GOAL_DEPLOYMENTS),
        report.check(f"full search, {args.num_requests} requests a run (s)", full_s),
        report.check("full search: runs taken (count)", runs),
        report.check("full search: requests simulated (count)", simulated),
    ]
    if args.num_requests == args.sample_requests:
        checks.append(report.check(f"{len(space)} deployments x {args.num_requests} requests a run (s)", full_s, "<", GOAL_S))  # fmt: skip
    if args.plain:
        off = dict(early_stop=False, from_estimate=False, skip_bound=False)
        plain_ask = replace(ask(args.num_requests), **off)
        plain, plain_s = timed_search(plain_ask, space, args.workers, args.ray)
        plain_runs, plain_simulated = taken(plain)
        rows += [r | {"phase": "plain", "num_requests": args.num_requests} for r in plain]
        print(f"plain: {plain_s:.1f} s, {plain_runs} runs, {plain_simulated} requests", flush=True)
        checks += [
            report.check(f"plain search (no shortcuts), {args.num_requests} a run (s)", plain_s),
            report.check("plain search: runs taken (count)", plain_runs),
            report.check("plain search: requests simulated (count)", plain_simulated),
            report.check(
                "the same deployments meet the load",
                {r["deployment"] for r in full if r["meets"]}
                == {r["deployment"] for r in plain if r["meets"]},
                "==", True,
            ),
            report.check(
                "the same cheapest",
                (cheapest(full) or {}).get("deployment") == (cheapest(plain) or {}).get("deployment"),
                "==", True,
            ),
        ]  # fmt: skip
    # families that need runs: not every member ruled out by the TPOT bound
    by_label = {r["deployment"]: r for r in full}
    families = list(dict.fromkeys(
        (d.device, d.tp, d.replicas, d.decode) for d in space
        if not by_label[d.label]["bound"] and not by_label[d.label]["error"]
    ))  # fmt: skip
    if args.sample and families:
        step = max(1, len(families) // args.sample)
        chosen = set(families[::step][: args.sample])
        sampled = [d for d in space if (d.device, d.tp, d.replicas, d.decode) in chosen]
        sample, sample_s = timed_search(ask(args.sample_requests), sampled, args.workers, args.ray)
        s_runs, s_simulated = taken(sample)
        print(f"sample: {len(chosen)} families, {len(sampled)} deployments x "
              f"{args.sample_requests} requests: {sample_s:.1f} s", flush=True)  # fmt: skip
        rows += [r | {"phase": "sample", "num_requests": args.sample_requests} for r in sample]
        core_s = sum(r["wall_s"] for r in sample)  # each deployment's own seconds, on one core
        estimate = core_s / len(chosen) * len(families) / workers
        checks += [
            report.check(
                f"sample: {len(chosen)} families ({len(sampled)} deployments), "
                f"{args.sample_requests} requests a run (s)",
                sample_s,
            ),
            report.check("sample: runs taken (count)", s_runs),
            report.check("sample: requests simulated (count)", s_simulated),
            report.check("simulated requests a core-second (count)", s_simulated / core_s),
            report.check(f"families that need runs, of {len(space)} deployments (count)", len(families)),
            report.check(
                f"estimated: {len(space)} deployments x {args.sample_requests} requests a run (s)",
                estimate, "<", GOAL_S,
            ),
        ]  # fmt: skip
    checks.insert(0, report.check(
        "every request of every run served once", all(r["all_served"] for r in rows), "==", True
    ))  # fmt: skip
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
    res = report.result("capacity_search", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
