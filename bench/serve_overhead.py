"""What serving over HTTP costs: the same workload through the server and through the offline engine,
for both server designs (the engine core in its own process, or in a thread of the HTTP server's)
and both in-flight policies.

    python bench/serve_overhead.py [--num-prompts 64] [--max-num-seqs 16] [--out bench/results/serve_overhead.json]
    python bench/serve_overhead.py --show bench/results/serve_overhead.json   # print a saved result

1. offline   Engine("docstrings") runs the docstrings workload's prompts (greedy), timed
             by the wall clock around `engine.run()` (timeline recording included, as in
             the server).
2. server    `python -m minilm serve --engine-core process|thread` with the same knobs;
             `python -m minilm bench-serve` in another sends the same prompts all at once
             and measures output tok/s from the client side. Greedy: the same tokens.
3. low load  bench-serve sends short requests one at a time (--max-concurrency 1): the
             client's TTFT minus the engine's own TTFT for the same request (arrival ->
             first token on the server's timeline, matched by X-Request-Id) is what the
             HTTP layer adds: parsing, tokenizing, handing over to the engine thread and
             back, SSE, and the client's own parsing.

Targets (issue 19, for the process design, both policies): server output tok/s >= 90% of
offline; at low load, the TTFT the HTTP layer adds has p50 < 5 ms. The thread design is
measured beside it for lesson 9, with no target. Each repeat runs offline and server back
to back, so both see the same machine; the tables show each configuration's median
repeat, with the engine's time split (its steps, its loop between steps, the client's
share) and each process's CPU seconds (on 2 cores the client, the HTTP side and the
engine compete).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from minilm import Engine, EngineConfig, Timeline  # noqa: E402
from minilm.client.bench_serve import client_tokenizer, make_requests  # noqa: E402
from minilm.client.process import free_port  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (/proc/stat)."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Every 50 ms: the machine's busy CPU seconds and those of a few processes, stamped with
    time.perf_counter() (one monotonic clock for all processes on Linux, the clock bench-serve
    stamps its requests with), so the CPU used inside any window of the run can be read off."""

    def __init__(self, pids: dict[str, int]):
        self.pids, self.samples, self.stop = pids, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def sample(self) -> tuple:
        procs = {}
        for name, pid in self.pids.items():
            try:
                procs[name] = cpu_seconds(pid)
            except (FileNotFoundError, ProcessLookupError, IndexError):
                procs[name] = None  # not started yet or gone
        return time.perf_counter(), machine_busy_seconds(), procs

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.sample())
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds used between t0 and t1 (nearest samples): the machine, each process, the rest."""
        a = min(self.samples, key=lambda x: abs(x[0] - t0))
        b = min(self.samples, key=lambda x: abs(x[0] - t1))
        out = {"seconds": b[0] - a[0], "machine_busy": b[1] - a[1]}
        for name in self.pids:
            out[name] = (b[2][name] or 0.0) - (a[2][name] or b[2][name] or 0.0)
        out["other_processes"] = out["machine_busy"] - sum(out[n] for n in self.pids)
        out["idle"] = (os.cpu_count() or 1) * out["seconds"] - out["machine_busy"]
        return out


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (the engine-core process of `serve`), from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            pass
    return out


def offline(prompts, max_num_seqs: int, policy: str) -> dict:
    engine = Engine(
        "docstrings",
        # one torch thread, as the server below: on a shared 2-core machine more wait on each other
        EngineConfig(
            policy=policy, max_num_seqs=max_num_seqs, enable_prefix_caching=True, cpu_threads=1
        ),
    )
    for i, r in enumerate(prompts):
        engine.add_request(f"o{i}", prompt=r.prompt, max_tokens=r.max_tokens, temperature=0.0)
    sampler = CpuSampler({"engine": os.getpid()})
    cpu, t0 = time.process_time(), time.perf_counter()
    tl = engine.run()
    t1 = time.perf_counter()
    wall, cpu = t1 - t0, time.process_time() - cpu
    time.sleep(0.06)
    sampler.close()
    out = sum(r.output_len for r in tl.requests)
    busy = sum(s.duration for s in tl.steps)
    return {
        "output_tokens": out,
        "time_s": wall,
        "out_tok_per_s": out / wall,
        "steps": len(tl.steps),
        "busy_s": busy,
        "between_steps_s": wall - busy,
        "mean_step_ms": busy / len(tl.steps) * 1e3,
        "cpu_s": cpu,
        "cpu_window": sampler.window(t0, t1),
        "texts": {f"o{i}": engine.text(f"o{i}") for i in range(len(prompts))},
    }


def bench_serve(url: str, out: Path, server_pids: dict[str, int], *extra: str) -> tuple[dict, dict]:
    """Run bench-serve in its own process; its result and the CPU seconds used while it sent
    requests (its own import time excluded: the window is its first send to its last token)."""
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minilm",
            "bench-serve",
            "--base-url",
            url,
            "--save",
            str(out),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    sampler = CpuSampler(server_pids | {"client": client.pid, "bench": os.getpid()})
    if client.wait() != 0:
        raise RuntimeError("bench-serve failed")
    time.sleep(0.06)
    sampler.close()
    result = json.loads(out.read_text())
    start = min(result["start_times"])
    end = max(
        t + ttft + sum(gaps)
        for t, ttft, gaps in zip(result["start_times"], result["ttfts"], result["itls"])
    )
    return result, sampler.window(start, end)


def start_server(args, port: int, timeline: Path, design: str, policy: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minilm",
            "serve",
            "--port",
            str(port),
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--cpu-threads",
            "1",  # as the offline run: the numbers compare one torch thread each
            "--stream-interval",
            str(args.stream_interval),
            "--engine-core",
            design,
            "--policy",
            policy,
            "--timeline",
            str(timeline),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import httpx

    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.ConnectError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # Ctrl-C: drains, stops the engine thread, writes --timeline
    proc.wait(60)


def served(args, tmp: Path, k: int, design: str, policy: str) -> dict:
    """One server: a warm-up request, the all-at-once run, then the low-load run."""
    port, tl_path = free_port(), tmp / f"timeline_{design}_{policy}_{k}.json"
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args, port, tl_path, design, policy)
    try:
        import httpx

        httpx.post(
            f"{url}/v1/completions", json={"prompt": "Return the", "max_tokens": 4}, timeout=60
        )
        pids = {"server": proc.pid} | dict(zip(["engine_core"], child_pids(proc.pid)))
        result, cpu = bench_serve(
            url,
            tmp / f"load{k}.json",
            pids,
            "--num-prompts",
            str(args.num_prompts),
            "--seed",
            str(args.seed),
        )
        low, _ = bench_serve(
            url,
            tmp / f"low{k}.json",
            pids,
            "--num-prompts",
            str(args.low_load_requests),
            "--max-concurrency",
            "1",
            "--max-tokens",
            "8",
            "--seed",
            str(args.seed + 1),
        )
    finally:
        stop_server(proc)
    tl = Timeline.from_json(tl_path)
    return {"result": result, "low": low, "timeline": tl, "cpu_window": cpu}


def engine_side(tl: Timeline, ids: list[str]) -> dict:
    """The engine's share of the server run: steps that ran the benchmark's requests."""
    ids = set(ids)
    reqs = [r for r in tl.requests if r.request_id in ids]
    start, end = min(r.arrival for r in reqs), max(r.t_finished for r in reqs)
    steps = [s for s in tl.steps if s.t_start >= start and s.t_end <= end]
    busy = sum(s.duration for s in steps)
    return {
        "span_s": end - start,
        "steps": len(steps),
        "busy_s": busy,
        "between_steps_s": end - start - busy,
        "mean_step_ms": busy / len(steps) * 1e3,
        "output_tokens": sum(r.output_len for r in reqs),
    }


def low_load(run: dict) -> dict:
    """Client TTFT - engine TTFT, per request of the one-at-a-time run."""
    low, tl = run["low"], run["timeline"]
    engine_ttft = {r.request_id: r.t_first_token - r.arrival for r in tl.requests}
    client = np.array(low["ttfts"])
    engine = np.array([engine_ttft[rid] for rid in low["request_ids"]])
    added = (client - engine) * 1e3
    return {
        "client_ttft_p50_ms": float(np.median(client) * 1e3),
        "engine_ttft_p50_ms": float(np.median(engine) * 1e3),
        "added_p50_ms": float(np.median(added)),
        "added_p90_ms": float(np.percentile(added, 90)),
        "added_max_ms": float(added.max()),
        "requests": len(added),
    }


DESIGNS, POLICIES = ("process", "thread"), ("continuous", "chunked")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--low-load-requests", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stream-interval", type=int, default=1, help="the server's --stream-interval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/serve_overhead.json"))
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    prompts = make_requests(
        "docstrings", args.num_prompts, args.seed, tokenizer=client_tokenizer("docstrings")
    )
    command = report.command_line()
    conditions = report.machine() | {
        "torch_threads": 1,
        "loadavg_before": os.getloadavg(),
        "model": "docstrings",
        "prefix_caching": True,
        "max_num_seqs": args.max_num_seqs,
        "num_prompts": args.num_prompts,
        "stream_interval": args.stream_interval,
    }
    offline(prompts[:4], 4, "continuous")  # warm up
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            for design in DESIGNS:
                for policy in POLICIES:
                    off = offline(prompts, args.max_num_seqs, policy)
                    run = served(args, Path(tmp), k, design, policy)
                    r = run["result"]
                    same = all(
                        off["texts"][f"o{i}"] == text for i, text in enumerate(r["generated_texts"])
                    )
                    rows.append(
                        {
                            "design": design,
                            "policy": policy,
                            "repeat": k,
                            "offline": {k2: v for k2, v in off.items() if k2 != "texts"},
                            "server": {
                                "output_tokens": r["total_output_tokens"],
                                "time_s": r["duration"],
                                "out_tok_per_s": r["output_throughput"],
                                "failed": r["failed"],
                                "cpu_window": run["cpu_window"],
                            },
                            "engine_side": engine_side(run["timeline"], r["request_ids"]),
                            "low_load": low_load(run),
                            "same_texts": same,
                            "ratio": r["output_throughput"] / off["out_tok_per_s"],
                        }
                    )
                    print(
                        f"repeat {k} {design} {policy}: offline {off['out_tok_per_s']:.0f} tok/s, server "
                        f"{r['output_throughput']:.0f} tok/s ({rows[-1]['ratio']:.0%}), HTTP adds "
                        f"{rows[-1]['low_load']['added_p50_ms']:.2f} ms TTFT p50",
                        file=sys.stderr,
                    )
    conditions["loadavg_after"] = os.getloadavg()
    res = report.result("serve_overhead", command, conditions, rows, checks(rows))
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")


def medians(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Each configuration's median repeat (by its server / offline ratio)."""
    out = {}
    for design in DESIGNS:
        for policy in POLICIES:
            mine = sorted(
                (r for r in rows if (r["design"], r["policy"]) == (design, policy)),
                key=lambda r: r["ratio"],
            )
            if mine:
                out[design, policy] = mine[len(mine) // 2]
    return out


def checks(rows: list[dict]) -> list[dict]:
    """The issue's targets for the process design, on each policy's median repeat (every repeat's value
    beside it); the thread design's ratio for comparison, with no target."""
    out = []
    for (design, policy), med in medians(rows).items():
        same = [r for r in rows if (r["design"], r["policy"]) == (design, policy)]
        target = (">=", 0.9) if design == "process" else (None, None)
        out.append(
            report.check(
                f"{design}, {policy}: server / offline output tok/s",
                med["ratio"],
                *target,
                repeats=[r["ratio"] for r in same],
            )
        )
        if design == "process":
            out.append(
                report.check(
                    f"{design}, {policy}: TTFT the HTTP layer adds, p50 (ms)",
                    med["low_load"]["added_p50_ms"],
                    "<",
                    5,
                    repeats=[r["low_load"]["added_p50_ms"] for r in same],
                )
            )
    out.append(
        report.check(
            "same texts through the server as offline, every run",
            all(r["same_texts"] for r in rows),
            "==",
            True,
        )
    )
    return out


RUNS = [
    report.Column("run", "run"),
    report.Column("out (tokens)", "output_tokens", "d"),
    report.Column("time (s)", "time_s", ".2f"),
    report.Column("out (tok/s)", "out_tok_per_s", ".0f"),
    report.Column("vs offline (%)", "vs_offline", ".0%"),
]
TIME = [
    report.Column("run", "run"),
    report.Column("engine steps (s)", "busy_s", ".2f"),
    report.Column("engine loop between steps (s)", "between_steps_s", ".2f"),
    report.Column("client beyond the engine (s)", "client_s", ".2f"),
    report.Column("total (s)", "time_s", ".2f"),
    report.Column("steps (count)", "steps", "d"),
    report.Column("mean step (ms)", "mean_step_ms", ".2f"),
]
CPU = [
    report.Column("run", "run"),
    report.Column("CPU server, both processes (s)", "engine", ".2f"),
    report.Column("CPU bench-serve client (s)", "client", ".2f"),
    report.Column("CPU other processes (s)", "other_processes", ".2f"),
    report.Column("CPU idle, all cores (s)", "idle", ".2f"),
]
LOW = [
    report.Column("run", "run"),
    report.Column("client TTFT p50 (ms)", "client_ttft_p50_ms", ".2f"),
    report.Column("engine TTFT p50 (ms)", "engine_ttft_p50_ms", ".2f"),
    report.Column("HTTP adds p50 (ms)", "added_p50_ms", ".2f"),
    report.Column("HTTP adds p90 (ms)", "added_p90_ms", ".2f"),
]


def show(res: dict) -> None:
    c, rows = res["conditions"], res["rows"]
    print(
        f"docstrings model, max_num_seqs {c['max_num_seqs']}, prefix caching on, {c['num_prompts']} prompts all at "
        f"once, greedy, stream interval {c['stream_interval']}; {c['cpus']} CPUs ({c['machine']}), torch "
        f"{c['torch']} with 1 thread; load average {c['loadavg_before'][0]:.1f} before, {c['loadavg_after'][0]:.1f} "
        f"after; each configuration's median of {len(rows) // 4} repeats"
    )
    meds = medians(rows)
    print()
    report.print_table(
        [
            {"run": f"{d} {p}: offline engine", **m["offline"], "vs_offline": 1.0}
            for (d, p), m in meds.items()
            if d == "process"
        ]
        + [
            {"run": f"{d} {p}: server, client side", **m["server"], "vs_offline": m["ratio"]}
            for (d, p), m in meds.items()
        ],
        RUNS,
    )
    print("\nwhere the time goes (server runs)")
    report.print_table(
        [
            {
                "run": f"{d} {p}",
                **m["engine_side"],
                "client_s": m["server"]["time_s"] - m["engine_side"]["span_s"],
                "time_s": m["server"]["time_s"],
            }
            for (d, p), m in meds.items()
        ],
        TIME,
    )
    print()
    report.print_table(
        [
            {
                "run": f"{d} {p}",
                **m["server"]["cpu_window"],
                "engine": m["server"]["cpu_window"]["server"]
                + m["server"]["cpu_window"].get("engine_core", 0.0),
            }
            for (d, p), m in meds.items()
        ],
        CPU,
    )
    print(
        "\nlow load (one request at a time, 8 tokens): TTFT p50 at the client, at the engine, and what HTTP adds"
    )
    report.print_table([{"run": f"{d} {p}", **m["low_load"]} for (d, p), m in meds.items()], LOW)
    print("\nchecks on each configuration's median repeat, every repeat's value in brackets")
    report.print_checks(res["checks"])


if __name__ == "__main__":
    main()
