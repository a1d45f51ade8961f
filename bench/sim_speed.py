"""How fast the simulator runs: 1,000 requests of `mixed`, Llama-3-8B on an H100.

    python bench/sim_speed.py [--num-requests 1000] [--max-num-seqs 16] [--no-kv-blocks] [--out FILE]
    python bench/sim_speed.py --show bench/results/sim_speed.json   # print a saved result

For each policy: build the simulated engine, queue the workload, run it, summarize
(what `compare` does); the total must stay under 1 second (issue 4). The engine run and
`summarize` are also timed on their own. The knobs are the command line's defaults
(`python -m minilm compare --simulate --model llama-3-8b --device h100`).

Two times per policy: wall time, and the process's CPU time. On a machine shared with
other processes the wall time includes time the OS gave to them; the CPU time does not.
A fixed pure-Python loop is timed the same way, so a reader can see how busy the
machine was. Prints a table and the checks; writes bench/results/sim_speed.json (--out),
in bench/report.py's shape; `--show FILE` prints a saved result without rerunning.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm.metrics import summarize  # noqa: E402
from minilm.sim import simulated_engine  # noqa: E402
from minilm.workload import make_workload  # noqa: E402

LIMIT_S = 1.0


def python_loop_probe(n: int = 2_000_000) -> dict:
    """Wall and CPU seconds of a plain Python loop: a yardstick of the machine's state."""
    w, c = time.perf_counter(), time.process_time()
    s = 0
    for i in range(n):
        s += i
    return {"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c}


def simulate(policy: str, args) -> dict:
    w, c = time.perf_counter(), time.process_time()
    engine = simulated_engine(
        args.model,
        args.device,
        policy,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        record_kv_blocks=args.record_kv_blocks,
    )
    specs = make_workload(
        "mixed",
        args.num_requests,
        seed=0,
        vocab_size=engine.model_config.vocab_size,
        max_model_len=args.max_model_len,
    )
    engine.add_workload(specs)
    t_run, c_run = time.perf_counter(), time.process_time()
    timeline = engine.run()
    run_s, run_cpu_s = time.perf_counter() - t_run, time.process_time() - c_run
    c_sum = time.process_time()
    m = summarize(timeline)
    return {
        "policy": policy,
        "requests": m["requests"],
        "steps": m["steps"],
        "items": sum(len(s.items) for s in timeline.steps),
        "run_s": run_s,
        "run_cpu_s": run_cpu_s,
        "summarize_cpu_s": time.process_time() - c_sum,
        "wall_s": time.perf_counter() - w,
        "cpu_s": time.process_time() - c,
        "simulated_s": m["wall_s"],
        "simulated_output_tok_per_s": m["output_tok_per_s"],
    }


COLUMNS = [
    report.Column("policy", "policy"),
    report.Column("steps (count)", "steps", "d"),
    report.Column("items (count)", "items", "d"),
    report.Column("wall (s)", "wall_s", ".3f"),
    report.Column("cpu (s)", "cpu_s", ".3f"),
    report.Column("run cpu (s)", "run_cpu_s", ".3f"),
    report.Column("summarize cpu (s)", "summarize_cpu_s", ".3f"),
    report.Column("simulated (s)", "simulated_s", ".2f"),
    report.Column("sim out (tok/s)", "simulated_output_tok_per_s", ".0f"),
]


def checks(rows: list[dict], limit_s: float) -> list[dict]:
    """Build, run and summarize under the limit, by the wall clock (the exit status) and by CPU time."""
    return [
        report.check(
            f"{r['policy']}: {clock} time, build + run + summarize (s)",
            r[f"{clock}_s"],
            "<",
            limit_s,
        )
        for r in rows
        for clock in ("wall", "cpu")
    ]


def show(res: dict) -> None:
    c = res["conditions"]
    a = c["args"]
    print(
        report.joined(
            f"{a['num_requests']} requests of mixed, {a['model']} on {a['device']} (simulated), "
            f"max_num_seqs={a['max_num_seqs']}, record_kv_blocks={a['record_kv_blocks']}",
            report.about(c),
        )
    )
    report.print_table(res["rows"], COLUMNS)
    b, f = c["probe_before"], c["probe_after"]
    print(
        f"machine yardstick, 2M-iteration Python loop: wall {b['wall_s']:.3f} / {f['wall_s']:.3f} s, "
        f"cpu {b['cpu_s']:.3f} / {f['cpu_s']:.3f} s (before / after)"
    )
    print()
    report.print_checks(res["checks"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="h100")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--no-kv-blocks",
        dest="record_kv_blocks",
        action="store_false",
        help="do not keep each step's block tables (the KV-map widget needs them; compare does not)",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim_speed.json")
    report.add_show_option(p)
    args = p.parse_args()
    if args.show:
        return show(report.load(args.show))
    probe_before = python_loop_probe()
    rows = [simulate(policy, args) for policy in ("static", "continuous", "chunked")]
    probe_after = python_loop_probe()
    conditions = report.machine() | {
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "show")},
        "probe_before": probe_before,
        "probe_after": probe_after,
        "limit_s": LIMIT_S,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    res = report.result("sim_speed", report.command_line(), conditions, rows, checks(rows, LIMIT_S))
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0 if all(r["wall_s"] < LIMIT_S for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
