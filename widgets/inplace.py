"""Update a shown figure in place: new data into the same traces, one repaint.

A `FigureWidget` redraws when its traces change. Replacing the figure object
would flicker and lose the user's zoom; instead copy a freshly built figure's
traces and layout into the shown one inside `batch_update()`, which sends all
changes to the browser in one message.
"""

from __future__ import annotations

import plotly.graph_objects as go


def trace_props(trace) -> dict:
    props = trace.to_plotly_json()
    props.pop("type", None)
    props.pop("uid", None)
    return props


def update_figure(target: go.Figure, source: go.Figure, keep_view: bool = False) -> None:
    """Make `target` show what `source` shows. Traces are updated one by one when both have the
    same trace types in the same order (the figure functions always build the same traces);
    otherwise they are replaced. `keep_view=True` keeps the user's zoom."""
    same = [t.type for t in target.data] == [t.type for t in source.data]
    layout = source.layout.to_plotly_json()
    if keep_view:
        for axis in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
            layout[axis].pop("range", None)
            layout[axis].pop("autorange", None)
    with target.batch_update():
        if same:
            for t, s in zip(target.data, source.data):
                t.update(trace_props(s), overwrite=True)
        else:
            target.data = []
            target.add_traces(list(source.data))
        target.layout.update(layout, overwrite=True)


def fill_width(fig: go.FigureWidget) -> go.FigureWidget:
    """Make a `FigureWidget` as wide as the notebook. Its view draws the figure before the page
    has attached it, when the view has no width yet, so Plotly falls back to its default 700 px
    (a plain `go.Figure` does not have this problem). Each time a view appears, ask Plotly to
    size the figure again: by then the view sits in the page and has the output's width."""
    fig._view_count = 0  # ipywidgets counts this model's views from here on

    def resize(change) -> None:
        if (change["new"] or 0) > (change["old"] or 0):
            fig.layout.autosize = False  # a change Plotly acts on: autosize measures the container
            fig.layout.autosize = True

    fig.observe(resize, names="_view_count")
    return fig
