"""How fast the simulator runs, fast path on and off (issue 4, issue 27 section 1).

    python bench/sim_speed.py [--cases mixed-1k,poisson-10k,mixed-100k,mixed-1m] [--repeats 3] [--out FILE]
    python bench/sim_speed.py --show bench/results/sim_speed.json   # print a saved result

Four cases, each timed as `compare` runs a policy: build the simulated engine, make and
queue the workload, run it, summarize. Chunked prefill runs at vLLM's default token budget for
the GPU; poisson-10k also at the lab's CPU default, 256 (`chunked@256`, no limit). The three
large cases make their prompts compact (numpy int32, docs/SIMULATOR.md "Memory"): the
simulated clock reads lengths only.
    mixed-1k     1,000 `mixed` requests at t=0, Llama-3-8B on an H100, 16 seats, every policy (limit 1 s)
    poisson-10k  10,000 requests of 512 prompt / 128 output tokens, Poisson at 13 req/s,
                 Llama-3-8B on an A100, 128 seats, continuous and chunked (limit 2 s)
    mixed-100k   100,000 `mixed` requests at t=0, Llama-3-8B on an H100, 256 seats,
                 continuous and chunked (limit 10 s)
    mixed-1m     1,000,000 `mixed` requests at t=0, as mixed-100k, with record="aggregate" (docs/SIMULATOR.md, "Memory"): peak RSS <= 4,096 MB (its
                 times reported, without a limit); one repeat whatever --repeats says (minutes)
Every run is a fresh subprocess, so that its peak RSS (the child's own ru_maxrss, read at
its end) is its own: each row gives the highest of its repeats.
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
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm.gcpause import gc_paused  # noqa: E402
from minilm.metrics import summarize  # noqa: E402
from minilm.sim import simulated_engine, vllm_default_budget  # noqa: E402
from minilm.workload import RequestSpec, make_workload, poisson_arrivals  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    device: str
    num_requests: int
    max_num_seqs: int
    policies: tuple[str, ...]
    limit_s: float | None  # None: times reported without a limit
    record_kv_blocks: bool
    fixed: tuple[int, int, float] | None = None  # (prompt, output, req/s); None: `mixed` at t=0
    compact: bool = False  # prompts as numpy int32 arrays (make_workload's compact)
    record: str = "full"  # EngineConfig.record: "aggregate" keeps totals (docs/SIMULATOR.md)
    rss_limit_mb: float | None = None  # a check of the peak RSS, where given
    max_repeats: int | None = None  # at most this many repeats (a slow case)


MODEL, MAX_MODEL_LEN = "llama-3-8b", 2048
# Chunked prefill runs at vLLM's default budget for the GPU (2,048 on an A100, 8,192 on an
# H100), as every simulated GPU run in the lab does; `chunked@256` is the lab's CPU default,
# a budget no one runs on a GPU, reported as a harder case for the simulator, without a limit.
LAB_BUDGET = 256


def policy_knobs(policy: str, device: str) -> tuple[str, dict]:
    """`chunked@N`: chunked prefill with a budget of N; plain `chunked`: vLLM's default."""
    name, _, budget = policy.partition("@")
    if name != "chunked":
        return name, {}
    return name, {"max_num_batched_tokens": int(budget) if budget else vllm_default_budget(device)}


CASES = {
    c.name: c
    for c in (
        Case("mixed-1k", "h100", 1000, 16, ("static", "continuous", "chunked"), 1.0, True),
        Case(
            "poisson-10k",
            "a100",
            10_000,
            128,
            ("continuous", "chunked", f"chunked@{LAB_BUDGET}"),
            2.0,
            False,
            (512, 128, 13.0),
            compact=True,
        ),
        Case(
            "mixed-100k", "h100", 100_000, 256, ("continuous", "chunked"), 10.0, False, compact=True
        ),
        Case(
            "mixed-1m",
            "h100",
            1_000_000,
            256,
            ("continuous", "chunked"),
            None,
            False,
            compact=True,
            record="aggregate",
            rss_limit_mb=4096.0,
            max_repeats=1,
        ),
    )
}


@gc_paused()  # as make_workload: 10,000 token lists, none in a cycle
def workload(case: Case, vocab_size: int, num_requests: int) -> list[RequestSpec]:
    if case.fixed is None:
        return make_workload(
            "mixed",
            num_requests,
            seed=0,
            vocab_size=vocab_size,
            max_model_len=MAX_MODEL_LEN,
            compact=case.compact,
        )
    prompt, output, rate = case.fixed
    rng = np.random.default_rng(0)
    arrivals = poisson_arrivals(rng, rate, num_requests)
    tokens = rng.integers(0, vocab_size, (num_requests, prompt))
    if case.compact:  # each prompt a row of one int32 array
        tokens = tokens.astype(np.int32)
        return [RequestSpec(f"r{i}", tokens[i], output, float(a)) for i, a in enumerate(arrivals)]
    return [
        RequestSpec(f"r{i}", tokens[i].tolist(), output, float(a)) for i, a in enumerate(arrivals)
    ]


def simulate(case: Case, policy: str, fast: bool, num_requests: int):
    """One build + run + summarize: its times, and the timeline."""
    w, c = time.perf_counter(), time.process_time()
    name, knobs = policy_knobs(policy, case.device)
    engine = simulated_engine(
        MODEL,
        case.device,
        name,
        fast_forward=fast,
        **knobs,
        max_num_seqs=case.max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        record_kv_blocks=case.record_kv_blocks,
        record=case.record,
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


def fingerprint(timeline) -> str:
    """What "the same run" means here: every step's times, every request's times, in order
    (a digest of their exact reprs, so that a child process can hand it back)."""
    values = (
        [(s.t_start, s.t_end) for s in timeline.steps],
        [(r.request_id, r.arrival, r.t_first_token, r.t_finished) for r in timeline.requests],
    )
    return hashlib.sha256(repr(values).encode()).hexdigest()


def child(name: str, policy: str, fast: bool, num_requests: int) -> dict:
    """One run, in this (fresh) process: its times, facts, fingerprint and peak RSS."""
    times, facts, timeline = simulate(CASES[name], policy, fast, num_requests)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"times": times, "facts": facts, "print": fingerprint(timeline), "peak_rss_mb": rss}


def run_child(case: Case, policy: str, fast: bool, num_requests: int) -> dict:
    argv = [
        sys.executable,
        __file__,
        "--child",
        case.name,
        policy,
        str(int(fast)),
        str(num_requests),
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{case.name} {policy}: the run failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def row(case: Case, policy: str, fast: bool, repeats: int, num_requests: int) -> tuple[dict, str]:
    load = os.getloadavg()[0]
    repeats = min(repeats, case.max_repeats or repeats)
    runs = []
    for _ in range(repeats):  # each run a fresh process: its own memory, its own GC
        r = run_child(case, policy, fast, num_requests)
        runs.append((r["times"], r["facts"] | {"peak_rss_mb": r["peak_rss_mb"]}, r["print"]))
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
    peak = max(r[1]["peak_rss_mb"] for r in runs)
    return out | runs[0][1] | {"peak_rss_mb": peak}, runs[-1][2]


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
    report.Column("peak RSS (MB)", "peak_rss_mb", ".0f"),
]


def checks(rows: list[dict], same: dict[tuple, bool], limits: dict[str, float]) -> list[dict]:
    out = []
    for r in rows:
        if r["path"] != "fast":
            continue
        if (rss_limit := CASES[r["case"]].rss_limit_mb) is not None:
            out.append(
                report.check(
                    f"{r['case']} {r['policy']}: peak RSS of its process (MB), highest repeat",
                    r["peak_rss_mb"],
                    "<=",
                    rss_limit,
                )
            )
        limit = None if "@" in r["policy"] else limits[r["case"]]
        for clock in ("wall", "cpu"):
            out.append(
                report.check(
                    f"{r['case']} {r['policy']}: {clock} time, build + run + summarize (s), median",
                    r[f"{clock}_s"],
                    None if limit is None else "<=",
                    limit,
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
    # a result saved before the rows had their peak RSS prints without it
    rss = all("peak_rss_mb" in r for r in res["rows"])
    report.print_table(res["rows"], [c for c in COLUMNS if rss or c.key != "peak_rss_mb"])
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
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # case policy fast n: one run
    report.add_show_option(p)
    args = p.parse_args()
    if args.child:
        name, policy, fast, n = args.child
        print(json.dumps(child(name, policy, fast == "1", int(n))))
        return 0
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
                "compact_prompts": c.compact,
                "record": c.record,
                "chunked_budget": vllm_default_budget(c.device),
                "limit_s": c.limit_s,
                "rss_limit_mb": c.rss_limit_mb,
                "max_repeats": c.max_repeats,
            }
            for name, c in CASES.items()
            if name in names
        },
        "model": MODEL,
        "max_model_len": MAX_MODEL_LEN,
        "repeats": args.repeats,
        "step_repeats": args.step_repeats,
        "load_avg_end": list(os.getloadavg()),
        # the highest of this process's and its runs' (each a child process)
        "peak_rss_mb": max(
            [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]
            + [r["peak_rss_mb"] for r in rows]
        ),
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
