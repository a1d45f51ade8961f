"""A standalone HTML report of one workload under several policies (no server, no kernel).

    python -m widgets.report --workload long-prompt --html report.html   # any `minilm compare` arguments

runs `python -m minilm compare` and writes its timelines as one page; so does
`write_report`. plotly.js is inlined once, so the file opens offline. (The report
lives here, not in the engine's command line: the engine never imports its views.)
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

import plotly.graph_objects as go

from minilm.timeline import Timeline

from .compare import compare_figure, metrics_table
from .latency import latency_cdfs_figure
from .steps import steps_figure


def metrics_html(timelines: dict[str, Timeline]) -> str:
    """The CLI's metrics table (units in its headers) as HTML."""
    return metrics_table(timelines).to_html(na_rep="-")


def report_figures(timelines: dict[str, Timeline]) -> list[go.Figure]:
    return [
        compare_figure(timelines),
        latency_cdfs_figure(timelines),
        *(steps_figure(tl, title=f"{name}: per-step view") for name, tl in timelines.items()),
    ]


def write_report(
    timelines: dict[str, Timeline], path: str | Path, title: str = "minilm: policy comparison"
) -> Path:
    """Write the report; returns its path."""
    if not timelines:
        raise ValueError("write_report needs at least one timeline")
    path = Path(path)
    if path.suffix not in (".html", ".htm"):
        raise ValueError(f"report path {str(path)!r} must end in .html")
    figs = report_figures(timelines)
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figs)]
    meta = next(iter(timelines.values())).meta
    setting = ", ".join(
        f"{k}={meta[k]}"
        for k in ("model", "clock", "device", "max_num_seqs", "block_size", "kv_mode")
        if k in meta
    )
    path.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse}"
        " td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(setting)}. Units are in the table's headers; the charts' times are in ms."
        f"</p>{metrics_html(timelines)}" + "".join(parts) + "</body></html>"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    from minilm.cli import add_compare_args, compare

    parser = argparse.ArgumentParser(
        prog="python -m widgets.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_compare_args(parser)
    parser.add_argument("--html", required=True, help="write the report here (.html)")
    args = parser.parse_args(argv)
    try:
        path = write_report(compare(args), args.html)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
