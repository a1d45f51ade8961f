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
3. agreement   both models run densely (training/dense.py) over prompt +
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
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm import Engine, make_workload  # noqa: E402
from minilm.model.loader import load_model, resolve_model_path  # noqa: E402
from minilm.workload import DOCSTRINGS_HELDOUT  # noqa: E402
from training.dense import dense_logits  # noqa: E402

ALPHA_TARGET = 0.6  # below it a draft of k=4 buys less than 2.3 tokens per target step


def target_continuations(
    target: str, num_requests: int, seed: int, threads: int
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy output ids) for the docstrings preset's prompts."""
    engine = Engine(target, max_num_seqs=16, cpu_threads=threads, record_kv_blocks=False)
    specs = make_workload(
        "docstrings",
        num_requests=num_requests,
        seed=seed,
        max_model_len=engine.config.max_model_len,
    )
    engine.add_workload(specs)
    engine.run()
    return [(engine.requests[s.id].prompt_ids, engine.requests[s.id].output_ids) for s in specs]


@torch.no_grad()
def argmaxes(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """The model's argmax at each position that predicts an output token (teacher-forced)."""
    ids = torch.tensor(prompt + output[:-1])[None]
    return dense_logits(model, ids)[0, len(prompt) - 1 :].argmax(-1)


def accepted_runs(agree: list[bool], k: int) -> tuple[list[int], int]:
    """Accepted drafted tokens per round of k (full rounds only), and the rounds left out:
    a round accepts up to the first disagreement, then the target adds its own token."""
    runs, pos, cut = [], 0, 0
    while pos < len(agree):
        if pos + k > len(agree):
            cut += 1
            break
        a = next((i for i, ok in enumerate(agree[pos : pos + k]) if not ok), k)
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
    return statistics.median(s.duration for s in decode), statistics.median(
        s.model_time for s in decode
    )


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
    ap.add_argument(
        "--num-requests", type=int, default=None, help="default: one per held-out docstring (340)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--k", type=int, default=4, help="drafted tokens per round for the empirical run lengths"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--repeats",
        type=int,
        default=8,
        help="speed runs per model and batch (the fastest is kept)",
    )
    ap.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "draft_agreement.json")
    )
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    torch.set_num_threads(args.threads)
    t_bench = time.time()
    n = args.num_requests or len(json.loads(DOCSTRINGS_HELDOUT.read_text()))

    pairs = target_continuations(args.target, n, args.seed, args.threads)
    target, draft = load_model(args.target), load_model(args.draft)
    if (target.config.vocab_size, target.config.eos_token_id) != (
        draft.config.vocab_size,
        draft.config.eos_token_id,
    ):
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
    rows += [
        {
            "kind": "expected tokens per round, i.i.d.",
            "k": k,
            "value": expected_tokens_iid(alpha, k),
        }
        for k in range(1, 7)
    ]
    rows += [
        {
            "kind": f"accepted run length, k={args.k}",
            "accepted": a,
            "rounds": hist.get(a, 0),
            "share": hist.get(a, 0) / len(runs),
        }
        for a in range(args.k + 1)
    ]
    rows += [
        {
            "kind": f"tokens per round, k={args.k}, empirical",
            "value": emp_tokens,
            "rounds": len(runs),
            "rounds_cut_by_end": cut,
        }
    ]

    speed = measure_speed([args.draft, args.target], [1, 16], args.threads, args.repeats)
    for (m, b), (sec, model_sec) in speed.items():
        rows.append(
            {
                "kind": "decode step",
                "model": m,
                "batch": b,
                "step_ms": sec * 1e3,
                "model_ms": model_sec * 1e3,
                "tokens_per_s": b / sec,
            }
        )
    ratio = {b: speed[(args.target, b)][0] / speed[(args.draft, b)][0] for b in (1, 16)}
    rows += [
        {
            "kind": "speedup bound, i.i.d., batch 1",
            "k": k,
            "value": speedup_iid(alpha, k, 1 / ratio[1]),
        }
        for k in range(1, 7)
    ]

    draft_dir = resolve_model_path(args.draft)
    size = sum(f.stat().st_size for f in draft_dir.iterdir() if f.is_file())
    checks = [
        report.check("greedy agreement alpha", alpha, ">=", ALPHA_TARGET),
        report.check("draft checkpoint directory (bytes)", size, "<", 2_000_000),
        report.check(
            "target dense argmax = engine greedy token (share)",
            engine_match / positions,
            ">=",
            0.99,
        ),
        report.check("draft decode step faster than the target's, batch 1 (x)", ratio[1], ">", 1),
    ]
    conditions = report.machine() | {
        "draft": args.draft,
        "target": args.target,
        "workload": "docstrings",
        "num_requests": len(pairs),
        "positions": positions,
        "seed": args.seed,
        "k": args.k,
        "threads": args.threads,
        "repeats": args.repeats,
        "draft_params": draft.config.num_params,
        "target_params": target.config.num_params,
        "loadavg_5min": os.getloadavg()[1],
        "bench_s": time.time() - t_bench,
    }
    res = report.result("draft_agreement", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"JSON: {args.out}")


def show(res: dict) -> None:
    c, rows = res["conditions"], res["rows"]
    print(
        report.joined(
            f"target {c['target']} ({c['target_params'] / 1e6:.2f} M params), draft {c['draft']} "
            f"({c['draft_params'] / 1e6:.2f} M); {c['num_requests']} prompts, {c['positions']} "
            f"continuation positions",
            report.about(c),
        )
    )
    alpha = next(r["value"] for r in rows if r["kind"] == "alpha")
    print(f"greedy agreement alpha = {alpha:.3f}")
    iid = {r["k"]: r["value"] for r in rows if r["kind"] == "expected tokens per round, i.i.d."}
    bound = {r["k"]: r["value"] for r in rows if r["kind"] == "speedup bound, i.i.d., batch 1"}
    report.print_table(
        [{"k": k, "tokens": iid[k], "bound": bound[k]} for k in sorted(iid)],
        [
            report.Column("k (drafted)", "k", "d"),
            report.Column("tokens per round, i.i.d. (tokens)", "tokens", ".2f"),
            report.Column("speed-up bound, batch 1 (x)", "bound", ".2f"),
        ],
    )
    report.print_table(
        [r for r in rows if r["kind"].startswith("accepted run length")],
        [
            report.Column(f"accepted of k={c['k']} (tokens)", "accepted", "d"),
            report.Column("rounds (count)", "rounds", "d"),
            report.Column("share (%)", "share", ".1%"),
        ],
    )
    report.print_table(
        [r for r in rows if r["kind"] == "decode step"],
        [
            report.Column("model", "model"),
            report.Column("batch (seqs)", "batch", "d"),
            report.Column("step (ms)", "step_ms", ".2f"),
            report.Column("model (ms)", "model_ms", ".2f"),
            report.Column("throughput (tok/s)", "tokens_per_s", ".0f"),
        ],
    )
    report.print_checks(res["checks"])


if __name__ == "__main__":
    main()
