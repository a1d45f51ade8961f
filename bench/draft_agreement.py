"""How often the `docstrings-draft` model guesses the `docstrings` model's next token: a table and JSON.

    python bench/draft_agreement.py [--out bench/results/draft_agreement.json]

Greedy speculative decoding accepts a drafted token when it is the token the target
would pick itself, so the number that matters is the draft's greedy agreement alpha:
along the target's own greedy text, the fraction of positions where the draft's argmax
is the target's argmax. Measured here as:

1. prompts     the `docstrings` workload preset (minilm.workload), one request per
               held-out docstring (all 340, seed 0): text neither model trained on
2. target text the engine runs the target greedily on them (stopping at its EOS or
               at the preset's max_tokens)
3. agreement   both models run densely (`LlamaModel.forward_dense`) over prompt +
               continuation; at every continuation position, does the draft's argmax
               equal the target's? (The target's dense argmax is checked against the
               engine's tokens: the two paths differ only by float rounding.)

Two views of the accepted length with k drafted tokens per target step:

  i.i.d.       if every position agreed independently with probability alpha, a round
               yields (1 - alpha^(k+1)) / (1 - alpha) tokens (the accepted ones plus the
               target's own next token; Leviathan et al. 2023)
  empirical    walk each continuation in rounds of k = 4 (--k): accept drafted tokens
               up to the first disagreement, then the target's token; count the accepted
               runs. Agreements cluster (easy stretches, hard words), so this is the
               honest number; rounds cut short by the end of a text are left out.

Speed: tokens/s of one engine decode step (all requests decoding, none prefilling) at
batch 1 and 16, one thread, for both models: each run's median step, and of --repeats
(8) runs that alternate the models, the fastest (the machine may be shared: other work
slowed some runs by up to 2x, the target's more than the draft's). From them, the i.i.d.
speedup bound of greedy speculative decoding at batch 1 (Leviathan et al. 2023): a round
costs k draft steps plus one target step (verifying k+1 tokens, counted as one decode
step, which makes it an upper bound), with c = draft step / target step:

    speedup(k) = (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from minilm import Engine, make_workload
from minilm.loader import load_model, resolve_model_path
from minilm.train import machine_name
from minilm.workload import DOCSTRINGS_HELDOUT

ALPHA_TARGET = 0.6  # below it a draft of k=4 buys less than 2.3 tokens per target step


def target_continuations(target: str, num_requests: int, seed: int, threads: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy output ids) for the docstrings preset's prompts."""
    engine = Engine(target, max_num_seqs=16, cpu_threads=threads, record_kv_blocks=False)
    specs = make_workload("docstrings", num_requests=num_requests, seed=seed, max_model_len=engine.config.max_model_len)
    engine.add_workload(specs)
    engine.run()
    return [(engine.requests[s.id].prompt_ids, engine.requests[s.id].output_ids) for s in specs]


@torch.no_grad()
def argmaxes(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """The model's argmax at each position that predicts an output token (teacher-forced)."""
    ids = torch.tensor(prompt + output[:-1])[None]
    return model.forward_dense(ids)[0, len(prompt) - 1:].argmax(-1)


def accepted_runs(agree: list[bool], k: int) -> tuple[list[int], int]:
    """Accepted drafted tokens per round of k (full rounds only), and the rounds left out:
    a round accepts up to the first disagreement, then the target adds its own token."""
    runs, pos, cut = [], 0, 0
    while pos < len(agree):
        if pos + k > len(agree):
            cut += 1
            break
        a = next((i for i, ok in enumerate(agree[pos:pos + k]) if not ok), k)
        runs.append(a)
        pos += a + 1
    return runs, cut


def expected_tokens_iid(alpha: float, k: int) -> float:
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup_iid(alpha: float, k: int, c: float) -> float:
    return expected_tokens_iid(alpha, k) / (k * c + 1)


def decode_step_speed(model: str, batch: int, threads: int, steps: int = 48) -> tuple[float, float]:
    """Median seconds of a full-batch decode step (no prefill in it) of one engine run, and
    of the model's share of it (the rest is the engine's Python, the same for both models)."""
    engine = Engine(model, max_num_seqs=batch, cpu_threads=threads, record_kv_blocks=False)
    prompt = engine.tokenizer.encode("Return the number of items in the")
    for i in range(batch):
        engine.add_request(f"b{i}", prompt_ids=prompt, max_tokens=steps, ignore_eos=True)
    tl = engine.run()
    decode = [s for s in tl.steps if s.tokens("decode") == batch and s.tokens("prefill") == 0]
    return statistics.median(s.duration for s in decode), statistics.median(s.model_time for s in decode)


def measure_speed(models: list[str], batches: list[int], threads: int, repeats: int) -> dict:
    for m in models:  # warm up (first-call allocations, torch's lazy init)
        decode_step_speed(m, 1, threads, steps=8)
    samples = {(m, b): [] for m in models for b in batches}
    for _ in range(repeats):
        for b in batches:
            for m in models:
                samples[(m, b)].append(decode_step_speed(m, b, threads))
    return {key: min(v) for key, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", default="docstrings-draft")
    ap.add_argument("--target", default="docstrings")
    ap.add_argument("--num-requests", type=int, default=None, help="default: one per held-out docstring (340)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=4, help="drafted tokens per round for the empirical run lengths")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=8, help="speed runs per model and batch (the fastest is kept)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "draft_agreement.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_bench = time.time()
    n = args.num_requests or len(json.loads(DOCSTRINGS_HELDOUT.read_text()))

    pairs = target_continuations(args.target, n, args.seed, args.threads)
    target, draft = load_model(args.target), load_model(args.draft)
    if (target.config.vocab_size, target.config.eos_token_id) != (draft.config.vocab_size, draft.config.eos_token_id):
        raise SystemExit(f"{args.draft} and {args.target} do not share a vocabulary")
    agree_all, runs, cut, engine_match, positions = [], [], 0, 0, 0
    for prompt, output in pairs:
        t, d = argmaxes(target, prompt, output), argmaxes(draft, prompt, output)
        engine_match += (t == torch.tensor(output)).sum().item()
        agree = (t == d).tolist()
        agree_all.extend(agree)
        r, c = accepted_runs(agree, args.k)
        runs += r
        cut += c
        positions += len(output)
    alpha = sum(agree_all) / len(agree_all)
    hist = Counter(runs)
    emp_tokens = sum(a + 1 for a in runs) / len(runs)

    rows = [{"kind": "alpha", "value": alpha, "positions": positions}]
    rows += [{"kind": "expected tokens per round, i.i.d.", "k": k, "value": expected_tokens_iid(alpha, k)}
             for k in range(1, 7)]
    rows += [{"kind": f"accepted run length, k={args.k}", "accepted": a, "rounds": hist.get(a, 0),
              "share": hist.get(a, 0) / len(runs)} for a in range(args.k + 1)]
    rows += [{"kind": f"tokens per round, k={args.k}, empirical", "value": emp_tokens, "rounds": len(runs),
              "rounds_cut_by_end": cut}]

    speed = measure_speed([args.draft, args.target], [1, 16], args.threads, args.repeats)
    for (m, b), (sec, model_sec) in speed.items():
        rows.append({"kind": "decode step", "model": m, "batch": b, "step_ms": sec * 1e3, "model_ms": model_sec * 1e3,
                     "tokens_per_s": b / sec})
    ratio = {b: speed[(args.target, b)][0] / speed[(args.draft, b)][0] for b in (1, 16)}
    rows += [{"kind": "speedup bound, i.i.d., batch 1", "k": k, "value": speedup_iid(alpha, k, 1 / ratio[1])}
             for k in range(1, 7)]

    print(f"target {args.target} ({target.config.num_params / 1e6:.2f} M), draft {args.draft} "
          f"({draft.config.num_params / 1e6:.2f} M); {len(pairs)} prompts, {positions} continuation positions")
    print(f"target dense argmax = engine's greedy token at {engine_match / positions:.2%} of positions")
    print(f"\ngreedy agreement alpha = {alpha:.3f}\n")
    print(f"{'k':>3} {'tokens/round (i.i.d.)':>22} {'speedup bound, batch 1':>23}")
    for k in range(1, 7):
        print(f"{k:>3} {expected_tokens_iid(alpha, k):>22.2f} {speedup_iid(alpha, k, 1 / ratio[1]):>23.2f}")
    print(f"\naccepted drafted tokens per round, k={args.k} ({len(runs)} full rounds, {cut} cut by a text's end):")
    for a in range(args.k + 1):
        print(f"  {a}: {hist.get(a, 0):>6}  {hist.get(a, 0) / len(runs):6.1%}")
    print(f"  tokens per round: {emp_tokens:.2f} empirical vs {expected_tokens_iid(alpha, args.k):.2f} i.i.d.")
    print(f"\n{'model':<18} {'batch':>5} {'step ms':>8} {'model ms':>9} {'tok/s':>8}")
    for (m, b), (sec, model_sec) in sorted(speed.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{m:<18} {b:>5} {sec * 1e3:>8.2f} {model_sec * 1e3:>9.2f} {b / sec:>8.0f}")
    print(f"draft step is {ratio[1]:.1f}x faster at batch 1, {ratio[16]:.1f}x at batch 16")

    draft_dir = resolve_model_path(args.draft)
    size = sum(f.stat().st_size for f in draft_dir.iterdir() if f.is_file())
    checks = [
        {"name": "greedy agreement alpha", "value": alpha, "target": f">= {ALPHA_TARGET}", "pass": alpha >= ALPHA_TARGET},
        {"name": "draft checkpoint directory, bytes", "value": size, "target": "< 2000000", "pass": size < 2_000_000},
        {"name": "target dense argmax = engine greedy token, share", "value": engine_match / positions,
         "target": ">= 0.99", "pass": engine_match / positions >= 0.99},
        {"name": "draft decode step faster than target's, batch 1 (x)", "value": ratio[1], "target": "> 1",
         "pass": ratio[1] > 1},
    ]
    for c in checks:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['name']}: {c['value']:.4g} (target {c['target']})")
    result = {"conditions": {"draft": args.draft, "target": args.target, "workload": "docstrings",
                             "num_requests": len(pairs), "seed": args.seed, "k": args.k, "threads": args.threads,
                             "repeats": args.repeats, "draft_params": draft.config.num_params,
                             "target_params": target.config.num_params, "draft_dir_bytes": size,
                             "machine": machine_name("cpu", args.threads),
                             "loadavg_5min": os.getloadavg()[1], "torch": torch.__version__,
                             "bench_s": time.time() - t_bench},
              "rows": rows, "checks": checks}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
