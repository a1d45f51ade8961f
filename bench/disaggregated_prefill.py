"""Disaggregated prefill on this CPU, measured: a prefill and a decode engine-core process with a
real KV transfer between them (minilm/serve/kv_transfer.py), against one colocated engine core
with the same total cores, on the same requests; and the simulator's prediction for both.

    python bench/disaggregated_prefill.py [--num-prompts 16] [--out FILE]
    python bench/disaggregated_prefill.py --show bench/results/disaggregated_prefill.json

colocated       one engine-core process, cpu_threads=2 (the machine's two cores)
colocated-1-thread   the same with cpu_threads=1: what torch's second thread buys (or costs) here
disaggregated   a prefill and a decode engine-core process, cpu_threads=1 each, linked by ZeroMQ
                over TCP on loopback (the KV of each prompt, its block table's blocks, as bytes)

Both run the docstrings model (float32, continuous batching, prefix caching on), greedy with
ignore_eos, driven from the API process's side of the engine client (no HTTP: what differs is
the engine side): TTFT is a request's arrival to its first token reaching the API process, ITL
the gap between its tokens there, tok/s all output tokens over the run's span. The transfer is
timed on both sides: `send` (the prefill core copies the blocks out and hands the message to
ZeroMQ), `link` (sent to taken in by the decode core: the bytes on loopback, decoding, and the
wait for the step the decode core was running when they came) and `held` (taken in to written
into its blocks, waiting for a seat included); its share of TTFT is (send + link) / TTFT.

The simulator's rows (SIMULATED) run the same requests on `simulated_engine("docstrings",
"cpu")` (the CPU cost model fitted by bench/calibrate_cpu.py) and `simulated_disaggregated` with
a Link whose bandwidth and latency are this run's measured link (bytes / link time, so the
decode step's wait is in it). The simulator has one CPU spec per engine and no threads: its
colocated engine is one calibrated CPU, its pair two of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm import EngineConfig  # noqa: E402
from minilm.config import ModelConfig  # noqa: E402
from minilm.metrics import summarize  # noqa: E402
from minilm.model.loader import resolve_model_path  # noqa: E402
from minilm.serve.engine_core import ProcessEngineClient  # noqa: E402
from minilm.serve.kv_transfer import DisaggEngineClient  # noqa: E402
from minilm.serve.messages import Rejected, Tokens  # noqa: E402
from minilm.serve.metrics import ServerMetrics  # noqa: E402
from minilm.serve.openai_api import COMPLETIONS, GenerateRequest  # noqa: E402
from minilm.sim.disaggregation import Link, simulated_disaggregated  # noqa: E402
from minilm.sim.executor import simulated_engine  # noqa: E402
from minilm.workload import RequestSpec, make_workload  # noqa: E402

MODEL, MAX_MODEL_LEN = "docstrings", 256
RATES = {"mixed": 4.0, "long-prompt": None}  # req/s (long-prompt: its own arrival pattern)


def knobs(threads: int) -> EngineConfig:
    return EngineConfig(max_num_seqs=16, enable_prefix_caching=True, cpu_threads=threads)


def workload(name: str, n: int) -> list[RequestSpec]:
    return make_workload(
        name, n, seed=0, vocab_size=4096, rate=RATES[name], max_model_len=MAX_MODEL_LEN
    )


async def drive(client, specs: list[RequestSpec]) -> dict[str, dict]:
    """Every request at its arrival; the times its tokens reach this process."""
    t0 = time.perf_counter()

    async def one(s: RequestSpec) -> tuple[str, dict]:
        await asyncio.sleep(max(0.0, t0 + s.arrival - time.perf_counter()))
        arrival = time.perf_counter()
        req = GenerateRequest(COMPLETIONS, s.prompt_ids, s.max_tokens, {"ignore_eos": True})
        stream = client.add(s.id, req, arrival)
        times, ids = [], []
        while True:
            e = await stream.queue.get()
            if isinstance(e, Rejected):
                raise RuntimeError(f"{s.id}: {e.message}")
            if not isinstance(e, Tokens):
                continue  # Accepted
            now = time.perf_counter()
            times += [now] * len(e.token_ids)
            ids += e.token_ids
            if e.finish_reason is not None:
                return s.id, {"arrival": arrival, "times": times, "ids": ids}

    return dict(await asyncio.gather(*map(one, specs)))


async def measure(deployment: str, specs: list[RequestSpec]) -> tuple[dict, dict]:
    metrics = ServerMetrics(MODEL, None)
    if deployment.startswith("colocated"):
        threads = 1 if deployment == "colocated-1-thread" else 2
        client = ProcessEngineClient(MODEL, knobs(threads), metrics, window=None)
    else:
        client = DisaggEngineClient(MODEL, knobs(1), knobs(1), metrics, window=None)
    await client.start()
    try:
        await drive(client, [RequestSpec("warmup", [5] * 40, 4)])
        out = await drive(client, specs)
        sides = {}
        if deployment == "disaggregated":
            for side in ("prefill", "decode"):
                sides[side] = await client.snapshot_of(side)
    finally:
        await client.stop()
    return out, sides


def latency_row(out: dict[str, dict]) -> dict:
    ttft = [r["times"][0] - r["arrival"] for r in out.values()]
    itl = [b - a for r in out.values() for a, b in zip(r["times"], r["times"][1:])]
    span = max(r["times"][-1] for r in out.values()) - min(r["arrival"] for r in out.values())
    tokens = sum(len(r["ids"]) for r in out.values())
    return {
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "itl_p99": float(np.percentile(itl, 99)),
        "output_tok_per_s": tokens / span,
        "requests": len(out),
    }


def transfer_row(out: dict[str, dict], sides: dict) -> dict:
    sent = {t["request_id"]: t for t in sides["prefill"]["transfers"]}
    got = {t["request_id"]: t for t in sides["decode"]["transfers"] if t["request_id"] in out}
    share = [
        (sent[rid]["send_s"] + t["link_s"]) / (out[rid]["times"][0] - out[rid]["arrival"])
        for rid, t in got.items()
    ]
    return {
        "kv_bytes_per_request": float(np.mean([t["bytes"] for t in got.values()])),
        "send_ms_mean": 1e3 * float(np.mean([sent[r]["send_s"] for r in got])),
        "link_ms_mean": 1e3 * float(np.mean([t["link_s"] for t in got.values()])),
        "held_ms_mean": 1e3 * float(np.mean([t["held_s"] for t in got.values()])),
        "transfer_share_of_ttft": float(np.mean(share)),
        "link_bytes_per_s": sum(t["bytes"] for t in got.values())
        / sum(t["link_s"] for t in got.values()),
        "link_latency_s": min(t["link_s"] for t in got.values()),
    }


def simulated_rows(name: str, specs: list[RequestSpec], transfer: dict) -> list[dict]:
    """The same requests, SIMULATED: one engine; a prefill and a decode engine over this link."""
    model = ModelConfig.from_json(resolve_model_path(MODEL) / "config.json")
    common = dict(max_num_seqs=16, max_model_len=MAX_MODEL_LEN, dtype="float32")
    one = simulated_engine(model, "cpu", policy="continuous", enable_prefix_caching=True, **common)
    one.add_workload(specs, ignore_eos=True)
    link = Link(
        "ZeroMQ TCP loopback",
        transfer["link_bytes_per_s"],
        transfer["link_latency_s"],
        "this run's measured link: bytes over link time, the fastest transfer's time",
    )
    pair = simulated_disaggregated(model, "cpu", link=link, policy="continuous", **common)
    pair.add_workload(specs, ignore_eos=True)
    rows = []
    for deployment, tl in (("colocated", one.run()), ("disaggregated", pair.run().timeline())):
        m = summarize(tl)
        rows.append(
            {
                "workload": name,
                "deployment": deployment,
                "source": "simulated",
                **{k: m[k] for k in ("ttft_p50", "ttft_p99", "itl_p99", "output_tok_per_s")},
                "requests": len(tl.requests),
            }
        )
    return rows


COLUMNS = [
    report.Column("workload", "workload"),
    report.Column("deployment", "deployment"),
    report.Column("source", "source"),
    report.Column("TTFT p50 (ms)", "ttft_p50", ".1f", 1e3),
    report.Column("TTFT p99 (ms)", "ttft_p99", ".1f", 1e3),
    report.Column("ITL p99 (ms)", "itl_p99", ".1f", 1e3),
    report.Column("output (tok/s)", "output_tok_per_s", ".0f"),
]
TRANSFER_COLUMNS = [
    report.Column("workload", "workload"),
    report.Column("KV (kB/request)", "kv_bytes_per_request", ".0f", 1e-3),
    report.Column("send (ms)", "send_ms_mean", ".2f"),
    report.Column("link (ms)", "link_ms_mean", ".2f"),
    report.Column("held (ms)", "held_ms_mean", ".2f"),
    report.Column("share of TTFT (%)", "transfer_share_of_ttft", ".1%"),
]


def show(res: dict) -> int:
    c = res["conditions"]
    print(report.about(c))
    print(f"load average {c['loadavg_before']} before, {c['loadavg_after']} after; {c['note']}")
    report.print_table([r for r in res["rows"] if "deployment" in r], COLUMNS)
    print()
    report.print_table([r for r in res["rows"] if "kv_bytes_per_request" in r], TRANSFER_COLUMNS)
    print()
    report.print_checks(res["checks"])
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "disaggregated_prefill.json"
    )
    report.add_show_option(p)
    args = p.parse_args()
    if args.show:
        return show(report.load(args.show))
    before = [round(x, 2) for x in os.getloadavg()]
    rows, checks = [], []
    for name in RATES:
        specs = workload(name, args.num_prompts)
        measured = {}
        for deployment in ("colocated", "colocated-1-thread", "disaggregated"):
            out, sides = asyncio.run(measure(deployment, specs))
            measured[deployment] = out
            row = {"workload": name, "deployment": deployment, "source": "measured"}
            rows.append(row | latency_row(out))
            print(f"{name} {deployment}: {rows[-1]['output_tok_per_s']:.0f} tok/s", flush=True)
        transfer = {"workload": name} | transfer_row(measured["disaggregated"], sides)
        rows.append(transfer)
        rows += simulated_rows(name, specs, transfer)
        same = all(
            measured["colocated"][s.id]["ids"] == measured["disaggregated"][s.id]["ids"]
            for s in specs
        )
        checks.append(report.check(f"{name}: every output token-identical", same, "==", True))
        checks.append(
            report.check(f"{name}: transfer's share of TTFT", transfer["transfer_share_of_ttft"])
        )
        by = {
            (r["deployment"], r["source"]): r
            for r in rows
            if r.get("workload") == name and "source" in r
        }
        for base, source in (
            ("colocated", "measured"),
            ("colocated-1-thread", "measured"),
            ("colocated", "simulated"),
        ):
            ratio = (
                by[("disaggregated", source)]["output_tok_per_s"]
                / by[(base, source)]["output_tok_per_s"]
            )
            checks.append(report.check(f"{name}: disaggregated / {base} tok/s, {source}", ratio))
            ttft = by[("disaggregated", source)]["ttft_p50"] / by[(base, source)]["ttft_p50"]
            checks.append(report.check(f"{name}: disaggregated / {base} TTFT p50, {source}", ttft))
    conditions = report.machine() | {
        "model": MODEL,
        "num_prompts": args.num_prompts,
        "rates": RATES,
        "loadavg_before": before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "note": "a 2-core machine shared with other work; colocated: 1 process x 2 threads, "
        "disaggregated: 2 processes x 1 thread (plus the API process in both)",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    res = report.result("disaggregated_prefill", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
