"""The cost model against published GPU measurements: reproduce, fit, hold out.

    python bench/calibrate_gpu.py [--out FILE]     # ~30 s on a 2-core laptop
    python bench/calibrate_gpu.py --show bench/results/calibrate_gpu.json [--points]

bench/data/gpu_measurements.json holds measured numbers of Llama-family models on A100 and
H100 GPUs taken from public sources (gpt-fast's README, TensorRT-LLM's and LMDeploy's
benchmark pages, NeMo's docs, torchao's benchmark log, Qwen's speed benchmark), each with
its citation and conditions. This script:

1. Reproduces every point with the lab's own machinery: a first-token latency of one
   prompt is one prefill step, `CostModel(...).cost([(N, N)])`; everything else is a run
   of `simulated_engine` with the measured batch, prompt and output lengths (all requests
   at t = 0, so the schedule does not depend on the step times), read the way the source
   reads its run (output tokens / wall time, mean request latency, median inter-token gap).
2. Fits the GPU parameters of costmodel.py on the FIT sources and keeps the HELD-OUT ones
   (LMDeploy, torchao: other engines' builds and other people's machines) for the test:
   per device its memory efficiency and the fixed latency of an all-reduce, one compute
   efficiency and one roofline exponent p for every GPU (no H100 point is compute-bound
   enough to pin its own), and per engine kind its overhead per step (and per layer for
   eager PyTorch). A step takes

       (c^p + m^p)^(1/p) + 2 L (tp > 1) (allreduce_latency + all-reduce bytes / link)
                         + step_overhead + L layer_overhead,   c = FLOPs / (tp peak eff_c),
                                                               m = bytes / (tp bandwidth eff_m)

   A point's metric is a time (a throughput is its tokens over one), a weighted sum of its
   step times; the overheads and latencies enter it linearly, so for each (p, efficiencies)
   a non-negative least-squares fit on relative errors gives them, and a Nelder-Mead search
   over (p, efficiencies) minimizes the rest. The loss is soft-L1 (errors past ~10% count
   less and less): a few published points have costs the model has not, and must not
   drag the others.
3. Compares the committed constants of costmodel.py with the fit (rounded to 3 digits; a
   new fit is pasted there by hand, with its comment), predicts every point end to end with
   the committed model, and reports |error| per source and engine, fit and held out, next
   to the model before this fit (max(compute, memory), 0.7 / 0.8, 1 ms a step, free
   all-reduces). Writes bench/results/calibrate_gpu.json in bench/report.py's shape.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from bench.calibrate_cpu import nnls_small  # noqa: E402
from minilm.sim import simulated_engine  # noqa: E402
from minilm.sim.costmodel import (  # noqa: E402
    A100_FIT,
    DEVICE_SPECS,
    ENGINE_KINDS,
    H100_FIT,
    MODEL_SPECS,
    ROOFLINE_P,
    CostModel,
    items_shape,
)
from minilm.workload import RequestSpec  # noqa: E402

DATA = ROOT / "bench" / "data" / "gpu_measurements.json"
HELD_OUT_SOURCES = ("lmdeploy", "torchao")
HELD_OUT_LIMIT = 0.10  # the held-out median |error| must stay under this
FIT_DEVICES = ("a100", "h100")  # the devices with measurements; the other GPUs borrow their fit
KINDS = tuple(ENGINE_KINDS)
METRICS = ("output_tok_per_s", "ttft_s", "itl_median_s", "mean_latency_s")
POINT_KEYS = (
    "id",
    "source",
    "engine",
    "engine_kind",
    "model",
    "device",
    "tp",
    "dtype",
    "batch",
    "input_len",
    "output_len",
    "metric",
    "value",
    "unit",
    "policy",
    "citation",
    "note",
)
# The model before this fit, for comparison: the datasheet roofline's max, assumed efficiencies,
# 1 ms a step for every engine, no latency per all-reduce.
BEFORE = {
    "p": math.inf,
    "a100": (0.7, 0.8, 0.0),
    "h100": (0.7, 0.8, 0.0),
    "engines": {k: (1e-3, 0.0) for k in KINDS},
}


# ---- the data -----------------------------------------------------------------------------
def load_data(path: Path = DATA) -> dict:
    return json.loads(Path(path).read_text())


def problems(data: dict) -> list[str]:
    """What is wrong with the data file (empty when well-formed): every point complete, cited
    by a known source, in units the script reads, on a model, device and engine kind it knows."""
    out, seen = [], set()
    for p in data.get("points", []):
        pid = p.get("id", "?")
        missing = [k for k in POINT_KEYS if k not in p or p[k] in (None, "") and k != "note"]
        if missing:
            out.append(f"{pid}: missing {', '.join(missing)}")
            continue
        if pid in seen:
            out.append(f"{pid}: duplicate id")
        seen.add(pid)
        if p["source"] not in data.get("sources", {}):
            out.append(f"{pid}: source {p['source']!r} is not in `sources`")
        elif not data["sources"][p["source"]].get("citation", "").startswith(p["citation"]):
            out.append(f"{pid}: citation does not match its source's")
        if not p["citation"].startswith("https://"):
            out.append(f"{pid}: citation is not a URL")
        checks = [
            (p["metric"] in METRICS, f"metric {p['metric']!r}"),
            (p["model"] in MODEL_SPECS, f"model {p['model']!r}"),
            (p["device"] in DEVICE_SPECS, f"device {p['device']!r}"),
            (p["engine_kind"] in ENGINE_KINDS, f"engine_kind {p['engine_kind']!r}"),
            (isinstance(p["value"], (int, float)) and p["value"] > 0, f"value {p['value']!r}"),
            (
                p["unit"] == ("tok/s" if p["metric"] == "output_tok_per_s" else "s"),
                f"unit {p['unit']!r}",
            ),
            (p["policy"] in ("static", "continuous"), f"policy {p['policy']!r}"),
        ]
        out += [f"{pid}: unknown {what}" for ok, what in checks if not ok]
    return out


def used(data: dict) -> list[dict]:
    return [p for p in data["points"] if "excluded" not in p]


def is_held_out(p: dict) -> bool:
    return p["source"] in HELD_OUT_SOURCES


# ---- 1. reproduce a point with the lab's machinery ---------------------------------------------
@dataclass
class Trace:
    """A point's steps (new tokens, context) and how its metric reads their durations d:
    metric time = weights @ d, except the median gap, read from token_steps."""

    shapes: list[list[tuple[int, int]]]
    weights: np.ndarray  # per step: how much of it the metric's time contains
    token_steps: list[list[int]]  # per request: the step that produced each token
    tokens: int  # output tokens of the run


def run_point(p: dict, device=None, engine=None):
    """The committed model's answer for a point: (metric value, Trace). `device` and `engine`
    default to the point's device and engine kind."""
    device = device or p["device"]
    engine = engine or p["engine_kind"]
    if p["metric"] == "ttft_s" and p["batch"] == 1:  # one prompt alone: its prefill step
        shape = [(p["input_len"], p["input_len"])]
        t = (
            CostModel(p["model"], device, dtype=p["dtype"], tp=p["tp"], engine=engine)
            .cost(shape)
            .time
        )
        return t, Trace([shape], np.ones(1), [[0]], 1)
    tl = simulate(
        p["model"],
        device,
        p["tp"],
        p["dtype"],
        engine,
        p["policy"],
        p["batch"],
        p["input_len"],
        p["output_len"],
        p.get("gpu_memory_utilization", 0.9),
    )
    index = {s.t_end: i for i, s in enumerate(tl.steps)}
    token_steps = [[index[t] for t in r.token_times] for r in tl.requests]
    return metric_of_timeline(p["metric"], tl), trace_of(p["metric"], tl, token_steps)


@cache
def simulate(
    model: str,
    device: str,
    tp: int,
    dtype: str,
    engine: str,
    policy: str,
    batch: int,
    input_len: int,
    output_len: int,
    gpu_memory_utilization: float,
):
    """`batch` requests of `input_len` prompt tokens and `output_len` new ones, all at t = 0,
    on the simulated engine (several points read the same run)."""
    e = simulated_engine(
        model,
        device,
        policy,
        dtype=dtype,
        tp=tp,
        engine=engine,
        max_num_seqs=batch,
        max_num_batched_tokens=max(batch * input_len, input_len + output_len),
        max_model_len=input_len + output_len,
        record_kv_blocks=False,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    e.add_workload([RequestSpec(f"r{i}", [7] * input_len, output_len) for i in range(batch)])
    return e.run()


def metric_of_timeline(metric: str, tl) -> float:
    """What the source measured, read from a simulated timeline (arrivals at t = 0)."""
    reqs = tl.requests
    if metric == "output_tok_per_s":
        return sum(r.output_len for r in reqs) / max(r.t_finished for r in reqs)
    if metric == "mean_latency_s":
        return float(np.mean([r.t_finished - r.arrival for r in reqs]))
    if metric == "ttft_s":
        return float(np.mean([r.t_first_token - r.arrival for r in reqs]))
    return float(np.median([b - a for r in reqs for a, b in zip(r.token_times, r.token_times[1:])]))


def trace_of(metric: str, tl, token_steps: list[list[int]]) -> Trace:
    n = len(tl.steps)
    steps = np.arange(n)
    if metric == "output_tok_per_s":
        w = np.ones(n)
    elif metric in ("mean_latency_s", "ttft_s"):
        ends = [ts[-1] if metric == "mean_latency_s" else ts[0] for ts in token_steps]
        w = np.mean([steps <= e for e in ends], axis=0)
    else:  # the median gap: its steps, as the committed model orders the gaps
        d = np.array([s.duration for s in tl.steps])
        cum = np.cumsum(d)
        gaps = sorted((cum[b] - cum[a], a, b) for ts in token_steps for a, b in zip(ts, ts[1:]))
        _, a, b = gaps[len(gaps) // 2]
        w = ((steps > a) & (steps <= b)).astype(float)
    return Trace(
        [items_shape(s.items) for s in tl.steps],
        w,
        token_steps,
        sum(r.output_len for r in tl.requests),
    )


# ---- 2. the fast path: step times from the parameters ------------------------------------------
@dataclass
class Features:
    """Per step of a point, what the parameters multiply."""

    flops: np.ndarray  # FLOPs per GPU / peak: compute seconds at efficiency 1
    bytes: np.ndarray  # bytes per GPU / bandwidth: memory seconds at efficiency 1
    comm_bw_s: np.ndarray  # all-reduce bytes over the link
    allreduces: int  # per step
    layers: int


def features(p: dict, trace: Trace) -> Features:
    dev = DEVICE_SPECS[p["device"]]
    unit = replace(
        dev,
        flops=1.0,
        mem_bw=1.0,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        step_overhead=0.0,
        layer_overhead=0.0,
        allreduce_latency=0.0,
        roofline_p=math.inf,
    )
    cm = CostModel(p["model"], unit, dtype=p["dtype"], tp=p["tp"])
    costs = [cm.cost(shape) for shape in trace.shapes]
    return Features(
        np.array([c.compute_s for c in costs]) / dev.flops,
        np.array([c.memory_s for c in costs]) / dev.mem_bw,
        np.array([c.comm_s for c in costs]),
        cm.allreduces,
        cm.model.num_hidden_layers,
    )


def roof(f: Features, p_norm: float, eff_c: float, eff_m: float) -> np.ndarray:
    c, m = f.flops / eff_c, f.bytes / eff_m
    if math.isinf(p_norm):
        return np.maximum(c, m)
    hi = np.maximum(c, m)
    return hi * ((c / hi) ** p_norm + (m / hi) ** p_norm) ** (1 / p_norm)


# The parameters that enter a step's time linearly: each engine kind's overhead a step,
# eager PyTorch's a layer (the other kinds run a step as one CUDA graph or from C++), each
# fitted device's latency an all-reduce.
LINEAR = (
    [("step", k) for k in KINDS] + [("layer", "eager")] + [("allreduce", d) for d in FIT_DEVICES]
)


def linear_columns(p: dict, f: Features, n: int) -> np.ndarray:
    """Per step, the coefficient of each LINEAR parameter."""
    per_step = {
        ("step", p["engine_kind"]): 1.0,
        ("layer", p["engine_kind"]): f.layers,
        ("allreduce", p["device"]): f.allreduces,
    }
    return np.tile([per_step.get(name, 0.0) for name in LINEAR], (n, 1))


def theta_of(params: dict) -> np.ndarray:
    values = {("step", k): params["engines"][k][0] for k in KINDS} | {
        ("layer", "eager"): params["engines"]["eager"][1]
    }
    return np.array(
        [values.get(name, params[name[1]][2] if name[0] == "allreduce" else 0.0) for name in LINEAR]
    )


def step_times(p: dict, f: Features, params: dict) -> np.ndarray:
    eff_c, eff_m, _ = params[p["device"]]
    n = len(f.flops)
    return (
        roof(f, params["p"], eff_c, eff_m)
        + f.comm_bw_s
        + linear_columns(p, f, n) @ theta_of(params)
    )


def predict(p: dict, trace: Trace, f: Features, params: dict) -> float:
    """The point's metric from the parameters, without rerunning the simulator."""
    d = step_times(p, f, params)
    if p["metric"] == "itl_median_s":
        cum = np.concatenate([[0.0], np.cumsum(d)])
        return float(
            np.median(
                [cum[b + 1] - cum[a + 1] for ts in trace.token_steps for a, b in zip(ts, ts[1:])]
            )
        )
    t = float(trace.weights @ d)
    return trace.tokens / t if p["metric"] == "output_tok_per_s" else t


def measured_time(p: dict, trace: Trace) -> float:
    """The measurement as a time (a throughput's tokens over it)."""
    return trace.tokens / p["value"] if p["metric"] == "output_tok_per_s" else p["value"]


# ---- the fit ------------------------------------------------------------------------------------
def unpack(x: np.ndarray) -> tuple[float, dict]:
    """Search space -> (p, per device (eff_c, eff_m)): p = 1 + e^x0, efficiencies = sigmoid.
    x = [p, eff_c, eff_m of each device] gives every GPU one compute efficiency: no published
    H100 point is compute-bound enough to fit its own. x = [p, eff_c of each device, eff_m of
    each device] fits one per device, which Vidur's matmul profiles allow (costmodel_vs_vidur.py)."""
    sig = 1 / (1 + np.exp(-x[1:]))
    n = len(FIT_DEVICES)
    c = sig[:n] if len(sig) == 2 * n else np.repeat(sig[0], n)
    return 1 + math.exp(x[0]), {d: (c[i], sig[-n + i]) for i, d in enumerate(FIT_DEVICES)}


ROBUST_SCALE = 0.1  # relative errors beyond ~10% count less and less (soft-L1)


def fit(points: list[dict], traces: dict, feats: dict, ops: list | tuple = ()) -> dict:
    """Parameters minimizing a robust (soft-L1) loss of relative time errors: the published
    points', and, when given, Vidur's matmul times (`ops`: kernel times, no overhead and no
    all-reduce in them; the two sources weigh alike in all, and each GPU gets its own compute
    efficiency). The loss is robust because a few published points have costs no roofline has
    (see bench/README.md), and must not pull the rest. The committed fit uses no `ops`:
    bench/costmodel_vs_vidur.py shows that adding them raises the held-out error."""
    y = np.array([measured_time(p, traces[p["id"]]) for p in points])
    lin = np.array(
        [
            traces[p["id"]].weights @ linear_columns(p, feats[p["id"]], len(feats[p["id"]].flops))
            for p in points
        ]
    )
    comm = np.array([traces[p["id"]].weights @ feats[p["id"]].comm_bw_s for p in points])
    op_y = np.array([o.measured_s for o in ops])
    op_weight = len(points) / max(len(ops), 1)

    def soft_l1(e: np.ndarray) -> np.ndarray:
        return 2 * ROBUST_SCALE**2 * (np.sqrt(1 + (e / ROBUST_SCALE) ** 2) - 1)

    def solve(x: np.ndarray) -> tuple[float, dict]:
        p_norm, effs = unpack(x)
        r = np.array(
            [
                traces[p["id"]].weights @ roof(feats[p["id"]], p_norm, *effs[p["device"]])
                for p in points
            ]
        )
        weights = np.ones(len(points))
        for _ in range(4):  # iteratively reweighted least squares for the soft-L1 loss
            w = np.sqrt(weights)[:, None]
            theta = nnls_small(w * lin / y[:, None], w[:, 0] * (1 - (r + comm) / y))
            e = (r + comm + lin @ theta) / y - 1
            weights = 1 / np.sqrt(1 + (e / ROBUST_SCALE) ** 2)
        op_e = np.array([o.predicted(p_norm, *effs[o.device]) for o in ops]) / op_y - 1
        loss = float(np.sum(soft_l1(e)) + op_weight * np.sum(soft_l1(op_e)))
        return loss, to_params(p_norm, effs, theta)

    x0 = [0.0, 0.85, 0.85, 1.4, 1.4] if ops else [0.0, 0.85, 1.4, 1.4]
    x = nelder_mead(lambda x: solve(x)[0], np.array(x0))
    return solve(x)[1]


def to_params(p_norm: float, effs: dict, theta: np.ndarray) -> dict:
    value = dict(zip(LINEAR, map(float, theta)))
    return {
        "p": p_norm,
        **{d: (*effs[d], value["allreduce", d]) for d in FIT_DEVICES},
        "engines": {k: (value["step", k], value.get(("layer", k), 0.0)) for k in KINDS},
    }


def nelder_mead(
    f, x0: np.ndarray, step: float = 0.5, iters: int = 400, tol: float = 1e-10
) -> np.ndarray:
    """Minimize f from x0 (the textbook simplex: reflect, expand, contract, shrink)."""
    pts = [x0] + [x0 + step * np.eye(len(x0))[i] for i in range(len(x0))]
    vals = [f(x) for x in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < tol:
            break
        centre = np.mean(pts[:-1], axis=0)
        refl = centre + (centre - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centre + 2 * (centre - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centre + 0.5 * (pts[-1] - centre)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (x - pts[0]) for x in pts[1:]]
                vals = [vals[0]] + [f(x) for x in pts[1:]]
    return pts[int(np.argmin(vals))]


def rounded(params: dict) -> dict:
    """3 significant digits: what costmodel.py commits."""
    r3 = lambda v: float(f"{v:.3g}")  # noqa: E731
    return {
        "p": r3(params["p"]),
        **{d: tuple(r3(v) for v in params[d]) for d in FIT_DEVICES},
        "engines": {k: tuple(r3(v) for v in params["engines"][k]) for k in KINDS},
    }


def committed() -> dict:
    """The constants costmodel.py holds now."""
    fits = {"a100": A100_FIT, "h100": H100_FIT}
    return {
        "p": ROOFLINE_P,
        **{
            d: (
                fits[d]["compute_efficiency"],
                fits[d]["memory_efficiency"],
                fits[d]["allreduce_latency"],
            )
            for d in FIT_DEVICES
        },
        "engines": {
            k: (ENGINE_KINDS[k].step_overhead, ENGINE_KINDS[k].layer_overhead) for k in KINDS
        },
    }


# ---- 3. the comparison --------------------------------------------------------------------------
def reproduce(points: list[dict]) -> tuple[dict, dict, dict]:
    """Every point through the lab's machinery once: (committed model's value, trace, features)."""
    values, traces, feats = {}, {}, {}
    for p in points:
        values[p["id"]], traces[p["id"]] = run_point(p)
        feats[p["id"]] = features(p, traces[p["id"]])
    return values, traces, feats


def error(p: dict, predicted: float) -> float:
    return predicted / p["value"] - 1


def summarize(label: str, rows: list[dict]) -> dict:
    e = np.abs([r["error"] for r in rows])
    b = np.abs([r["error_before"] for r in rows])
    first = rows[0]
    return {
        "split": first["split"],
        "group": label,
        "points": len(rows),
        "devices": " ".join(sorted({r["device"] for r in rows})),
        "median_abs_err": float(np.median(e)),
        "p90_abs_err": float(np.percentile(e, 90)),
        "max_abs_err": float(e.max()),
        "median_abs_err_before": float(np.median(b)),
    }


def summary_rows(rows: list[dict]) -> list[dict]:
    """Per split; per source and per engine kind within it."""
    out = []
    for split in ("fit", "held-out"):
        mine = [r for r in rows if r["split"] == split and not r["excluded"]]
        out.append(summarize(f"all {split}", mine))
        for key, name in (("source", "source"), ("engine_kind", "engine kind")):
            for v in sorted({r[key] for r in mine}):
                out.append(summarize(f"{name} {v}", [r for r in mine if r[key] == v]))
    return out


def point_row(p: dict, value: float, before: float) -> dict:
    return {
        "id": p["id"],
        "split": "held-out" if is_held_out(p) else "fit",
        "source": p["source"],
        "engine_kind": p["engine_kind"],
        "device": p["device"],
        "tp": p["tp"],
        "metric": p["metric"],
        "measured": p["value"],
        "predicted": value,
        "error": error(p, value),
        "predicted_before": before,
        "error_before": None if before is None else error(p, before),
        "excluded": p.get("excluded", ""),
    }


SUMMARY_COLUMNS = [
    report.Column("split", "split"),
    report.Column("group", "group"),
    report.Column("devices", "devices"),
    report.Column("points (count)", "points", "d"),
    report.Column("median |err| (%)", "median_abs_err", ".1%"),
    report.Column("p90 |err| (%)", "p90_abs_err", ".1%"),
    report.Column("max |err| (%)", "max_abs_err", ".1%"),
    report.Column("before: median |err| (%)", "median_abs_err_before", ".1%"),
]
POINT_COLUMNS = [
    report.Column("point", "id"),
    report.Column("split", "split"),
    report.Column("metric", "metric"),
    report.Column("measured (tok/s or s)", "measured", ".4g"),
    report.Column("model (tok/s or s)", "predicted", ".4g"),
    report.Column("error (%)", "error", "+.1%"),
    report.Column("before (%)", "error_before", "+.1%"),
    report.Column("excluded", "excluded"),
]


def params_text(params: dict) -> list[str]:
    lines = [f"roofline p = {params['p']:.3g} (every GPU)"]
    for d in FIT_DEVICES:
        c, m, ar = params[d]
        lines.append(
            f"{d}: compute efficiency {c:.3g}, memory efficiency {m:.3g}, all-reduce latency {ar * 1e6:.3g} us"
        )
    for k in KINDS:
        s, layer = params["engines"][k]
        lines.append(
            f"engine {k}: {s * 1e3:.3g} ms a step"
            + (f" + {layer * 1e3:.3g} ms a layer" if layer else "")
        )
    return lines


def show(res: dict, points: bool = False) -> None:
    c = res["conditions"]
    print(
        report.joined(
            f"{c['points_used']} published measurements ({c['points_excluded']} more excluded) from "
            f"{len(c['sources'])} sources; held out: {', '.join(c['held_out_sources'])}",
            report.about(c),
        )
    )
    print("fitted on the fit sources, committed in minilm/sim/costmodel.py:")
    for line in params_text(c["committed"]):
        print("  " + line)
    summary = [r for r in res["rows"] if "group" in r]
    report.print_table(summary, SUMMARY_COLUMNS)
    if points:
        print()
        report.print_table([r for r in res["rows"] if "id" in r], POINT_COLUMNS)
    print()
    report.print_checks(res["checks"])
    print(f"reproduced and fitted in {c['seconds']:.0f} s")


def jsonable(params: dict) -> dict:
    return {
        "p": params["p"],
        **{d: list(params[d]) for d in FIT_DEVICES},
        "engines": {k: list(v) for k, v in params["engines"].items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "calibrate_gpu.json"
    )
    ap.add_argument("--points", action="store_true", help="with --show: every point's row too")
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show), args.points)
    t0 = time.perf_counter()
    data = load_data(args.data)
    bad = problems(data)
    if bad:
        raise SystemExit("bad data file:\n" + "\n".join(bad))
    points = used(data)
    values, traces, feats = reproduce(points)
    fitted = fit([p for p in points if not is_held_out(p)], traces, feats)
    now = committed()
    fast = {p["id"]: predict(p, traces[p["id"]], feats[p["id"]], now) for p in points}
    agreement = max(abs(fast[i] / values[i] - 1) for i in values)
    before = {p["id"]: predict(p, traces[p["id"]], feats[p["id"]], BEFORE) for p in points}
    excluded = [p for p in data["points"] if "excluded" in p]
    for p in excluded:  # shown, never counted
        values[p["id"]], _ = run_point(p)
        before[p["id"]] = None
    rows = [point_row(p, values[p["id"]], before[p["id"]]) for p in points + excluded]
    summary = summary_rows(rows)
    held = summary[[r["group"] for r in summary].index("all held-out")]
    fit_all = summary[0]
    checks = [
        report.check(
            "held-out median |err| (fraction)", held["median_abs_err"], "<", HELD_OUT_LIMIT
        ),
        report.check("held-out p90 |err| (fraction)", held["p90_abs_err"]),
        report.check("fit median |err| (fraction)", fit_all["median_abs_err"]),
        report.check(
            "held-out median |err| before this fit (fraction)", held["median_abs_err_before"]
        ),
        report.check(
            "costmodel.py holds this fit (3 digits)", rounded(fitted) == rounded(now), "==", True
        ),
        report.check("fast path = simulator, max relative difference", agreement, "<", 1e-9),
    ]
    conditions = report.machine() | {
        "data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data),
        "sources": {k: v["citation"] for k, v in data["sources"].items()},
        "held_out_sources": list(HELD_OUT_SOURCES),
        "points_used": len(points),
        "points_excluded": len(excluded),
        "fitted": jsonable(fitted),
        "committed": jsonable(now),
        "before": jsonable(BEFORE),
        "seconds": time.perf_counter() - t0,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    res = report.result("calibrate_gpu", report.command_line(), conditions, summary + rows, checks)
    report.write(args.out, res)
    show(res)
    if rounded(fitted) != rounded(now):
        print("\nthe fit differs from costmodel.py's constants; paste these there:")
        for line in params_text(rounded(fitted)):
            print("  " + line)
    print(f"\nJSON: {args.out}")
    return 0 if all(c["pass"] is not False for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
