"""What 8-bit weights (`--quantization`, torchao) cost and buy on this CPU: a table and JSON.

    python bench/quantization.py [--repeats 5] [--out bench/results/quantization.json]
    python bench/quantization.py --show bench/results/quantization.json   # print a saved result

The shipped `docstrings` model, its linear layers (q/k/v/o and the MLP; not the tied LM
head and embedding: minilm/model/quantization.py says why) in float32 (as shipped, read
into float32), int8 weight-only and fp8 weight-only (torchao 0.18). For each:

weights     bytes of the parameters as stored (the engine's `weight_bytes` in the
            timeline's meta): int8 data and scales for a quantized matrix
speed       decode tokens/s at batch 1 and 16 (the median full-batch decode step of a run,
            no prefill in it) and prefill tokens/s (one step prefilling 8 held-out
            prompts of 128 tokens), one thread; the median of --repeats runs that take
            the methods in turn. Each step is timed by the CPU time of the engine's
            thread: the machine is shared (2 cores, other work running), and a step's
            wall time also counts the time it waited for a core, which doubled it and
            moved it 2x from run to run while this was written. Wall-time medians are
            kept too; the ratios to fp32 pair each run with fp32's in the same repeat
quality     along the fp32 model's own greedy text on the `docstrings` workload (one
            prompt per held-out docstring, all 340): the share of positions where the
            quantized model's argmax is the fp32 model's (teacher-forced, as
            bench/draft_agreement.py measures a draft); the share of requests whose whole
            greedy output from the engine is identical; and perplexity and bits per byte
            on the held-out docstrings (training/train.py's `evaluate`, the numbers the
            checkpoint's README gives for fp32)

A simulated table beside it: Llama-3-8B decode on an H100 and an A100 from the cost model
(minilm/sim/costmodel.py), the same knobs, labelled simulated, and the one published
8-bit measurement the model can be held against (torchao's int8 weight-only on an A100).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from bench.draft_agreement import argmaxes  # noqa: E402
from minilm import Engine, make_workload  # noqa: E402
from minilm.model.loader import load_model, resolve_model_path  # noqa: E402
from minilm.model.quantization import quantize  # noqa: E402
from minilm.sim.costmodel import CostModel  # noqa: E402
from minilm.timeline import StepRecord  # noqa: E402
from minilm.workload import DOCSTRINGS_HELDOUT  # noqa: E402
from training.train import encode_docs, eval_rows, evaluate, token_byte_lengths  # noqa: E402

MODEL = "docstrings"
METHODS = (None, "int8", "fp8")
PREFILL_PROMPTS, PREFILL_LEN = 8, 128
# torchao's Llama-2-7B on one A100, batch 1, torch.compile: bf16 107.38 tok/s, int8 weight-only 170.83
# (github.com/pytorch/ao/blob/1df9caef6386061cc2fdcb52dc60efea5edf82a2/torchao/_models/llama/benchmark_results.txt,
# rows 20240831225155 and 20240831230013)
TORCHAO_A100_INT8_SPEEDUP = 170.83 / 107.38
SIM_MODEL, SIM_DEVICES, SIM_BATCHES, SIM_CONTEXT = "llama-3-8b", ("h100", "a100"), (1, 64), 1024
SIM_KNOBS = ((None, "auto"), ("int8", "auto"), ("fp8", "auto"), ("fp8", "fp8"))


def name(method: str | None) -> str:
    return method or "fp32"


# ---- speed --------------------------------------------------------------------------
def timed_steps(engine: Engine) -> list[tuple[StepRecord, float]]:
    """Run the engine, each step with the CPU seconds this thread spent in it (`time.thread_time`:
    what the step cost the core; its wall time, `StepRecord.duration`, also counts the time the
    thread waited for a core, which on a shared machine is most of the noise)."""
    out = []
    while engine.has_unfinished():
        t = time.thread_time()
        record = engine.step()
        out.append((record, time.thread_time() - t))
    return out


def decode_speed(method: str | None, batch: int, threads: int, steps: int = 48) -> dict:
    """Tokens/s of the median full-batch decode step (no prefill in it) of one run, by CPU and wall time."""
    engine = Engine(
        MODEL, max_num_seqs=batch, cpu_threads=threads, record_kv_blocks=False, quantization=method
    )
    prompt = engine.tokenizer.encode("Return the number of items in the")
    for i in range(batch):
        engine.add_request(f"b{i}", prompt_ids=prompt, max_tokens=steps, ignore_eos=True)
    decode = [
        (s, cpu)
        for s, cpu in timed_steps(engine)
        if s.tokens("decode") == batch and s.tokens("prefill") == 0
    ]
    return {
        "cpu": batch / statistics.median(cpu for _, cpu in decode),
        "wall": batch / statistics.median(s.duration for s, _ in decode),
        "weight_bytes": engine.timeline.meta["weight_bytes"],
    }


def prefill_speed(method: str | None, prompts: list[list[int]], threads: int) -> dict:
    """Tokens/s of one step that prefills every prompt (and nothing else), by CPU and wall time."""
    engine = Engine(
        MODEL,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=sum(map(len, prompts)),
        cpu_threads=threads,
        record_kv_blocks=False,
        quantization=method,
    )
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", prompt_ids=p, max_tokens=1)
    step, cpu = timed_steps(engine)[0]
    assert step.tokens("prefill") == sum(map(len, prompts)) and step.tokens("decode") == 0
    return {"cpu": step.tokens("prefill") / cpu, "wall": step.tokens("prefill") / step.duration}


SPEEDS = ("decode_1", "decode_16", "prefill")


def measure_speed(prompts: list[list[int]], threads: int, repeats: int) -> dict:
    """{method: {speed: median tok/s by CPU time, speed_wall: by wall time, speed_ratios: each
    repeat's tok/s / fp32's in the same repeat (by CPU time)}, weight_bytes}. A repeat runs
    every method back to back, so a burst of load on the machine hits all of them."""
    for m in METHODS:  # warm up: first-call allocations, torch's and torchao's lazy init
        decode_speed(m, 1, threads, steps=8)
    runs = {m: {k: [] for k in SPEEDS} for m in METHODS}
    out: dict = {m: {} for m in METHODS}
    for _ in range(repeats):
        for m in METHODS:
            for b in (1, 16):
                run = decode_speed(m, b, threads)
                runs[m][f"decode_{b}"].append(run)
                out[m]["weight_bytes"] = run["weight_bytes"]
            runs[m]["prefill"].append(prefill_speed(m, prompts, threads))
    for m in METHODS:
        for k in SPEEDS:
            out[m][k] = statistics.median(r["cpu"] for r in runs[m][k])
            out[m][f"{k}_wall"] = statistics.median(r["wall"] for r in runs[m][k])
            out[m][f"{k}_ratios"] = [r["cpu"] / f["cpu"] for r, f in zip(runs[m][k], runs[None][k])]
    return out


# ---- quality ------------------------------------------------------------------------
def greedy_outputs(
    method: str | None, n: int, seed: int, threads: int
) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt ids, greedy output ids) of every request of the `docstrings` workload, by id."""
    engine = Engine(
        MODEL, max_num_seqs=16, cpu_threads=threads, record_kv_blocks=False, quantization=method
    )
    specs = make_workload(
        "docstrings", num_requests=n, seed=seed, max_model_len=engine.config.max_model_len
    )
    engine.add_workload(specs)
    engine.run()
    return {
        s.id: (engine.requests[s.id].prompt_ids, engine.requests[s.id].output_ids) for s in specs
    }


def measure_quality(n: int, seed: int, threads: int) -> dict:
    """{method: {"agreement", "identical", "loss", "bits_per_byte", "perplexity", ...}}."""
    fp32 = greedy_outputs(None, n, seed, threads)
    path = resolve_model_path(MODEL)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    seq_len = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    held = eval_rows(encode_docs(tok, json.loads(DOCSTRINGS_HELDOUT.read_text())), seq_len)
    base = load_model(MODEL)
    reference = {rid: argmaxes(base, prompt, output) for rid, (prompt, output) in fp32.items()}
    out = {}
    for m in METHODS:
        model = quantize(base, m)
        agree = sum(
            int((argmaxes(model, *fp32[rid]) == ref).sum()) for rid, ref in reference.items()
        )
        positions = sum(len(output) for _, output in fp32.values())
        outputs = fp32 if m is None else greedy_outputs(m, n, seed, threads)
        same = sum(outputs[rid][1] == fp32[rid][1] for rid in fp32)
        ev = evaluate(model, held, seq_len, token_byte_lengths(tok), "cpu")
        out[m] = {
            "agreement": agree / positions,
            "positions": positions,
            "identical": same / len(fp32),
            "loss": ev.loss,
            "bits_per_byte": ev.bits_per_byte,
            "perplexity": math.exp(ev.loss),
            "heldout_tokens": ev.tokens,
        }
    return out


# ---- simulated ----------------------------------------------------------------------
def simulated_rows() -> list[dict]:
    """Llama-3-8B decode steps from the cost model: every knob, on each device and batch."""
    rows = []
    for device in SIM_DEVICES:
        base = CostModel(SIM_MODEL, device)
        for q, kv in SIM_KNOBS:
            cm = CostModel(SIM_MODEL, device, quantization=q, kv_cache_dtype=kv)
            row = {
                "kind": "simulated",
                "device": cm.device.name,
                "quantization": name(q) if q else "bf16",
                "kv_cache_dtype": kv,
                "weight_gb": cm.weight_memory / 1e9,
                "kv_blocks": cm.kv_num_blocks(),
            }
            for b in SIM_BATCHES:
                t = cm.cost([(1, SIM_CONTEXT)] * b).time
                row[f"decode_{b}"] = b / t
                row[f"speedup_{b}"] = base.cost([(1, SIM_CONTEXT)] * b).time / t
            rows.append(row)
    return rows


def torchao_speedup_simulated() -> float:
    """The cost model's int8 weight-only / bf16 tokens/s for torchao's run: Llama-2-7B, one A100,
    a compiled engine (no scheduler), a 5-token prompt and 200 new tokens at batch 1."""

    def tok_s(q):
        cm = CostModel("llama-2-7b", "a100", engine="compiled", quantization=q)
        return 200 / (
            cm.cost([(5, 5)]).time + sum(cm.cost([(1, 5 + i)]).time for i in range(1, 200))
        )

    return tok_s("int8") / tok_s(None)


# ---- the table ----------------------------------------------------------------------
WALL_COLUMNS = [report.Column("linear layers", "method")] + [
    report.Column(f"{k.replace('_', ' b=')}, wall (tok/s)", f"{k}_wall", ".0f") for k in SPEEDS
]
COLUMNS = [
    report.Column("linear layers", "method"),
    report.Column("weights (MB)", "weight_bytes", ".2f", 1e-6),
    report.Column("decode b=1 (tok/s)", "decode_1", ".0f"),
    report.Column("decode b=16 (tok/s)", "decode_16", ".0f"),
    report.Column("prefill (tok/s)", "prefill", ".0f"),
    report.Column("argmax agrees (%)", "agreement", ".1%"),
    report.Column("same output (%)", "identical", ".1%"),
    report.Column("perplexity (per token)", "perplexity", ".2f"),
    report.Column("bits per byte (bits)", "bits_per_byte", ".4f"),
]
SIM_COLUMNS = [
    report.Column("device", "device"),
    report.Column("linear layers", "quantization"),
    report.Column("KV", "kv_cache_dtype"),
    report.Column("weights (GB)", "weight_gb", ".2f"),
    report.Column("KV blocks (count)", "kv_blocks", "d"),
] + [
    c
    for b in SIM_BATCHES
    for c in (
        report.Column(f"decode b={b} (tok/s)", f"decode_{b}", ".0f"),
        report.Column(f"vs bf16 b={b} (x)", f"speedup_{b}", ".2f"),
    )
]


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"{c['model']} ({c['params'] / 1e6:.2f} M params), torchao {c['torchao']}, {c['threads']} thread(s); speed: "
            f"CPU time of each step, median of {c['repeats']} runs on a shared machine (load average "
            f"{c['loadavg_5min']:.1f} over the last 5 min at the end); quality: {c['num_requests']} held-out prompts, {c['positions']} positions of the fp32 "
            f"model's greedy text, perplexity over {c['heldout_tokens']} held-out tokens",
            report.about(c),
        )
    )
    report.print_table([r for r in res["rows"] if r["kind"] == "measured"], COLUMNS)
    print(
        "\nthe same steps by wall time (what a client waits for; it includes waiting for a core):"
    )
    report.print_table([r for r in res["rows"] if r["kind"] == "measured"], WALL_COLUMNS)
    print(
        f"\nSIMULATED (cost model, not measured): {c['sim_model']} decode steps at context {c['sim_context']}"
    )
    report.print_table([r for r in res["rows"] if r["kind"] == "simulated"], SIM_COLUMNS)
    print()
    report.print_checks(res["checks"])


def checks(measured: dict, torchao_sim: float) -> list[dict]:
    fp32, out = measured[None], []
    for m in METHODS[1:]:
        q = measured[m]
        out += [
            report.check(
                f"{m}: weights / fp32 weights", q["weight_bytes"] / fp32["weight_bytes"], "<", 0.5
            ),
            report.check(
                f"{m}: argmax agrees with fp32 (share of positions)", q["agreement"], ">=", 0.95
            ),
            report.check(
                f"{m}: perplexity / fp32 perplexity",
                q["perplexity"] / fp32["perplexity"],
                "<=",
                1.02,
            ),
        ]
        out += [
            report.check(
                f"{m}: {k.replace('_', ' b=')} speed / fp32's, CPU time (median repeat)",
                statistics.median(q[f"{k}_ratios"]),
                repeats=q[f"{k}_ratios"],
            )
            for k in SPEEDS
        ]
    out.append(
        report.check(
            "simulated / published A100 int8 weight-only decode speed-up",
            torchao_sim / TORCHAO_A100_INT8_SPEEDUP,
            published=TORCHAO_A100_INT8_SPEEDUP,
            simulated=torchao_sim,
        )
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--repeats", type=int, default=5, help="speed runs per method (the median is kept)"
    )
    ap.add_argument(
        "--num-requests", type=int, default=None, help="default: one per held-out docstring (340)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "quantization.json"))
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    torch.set_num_threads(args.threads)
    t_start = time.time()
    n = args.num_requests or len(json.loads(DOCSTRINGS_HELDOUT.read_text()))
    tok = Tokenizer.from_file(str(resolve_model_path(MODEL) / "tokenizer.json"))
    docs = [
        d
        for d in json.loads(DOCSTRINGS_HELDOUT.read_text())
        if len(tok.encode(d).ids) >= PREFILL_LEN
    ]
    prompts = [tok.encode(d).ids[:PREFILL_LEN] for d in docs[:PREFILL_PROMPTS]]

    quality = measure_quality(n, args.seed, args.threads)
    speed = measure_speed(prompts, args.threads, args.repeats)
    measured = {m: speed[m] | quality[m] for m in METHODS}
    rows = [{"kind": "measured", "method": name(m), **measured[m]} for m in METHODS]
    torchao_sim = torchao_speedup_simulated()
    rows += simulated_rows()
    import torchao  # noqa: PLC0415 (its version, for the conditions)

    conditions = report.machine() | {
        "model": MODEL,
        "params": load_model(MODEL).config.num_params,
        "torchao": torchao.__version__,
        "threads": args.threads,
        "repeats": args.repeats,
        "num_requests": n,
        "seed": args.seed,
        "positions": quality[None]["positions"],
        "heldout_tokens": quality[None]["heldout_tokens"],
        "prefill": f"{PREFILL_PROMPTS} prompts x {PREFILL_LEN} tokens in one step",
        "note": "speed measured on a shared 2-core machine with other work running: each step timed by the "
        "thread's CPU time (wall time too), medians of the repeats",
        "loadavg_5min": os.getloadavg()[1],
        "sim_model": SIM_MODEL,
        "sim_context": SIM_CONTEXT,
        "bench_s": time.time() - t_start,
    }
    res = report.result(
        "quantization", report.command_line(), conditions, rows, checks(measured, torchao_sim)
    )
    out = report.write(args.out, res)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        show(res)
    out.with_suffix(".txt").write_text(
        printed.getvalue()
    )  # what --show prints, for bench/README.md
    print(
        printed.getvalue()
        + f"\nJSON: {out} and {out.with_suffix('.txt')}  ({conditions['bench_s']:.0f} s)"
    )


if __name__ == "__main__":
    main()
