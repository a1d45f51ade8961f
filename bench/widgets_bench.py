"""How heavy is the comparison figure? Build and update times and JSON size for
1,000 requests x 3 policies (issue 5: an update must take under 1 s).

    .venv/bin/python bench/widgets_bench.py [--num-requests 1000] [--cache /tmp/minilm_widgets_bench] [--out FILE]
    .venv/bin/python bench/widgets_bench.py --show bench/results/widgets_bench.json   # print a saved result

Timelines come from the simulator (Llama-3-8B on an H100, simulated time, fast; cached as
JSON under --cache and reused). The figure cost depends on the number of bars, not on
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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import plotly.graph_objects as go

from bench import report
from minilm import Timeline, make_workload
from minilm.sim import simulated_engine
from widgets.compare import compare_figure, set_compare_step
from widgets.gantt import SEGMENT_KINDS, gantt_segments
from widgets.inplace import update_figure

POLICIES = ("static", "continuous", "chunked")
KNOBS = dict(max_num_seqs=32, max_model_len=2048)


def make_timeline(policy: str, num_requests: int, seed: int) -> Timeline:
    engine = simulated_engine(model="llama-3-8b", device="h100", policy=policy, **KNOBS)
    specs = make_workload(
        "mixed",
        num_requests,
        seed,
        engine.model_config.vocab_size,
        max_model_len=KNOBS["max_model_len"],
    )
    engine.add_workload(specs, ignore_eos=True)
    return engine.run()


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


COLUMNS = [
    report.Column("what", "what"),
    report.Column("wall (s)", "wall_s", ".3f"),
    report.Column("cpu (s)", "cpu_s", ".3f"),
]
UPDATE_LIMIT_S = 1.0  # issue 5


def show(res: dict) -> None:
    c, f = res["conditions"], res["conditions"]["figure"]
    print(
        report.joined(
            f"{c['requests']} requests x {len(c['policies'])} policies, {'/'.join(c['clock'])} timelines",
            "repeats" in c and f"best of {c['repeats']}",
            report.about(c),
        )
    )
    report.print_table(res["rows"], COLUMNS)
    print(f"{f['items']} step items -> {f['bars']} bars; figure JSON {f['json_bytes']:,} bytes")
    print()
    report.print_checks(res["checks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/minilm_widgets_bench"))
    ap.add_argument(
        "--out",
        type=Path,
        help="also write the JSON result here (e.g. bench/results/widgets_bench.json)",
    )
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    tls = load_timelines(args.num_requests, args.seed, args.cache)
    rotated = dict(
        zip(POLICIES, [tls[p] for p in POLICIES[1:] + POLICIES[:1]])
    )  # new data in every row

    segments_s = timed(lambda: [gantt_segments(tl) for tl in tls.values()])
    build_s = timed(lambda: compare_figure(tls))
    fig = compare_figure(tls)
    widget = go.FigureWidget(fig)
    flip = iter([rotated, tls, rotated])
    update_s = timed(lambda: update_figure(widget, compare_figure(next(flip))))
    middle = iter([{p: len(tl.steps) // d for p, tl in tls.items()} for d in (2, 3, 4)])
    highlight_s = timed(lambda: set_compare_step(widget, tls, next(middle)))
    segs = {
        k: sum(int((gantt_segments(tl)["kind"] == k).sum()) for tl in tls.values())
        for k in SEGMENT_KINDS
    }
    figure = {  # what was timed: the size of the figure
        "steps": {p: len(tl.steps) for p, tl in tls.items()},
        "items": sum(len(s.items) for tl in tls.values() for s in tl.steps),
        "bars": sum(segs.values()),
        "bars_by_kind": segs,
        "json_bytes": len(fig.to_json()),
    }
    conditions = report.machine() | {
        "requests": args.num_requests,
        "seed": args.seed,
        "policies": list(POLICIES),
        "clock": sorted({tl.meta.get("clock") for tl in tls.values()}),
        "repeats": 3,
        "figure": figure,
    }
    rows = [
        {"what": what, "wall_s": t[0], "cpu_s": t[1]}
        for what, t in (
            ("segments", segments_s),
            ("build", build_s),
            ("update", update_s),
            ("step move", highlight_s),
        )
    ]
    checks = [report.check("update in place, wall (s)", update_s[0], "<", UPDATE_LIMIT_S)]
    res = report.result("widgets_bench", report.command_line(), conditions, rows, checks)
    show(res)
    if args.out:
        report.write(args.out, res)
        print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
