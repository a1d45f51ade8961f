"""Calibrate the `cpu` device spec from the real engine's measured step times.

    python bench/calibrate_cpu.py [raw.pkl] [--out FILE]  # ~2 minutes on a 2-core laptop
                                             # raw.pkl: save the measurements there, or
                                             # refit from it when it exists
    python bench/calibrate_cpu.py --show bench/results/calibrate_cpu.json   # print a saved result

1. Runs the real engine (reference attention, float32, one torch thread) on small
   offline workloads with three model configs of different depth and width (`tiny`,
   `small`, and a wide 2-layer one), each workload six times; with every request
   arriving at t=0 the steps are identical in every run, so each step's time is the
   fastest of its six measurements (a busy machine only ever makes a step slower).
   A step's time is the CPU time of the engine's thread (`time.thread_time`), not the
   wall time: on a machine shared with other processes the wall time of a 10 ms step
   varied by 50% between identical runs (the OS hands the core to others mid-step),
   its CPU time by about 10%. On an idle machine the two agree.
2. Fits the cost model's free numbers for this machine: the effective FLOP rate R,
   bandwidth W, and the overheads per step, per layer and per sequence and layer:

       t = step + layer * L + seq * B * L + max(FLOPs / R, bytes / W)

   For each candidate ridge point k = R / W (a log grid) the model is linear in
   (step, layer, seq, 1/R) with max(FLOPs, k * bytes) as the last feature; a
   non-negative least-squares fit on relative errors (every subset of the features,
   keeping the best one with no negative coefficient) gives the rest, and the k with the
   smallest error wins.
3. Saves the spec to minilm/sim/cpu_device.json, and reports the prediction error on a
   held-out workload (the `tiny` engine on the `mixed` preset with another seed and a
   different token budget, not used by the fit): the median absolute error must stay
   under 10%.

One torch thread: two threads on a 2-core machine shared with other processes stall
each other (steps measured 50-100x slower under load), which no cost model can follow.
Prints a table and the check; writes bench/results/calibrate_cpu.json (--out), in
bench/report.py's shape.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pickle
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from minilm.config import MODEL_PRESETS, EngineConfig, ModelConfig  # noqa: E402
from minilm.core.clock import MeasuredClock  # noqa: E402
from minilm.core.engine import Engine  # noqa: E402
from minilm.model.llama import LlamaModel  # noqa: E402
from minilm.sim.costmodel import CostModel, DeviceSpec, items_shape, save_cpu_spec  # noqa: E402
from minilm.workload import make_workload  # noqa: E402

THREADS = 1
REPEATS = 6
MODELS = {
    "tiny": MODEL_PRESETS["tiny"],
    "small": MODEL_PRESETS["small"],
    "wide-2l": ModelConfig(
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
    ),
}
# (model, workload preset, requests, seed, policy, token budget); all arrive at t=0
FIT_RUNS = [
    ("tiny", "uniform", 12, 0, "chunked", 128),
    ("tiny", "mixed", 12, 0, "continuous", None),
    ("small", "uniform", 8, 0, "chunked", 128),
    ("small", "mixed", 8, 0, "continuous", None),
    ("wide-2l", "uniform", 8, 0, "chunked", 128),
    ("wide-2l", "mixed", 8, 0, "continuous", None),
]
HELD_OUT = ("tiny", "mixed", 16, 1, "chunked", 256)
MAX_MODEL_LEN = 512
UNIT = DeviceSpec(
    "unit",
    flops=1.0,
    mem_bw=1.0,
    memory=1.0,
    step_overhead=0.0,
    compute_efficiency=1.0,
    memory_efficiency=1.0,
    dtype="float32",
)


class ThreadTimeClock(MeasuredClock):
    """A step's CPU time in the engine's thread: what the step costs this machine when no
    other process competes for the core (on an idle machine it equals the wall time)."""

    kind = "measured (thread CPU time)"

    def _sync(self) -> float:  # the clock's one reading of time: this thread's CPU seconds
        return time.thread_time()


def measure_once(run) -> list:
    """The steps of one run of a workload: [(items, seconds)]."""
    name, preset, n, seed, policy, budget = run
    cfg = MODELS[name]
    model = LlamaModel(cfg).init_random(0).eval()
    specs = make_workload(
        preset, n, seed=seed, vocab_size=cfg.vocab_size, max_model_len=MAX_MODEL_LEN
    )
    engine = Engine(
        model,
        EngineConfig(
            policy=policy,
            max_num_batched_tokens=budget,
            max_model_len=MAX_MODEL_LEN,
            record_kv_blocks=False,
            cpu_threads=THREADS,  # the engine sets torch's threads: the module docstring says why one
        ),
        clock=ThreadTimeClock(),
    )
    engine.add_workload(specs, ignore_eos=True)
    return [(s.items, s.duration) for s in engine.run().steps]


def measure(runs) -> dict:
    """Every run REPEATS times, interleaved (a burst of load then hits one repeat of several
    runs, not every repeat of one); each step keeps its fastest time."""
    best: dict = {}
    for _ in range(REPEATS):
        for run in runs:
            steps = measure_once(run)
            if run not in best:
                best[run] = steps
                continue
            assert [i for i, _ in steps] == [i for i, _ in best[run]], (
                "steps differ between repeats"
            )
            best[run] = [(i, min(d, d0)) for (i, d), (_, d0) in zip(steps, best[run])]
    return best


def features(model: ModelConfig, steps) -> np.ndarray:
    """Per step: FLOPs, bytes, layers, sequences x layers (the fit's raw inputs)."""
    unit = CostModel(model, UNIT)
    rows = []
    for items, _ in steps:
        c = unit.cost(items_shape(items))
        rows.append(
            (c.compute_s, c.memory_s, model.num_hidden_layers, c.num_seqs * model.num_hidden_layers)
        )
    return np.array(rows, dtype=float)


def nnls_small(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns: the best of all column subsets
    whose unconstrained fit has no negative coefficient."""
    best, best_err = np.zeros(X.shape[1]), float(np.sum(y**2))
    for k in range(1, X.shape[1] + 1):
        for cols in itertools.combinations(range(X.shape[1]), k):
            coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((X[:, cols] @ coef - y) ** 2))
            if err < best_err:
                best, best_err = np.zeros(X.shape[1]), err
                best[list(cols)] = coef
    return best


def fit(F: np.ndarray, t: np.ndarray) -> DeviceSpec:
    """F columns: flops, bytes, layers, seqs*layers; t: seconds. Relative-error weighting."""
    flops, nbytes, layers, seq_layers = F.T
    best = None
    for k in np.logspace(-2, 3, 101):  # ridge point R/W in FLOP/byte
        X = np.column_stack([np.ones_like(t), layers, seq_layers, np.maximum(flops, k * nbytes)])
        coef = nnls_small(X / t[:, None], np.ones_like(t))
        err = float(np.sum((X @ coef / t - 1) ** 2))
        if best is None or err < best[0]:
            best = (err, k, coef)
    _, k, (step, layer, seq, inv_rate) = best
    rate = 1.0 / inv_rate if inv_rate > 0 else 1e18
    return DeviceSpec(
        f"CPU ({platform.processor() or platform.machine()}, {THREADS} thread)",
        flops=rate,
        mem_bw=rate / k,
        memory=ram_bytes(),
        step_overhead=step,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        layer_overhead=layer,
        seq_overhead=seq,
        dtype="float32",
        source="fitted by bench/calibrate_cpu.py",
    )


def ram_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def errors(spec: DeviceSpec, model: ModelConfig, steps) -> np.ndarray:
    cm = CostModel(model, spec)
    return np.array([cm.items_time(items) / d - 1 for items, d in steps])


def row(label: str, spec: DeviceSpec, model: ModelConfig, steps) -> dict:
    e = np.abs(errors(spec, model, steps))
    measured = np.array([d for _, d in steps])
    return {
        "run": label,
        "steps": len(steps),
        "measured_ms_mean": 1e3 * measured.mean(),
        "median_abs_err": float(np.median(e)),
        "p90_abs_err": float(np.percentile(e, 90)),
        "max_abs_err": float(e.max()),
    }


COLUMNS = [
    report.Column("run", "run"),
    report.Column("steps (count)", "steps", "d"),
    report.Column("mean step (ms)", "measured_ms_mean", ".2f"),
    report.Column("median |err| (%)", "median_abs_err", ".1%"),
    report.Column("p90 |err| (%)", "p90_abs_err", ".1%"),
    report.Column("max |err| (%)", "max_abs_err", ".1%"),
]
HELD_OUT_LIMIT = 0.10  # the held-out median absolute error must stay under this


def show(res: dict) -> None:
    c = res["conditions"]
    spec = c["spec"]
    print(
        report.joined(
            f"{c['threads']} thread(s), fastest of {c['repeats']} runs per step", report.about(c)
        )
    )
    print(
        f"cpu spec: R = {spec['flops'] / 1e9:.1f} GFLOP/s, W = {spec['mem_bw'] / 1e9:.1f} GB/s, "
        f"step = {spec['step_overhead'] * 1e3:.3f} ms, layer = {spec['layer_overhead'] * 1e3:.3f} ms, "
        f"seq x layer = {spec['seq_overhead'] * 1e3:.3f} ms"
    )
    report.print_table(res["rows"], COLUMNS)
    print()
    report.print_checks(res["checks"])
    print(f"measured and fitted in {c['seconds']:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "raw",
        nargs="?",
        type=Path,
        help="save the measurements there, or refit from it when it exists (a pickle)",
    )
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "calibrate_cpu.json"
    )
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    torch.set_num_threads(THREADS)
    t0 = time.perf_counter()
    raw = args.raw  # optional: keep (or reuse) the measurements
    if raw is not None and raw.exists():
        measured = pickle.loads(raw.read_bytes())
    else:
        measured = measure(FIT_RUNS + [HELD_OUT])
        if raw is not None:
            raw.write_bytes(pickle.dumps(measured))
    held_out = measured.pop(HELD_OUT)
    F = np.concatenate([features(MODELS[r[0]], measured[r]) for r in FIT_RUNS])
    t = np.concatenate([[d for _, d in measured[r]] for r in FIT_RUNS])
    spec = fit(F, t)
    rows = [row("fit " + " ".join(map(str, r)), spec, MODELS[r[0]], measured[r]) for r in FIT_RUNS]
    rows.append(
        row("HELD-OUT " + " ".join(map(str, HELD_OUT)), spec, MODELS[HELD_OUT[0]], held_out)
    )
    held_out_err = rows[-1]["median_abs_err"]
    seconds, date = time.perf_counter() - t0, time.strftime("%Y-%m-%d %H:%M")
    conditions = report.machine() | {
        "spec": spec.__dict__,
        "threads": THREADS,
        "repeats": REPEATS,
        "seconds": seconds,
        "date": date,
    }
    save_cpu_spec(
        spec,
        {
            "threads": THREADS,
            "repeats": REPEATS,
            "held_out_median_abs_err": held_out_err,
            "date": conditions["date"],
        },
    )
    checks = [report.check("held-out median |err| (fraction)", held_out_err, "<", HELD_OUT_LIMIT)]
    res = report.result("calibrate_cpu", report.command_line(), conditions, rows, checks)
    report.write(args.out, res)
    show(res)
    print(f"\nJSON: {args.out}")
    return 0 if checks[0]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
