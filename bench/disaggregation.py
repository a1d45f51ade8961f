"""Prefill/decode disaggregation against colocated serving on the same GPUs, simulated.

    python bench/disaggregation.py [--seconds 5] [--out FILE]
    python bench/disaggregation.py --show bench/results/disaggregation.json

For each case (a model, a workload, a number of H100s) it finds each deployment's DistServe
goodput, the highest request rate at which >= 90% of requests meet both the TTFT and the TPOT
limit, by bisection on the rate (minilm/sim/capacity.py), and says which wins and by how much:
colocated replicas (each continuous batching, DistServe's vLLM baseline, or chunked prefill,
Sarathi-Serve's) behind a least-outstanding router, against P prefill + D decode replicas
(minilm/sim/disaggregation.py) over NVLink or 100 Gb/s Ethernet. Every time is SIMULATED by the
roofline cost model (minilm/sim/costmodel.py); link latencies are assumptions (disaggregation.py).

A run at rate R has R x `--seconds` requests (200 to 2,000; seed 0, Poisson arrivals), so a
run at a high rate spans less than `--seconds`: a burst that queues can hide. Workloads: `mixed` (prompts and outputs of a few
dozen to a few thousand tokens), `long-prompt` (short chats and 1 in 16 prompts of half the
context), `uniform` (16-128-token prompts: the short-prompt case).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm.sim.capacity import slo_goodput  # noqa: E402
from minilm.sim.cluster import simulated_cluster  # noqa: E402
from minilm.sim.disaggregation import simulated_disaggregated  # noqa: E402
from minilm.workload import make_workload  # noqa: E402

TTFT_SLO, TPOT_SLO = 0.5, 0.020  # seconds: a chat service's promise (DistServe's kind of SLO)
TARGET = 0.9  # DistServe's: 90% of requests within both limits
LINK_KEYS = ("transfer_ms_mean", "link_wait_ms_max", "link_busy")
COLOCATED = (("colocated", "continuous"), ("colocated", "chunked"))


def cases() -> list[dict]:
    """(model, workload, GPUs) and the deployments compared on them."""
    out = []
    for workload in ("mixed", "long-prompt", "uniform"):
        out.append(dict(model="llama-3-8b", workload=workload, gpus=2, splits=[(1, 1, "nvlink")]))
    for workload in ("mixed", "long-prompt"):
        out.append(
            dict(
                model="llama-3-8b",
                workload=workload,
                gpus=4,
                splits=[(1, 3, "nvlink"), (2, 2, "nvlink")],
            )
        )
    # DistServe's premise: limits tight enough that prefill and decode get in each other's way
    out.append(
        dict(
            model="llama-3-8b",
            workload="long-prompt",
            gpus=4,
            splits=[(1, 3, "nvlink"), (2, 2, "nvlink")],
            ttft_slo=0.2,
            tpot_slo=0.012,
        )
    )
    # a model with 4x the KV per token (32 KV heads, no GQA): where the link can matter
    out.append(
        dict(
            model="llama-2-7b",
            workload="long-prompt",
            gpus=2,
            splits=[(1, 1, "nvlink"), (1, 1, "ethernet")],
        )
    )
    return out


def deployments(case: dict) -> list[dict]:
    colocated = [
        dict(kind="colocated", policy=p, label=f"{case['gpus']} x {p}") for _, p in COLOCATED
    ]
    split = [
        dict(kind="disaggregated", prefill=p, decode=d, link=link, label=f"{p}P{d}D {link}")
        for p, d, link in case["splits"]
    ]
    return colocated + split


def build(case: dict, dep: dict, args):
    knobs = dict(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    if dep["kind"] == "colocated":
        return simulated_cluster(
            case["model"],
            args.device,
            replicas=case["gpus"],
            router="least_outstanding",
            policy=dep["policy"],
            **knobs,
        )
    return simulated_disaggregated(
        case["model"],
        args.device,
        prefill=dep["prefill"],
        decode=dep["decode"],
        link=dep["link"],
        **knobs,
    )


def goodput_row(case: dict, dep: dict, args) -> dict:
    served, links = [], {}

    def run_at(rate: float):
        fleet = build(case, dep, args)
        n = int(min(2000, max(200, rate * args.seconds)))
        specs = make_workload(
            case["workload"],
            n,
            seed=0,
            rate=rate,
            vocab_size=32000,
            max_model_len=fleet.replicas[0].engine.config.max_model_len,
        )
        fleet.add_workload(specs)
        run = fleet.run()
        served.append(sorted(r.request_id for r in run.requests) == sorted(s.id for s in specs))
        if run.transfers:
            links[rate] = link_use(run)
        return run.timeline()

    w = time.perf_counter()
    ttft, tpot = case.get("ttft_slo", TTFT_SLO), case.get("tpot_slo", TPOT_SLO)
    g = slo_goodput(run_at, ttft, tpot, TARGET, low=args.low, rel_tol=args.rel_tol)
    link = links.get(g.rate, dict.fromkeys(LINK_KEYS))  # None where no KV crossed a link
    return {
        "model": case["model"],
        "workload": case["workload"],
        "gpus": case["gpus"],
        "slo": f"{ttft * 1000:.0f} ms / {tpot * 1000:.0f} ms",
        "deployment": dep["label"],
        "kind": dep["kind"],
        "goodput_req_per_s": g.rate,
        "runs": len(g.tried),
        "tried": [[rate, att] for rate, att in sorted(g.tried.items())],
        "all_served": all(served),
        # at the goodput rate: the mean transfer, the longest wait for the link, its busy share
        **link,
        "wall_s": time.perf_counter() - w,
    }


def link_use(run) -> dict:
    """How much the link did in a disaggregated run."""
    x = run.transfers
    span = max(t.t_end for t in x) - min(t.t_ready for t in x)
    links = len({t.source for t in x})  # a link a prefill replica
    busy = sum(t.t_end - t.t_start for t in x) / links
    return {
        "transfer_ms_mean": 1000 * sum(t.t_end - t.t_start for t in x) / len(x),
        "link_wait_ms_max": 1000 * max(t.t_start - t.t_ready for t in x),
        "link_busy": busy / span if span else 0.0,
    }


def ratio(a: dict, b: dict) -> float:
    return a["goodput_req_per_s"] / b["goodput_req_per_s"] if b["goodput_req_per_s"] else math.inf


def verdicts(rows: list[dict]) -> list[dict]:
    """Per case and link: the best disaggregated goodput against the best colocated one (who
    wins) and against colocated continuous batching (DistServe's baseline, vLLM without
    chunked prefill)."""
    out = []
    keys = list(dict.fromkeys((r["model"], r["workload"], r["gpus"], r["slo"]) for r in rows))
    for key in keys:
        group = [r for r in rows if (r["model"], r["workload"], r["gpus"], r["slo"]) == key]
        colocated = [r for r in group if r["kind"] == "colocated"]
        best = max(colocated, key=lambda r: r["goodput_req_per_s"])
        continuous = next(r for r in colocated if r["deployment"].endswith("continuous"))
        links = dict.fromkeys(
            r["deployment"].split()[-1] for r in group if r["kind"] != "colocated"
        )
        for link in links:
            split = [
                r for r in group if r["kind"] != "colocated" and r["deployment"].endswith(link)
            ]
            dis = max(split, key=lambda r: r["goodput_req_per_s"])
            x = ratio(dis, best)
            out.append(
                {
                    "case": f"{key[0]}, {key[1]}, {key[2]} GPUs, SLO {key[3]}",
                    "colocated": f"{best['deployment']}: {best['goodput_req_per_s']:.0f}",
                    "disaggregated": f"{dis['deployment']}: {dis['goodput_req_per_s']:.0f}",
                    "ratio": x,
                    "vs_continuous": ratio(dis, continuous),
                    "winner": "disaggregated" if x > 1 else "colocated" if x < 1 else "tie",
                }
            )
    return out


COLUMNS = [
    report.Column("model", "model"),
    report.Column("workload", "workload"),
    report.Column("GPUs (count)", "gpus", "d"),
    report.Column("SLO TTFT / TPOT", "slo"),
    report.Column("deployment", "deployment"),
    report.Column("goodput (req/s)", "goodput_req_per_s", ".1f"),
    report.Column("transfer mean (ms)", "transfer_ms_mean", ".2f"),
    report.Column("link wait max (ms)", "link_wait_ms_max", ".2f"),
    report.Column("link busy (%)", "link_busy", ".1f", scale=100),
    report.Column("runs (count)", "runs", "d"),
    report.Column("wall (s)", "wall_s", ".1f"),
]
VERDICT_COLUMNS = [
    report.Column("case", "case"),
    report.Column("best colocated (req/s)", "colocated"),
    report.Column("best disaggregated (req/s)", "disaggregated"),
    report.Column("disagg / best coloc (x)", "ratio", ".2f"),
    report.Column("disagg / coloc continuous (x)", "vs_continuous", ".2f"),
    report.Column("winner", "winner"),
]


def show(res: dict) -> None:
    c = res["conditions"]
    a = c["args"]
    print(
        report.joined(
            f"SIMULATED on {a['device']} (roofline cost model); DistServe goodput: the highest rate with "
            f">= {c['target']:.0%} of requests within the TTFT and TPOT limits (SLO column), "
            f"by bisection to {a['rel_tol']:.0%}; max_num_seqs={a['max_num_seqs']}",
            report.about(c),
        )
    )
    report.print_table(res["rows"], COLUMNS)
    print()
    report.print_table(verdicts(res["rows"]), VERDICT_COLUMNS)
    print()
    report.print_checks(res["checks"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="h100")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--seconds", type=float, default=5.0, help="arrivals a run spans at its rate")
    p.add_argument("--low", type=float, default=8.0, help="the first rate tried (req/s)")
    p.add_argument("--rel-tol", type=float, default=0.1, help="bisection stops this close")
    p.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "disaggregation.json"
    )
    report.add_show_option(p)
    args = p.parse_args()
    if args.show:
        return show(report.load(args.show))
    rows = []
    for case in cases():
        for dep in deployments(case):
            rows.append(goodput_row(case, dep, args))
            r = rows[-1]
            print(
                f"{r['model']} {r['workload']} {r['deployment']}: {r['goodput_req_per_s']:.1f} req/s",
                flush=True,
            )
    conditions = report.machine() | {
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "show")},
        "ttft_slo": TTFT_SLO,
        "tpot_slo": TPOT_SLO,
        "target": TARGET,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    checks = [
        report.check(
            "every request of every run served once", all(r["all_served"] for r in rows), "==", True
        )
    ]
    checks += [
        report.check(f"{v['case']}: disaggregated / colocated goodput (x)", v["ratio"])
        for v in verdicts(rows)
    ]
    res = report.result("disaggregation", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
