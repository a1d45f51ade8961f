"""Other tools' runs in the lab's views: `vllm bench serve` result files and guidellm reports (lesson 9).

    tl = widgets.load_bench_result("result.json")     # this lab's bench-serve or vLLM's own, detailed
    tl = widgets.load_bench_result("benchmarks.json", benchmark="concurrent@4")   # guidellm's report
    widgets.gantt_figure(tl)                           # a row per request: waiting, then a tick per token
    widgets.latency_cdfs_figure({"vLLM": tl, ...})     # TTFT and ITL as the client measured them

A result file holds what the client saw, not the engine's steps, so the timeline has
requests only (minilm/client/bench_result.py and guidellm_result.py explain the formats; the
format is read from the file). `minilm.client.bench_result.simulate_result(tl, model, device,
policy)` replays the same requests on the simulator: what an engine would have done with
them, side by side in `compare_figure`.
"""

from __future__ import annotations

from pathlib import Path

from minilm.client.bench_result import result_to_timeline
from minilm.timeline import Timeline


def load_bench_result(
    path: str | Path | dict, label: str | None = None, benchmark: int | str | None = None
) -> Timeline:
    """The client-side timeline of a result file (or of a result dict, as `bench_serve.run` returns);
    `benchmark`: which of a guidellm run's benchmarks (index or strategy name)."""
    return result_to_timeline(path, label, benchmark)  # it reads and checks the file
