"""Plotly figures and an ipywidgets panel over minilm timelines (docs/DESIGN.md).

Every figure function takes `Timeline`s and returns a static `go.Figure` (works in
nbconvert/HTML); the panel shows the same figures as live `FigureWidget`s. Figures read
only the timeline, never the engine. The radix-tree view (lesson 8) draws a workload's
prompts instead: what a prefix cache can find before anything runs; the capacity figure draws
a capacity search's ranked deployments (minilm/sim/search.py).
"""

from minilm.trace import save_trace

from .bench import load_bench_result
from .capacity import capacity_figure
from .compare import compare_figure, metrics_table, metrics_table_figure
from .fleet import fleet_figure, routes_frame
from .gantt import gantt_figure, gantt_segments, set_gantt_step
from .inplace import fill_width, update_figure
from .kvmap import kv_cells, kvmap_figure
from .latency import latency_cdfs_figure, sweep, sweep_figure
from .live import LiveGantt, live_gantt
from .masks import mask_counts, masks_figure
from .radix import build_radix_tree, prefix_hits, radix_figure
from .report import write_report
from .states import states_figure, transition_counts
from .steps import steps_figure

__all__ = [
    "LiveGantt",
    "build_radix_tree",
    "capacity_figure",
    "compare_figure",
    "fill_width",
    "fleet_figure",
    "gantt_figure",
    "gantt_segments",
    "kv_cells",
    "kvmap_figure",
    "latency_cdfs_figure",
    "live_gantt",
    "load_bench_result",
    "mask_counts",
    "masks_figure",
    "metrics_table",
    "metrics_table_figure",
    "prefix_hits",
    "radix_figure",
    "routes_frame",
    "save_trace",
    "set_gantt_step",
    "states_figure",
    "steps_figure",
    "sweep",
    "sweep_figure",
    "transition_counts",
    "update_figure",
    "write_report",
]
