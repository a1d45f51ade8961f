"""How heavy is the comparison figure? Build and update times and JSON size for
1,000 requests x 3 policies (issue 5: an update must take under 1 s).

    .venv/bin/python bench/widgets_bench.py [--num-requests 1000] [--cache /tmp/minilm_widgets_bench]

Timelines come from `minilm.simulator` when it exists (Llama-3-8B on an H100, simulated
time, fast), else from
the tiny model on this CPU (measured time; slow for 1,000 requests, so they are cached
as JSON under --cache and reused). The figure cost depends on the number of bars, not on
where the times came from.

Measured:
  segments        gantt_segments of the 3 timelines: the one pass over every step item
  build           compare_figure(timelines): segments + traces + layout (go.Figure)
  update          new timelines into the shown FigureWidget: build a new figure and copy it
                  in with one batch_update (every row gets different data)
  step move       move the selected-step highlight in every row (set_compare_step)
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
from widgets.compare import compare_figure, set_compare_step
from widgets.gantt import SEGMENT_KINDS, gantt_segments
from widgets.inplace import update_figure

POLICIES = ("static", "continuous", "chunked")
KNOBS = dict(max_num_seqs=32, max_model_len=2048)


def make_timeline(policy: str, num_requests: int, seed: int) -> Timeline:
    if importlib.util.find_spec("minilm.simulator") is not None:
        from minilm.sim import simulated_engine

        engine = simulated_engine(model="llama-3-8b", device="h100", policy=policy, **KNOBS)
        specs = make_workload("mixed", num_requests, seed, engine.model_config.vocab_size,
                              max_model_len=KNOBS["max_model_len"])
        engine.add_workload(specs, ignore_eos=True)
        return engine.run()
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


def timed(fn, repeat: int = 3) -> tuple[float, float]:
    """Best of `repeat` runs: (wall seconds, CPU seconds of this process). On a shared
    machine the wall time includes waiting for a core; the CPU time does not."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return round(wall, 3), round(cpu, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/minilm_widgets_bench"))
    ap.add_argument("--out", type=Path, help="also write the JSON result here (e.g. bench/results/widgets_bench.json)")
    args = ap.parse_args()
    tls = load_timelines(args.num_requests, args.seed, args.cache)
    rotated = dict(zip(POLICIES, [tls[p] for p in POLICIES[1:] + POLICIES[:1]]))  # new data in every row

    segments_s = timed(lambda: [gantt_segments(tl) for tl in tls.values()])
    build_s = timed(lambda: compare_figure(tls))
    fig = compare_figure(tls)
    widget = go.FigureWidget(fig)
    flip = iter([rotated, tls, rotated])
    update_s = timed(lambda: update_figure(widget, compare_figure(next(flip))))
    middle = iter([{p: len(tl.steps) // d for p, tl in tls.items()} for d in (2, 3, 4)])
    highlight_s = timed(lambda: set_compare_step(widget, tls, next(middle)))
    segs = {k: sum(int((gantt_segments(tl)["kind"] == k).sum()) for tl in tls.values()) for k in SEGMENT_KINDS}
    result = {
        "requests": args.num_requests, "policies": list(POLICIES),
        "clock": sorted({tl.meta.get("clock") for tl in tls.values()}),
        "steps": {p: len(tl.steps) for p, tl in tls.items()},
        "items": sum(len(s.items) for tl in tls.values() for s in tl.steps),
        "bars": sum(segs.values()), "bars_by_kind": segs,
        "segments_s": segments_s, "build_s": build_s, "update_s": update_s, "highlight_s": highlight_s,
        "json_bytes": len(fig.to_json()), "update_under_1s": update_s[0] < 1.0,
    }
    print(f"{'what':<14}{'wall s':>10}{'cpu s':>10}   (best of 3)")
    for key, what in (("segments_s", "segments"), ("build_s", "build"), ("update_s", "update"),
                      ("highlight_s", "step move")):
        print(f"{what:<14}{result[key][0]:>10.3f}{result[key][1]:>10.3f}")
    print(f"{result['items']} step items -> {result['bars']} bars; figure JSON {result['json_bytes']:,} bytes")
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
