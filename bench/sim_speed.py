"""How fast the simulator runs, fast path on and off (issue 4, issue 27 section 1).

    python bench/sim_speed.py [--cases mixed-1k,poisson-10k,mixed-100k] [--repeats 3] [--out FILE]
    python bench/sim_speed.py --show bench/results/sim_speed.json   # print a saved result

Three cases, each timed as `compare` runs a policy: build the simulated engine, make and
queue the workload, run it, summarize.
    mixed-1k     1,000 `mixed` requests at t=0, Llama-3-8B on an H100, 16 seats, every policy (limit 1 s)
    poisson-10k  10,000 requests of 512 prompt / 128 output tokens, Poisson at 13 req/s,
                 Llama-3-8B on an A100, 128 seats, continuous and chunked (limit 2 s)
    mixed-100k   100,000 `mixed` requests at t=0, Llama-3-8B on an H100, 256 seats,
                 continuous and chunked (limit 10 s)
Each row is one (case, policy, path): `fast` is the simulator's default (sim/fastforward.py),
`step` every step through the scheduler (`fast_forward=False`, the reference), run
`--step-repeats` times on the cases in `--step-cases` (it is slow). Wall and CPU seconds are
the median of the repeats, with their min and max; the load average is read before each row
(the machine is shared: wall time includes time the OS gave to others, CPU time does not).
Where both paths ran, a check compares their timelines: the step count, every step's start
and end, every request's arrival, first-token and finish times, all with ==. Prints the table
and the checks; writes bench/results/sim_speed.json in bench/report.py's shape.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm.gcpause import gc_paused  # noqa: E402
from minilm.metrics import summarize  # noqa: E402
from minilm.sim import simulated_engine  # noqa: E402
from minilm.workload import RequestSpec, make_workload, poisson_arrivals  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    device: str
    num_requests: int
    max_num_seqs: int
    policies: tuple[str, ...]
    limit_s: float
    record_kv_blocks: bool
    fixed: tuple[int, int, float] | None = None  # (prompt, output, req/s); None: `mixed` at t=0


CASES = {
    c.name: c
    for c in (
        Case("mixed-1k", "h100", 1000, 16, ("static", "continuous", "chunked"), 1.0, True),
        Case(
            "poisson-10k",
            "a100",
            10_000,
            128,
            ("continuous", "chunked"),
            2.0,
            False,
            (512, 128, 13.0),
        ),
        Case("mixed-100k", "h100", 100_000, 256, ("continuous", "chunked"), 10.0, False),
    )
}
MODEL, MAX_MODEL_LEN = "llama-3-8b", 2048


@gc_paused()  # as make_workload: 10,000 token lists, none in a cycle
def workload(case: Case, vocab_size: int, num_requests: int) -> list[RequestSpec]:
    if case.fixed is None:
        return make_workload(
            "mixed", num_requests, seed=0, vocab_size=vocab_size, max_model_len=MAX_MODEL_LEN
        )
    prompt, output, rate = case.fixed
    rng = np.random.default_rng(0)
    arrivals = poisson_arrivals(rng, rate, num_requests)
    tokens = rng.integers(0, vocab_size, (num_requests, prompt))
    return [
        RequestSpec(f"r{i}", tokens[i].tolist(), output, float(a)) for i, a in enumerate(arrivals)
    ]


def simulate(case: Case, policy: str, fast: bool, num_requests: int):
    """One build + run + summarize: its times, and the timeline."""
    w, c = time.perf_counter(), time.process_time()
    engine = simulated_engine(
        MODEL,
        case.device,
        policy,
        fast_forward=fast,
        max_num_seqs=case.max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        record_kv_blocks=case.record_kv_blocks,
    )
    engine.add_workload(workload(case, engine.model_config.vocab_size, num_requests))
    c_run = time.process_time()
    timeline = engine.run()
    c_sum = time.process_time()
    m = summarize(timeline)
    times = {
        "wall_s": time.perf_counter() - w,
        "cpu_s": time.process_time() - c,
        "build_cpu_s": c_run - c,
        "run_cpu_s": c_sum - c_run,
        "summarize_cpu_s": time.process_time() - c_sum,
    }
    facts = {
        "requests": m["requests"],
        "steps": m["steps"],
        "fast_forwarded_steps": engine.fast_steps,
        "policy_lane_steps": engine.bulk_steps,
        "simulated_s": m["wall_s"],
        "simulated_output_tok_per_s": m["output_tok_per_s"],
    }
    return times, facts, timeline


def fingerprint(timeline) -> tuple:
    """What "the same run" means here: every step's times, every request's times, in order."""
    return (
        [(s.t_start, s.t_end) for s in timeline.steps],
        [(r.request_id, r.arrival, r.t_first_token, r.t_finished) for r in timeline.requests],
    )


def row(case: Case, policy: str, fast: bool, repeats: int, num_requests: int) -> tuple[dict, tuple]:
    load = os.getloadavg()[0]
    runs = []
    for _ in range(repeats):  # each timeline let go before the next build: the GC scans what lives
        times, facts, timeline = simulate(case, policy, fast, num_requests)
        runs.append((times, facts, fingerprint(timeline)))
        del timeline
    out = {
        "case": case.name,
        "policy": policy,
        "path": "fast" if fast else "step",
        "repeats": repeats,
        "load_avg_1min": load,
    }
    for key in runs[0][0]:
        values = [r[0][key] for r in runs]
        out[key] = statistics.median(values)
        if key in ("wall_s", "cpu_s"):
            out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    return out | runs[0][1], runs[-1][2]


COLUMNS = [
    report.Column("case", "case"),
    report.Column("policy", "policy"),
    report.Column("path", "path"),
    report.Column("repeats (count)", "repeats", "d"),
    report.Column("load (1 min)", "load_avg_1min", ".1f"),
    report.Column("steps (count)", "steps", "d"),
    report.Column("fast-forwarded (count)", "fast_forwarded_steps", "d"),
    report.Column("lanes + policy (count)", "policy_lane_steps", "d"),
    report.Column("wall (s)", "wall_s", ".2f"),
    report.Column("min (s)", "wall_s_min", ".2f"),
    report.Column("max (s)", "wall_s_max", ".2f"),
    report.Column("cpu (s)", "cpu_s", ".2f"),
    report.Column("min (s)", "cpu_s_min", ".2f"),
    report.Column("max (s)", "cpu_s_max", ".2f"),
    report.Column("build cpu (s)", "build_cpu_s", ".2f"),
    report.Column("run cpu (s)", "run_cpu_s", ".2f"),
    report.Column("summarize cpu (s)", "summarize_cpu_s", ".2f"),
    report.Column("simulated (s)", "simulated_s", ".1f"),
]


def checks(rows: list[dict], same: dict[tuple, bool], limits: dict[str, float]) -> list[dict]:
    out = []
    for r in rows:
        if r["path"] != "fast":
            continue
        for clock in ("wall", "cpu"):
            out.append(
                report.check(
                    f"{r['case']} {r['policy']}: {clock} time, build + run + summarize (s), median",
                    r[f"{clock}_s"],
                    "<=",
                    limits[r["case"]],
                    min=r[f"{clock}_s_min"],
                    max=r[f"{clock}_s_max"],
                    load_avg=r["load_avg_1min"],
                )
            )
        step = next(
            (
                x
                for x in rows
                if x["path"] == "step" and (x["case"], x["policy"]) == (r["case"], r["policy"])
            ),
            None,
        )
        if step is not None:
            out.append(
                report.check(
                    f"{r['case']} {r['policy']}: speed-up of the fast path, CPU time (x)",
                    step["cpu_s"] / r["cpu_s"],
                )
            )
            out.append(
                report.check(
                    f"{r['case']} {r['policy']}: fast path's timeline == step-by-step's",
                    same[(r["case"], r["policy"])],
                    "==",
                    True,
                )
            )
    return out


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"{MODEL} (simulated); fast = sim/fastforward.py, step = fast_forward=False",
            report.about(c),
            f"peak RSS {c['peak_rss_mb']:.0f} MB",
        )
    )
    for name, case in c["cases"].items():
        print(f"  {name}: {case}")
    report.print_table(res["rows"], COLUMNS)
    print()
    report.print_checks(res["checks"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--step-cases", default="mixed-1k,poisson-10k", help="cases also run step by step"
    )
    p.add_argument("--step-repeats", type=int, default=1)
    p.add_argument(
        "--max-requests",
        type=int,
        default=None,
        help="cap every case's request count (a quick try)",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim_speed.json")
    report.add_show_option(p)
    args = p.parse_args()
    if args.show:
        return show(report.load(args.show))
    names = args.cases.split(",")
    for name in names + args.step_cases.split(","):
        if name and name not in CASES:
            p.error(f"unknown case {name!r}; cases: {', '.join(CASES)}")
    rows, same = [], {}
    for name in names:
        case = CASES[name]
        n = min(case.num_requests, args.max_requests or case.num_requests)
        for policy in case.policies:
            r, fast_print = row(case, policy, True, args.repeats, n)
            rows.append(r)
            if name in args.step_cases.split(",") and args.step_repeats > 0:
                r, step_print = row(case, policy, False, args.step_repeats, n)
                rows.append(r)
                same[(name, policy)] = fast_print == step_print
    conditions = report.machine() | {
        "cases": {
            name: {
                "device": c.device,
                "num_requests": min(c.num_requests, args.max_requests or c.num_requests),
                "max_num_seqs": c.max_num_seqs,
                "workload": "mixed at t=0"
                if c.fixed is None
                else f"{c.fixed[0]} prompt / {c.fixed[1]} output tokens, Poisson at {c.fixed[2]:g} req/s",
                "record_kv_blocks": c.record_kv_blocks,
                "limit_s": c.limit_s,
            }
            for name, c in CASES.items()
            if name in names
        },
        "model": MODEL,
        "max_model_len": MAX_MODEL_LEN,
        "repeats": args.repeats,
        "step_repeats": args.step_repeats,
        "load_avg_end": list(os.getloadavg()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    limits = {name: c.limit_s for name, c in CASES.items()}
    res = report.result(
        "sim_speed", report.command_line(), conditions, rows, checks(rows, same, limits)
    )
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0 if all(ch["pass"] is not False for ch in res["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
