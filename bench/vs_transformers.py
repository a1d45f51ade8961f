"""minilm against Hugging Face transformers on the same weights, requests and threads (CPU).

    python bench/vs_transformers.py [--threads 1] [--max-num-seqs 32] [--rounds 3]
                                    [--out bench/results/vs_transformers.json]
    python bench/vs_transformers.py --show bench/results/vs_transformers.json   # print a saved result

One run builds a random Llama with `transformers` (vocab 2048, hidden 256, intermediate
704, 4 layers, 8 heads, 4 KV heads, fp32), saves it as an HF checkpoint (safetensors),
and serves one seeded `mixed` workload with:

  minilm continuous / chunked   Engine(checkpoint), the `sdpa` attention backend (and the
                                `reference` backend, to show what the backend buys)
  transformers continuous       its continuous batching (`init_continuous_batching`), sdpa
  transformers static           `generate` on padded batches in arrival order: left padding,
                                an attention mask, max_new_tokens = the batch's largest, each
                                row cut to its own max_tokens afterwards (static batching pays
                                for the rows that finished early)

Every system gets the same max batch size (`--max-num-seqs` requests), the same torch
thread count (`--threads`), the same per-step token budget where there is one
(`--max-batch-tokens`: minilm continuous, transformers continuous batching), greedy
decoding and one meaning of "ignore EOS": the EOS id is an ordinary token and every
request produces exactly its `max_tokens` tokens (minilm `ignore_eos=True`;
transformers `eos_token_id=-1`, in continuous batching and `generate` alike; not
`min_new_tokens`, which bans EOS and so changes the greedy choice, and not
`eos_token_id=None`, with which `generate` falls back to the model's EOS and stops).
So that this matters, the checkpoint's EOS is a token the model emits: the first greedy
token after the first prompt.

Throughput is output tokens over wall time from the first request in to the last token
out; model loading is excluded and every system runs a warmup first. Systems run in
interleaved rounds and the best round of each counts (the machine may be shared; the
ratio of medians is printed beside it); every round is in the JSON, with CPU time /
wall time (about 1.0 with one thread when nothing else runs; below 0.9 the script warns
that the machine was busy and the ratios are unreliable). Greedy outputs must agree token for token with minilm's; where one differs
the script prints the first differing position and the logit margin between the top two
candidates there (a dense forward pass), and exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install needed

from minilm.quiet import quiet_torchao  # noqa: E402

quiet_torchao()  # before transformers imports torchao
import transformers  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from bench import report  # noqa: E402
from minilm import Engine, EngineConfig, RequestSpec, make_workload  # noqa: E402

SHAPE = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
)
PAD, BOS = (
    0,
    1,
)  # inside the vocabulary, like the EOS id; prompts are random ids and may contain them
# The goal: minilm's output tokens/s at least this many times each transformers system's.
TARGETS = {"transformers continuous": 2.0, "transformers static": 3.0}


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    outputs: dict[str, list[int]]  # request id -> generated ids


@dataclass
class Result:
    name: str
    runs: list[Run] = field(default_factory=list)

    def best(self) -> Run:
        return min(self.runs, key=lambda r: r.wall_s)

    def median_wall_s(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)


def build_checkpoint(path: Path, seed: int, max_model_len: int, probe: list[int]) -> int:
    """A seeded random LlamaForCausalLM (transformers' own init), saved as safetensors.
    Returns its EOS id: the greedy token after `probe`, so that generated text contains it."""
    cfg = LlamaConfig(
        **SHAPE,
        max_position_embeddings=max_model_len,
        pad_token_id=PAD,
        bos_token_id=BOS,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.inference_mode():
        eos = int(model(torch.tensor([probe])).logits[0, -1].argmax())
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    model.save_pretrained(path, safe_serialization=True)
    return eos


def timed(fn) -> tuple[float, float, object]:
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


# ---- minilm ---------------------------------------------------------------------------
def run_minilm(path: Path, specs: list[RequestSpec], args, policy: str, backend: str) -> Run:
    cfg = EngineConfig(
        policy=policy,
        attention_backend=backend,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        cpu_threads=args.threads,
        record_kv_blocks=False,
    )  # the KV-map widget's per-step copies; nothing here draws it
    cfg.max_num_batched_tokens = args.chunk_budget if policy == "chunked" else args.max_batch_tokens
    engine = Engine(str(path), cfg)  # loads the checkpoint: not timed
    engine.add_workload(specs, ignore_eos=True)
    wall, cpu, timeline = timed(engine.run)
    return Run(wall, cpu, {r.request_id: list(r.output_ids) for r in timeline.requests})


# ---- transformers ---------------------------------------------------------------------
def greedy_config(max_new_tokens: int = 16) -> GenerationConfig:
    return GenerationConfig(
        do_sample=False, eos_token_id=-1, pad_token_id=PAD, max_new_tokens=max_new_tokens
    )


def page_size() -> int:
    """Tokens a KV block of transformers' continuous batching holds (`block_size` before 5.17,
    which the GPU image may have)."""
    defaults = ContinuousBatchingConfig()
    return getattr(defaults, "page_size", None) or defaults.block_size


def blocks_for_all(specs: list[RequestSpec], block_tokens: int) -> int:
    """KV blocks of `block_tokens` tokens that hold every request's prompt and output together."""
    return sum(-(-(len(s.prompt_ids) + s.max_tokens) // block_tokens) for s in specs)


def run_hf_continuous(model, specs: list[RequestSpec], args) -> Run:
    """A fresh manager per run (its cache would otherwise keep the last run's prompts: prefix sharing).
    Its KV cache holds every request at once: left to itself, it sizes the cache from free memory,
    and on a CPU zeroing that takes seconds, longer than the run."""
    cb = ContinuousBatchingConfig(
        max_requests_per_batch=args.max_num_seqs,
        max_batch_tokens=args.max_batch_tokens,
        num_blocks=blocks_for_all(specs, page_size()),
    )
    manager = model.init_continuous_batching(
        generation_config=greedy_config(), continuous_batching_config=cb
    )
    manager.warmup()
    manager.start()

    def serve() -> dict[str, list[int]]:
        for s in specs:
            manager.add_request(
                s.prompt_ids, request_id=s.id, max_new_tokens=s.max_tokens, eos_token_id=-1
            )
        done: dict[str, list[int]] = {}
        while len(done) < len(specs):
            r = manager.get_result(timeout=60)
            if r is None:
                raise RuntimeError("transformers continuous batching returned nothing for 60 s")
            if r.error:
                raise RuntimeError(f"transformers continuous batching: {r.error}")
            if r.is_finished():
                done[r.request_id] = list(r.generated_tokens)
        return done

    try:
        wall, cpu, outputs = timed(serve)
    finally:
        manager.stop(block=True, timeout=30)
    return Run(wall, cpu, outputs)


def run_hf_static(model, specs: list[RequestSpec], args) -> Run:
    def serve() -> dict[str, list[int]]:
        outputs = {}
        for i in range(0, len(specs), args.max_num_seqs):
            batch = specs[i : i + args.max_num_seqs]
            width = max(len(s.prompt_ids) for s in batch)
            ids = torch.tensor(
                [[PAD] * (width - len(s.prompt_ids)) + s.prompt_ids for s in batch],
                device=model.device,
            )
            mask = torch.tensor(
                [[0] * (width - len(s.prompt_ids)) + [1] * len(s.prompt_ids) for s in batch],
                device=model.device,
            )
            out = model.generate(
                ids,
                attention_mask=mask,
                generation_config=greedy_config(max(s.max_tokens for s in batch)),
            )
            for s, row in zip(batch, out[:, width:].tolist()):
                outputs[s.id] = row[: s.max_tokens]
        return outputs

    with torch.inference_mode():
        wall, cpu, outputs = timed(serve)
    return Run(wall, cpu, outputs)


# ---- checks ---------------------------------------------------------------------------
def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_margin(model, prompt: list[int], prefix: list[int]) -> dict:
    """Top two candidates after prompt + prefix, from one dense forward pass of the HF model."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + prefix], device=model.device)).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return {
        "top1": int(top.indices[0]),
        "top2": int(top.indices[1]),
        "margin": float(top.values[0] - top.values[1]),
    }


def compare(base: dict[str, list[int]], runs: list[Run], specs: list[RequestSpec], model) -> dict:
    """Every run's outputs against `base`; a request counts as identical only if it is in every run."""
    diffs = []
    for s in specs:
        for i, run in enumerate(runs):
            other = run.outputs.get(s.id, [])
            pos = first_difference(base[s.id], other)
            if pos is not None:
                d = {
                    "request": s.id,
                    "round": i,
                    "position": pos,
                    "minilm": base[s.id][pos : pos + 1],
                    "other": other[pos : pos + 1],
                }
                diffs.append(d | logit_margin(model, s.prompt_ids, base[s.id][:pos]))
                break
    return {"requests": len(specs), "identical": len(specs) - len(diffs), "differences": diffs}


# ---- main -----------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads, the same for every system"
    )
    ap.add_argument(
        "--max-num-seqs", type=int, default=32, help="max requests per batch, every system"
    )
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0, help="weights and workload")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="per-step token budget of minilm continuous and transformers continuous batching "
        "(default: --max-model-len, minilm continuous's own default)",
    )
    ap.add_argument(
        "--chunk-budget", type=int, default=256, help="minilm chunked: max_num_batched_tokens"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved timed rounds; the best of each system counts",
    )
    ap.add_argument(
        "--no-reference", action="store_true", help="skip minilm with the reference attention"
    )
    ap.add_argument("--out", default="bench/results/vs_transformers.json")
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    args.max_batch_tokens = args.max_batch_tokens or args.max_model_len

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # e.g. its warning that eos_token_id=-1 never stops
    load = os.getloadavg()[0]
    specs = make_workload(
        "mixed",
        num_requests=args.requests,
        seed=args.seed,
        vocab_size=SHAPE["vocab_size"],
        max_model_len=args.max_model_len,
    )
    warm = make_workload(
        "uniform", num_requests=4, seed=args.seed + 1, vocab_size=SHAPE["vocab_size"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama"
        eos = build_checkpoint(path, args.seed, args.max_model_len, specs[0].prompt_ids)
        hf = LlamaForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        systems = {
            "minilm continuous": lambda w: run_minilm(path, w, args, "continuous", "sdpa"),
            "minilm chunked": lambda w: run_minilm(path, w, args, "chunked", "sdpa"),
            "minilm continuous (reference attn)": lambda w: run_minilm(
                path, w, args, "continuous", "reference"
            ),
            "transformers continuous": lambda w: run_hf_continuous(hf, w, args),
            "transformers static": lambda w: run_hf_static(hf, w, args),
        }
        if args.no_reference:
            systems.pop("minilm continuous (reference attn)")
        results = {name: Result(name) for name in systems}
        for fn in systems.values():
            fn(warm)
        for _ in range(args.rounds):
            for name, fn in systems.items():
                results[name].runs.append(fn(specs))
        base = results["minilm continuous"].runs[0].outputs
        checks = {name: compare(base, r.runs, specs, hf) for name, r in results.items()}

    out_tokens = sum(s.max_tokens for s in specs)
    rows = []
    for name, r in results.items():
        b = r.best()
        rows.append(
            {
                "system": name,
                "output_tok_per_s": out_tokens / b.wall_s,
                "output_tok_per_cpu_s": out_tokens / b.cpu_s,
                "wall_s": b.wall_s,
                "cpu_s": b.cpu_s,
                "median_wall_s": r.median_wall_s(),
                "rounds_wall_s": [x.wall_s for x in r.runs],
                "rounds_cpu_s": [x.cpu_s for x in r.runs],
            }
            | checks[name]
        )
    # With one thread, CPU/wall below 0.9 means other processes took the CPU (with more threads,
    # CPU/wall also measures how well they split the work, so only the load average says so).
    cpu_share = min(t["cpu_s"] / t["wall_s"] for t in rows)
    busy = cpu_share < 0.9 if args.threads == 1 else load >= 1.0
    conditions = report.machine() | {
        "model": SHAPE | {"dtype": "float32", "eos_token_id": eos},
        "args": {k: v for k, v in vars(args).items() if k != "show"},
        "requests": args.requests,
        "prompt_tokens": sum(len(s.prompt_ids) for s in specs),
        "output_tokens": out_tokens,
        "threads": args.threads,
        "load_avg_at_start": load,
        "machine_busy": busy,
        "ignore_eos": "EOS is an ordinary token; every request produces exactly max_tokens tokens",
        "eos_emitted": sum(t == eos for ids in base.values() for t in ids),
        "eos_requests": sum(eos in ids for ids in base.values()),
    }
    res = report.result(
        "vs_transformers", report.command_line(), conditions, rows, ratio_checks(rows)
    )
    report.write(args.out, res)
    show(res)
    print(f"JSON: {args.out}")
    if any(r["differences"] for r in rows):
        raise SystemExit(1)


COLUMNS = [
    report.Column("system", "system"),
    report.Column("out (tok/s)", "output_tok_per_s", ".0f"),
    report.Column("wall (s)", "wall_s", ".2f"),
    report.Column("cpu/wall (ratio)", "cpu_per_wall", ".2f"),
    report.Column("out (tok/cpu-s)", "output_tok_per_cpu_s", ".0f"),
    report.Column("rounds wall (s)", "rounds_wall_s", ".2f"),
    report.Column("identical to minilm", "same"),
]


def ratio_checks(rows: list[dict]) -> list[dict]:
    """minilm's output tok/s over each transformers system's (the best rounds), against the
    issue's targets; then every system's greedy outputs against minilm continuous's."""
    table = {r["system"]: r for r in rows}
    out = []
    for ours in ("minilm continuous", "minilm chunked"):
        for name, target in TARGETS.items():
            ratio = table[ours]["output_tok_per_s"] / table[name]["output_tok_per_s"]
            per_cpu = table[ours]["output_tok_per_cpu_s"] / table[name]["output_tok_per_cpu_s"]
            median = table[name]["median_wall_s"] / table[ours]["median_wall_s"]
            out.append(
                report.check(
                    f"{ours} / {name}, output tok/s (x)",
                    ratio,
                    ">=",
                    target,
                    **{"median rounds": median, "per CPU-second": per_cpu},
                )
            )
    return out + [
        report.check(
            f"greedy outputs identical to minilm's: {r['system']} (requests)",
            r["identical"],
            "==",
            r["requests"],
        )
        for r in rows
    ]


def show(res: dict) -> None:
    c, a = res["conditions"], res["conditions"]["args"]
    print(
        report.joined(
            f"{c['requests']} `mixed` requests (seed {a['seed']})",
            "prompt_tokens" in c and f"{c['prompt_tokens']} prompt tokens",
            f"{c['output_tokens']} output tokens",
            f"max batch {a['max_num_seqs']} requests",
            f"{c['threads']} torch thread(s)",
            f"load avg {c['load_avg_at_start']:.2f} at start",
            report.about(c),
            sep=", ",
        )
    )
    rows = [
        r | {"cpu_per_wall": r["cpu_s"] / r["wall_s"], "same": f"{r['identical']}/{r['requests']}"}
        for r in res["rows"]
    ]
    report.print_table(rows, COLUMNS)  # minilm continuous: its own rounds agree
    if c["machine_busy"]:
        print(
            f"WARNING: the machine was busy (lowest CPU/wall {min(r['cpu_per_wall'] for r in rows):.2f}, load "
            f"average {c['load_avg_at_start']:.2f} at start): other processes took CPU, not equally from every "
            f"system, so the wall-time ratios below are unreliable; the per-CPU-second ratios in brackets are a "
            f"rough cross-check."
        )
    print()
    report.print_checks(res["checks"])
    print(
        report.joined(
            f"EOS id {c['model']['eos_token_id']} emitted as an ordinary token {c['eos_emitted']} "
            f"time(s) in minilm's outputs",
            "eos_requests" in c and f"({c['eos_requests']} of {c['requests']} requests)",
            sep=" ",
        )
    )
    for r in res["rows"]:
        for d in r["differences"]:
            print(
                f"DIFFERENT: {r['system']}, request {d['request']}, position {d['position']}: minilm {d['minilm']} "
                f"vs {d['other']}; dense-pass top two {d['top1']}, {d['top2']}, logit margin {d['margin']:.3g}"
            )
    if not any(r["differences"] for r in res["rows"]):
        print("greedy outputs: every system identical to minilm, token for token")


if __name__ == "__main__":
    main()
