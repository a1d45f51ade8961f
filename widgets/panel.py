"""The control panel: knobs, a Run button, and live figures of the run (JupyterLab).

    from widgets.panel import ControlPanel
    panel = ControlPanel()
    panel          # shows the controls and the figures; press Run

Run re-runs the engine with the knobs and copies the new figures into the shown
`FigureWidget`s in one `batch_update` (no flicker). The step slider (and its Play
button, for walking a lecture through a run) highlights one step's batch in the Gantt
chart, the step view and the KV map. A bad knob value shows a message in the panel and
leaves the previous figures as they were. The figures read only the timeline.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from traitlets import TraitError

from minilm.config import InvalidValue
from minilm.core.engine import Engine
from minilm.core.policies import POLICIES
from minilm.sim import costmodel, simulated_engine
from minilm.timeline import Timeline
from minilm.trace import save_trace
from minilm.workload import PRESETS, make_workload

from .gantt import gantt_figure, set_gantt_step
from .inplace import fill_width, update_figure
from .kvmap import kv_step_marker, kvmap_figure
from .steps import step_marker, steps_figure

MEASURED = "measured: tiny model on this machine"
SIMULATED = "simulated: cost model, no model run"
WIDE = {"description_width": "initial"}


class ControlPanel:
    def __init__(self, run_now: bool = True, **initial):
        """`initial` sets controls by name, e.g. `ControlPanel(policy="chunked", num_requests=50)`."""
        self.timeline: Timeline | None = None
        self.policy = W.Dropdown(options=tuple(POLICIES), value="continuous", description="policy")
        self.max_num_seqs = W.IntText(4, description="max_num_seqs", style=WIDE)
        self.max_num_batched_tokens = W.IntText(
            0, description="max_num_batched_tokens (0: default)", style=WIDE
        )
        self.block_size = W.IntText(16, description="block_size", style=WIDE)
        self.kv_mode = W.Dropdown(
            options=("paged", "reserved"), value="paged", description="KV mode", style=WIDE
        )
        self.workload = W.Dropdown(options=PRESETS, value="mixed", description="workload")
        self.num_requests = W.IntText(12, description="requests", style=WIDE)
        self.rate = W.FloatText(0.0, description="arrival rate req/s (0: all at t=0)", style=WIDE)
        self.seed = W.IntText(0, description="seed")
        self.max_model_len = W.IntText(512, description="max_model_len", style=WIDE)
        self.engine_kind = W.Dropdown(
            options=[MEASURED, SIMULATED], value=MEASURED, description="engine", style=WIDE
        )
        self.sim_model = W.Dropdown(
            options=list(costmodel.MODEL_SPECS), description="simulated model", style=WIDE
        )
        self.sim_device = W.Dropdown(
            options=list(costmodel.DEVICE_NAMES), description="simulated device", style=WIDE
        )
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.progress = W.IntProgress(
            value=0, min=0, max=1, description="requests done", style=WIDE
        )
        self.message = W.HTML()
        self.trace_path = W.Text("minilm_trace.json", description="trace file", style=WIDE)
        self.save_button = W.Button(description="Save Perfetto trace", icon="download")
        self.step_slider = W.IntSlider(
            0,
            min=0,
            max=0,
            description="step",
            continuous_update=True,
            layout=W.Layout(width="60%"),
        )
        self.play = W.Play(value=0, min=0, max=0, interval=400, description="play")
        W.jslink((self.play, "value"), (self.step_slider, "value"))
        self.gantt, self.steps, self.kv = (fill_width(go.FigureWidget()) for _ in range(3))

        self.run_button.on_click(self.on_run)
        self.save_button.on_click(self.on_save_trace)
        self.step_slider.observe(self.on_step, names="value")
        self.widget = self.layout()
        for name, value in initial.items():
            control = getattr(self, name, None)
            if not isinstance(control, W.ValueWidget):
                raise ValueError(
                    f"{name}={value!r}: no such control; controls: {', '.join(self.control_names())}"
                )
            try:
                control.value = value
            except TraitError as e:  # e.g. a policy that is not in the dropdown
                raise ValueError(f"{name}={value!r}: {e}") from None
        if run_now:
            self.on_run()

    def layout(self) -> W.VBox:
        knobs = W.GridBox(
            [
                self.policy,
                self.max_num_seqs,
                self.max_num_batched_tokens,
                self.block_size,
                self.kv_mode,
                self.workload,
                self.num_requests,
                self.rate,
                self.seed,
                self.max_model_len,
                self.engine_kind,
                self.sim_model,
                self.sim_device,
            ],
            layout=W.Layout(grid_template_columns="repeat(3, 1fr)"),
        )
        return W.VBox(
            [
                knobs,
                W.HBox([self.run_button, self.progress]),
                self.message,
                W.HBox([self.play, self.step_slider]),
                self.gantt,
                self.steps,
                self.kv,
                W.HBox([self.trace_path, self.save_button]),
            ]
        )

    def control_names(self) -> list[str]:
        return [
            k
            for k, v in vars(self).items()
            if isinstance(v, W.ValueWidget) and k not in ("message", "progress")
        ]

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # ---- reading the knobs and running ----------------------------------------------
    def knobs(self) -> dict[str, Any]:
        budget = self.max_num_batched_tokens.value
        return dict(
            policy=self.policy.value,
            max_num_seqs=self.max_num_seqs.value,
            max_num_batched_tokens=budget if budget != 0 else None,
            block_size=self.block_size.value,
            kv_mode=self.kv_mode.value,
            max_model_len=self.max_model_len.value,
        )

    def workload_specs(self, vocab_size: int):
        rate = self.rate.value
        if rate < 0:
            raise InvalidValue("rate", rate, "must be > 0 requests/s (or 0 for all at t=0)")
        return make_workload(
            self.workload.value,
            self.num_requests.value,
            self.seed.value,
            vocab_size,
            rate=rate or None,
            max_model_len=self.max_model_len.value,
        )

    def build_engine(self) -> Engine:
        if self.engine_kind.value == MEASURED:
            # one thread: the tiny model's ops are too small to share, and a lesson's machine
            # (a laptop, a shared server) runs the notebook beside it
            return Engine("tiny", seed=self.seed.value, cpu_threads=1, **self.knobs())
        return simulated_engine(
            model=self.sim_model.value, device=self.sim_device.value, **self.knobs()
        )

    def run_engine(self) -> Timeline:
        """Run the knobs' workload, moving the progress bar as requests finish."""
        engine = self.build_engine()
        engine.add_workload(self.workload_specs(engine.model_config.vocab_size), ignore_eos=True)
        self.progress.max, self.progress.value = len(engine.requests), 0
        while engine.has_unfinished():
            engine.step()
            self.progress.value = len(engine.timeline.requests)
        return engine.timeline

    # ---- callbacks ---------------------------------------------------------------------
    def on_run(self, _button=None) -> None:
        self.show_message("running…")
        try:
            tl = self.run_engine()
        except (
            Exception
        ) as e:  # a bad knob (ValueError) or anything else: a message, never a traceback
            self.show_message(f"{type(e).__name__}: {e}", error=True)
            return
        self.show_timeline(tl)
        self.show_message(
            f"{len(tl.requests)} requests in {len(tl.steps)} steps "
            f"({tl.meta.get('clock')} time, policy {tl.meta.get('policy')})"
        )

    def show_timeline(self, tl: Timeline) -> None:
        self.timeline = tl
        update_figure(self.gantt, gantt_figure(tl, step=0))
        update_figure(self.steps, steps_figure(tl, step=0))
        update_figure(self.kv, kvmap_figure(tl, step=0))
        last = len(tl.steps) - 1
        with self.step_slider.hold_trait_notifications():
            self.play.value = self.step_slider.value = 0
            self.play.max = self.step_slider.max = last

    def on_step(self, change) -> None:
        self.show_step(change["new"])

    def show_step(self, step: int) -> None:
        """Highlight `step`'s batch in every figure."""
        if self.timeline is None or not 0 <= step < len(self.timeline.steps):
            return
        set_gantt_step(self.gantt, self.timeline, step)
        self.steps.layout.shapes = step_marker(step)
        self.kv.layout.shapes = kv_step_marker(step)

    def on_save_trace(self, _button=None) -> None:
        if self.timeline is None:
            self.show_message("nothing to save yet: press Run first", error=True)
            return
        try:
            path = save_trace(self.timeline, self.trace_path.value)
        except (ValueError, OSError) as e:
            self.show_message(f"{type(e).__name__}: {e}", error=True)
            return
        self.show_message(f"saved {path}: open it at ui.perfetto.dev")

    def show_message(self, text: str, error: bool = False) -> None:
        color = "#b00020" if error else "#333"
        self.message.value = f'<span style="color:{color}">{html.escape(text)}</span>'
