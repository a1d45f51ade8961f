"""How heavy is the comparison figure? Build and update times and JSON size for
1,000 requests x 3 policies (issue 5: an update must take under 1 s).

    .venv/bin/python bench/widgets_bench.py [--num-requests 1000] [--cache /tmp/minilm_widgets_bench]

Timelines come from `minilm.simulator` when it exists (Llama-3-8B on an H100, simulated
time, fast), else from
the tiny model on this CPU (measured time; slow for 1,000 requests, so they are cached
as JSON under --cache and reused). The figure cost depends on the number of bars, not on
where the times came from.

Measured:
  build           compare_figure(timelines): segments + traces + layout (go.Figure)
  update          the panel's Run path: build a new figure and copy it into the shown
                  FigureWidget in one batch_update (rows get different data)
  step highlight  move the selected-step highlight in every row
  json            len(fig.to_json()): what travels to the browser
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import plotly.graph_objects as go

from minilm import Timeline, make_workload, run_workload
from widgets.compare import compare_figure
from widgets.gantt import SEGMENT_KINDS, gantt_segments
from widgets.inplace import update_figure

POLICIES = ("static", "continuous", "chunked")
KNOBS = dict(max_num_seqs=32, max_model_len=2048)


def make_timeline(policy: str, num_requests: int, seed: int) -> Timeline:
    if importlib.util.find_spec("minilm.simulator") is not None:
        from minilm.simulator import simulated_engine

        engine = simulated_engine(model="llama-3-8b", device="h100", policy=policy, **KNOBS)
        specs = make_workload("mixed", num_requests, seed, engine.model_config.vocab_size,
                              max_model_len=KNOBS["max_model_len"])
        engine.add_workload(specs, ignore_eos=True)
        return engine.run()
    import torch

    torch.set_num_threads(1)  # the tiny model is fastest on one thread; more only fight on a shared CPU
    specs = make_workload("mixed", num_requests, seed, vocab_size=512, max_model_len=KNOBS["max_model_len"])
    return run_workload(specs, policy=policy, sampling={"ignore_eos": True}, progress=True, **KNOBS)


def load_timelines(num_requests: int, seed: int, cache: Path) -> dict[str, Timeline]:
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for p in POLICIES:
        path = cache / f"{p}_{num_requests}_{seed}.json"
        if path.exists():
            out[p] = Timeline.from_json(path)
        else:
            out[p] = make_timeline(p, num_requests, seed)
            out[p].to_json(path)
    return out


def timed(fn, repeat: int = 3) -> float:
    """Best of `repeat` runs, seconds."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/minilm_widgets_bench"))
    args = ap.parse_args()
    tls = load_timelines(args.num_requests, args.seed, args.cache)
    rotated = dict(zip(POLICIES, [tls[p] for p in POLICIES[1:] + POLICIES[:1]]))  # new data in every row

    build_s = timed(lambda: compare_figure(tls))
    fig = compare_figure(tls)
    widget = go.FigureWidget(fig)
    flip = iter([rotated, tls, rotated])
    update_s = timed(lambda: update_figure(widget, compare_figure(next(flip))))
    steps = {p: len(tl.steps) // 2 for p, tl in tls.items()}
    highlight_s = timed(lambda: update_figure(widget, compare_figure(tls, step=steps)))
    bars = sum(len(gantt_segments(tl)) for tl in tls.values())
    segs = {k: sum(int((gantt_segments(tl)["kind"] == k).sum()) for tl in tls.values()) for k in SEGMENT_KINDS}
    result = {
        "requests": args.num_requests, "policies": list(POLICIES),
        "clock": sorted({tl.meta.get("clock") for tl in tls.values()}),
        "steps": {p: len(tl.steps) for p, tl in tls.items()},
        "items": sum(len(s.items) for tl in tls.values() for s in tl.steps),
        "bars": bars, "bars_by_kind": segs,
        "build_s": round(build_s, 3), "update_s": round(update_s, 3), "highlight_update_s": round(highlight_s, 3),
        "json_bytes": len(fig.to_json()), "update_under_1s": update_s < 1.0,
    }
    print(f"{'what':<22}{'value':>12}")
    for key in ("requests", "items", "bars", "build_s", "update_s", "highlight_update_s", "json_bytes"):
        print(f"{key:<22}{result[key]:>12}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
