"""Data-parallel engine cores, measured and simulated: `serve --data-parallel-size 1` against 2 on
this 2-core machine, and the same workload through the simulator's cluster (issue 28).

    python bench/data_parallel.py [--num-prompts 128] [--repeats 3] [--out bench/results/data_parallel.json]
    python bench/data_parallel.py --show bench/results/data_parallel.json   # print a saved result

1. measured   `python -m minilm serve --data-parallel-size N --router R` (each engine core a
              process of its own, one torch thread: `--cpu-threads 1`, the default), a warm-up
              request, then `python -m minilm bench-serve` in another process sends the
              docstrings workload all at once (greedy, `--ignore-eos`: every request writes its
              max_tokens, so N = 1 and 2 do the same work). Output tok/s and TTFT from the
              client's side, and how many requests each core served (its `--timeline` file).
              N = 1 and N = 2 alternate within each repeat, so both see the same machine.
2. simulated  the same requests (their prompts' tokens, max_tokens, all at 0) through
              `simulated_cluster` on the `cpu` device (fitted to this machine by
              bench/calibrate_cpu.py, one thread) with N replicas behind the same router and
              the server's knobs (max_num_seqs, KV blocks, prefix caching). Simulated.

The question is whether the simulator predicts the measured N = 2 / N = 1 ratio. It prices
each replica as if it had a core to itself and nothing else ran; on this machine the two
engine cores share 2 cores with the API process (tokenizing, detokenizing, SSE for every
token), the load generator and whatever else runs (the load averages are in the
conditions: the machine is shared, so the figures are noisy, and the spread of the repeats
is printed beside each median).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from bench.serve_overhead import bench_serve, child_pids  # noqa: E402
from minilm import Timeline  # noqa: E402
from minilm.client.bench_serve import client_tokenizer, make_requests  # noqa: E402
from minilm.client.process import ServerProcess  # noqa: E402
from minilm.metrics import summarize  # noqa: E402
from minilm.model.loader import resolve_model_path  # noqa: E402
from minilm.sim.cluster import fleet_summary, simulated_cluster  # noqa: E402
from minilm.workload import RequestSpec  # noqa: E402

SIZES = (1, 2)


def measured(args, tmp: Path, n: int, k: int) -> dict:
    """One server with `n` engine cores: the workload all at once, from the client's side."""
    path = tmp / f"run_{n}_{k}.json"
    load_before = os.getloadavg()
    with ServerProcess(
        timeline=path,
        data_parallel_size=n,
        router=args.router,
        max_num_seqs=args.max_num_seqs,
        timeout=300,
    ) as server:
        import httpx

        httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": "Return the", "max_tokens": 4},
            timeout=60,
        )
        cores = [pid for pid in sorted(child_pids(server.pid)) if is_engine_core(pid)]
        pids = {"server": server.pid} | {f"engine_core_{i}": pid for i, pid in enumerate(cores)}
        result, cpu = bench_serve(
            server.url,
            tmp / f"load_{n}_{k}.json",
            pids,
            "--num-prompts",
            str(args.num_prompts),
            "--seed",
            str(args.seed),
            "--ignore-eos",
        )
    files = [path] if n == 1 else [path.with_name(f"{path.stem}.engine{i}.json") for i in range(n)]
    ids = set(result["request_ids"])
    per_core = [sum(r.request_id in ids for r in Timeline.from_json(f).requests) for f in files]
    ttfts = np.array(result["ttfts"])
    core_cpu = sum(cpu[f"engine_core_{i}"] for i in range(n))
    return {
        "n": n,
        "repeat": k,
        "out_tok_per_s": result["output_throughput"],
        "ttft_p50_ms": float(np.median(ttfts) * 1e3),
        "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1e3),
        "duration_s": result["duration"],
        "output_tokens": result["total_output_tokens"],
        "failed": result["failed"],
        "requests_per_core": per_core,
        "cpu_window": cpu,
        # the engine cores' CPU seconds, and the machine's taken by processes not of this run
        "engine_cores_cpu_s": core_cpu,
        "engine_cores_busy": core_cpu / cpu["seconds"],  # cores' worth of CPU they got
        "tok_per_core_cpu_s": result["total_output_tokens"] / core_cpu,
        "other_cpu_share": cpu["other_processes"] / ((os.cpu_count() or 1) * cpu["seconds"]),
        "loadavg_before": load_before,
        "load_1min": load_before[0],
        "loadavg_after": os.getloadavg(),
        "loaded": loaded(load_before[0], os.getloadavg()[0]),
        "meta": Timeline.from_json(files[0]).meta,
    }


def loaded(load_before: float | None, load_after: float | None) -> bool | None:
    """Whether a repeat ran on a loaded machine: a 1-minute load average above the CPU count
    before it, or above the CPU count plus what the run itself keeps runnable (the engine
    cores, the API process, the load generator: 4) after it. None for a simulated row."""
    if load_before is None or load_after is None:
        return None
    cpus = os.cpu_count() or 1
    return load_before > cpus or load_after > cpus + 4


def is_engine_core(pid: int) -> bool:
    """A `serve` child that is an engine core (multiprocessing's resource tracker is not)."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False


def simulated(args, n: int, meta: dict) -> dict:
    """The same requests on the simulated `cpu`, `n` replicas behind the same router."""
    tokenizer = client_tokenizer("docstrings")
    requests = make_requests("docstrings", args.num_prompts, args.seed, tokenizer=tokenizer)
    specs = [
        RequestSpec(f"s{i}", tokenizer.encode(r.prompt), r.max_tokens, 0.0)
        for i, r in enumerate(requests)
    ]
    cluster = simulated_cluster(
        str(resolve_model_path("docstrings")),
        "cpu",
        replicas=n,
        router=args.router,
        policy=meta["policy"],
        max_num_seqs=meta["max_num_seqs"],
        max_num_batched_tokens=meta["max_num_batched_tokens"],
        num_blocks=meta["num_blocks"],
        block_size=meta["block_size"],
        enable_prefix_caching=meta["enable_prefix_caching"],
    )
    cluster.add_workload(specs, ignore_eos=True)
    run = cluster.run()
    m = fleet_summary(run)
    return {
        "n": n,
        "out_tok_per_s": m["output_tok_per_s"],
        "ttft_p50_ms": m["ttft_p50"] * 1e3,
        "ttft_p99_ms": m["ttft_p99"] * 1e3,
        "output_tokens": m["output_tokens"],
        "requests_per_core": [len(tl.requests) for tl in run.timelines],
        "per_core_out_tok_per_s": [summarize(tl)["output_tok_per_s"] for tl in run.timelines],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=16, help="per engine core")
    ap.add_argument("--router", default="least_outstanding")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/data_parallel.json"))
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    command = report.command_line()
    conditions = report.machine() | {
        "torch_threads_per_core": 1,
        "loadavg_before": os.getloadavg(),
        "model": "docstrings",
        "workload": "docstrings, all at once, greedy, ignore_eos",
        "num_prompts": args.num_prompts,
        "max_num_seqs_per_core": args.max_num_seqs,
        "router": args.router,
        "prefix_caching": True,
        "shared_machine": "other sessions ran on the same 2 cores: see the load averages",
        "loaded_means": "1-min load average > CPUs before a repeat, or > CPUs + 4 after it",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command,
    }
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            for n in SIZES:
                row = measured(args, Path(tmp), n, k)
                rows.append({"kind": "measured"} | row)
                print(
                    f"repeat {k} N={n}: {row['out_tok_per_s']:.0f} tok/s, TTFT p50 "
                    f"{row['ttft_p50_ms']:.0f} ms, p99 {row['ttft_p99_ms']:.0f} ms, per core "
                    f"{row['requests_per_core']}, load {row['loadavg_before'][0]:.1f}",
                    file=sys.stderr,
                )
    meta = rows[0]["meta"]
    for row in rows:
        row.pop("meta")
    for n in SIZES:
        rows.append(
            {"kind": "simulated", "repeat": None, "load_1min": None}
            | {"tok_per_core_cpu_s": None, "engine_cores_busy": None, "other_cpu_share": None}
            | {"loadavg_before": None, "loadavg_after": None, "loaded": None}
            | simulated(args, n, meta)
        )
    conditions["loadavg_after"] = os.getloadavg()
    conditions["engine_meta"] = meta
    conditions["wall_s"] = time.perf_counter() - t0
    res = report.result("data_parallel", command, conditions, rows, checks(rows))
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")


def median_row(rows: list[dict], kind: str, n: int, key: str) -> tuple[float, list[float]]:
    values = [r[key] for r in rows if r["kind"] == kind and r["n"] == n]
    return float(np.median(values)), values


def measured_rows(rows: list[dict], n: int) -> list[dict]:
    return [r | load_cells(r) for r in rows if r["kind"] == "measured" and r["n"] == n]


def checks(rows: list[dict]) -> list[dict]:
    """N = 2 against N = 1: measured (median of the repeats, every repeat beside it) and simulated."""
    out = []
    tok1, reps1 = median_row(rows, "measured", 1, "out_tok_per_s")
    tok2, reps2 = median_row(rows, "measured", 2, "out_tok_per_s")
    ratios = [b / a for a, b in zip(reps1, reps2)]  # each repeat's own pair
    sim1, _ = median_row(rows, "simulated", 1, "out_tok_per_s")
    sim2, _ = median_row(rows, "simulated", 2, "out_tok_per_s")
    measured_ratio, simulated_ratio = float(np.median(ratios)), sim2 / sim1
    out.append(
        report.check(
            "measured N=2 / N=1 output tok/s (median repeat)",
            measured_ratio,
            ">",
            1.0,
            repeats=ratios,
        )
    )
    quiet = [
        r
        for (r, a, b) in zip(ratios, measured_rows(rows, 1), measured_rows(rows, 2))
        if not (a["loaded"] or b["loaded"])
    ]
    out.append(
        report.check(
            "repeats on a loaded machine (either N's run loaded)", len(ratios) - len(quiet)
        )
    )
    if quiet:
        out.append(
            report.check(
                "measured N=2 / N=1 output tok/s, quiet repeats only (median)",
                float(np.median(quiet)),
                repeats=quiet,
            )
        )
    out.append(report.check("simulated N=2 / N=1 output tok/s", simulated_ratio))
    out.append(
        report.check(
            "measured ratio / simulated ratio (1: the simulator predicts it)",
            measured_ratio / simulated_ratio,
        )
    )
    _, busy1 = median_row(rows, "measured", 1, "engine_cores_busy")
    _, busy2 = median_row(rows, "measured", 2, "engine_cores_busy")
    got = [b / a for a, b in zip(busy1, busy2)]
    out.append(
        report.check(
            "CPU the engine cores got, N=2 / N=1 (the simulator assumes 2: a core each)",
            float(np.median(got)),
            repeats=got,
        )
    )
    # the simulator's replicas each have a CPU; given the CPU the cores did get, it predicts that
    # ratio instead (each core's tokens per CPU second are alike): 1 when that holds
    per_cpu = [r / g for r, g in zip(ratios, got)]
    out.append(
        report.check(
            "measured ratio / CPU-got ratio (1: throughput follows the CPU each core got)",
            float(np.median(per_cpu)),
            repeats=per_cpu,
        )
    )
    for key in ("ttft_p50_ms", "ttft_p99_ms"):
        m1, r1 = median_row(rows, "measured", 1, key)
        m2, r2 = median_row(rows, "measured", 2, key)
        s1, _ = median_row(rows, "simulated", 1, key)
        s2, _ = median_row(rows, "simulated", 2, key)
        out.append(
            report.check(
                f"measured N=2 / N=1 {key[:-3]}",
                m2 / m1,
                repeats=[b / a for a, b in zip(r1, r2)],
            )
        )
        out.append(report.check(f"simulated N=2 / N=1 {key[:-3]}", s2 / s1))
    both = [r for r in rows if r["kind"] == "measured" and r["n"] == 2]
    out.append(
        report.check(
            "measured N=2: every repeat, each core served some requests",
            all(min(r["requests_per_core"]) > 0 for r in both),
            "==",
            True,
        )
    )
    out.append(
        report.check(
            "no request failed",
            all(r["failed"] == 0 for r in rows if r["kind"] == "measured"),
            "==",
            True,
        )
    )
    return out


COLUMNS = [
    report.Column("kind", "kind"),
    report.Column("N (engine cores)", "n", "d"),
    report.Column("repeat", "repeat"),
    report.Column("out tok/s (tok/s)", "out_tok_per_s", ".0f"),
    report.Column("TTFT p50 (ms)", "ttft_p50_ms", ".0f"),
    report.Column("TTFT p99 (ms)", "ttft_p99_ms", ".0f"),
    report.Column("requests per core", "requests_per_core"),
    report.Column("tok per core CPU-s (tok/s)", "tok_per_core_cpu_s", ".0f"),
    report.Column("engine cores got (CPUs)", "engine_cores_busy", ".2f"),
    report.Column("others' CPU (share)", "other_cpu_share", ".0%"),
    report.Column("load 1 min before (procs)", "load_before", ".2f"),
    report.Column("load 1 min after (procs)", "load_after", ".2f"),
    report.Column("loaded machine", "loaded"),
]


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        f"{c['num_prompts']} docstrings prompts at once, greedy, {c['max_num_seqs_per_core']} seats "
        f"per core, router {c['router']}, 1 torch thread per core, {c['cpus']} CPUs; load average "
        f"{c['loadavg_before'][0]:.2f} before, {c['loadavg_after'][0]:.2f} after (a shared machine)"
    )
    if "date" in c:
        print(f"run {c['date']}: {c['command']}; loaded: {c['loaded_means']}")
    rows = [r | load_cells(r) for r in res["rows"]]
    report.print_table(rows, COLUMNS)
    report.print_checks(res["checks"])


def load_cells(row: dict) -> dict:
    """A row's 1-minute load before and after, and whether it ran loaded (an older result
    recorded the load averages but not the verdict)."""
    before, after = row.get("loadavg_before"), row.get("loadavg_after")
    b, a = (None if x is None else x[0] for x in (before, after))
    return {"load_before": b, "load_after": a, "loaded": row.get("loaded", loaded(b, a))}


if __name__ == "__main__":
    main()
