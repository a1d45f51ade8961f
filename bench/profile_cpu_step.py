"""Where a minilm CPU step's time goes: cProfile of one run of bench/vs_transformers.py's setup.

    python bench/profile_cpu_step.py [--backend sdpa] [--policy continuous] [--top 25] [--out FILE]
    python bench/profile_cpu_step.py --show FILE   # print the groups of a saved run
    python bench/profile_cpu_step.py --serving-loop [--out FILE]  # the server's loop per step, no cProfile

Same checkpoint, workload and knobs as `vs_transformers.py` (its `minilm continuous`
row), one thread. Prints the time of a few groups per step (model linear layers,
attention, the rest of the model, and the engine's own Python: scheduling, building
step inputs, sampling, bookkeeping), then cProfile's top functions by their own time.
cProfile adds its own cost to every Python call, so the absolute times run above the
benchmark's; the split is what this is for.

`--serving-loop` times instead, without cProfile, what one step costs the server's engine loop
(serve/engine_loop.py `EngineLoop.step`: the engine's step, then each request's new tokens and
the step's stats) at 16 and 256 running requests, on the simulator (no model: what is left is
the engine's and the loop's own Python), and the loop's share beyond `Engine.step`; then a real
tiny model's greedy decode steps per second at the same batch sizes (sampling included).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
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
    ap.add_argument("--serving-loop", action="store_true", help="time the server's loop per step")
    ap.add_argument("--repeats", type=int, default=5)
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        res = report.load(args.show)
        return show_loop(res) if res["conditions"].get("mode") == "serving-loop" else show(res)
    if args.serving_loop:
        return serving_loop(args)
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
                    cpu_threads=1,  # one thread, as the module docstring says
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


def timed_steps(loop, steps: int) -> tuple[float, float]:
    """Seconds per step of `loop.step()` and of the `Engine.step` inside it."""
    engine, inner = loop.engine, [0.0]
    name = "step_outputs" if hasattr(engine, "step_outputs") else "step"  # what the loop calls
    step = getattr(engine, name)

    def timed_step():
        t0 = time.perf_counter()
        try:
            return step()
        finally:
            inner[0] += time.perf_counter() - t0

    setattr(engine, name, timed_step)
    t0 = time.perf_counter()
    for _ in range(steps):
        loop.step()
    return (time.perf_counter() - t0) / steps, inner[0] / steps


def loop_row(running: int, model, steps: int, warm: int, repeats: int) -> dict:
    """The median over `repeats` runs of the loop's time per decode step with `running` requests
    running, after `warm` steps (so each request has `warm` tokens already)."""
    from minilm.serve.engine_loop import EngineLoop
    from minilm.serve.messages import Add
    from minilm.sim import simulated_engine

    per_step, inside = [], []
    for _ in range(repeats):
        if model == "simulated":
            engine = simulated_engine(
                "llama-3-8b", "h100", policy="continuous", max_num_seqs=running
            )
        else:
            engine = Engine(
                model,
                EngineConfig(
                    policy="continuous",
                    max_num_seqs=running,
                    max_model_len=512,
                    record_kv_blocks=False,
                    cpu_threads=1,  # one thread, as the module docstring says
                ),
            )
        loop = EngineLoop(engine)
        for i in range(running):
            loop.apply(
                Add(i, f"r{i}", [3 + i % 50] * 16, warm + steps + 8, {"ignore_eos": True}, 0.0)
            )
        for _ in range(warm):
            loop.step()
        gc.collect()
        total, inner = timed_steps(loop, steps)
        per_step.append(total)
        inside.append(inner)
    t, e = statistics.median(per_step), statistics.median(inside)
    return {
        "executor": "simulated" if model == "simulated" else "tiny model (random weights)",
        "running": running,
        "ms_per_step": t * 1e3,
        "engine_ms": e * 1e3,
        "loop_ms": (t - e) * 1e3,
        "steps_per_s": 1 / t,
        "spread_ms": (max(per_step) - min(per_step)) * 1e3,
    }


def serving_loop(args) -> None:
    torch.set_num_threads(1)
    from minilm.config import MODEL_PRESETS
    from minilm.model.llama import LlamaModel

    rows = [loop_row(n, "simulated", 50, 200, args.repeats) for n in (16, 256)]
    tiny = LlamaModel(MODEL_PRESETS["tiny"]).init_random(0)
    rows += [loop_row(n, tiny, 20, 20, args.repeats) for n in (16, 256)]
    conditions = report.machine() | {
        "mode": "serving-loop",
        "load_average_1min": os.getloadavg()[0],
        "threads": 1,
        "policy": "continuous",
        "repeats": args.repeats,
        "simulated": "llama-3-8b on h100, 50 steps timed after 200",
        "tiny": "20 steps timed after 20, greedy",
    }
    res = report.result("profile_cpu_step", report.command_line(), conditions, rows, [])
    show_loop(res)
    if args.out:
        report.write(args.out, res)
        print(f"JSON: {args.out}")


LOOP_COLUMNS = [
    report.Column("executor", "executor"),
    report.Column("running (requests)", "running"),
    report.Column("loop step (ms)", "ms_per_step", ".3f"),
    report.Column("of it Engine.step (ms)", "engine_ms", ".3f"),
    report.Column("of it the loop's own (ms)", "loop_ms", ".3f"),
    report.Column("rate (steps/s)", "steps_per_s", ".1f"),
    report.Column("spread (ms)", "spread_ms", ".3f"),
]


def show_loop(res: dict) -> None:
    print(report.joined("EngineLoop.step, median of repeats", report.about(res["conditions"])))
    report.print_table(res["rows"], LOOP_COLUMNS)


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
