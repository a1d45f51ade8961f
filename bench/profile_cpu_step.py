"""Where a minilm CPU step's time goes: cProfile of one run of bench/vs_transformers.py's setup.

    python bench/profile_cpu_step.py [--backend sdpa] [--policy continuous] [--top 25] [--out FILE]
    python bench/profile_cpu_step.py --show FILE   # print the groups of a saved run

Same checkpoint, workload and knobs as `vs_transformers.py` (its `minilm continuous`
row), one thread. Prints the time of a few groups per step (model linear layers,
attention, the rest of the model, and the engine's own Python: scheduling, building
step inputs, sampling, bookkeeping), then cProfile's top functions by their own time.
cProfile adds its own cost to every Python call, so the absolute times run above the
benchmark's; the split is what this is for.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install needed

from vs_transformers import SHAPE, build_checkpoint  # noqa: E402

from bench import report  # noqa: E402
from minilm import Engine, EngineConfig, make_workload  # noqa: E402


def total(stats: pstats.Stats, file_part: str, func: str, key: str = "cum") -> float:
    """Summed cumulative (or own, key='own') time of the functions called `func` in files matching `file_part`."""
    t = 0.0
    for (file, _, name), (_, _, own, cum, _) in stats.stats.items():
        if name == func and file_part in file:
            t += own if key == "own" else cum
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--policy", default="continuous")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--out", type=Path, help="also write the groups as JSON here (bench/report.py's shape)"
    )
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    torch.set_num_threads(1)
    specs = make_workload(
        "mixed",
        num_requests=48,
        seed=0,
        vocab_size=SHAPE["vocab_size"],
        max_model_len=args.max_model_len,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama"
        build_checkpoint(path, 0, args.max_model_len, specs[0].prompt_ids)

        def engine(workload):
            e = Engine(
                str(path),
                EngineConfig(
                    policy=args.policy,
                    attention_backend=args.backend,
                    max_num_seqs=args.max_num_seqs,
                    max_model_len=args.max_model_len,
                    record_kv_blocks=False,
                ),
            )
            e.add_workload(workload, ignore_eos=True)
            return e

        engine(
            make_workload("uniform", num_requests=4, seed=1, vocab_size=SHAPE["vocab_size"])
        ).run()  # warm up
        e = engine(specs)
        prof = cProfile.Profile()
        prof.enable()
        timeline = e.run()
        prof.disable()
    stats = pstats.Stats(prof)
    steps = len(timeline.steps)
    run = stats.total_tt
    # LlamaModel.forward is the outermost model.py forward; the layers' forwards are inside it.
    model = max(
        cum
        for (file, _, name), (_, _, _, cum, _) in stats.stats.items()
        if name == "forward" and "minilm/model/llama.py" in file
    )
    linear = total(stats, "", "<built-in method torch._C._nn.linear>", "own")
    logits = total(stats, "minilm/model/llama.py", "logits")
    attention = total(stats, "minilm/model/attention", "paged_attention")
    write_kv = total(stats, "minilm/model/attention", "write_kv")
    groups = {
        "model: linear layers (incl. lm_head)": linear,
        "model: attention": attention,
        "model: write_kv": write_kv,
        "model: everything else (norms, RoPE, SiLU, adds, module calls)": model
        + logits
        - linear
        - attention
        - write_kv,
        "engine: scheduling, step inputs, sampling, bookkeeping": run - model - logits,
    }
    rows = [
        {"group": name, "seconds": t, "share": t / run, "ms_per_step": t / steps * 1e3}
        for name, t in groups.items()
    ]
    conditions = report.machine() | {
        "threads": 1,
        "policy": args.policy,
        "backend": args.backend,
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "workload": {"preset": "mixed", "requests": 48, "seed": 0},
        "steps": steps,
        "profiled_s": run,
    }
    res = report.result("profile_cpu_step", report.command_line(), conditions, rows, [])
    show(res)
    if args.out:
        report.write(args.out, res)
        print(f"JSON: {args.out}")
    print()
    stats.sort_stats("tottime").print_stats(args.top)


COLUMNS = [
    report.Column("where", "group"),
    report.Column("time (s)", "seconds", ".2f"),
    report.Column("share (%)", "share", ".1%"),
    report.Column("per step (ms)", "ms_per_step", ".2f"),
]


def show(res: dict) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"{c['policy']}, {c['backend']} attention: {c['steps']} steps, {c['profiled_s']:.2f} s under "
            f"cProfile ({c['profiled_s'] / c['steps'] * 1e3:.2f} ms/step)",
            report.about(c),
        )
    )
    report.print_table(res["rows"], COLUMNS)
    print()
    report.print_checks(res["checks"])


if __name__ == "__main__":
    main()
