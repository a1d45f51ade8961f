"""A server that runs all day keeps its memory flat (issue 25.6): many short completions
through `python -m minilm serve`, the resident memory of its processes sampled as they go.

    python bench/soak.py [--requests 20000] [--concurrency 16] [--out bench/results/soak.json]
    python bench/soak.py --before /tmp/before   # first, the code before the change, for comparison
    python bench/soak.py --show bench/results/soak.json   # print a saved result

(`/tmp/before`: a checkout of the commit before, e.g. `git archive 8257a56 | tar -x -C /tmp/before`,
run as it is: its server has no `--timeline-window` and keeps everything.)

1. The server: `python -m minilm serve --model docstrings --max-num-seqs 16 --timeline FILE`
   (the engine core in a process of its own, as by default).
2. The load: `--concurrency` clients, each sending a short non-streaming completion
   (`--max-tokens`, greedy, a prompt from the docstrings workload) as soon as its last one
   answered, until `--requests` have. Beside them a poller reads `GET /timeline` every
   `--poll` seconds as the live Gantt does (widgets/live.py): from the cursors the last
   answer gave.
3. Memory: every `--sample-every` requests, the resident set (RSS, /proc/PID/status VmRSS)
   of the server's process and of each process it started (the engine core; multiprocessing's
   resource tracker), summed. The slope is a least-squares line through the samples from
   `--fit-from` requests on, in MiB per 1,000 requests; the samples before it (imports
   warming, the allocator's arenas filling) are shown but not fitted.
4. The live views at the end: `GET /timeline?since=0&since_request=0` (the server's window)
   against the `--timeline` file the server wrote when it stopped: its last steps and
   requests, in their public view, must be the window's; the file must hold every request.

Targets (issue 25.6), for this checkout's server: growth after `--fit-from` under 1 MiB per
1,000 requests, no failed request, the window equal to the file's tail and no longer than
`--window`. The before run's slope is reported beside it, with no target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from bench.serve_overhead import child_pids  # noqa: E402
from minilm import Timeline  # noqa: E402
from minilm.client.bench_serve import client_tokenizer, make_requests  # noqa: E402
from minilm.client.process import free_port  # noqa: E402
from minilm.serve.public import public_view  # noqa: E402

MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    """A process's resident set (Linux /proc); 0 once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def server_rss(pid: int) -> dict[str, int]:
    """RSS of the server's process and of every process it started, in bytes."""
    out = {"server": rss_bytes(pid)}
    for k, child in enumerate(sorted(child_pids(pid))):
        out[f"child{k}"] = rss_bytes(child)
    return out


def start_server(args, code: str, port: int, timeline: Path) -> subprocess.Popen:
    import httpx

    cmd = [sys.executable, "-m", "minilm", "serve", "--model", "docstrings"]
    cmd += ["--port", str(port), "--max-num-seqs", str(args.concurrency)]
    cmd += ["--cpu-threads", "1"]  # the old code's default: both runs alike, beside their clients
    cmd += ["--timeline", str(timeline)]
    if code == str(ROOT):
        cmd += ["--timeline-window", str(args.window)]
    env = {**os.environ, "PYTHONPATH": code}  # the server imports the code measured
    log = open(timeline.with_suffix(".log"), "w+")  # a file: a pipe nobody reads stalls the server
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server did not start: {log.read()[-2000:]}")
        time.sleep(0.2)


class Load:
    """The clients, the live-view poller and the memory samples of one run."""

    def __init__(self, args, requests: int, url: str, pid: int, prompts: list[str]):
        self.args, self.requests, self.url, self.pid = args, requests, url, pid
        self.prompts = prompts
        self.sent = self.done = 0
        self.errors: list[str] = []
        self.samples: list[dict] = []  # {"requests", "seconds", "rss": {process: bytes}}
        self.polls = self.gaps = 0  # live-view polls, and those whose records did not follow on
        self.cursor = {"since": 0, "since_request": 0}
        self.t0 = time.perf_counter()

    def sample(self) -> None:
        rss = server_rss(self.pid)
        self.samples.append(
            {"requests": self.done, "seconds": time.perf_counter() - self.t0, "rss": rss}
        )
        mib = sum(rss.values()) / MIB
        print(f"{self.done:>7} requests  {mib:7.1f} MiB  {self.samples[-1]['seconds']:7.0f} s")

    async def client(self, http) -> None:
        while self.sent < self.requests:
            k, self.sent = self.sent, self.sent + 1
            body = {
                "prompt": self.prompts[k % len(self.prompts)],
                "max_tokens": self.args.max_tokens,
                "temperature": 0.0,
            }
            try:
                r = await http.post(
                    f"{self.url}/v1/completions", json=body, headers={"X-Request-Id": f"soak-{k}"}
                )
                if r.status_code != 200:
                    self.errors.append(f"soak-{k}: HTTP {r.status_code} {r.text[:200]}")
            except Exception as e:  # noqa: BLE001 (counted and shown, the run goes on)
                self.errors.append(f"soak-{k}: {type(e).__name__}: {e}")
            self.done += 1
            if self.done % self.args.sample_every == 0:
                self.sample()

    async def poller(self, http) -> None:
        """GET /timeline as the live Gantt does: from the cursors of the last answer."""
        while True:
            await asyncio.sleep(self.args.poll)
            data = (await http.get(f"{self.url}/timeline", params=self.cursor)).json()
            steps = data["steps"]
            self.polls += 1
            self.gaps += bool(steps) and steps[0]["step"] != self.cursor["since"]
            self.cursor = {"since": data["next_step"], "since_request": data["next_request"]}

    async def run(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=self.args.concurrency + 2)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            self.sample()
            poller = asyncio.create_task(self.poller(http))
            await asyncio.gather(*(self.client(http) for _ in range(self.args.concurrency)))
            poller.cancel()
            self.window = (
                await http.get(f"{self.url}/timeline", params={"since": 0, "since_request": 0})
            ).json()


def slope(samples: list[dict], fit_from: int) -> dict:
    """Least-squares RSS growth through the samples from `fit_from` requests on (MiB per 1,000)."""
    pts = [
        (s["requests"], sum(s["rss"].values()) / MIB) for s in samples if s["requests"] >= fit_from
    ]
    if len(pts) < 2:
        return {"points": len(pts), "mib_per_1000": None, "r2": None}
    x, y = np.array(pts, dtype=float).T
    a, b = np.polyfit(x / 1000, y, 1)
    fit = a * x / 1000 + b
    ss = float(((y - y.mean()) ** 2).sum())
    return {
        "points": len(pts),
        "from_requests": int(x[0]),
        "to_requests": int(x[-1]),
        "mib_per_1000": float(a),
        "intercept_mib": float(b),
        "r2": 1 - float(((y - fit) ** 2).sum()) / ss if ss else 1.0,
        "max_residual_mib": float(abs(y - fit).max()),
    }


def window_check(window: dict, tl: Timeline) -> dict:
    """The server's /timeline window against its --timeline file: the file's tail, in public view."""
    steps, reqs = window.get("steps", []), window.get("requests", [])
    return {
        "window_steps": len(steps),
        "window_requests": len(reqs),
        "file_steps": len(tl.steps),
        "file_requests": len(tl.requests),
        "next_step": window.get("next_step"),
        "next_request": window.get("next_request"),
        "steps_match": steps == [public_view(s) for s in tl.steps[len(tl.steps) - len(steps) :]]
        and window.get("next_step") == len(tl.steps),
        "requests_match": reqs
        == [public_view(r) for r in tl.requests[len(tl.requests) - len(reqs) :]]
        and window.get("next_request") == len(tl.requests),
        "unfinished_at_end": len(window.get("unfinished", [])),
    }


def soak(args, code: str, requests: int, fit_from: int, run: str, prompts: list[str]) -> dict:
    """One server from checkout `code`, `requests` requests through it: its samples and verdicts."""
    with tempfile.TemporaryDirectory() as tmp:
        port, path = free_port(), Path(tmp) / "timeline.json"
        proc = start_server(args, code, port, path)
        load = Load(args, requests, f"http://127.0.0.1:{port}", proc.pid, prompts)
        try:
            asyncio.run(load.run())
        finally:
            proc.send_signal(signal.SIGINT)  # Ctrl-C: drains, stops, writes --timeline
            proc.wait(300)
        tl = Timeline.from_json(path)
        file_mib = path.stat().st_size / MIB
    samples = [
        {
            "run": run,
            "requests": s["requests"],
            "seconds": s["seconds"],
            "rss_mib": sum(s["rss"].values()) / MIB,
            "server_mib": s["rss"]["server"] / MIB,
            "children_mib": sum(v for k, v in s["rss"].items() if k != "server") / MIB,
            "processes": len(s["rss"]),
        }
        for s in load.samples
    ]
    summary = {
        "run": run,
        "code": git_commit(code),
        "requests_sent": requests,
        "fit": slope(load.samples, fit_from),
        "window": window_check(load.window, tl) | {"polls": load.polls, "poll_gaps": load.gaps},
        "timeline_file_mib": file_mib,
        "errors": len(load.errors),
        "first_errors": load.errors[:20],
    }
    return {"samples": samples, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=16, help="clients, and --max-num-seqs")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--sample-every", type=int, default=1000, help="requests between RSS samples")
    ap.add_argument("--fit-from", type=int, default=5000, help="fit the slope from here on")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between /timeline polls")
    ap.add_argument("--window", type=int, default=1000, help="the server's --timeline-window")
    ap.add_argument(
        "--before",
        metavar="DIR",
        help="first, the same through a checkout of the code before the change (no targets)",
    )
    ap.add_argument("--before-requests", type=int, default=6000)
    ap.add_argument("--before-fit-from", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "bench/results/soak.json"))
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    prompts = [
        r.prompt
        for r in make_requests("docstrings", 256, 0, tokenizer=client_tokenizer("docstrings"))
    ]
    conditions = report.machine() | {
        "loadavg_before": os.getloadavg(),
        "model": "docstrings",
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_num_seqs": args.concurrency,
        "max_tokens": args.max_tokens,
        "stream": False,
        "sample_every": args.sample_every,
        "fit_from": args.fit_from,
        "poll_s": args.poll,
        "timeline_window": args.window,
        "before_requests": args.before_requests if args.before else None,
        "before_fit_from": args.before_fit_from if args.before else None,
    }
    runs = []
    if args.before:  # the old server has no --timeline-window
        runs.append(
            soak(args, args.before, args.before_requests, args.before_fit_from, "before", prompts)
        )
    runs.append(soak(args, str(ROOT), args.requests, args.fit_from, "after", prompts))
    conditions["loadavg_after"] = os.getloadavg()
    rows = [s for r in runs for s in r["samples"]] + [r["summary"] for r in runs]
    res = report.result("soak", report.command_line(), conditions, rows, checks(args, runs))
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")


def checks(args, runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        s, fit = run["summary"], run["summary"]["fit"]
        if s["run"] == "before" and fit["mib_per_1000"] is not None:
            out.append(
                report.check(
                    f"before ({s['code']}): RSS growth after {fit['from_requests']:,} requests "
                    "(MiB per 1,000 requests)",
                    fit["mib_per_1000"],
                    r2=fit["r2"],
                    points=fit["points"],
                )
            )
    s = runs[-1]["summary"]
    fit, win = s["fit"], s["window"]
    out.append(
        report.check(
            f"RSS growth after {args.fit_from:,} requests (MiB per 1,000 requests)",
            fit["mib_per_1000"] if fit["mib_per_1000"] is not None else float("inf"),
            "<",
            1.0,
            r2=fit["r2"] or 0.0,
            points=fit["points"],
        )
    )
    out.append(report.check("failed requests", s["errors"], "==", 0))
    out.append(
        report.check("requests in the --timeline file", win["file_requests"], "==", args.requests)
    )
    out.append(
        report.check("/timeline window == the file's last steps", win["steps_match"], "==", True)
    )
    out.append(
        report.check(
            "/timeline window == the file's last requests", win["requests_match"], "==", True
        )
    )
    out.append(report.check("live polls that skipped steps", win["poll_gaps"], "==", 0))
    longest = max(win["window_steps"], win["window_requests"])
    out.append(report.check("/timeline window, longest (records)", longest, "<=", args.window))
    return out


def git_commit(path: str) -> str:
    try:
        return (
            subprocess.run(
                ["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or path
        )
    except OSError:
        return path


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            report.about(c),
            f"{c['requests']:,} requests at concurrency {c['concurrency']}, max_tokens "
            f"{c['max_tokens']}, --timeline-window {c['timeline_window']}",
        )
    )
    samples = [r for r in res["rows"] if "rss_mib" in r]
    report.print_table(
        samples,
        [
            report.Column("run", "run"),
            report.Column("requests (count)", "requests", "d"),
            report.Column("time (s)", "seconds", ".0f"),
            report.Column("RSS (MiB)", "rss_mib", ".1f"),
            report.Column("server (MiB)", "server_mib", ".1f"),
            report.Column("its children (MiB)", "children_mib", ".1f"),
            report.Column("processes (count)", "processes", "d"),
        ],
    )
    for s in (r for r in res["rows"] if "fit" in r):
        fit = s["fit"]
        if fit["mib_per_1000"] is not None:
            print(
                f"{s['run']} ({s['code']}): fit over {fit['points']} samples, "
                f"{fit['from_requests']:,}-{fit['to_requests']:,} requests: "
                f"{fit['mib_per_1000']:+.2f} MiB per 1,000 requests (R² {fit['r2']:.2f}, "
                f"largest residual {fit['max_residual_mib']:.1f} MiB)"
            )
    print()
    report.print_checks(res["checks"])


if __name__ == "__main__":
    main()
