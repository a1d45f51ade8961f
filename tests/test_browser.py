"""The control panel in a real browser: JupyterLab + headless Debian Chromium (Playwright), and
the check (tests/chromium.py, run after each notebook by conftest.py) that the lessons' figures draw.

Starts JupyterLab on a free port (no token, a temporary root dir, its own JUPYTER_* dirs),
opens a copy of a notebook that builds the panel, runs all cells, and checks that the
Plotly Gantt chart rendered and that moving the step slider changed its SVG.
Needs `apt-get install -y chromium`; skipped, saying so, where /usr/bin/chromium is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import plotly.graph_objects as go
import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS, figure_problems

from minilm.client.process import free_port

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 60_000

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"{CHROMIUM} is absent: install it with `apt-get install -y chromium`",
)

PANEL_CELL = """\
from widgets.panel import SIMULATED, ControlPanel

panel = ControlPanel(engine_kind=SIMULATED, sim_model="llama-3-8b", sim_device="h100",
                     policy="chunked", num_requests=8, max_num_seqs=3)
panel"""


def write_notebook(path: Path) -> None:
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
        for src in ("import plotly; plotly.__version__", PANEL_CELL)
    ]
    nb = {
        "cells": cells,
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    }
    path.write_text(json.dumps(nb))


def write_lab_settings(settings: Path) -> None:
    """No "fetch Jupyter news?" toast over the page, and start the notebook's own kernel
    without asking (the "Select Kernel" dialog)."""
    for name, value in (
        ("apputils-extension/notification", {"fetchNews": "false"}),
        ("notebook-extension/tracker", {"autoStartDefaultKernel": True}),
    ):
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def start_kernel_session(base: str, notebook: str, deadline_s: float = 60) -> None:
    """Start the notebook's kernel through the REST API before the page opens. Left to the
    page, JupyterLab asks "Select Kernel" when its kernel-spec list is not loaded yet (a
    race on a busy machine); the page then joins this session."""
    body = json.dumps(
        {"path": notebook, "type": "notebook", "name": notebook, "kernel": {"name": "python3"}}
    ).encode()
    req = urllib.request.Request(
        f"{base}/api/sessions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=deadline_s) as r:
        assert r.status == 201, r.read()


def wait_for_server(url: str, proc: subprocess.Popen, log: Path, deadline_s: float = 90) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.25)  # polling interval, not a wait for something to happen
    raise TimeoutError(
        f"JupyterLab did not answer {url} within {deadline_s}s:\n{log.read_text()[-3000:]}"
    )


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server on a free port serving tmp_path/root; yields its base URL."""
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "panel.ipynb")
    write_lab_settings(tmp_path / "settings")
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_PREFER_ENV_PATH": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
        "OMP_NUM_THREADS": "1",
    }
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp_path / "jupyterlab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_server(f"{base}/api/status", proc, log)
        start_kernel_session(base, "panel.ipynb")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


GANTT_SVG = """() => {
  const plot = document.querySelector('.js-plotly-plot');
  return plot ? Array.from(plot.querySelectorAll('.trace')).map(t => t.outerHTML).join('') : '';
}"""


PLOT_VS_OUTPUT_WIDTH = """() => {
  const plot = document.querySelector('.js-plotly-plot');
  const svg = plot.querySelector('.main-svg');
  return [svg.getBoundingClientRect().width, plot.closest('.jp-OutputArea-output').getBoundingClientRect().width];
}"""


def wait_accepting_kernel_dialog(page, selector: str) -> None:
    """Wait for `selector`; meanwhile accept JupyterLab's "Select Kernel" dialog whenever it shows.

    JupyterLab 4.6 sometimes asks for a kernel even though the notebook's session is running
    (it races the kernel-spec list). The dialog's default is the notebook's own python3 kernel."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    accept = page.locator(".jp-Dialog .jp-mod-accept")
    while True:
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 0:
            raise TimeoutError(f"{selector} did not appear within {TIMEOUT_MS} ms")
        page.wait_for_selector(f"{selector}, .jp-Dialog", timeout=left_ms)
        if accept.count():
            button = accept.first.element_handle()
            button.click()
            button.wait_for_element_state("hidden", timeout=max(1.0, left_ms))  # this dialog closed
            continue
        if page.locator(selector).count():
            return


def run_all_cells(page) -> None:
    """Run > Run All Cells, until the last cell has started. JupyterLab 4.6 sometimes runs only
    the first cell of a notebook opened moments before (seen 2 in 8 runs: the rest stay "[ ]",
    the kernel idle); running all again is what a user would do."""
    last_prompt = page.locator(".jp-Notebook .jp-Cell").last.locator(".jp-InputPrompt")
    for _ in range(3):
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            page.wait_for_function(
                "el => el.textContent.trim() !== '[ ]:'",
                arg=last_prompt.element_handle(),
                timeout=10_000,
            )
            return
        except Exception:  # Playwright's TimeoutError: try the menu again
            continue
    raise TimeoutError("Run All Cells did not start the notebook's last cell")


def test_panel_renders_and_slider_moves_the_gantt_highlight(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=TIMEOUT_MS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{jupyterlab}/lab/tree/panel.ipynb")
            wait_accepting_kernel_dialog(
                page, ".jp-Notebook-ExecutionIndicator[data-status='idle']"
            )
            run_all_cells(page)
            # the Gantt chart (the panel's first Plotly figure) draws its bars as SVG paths
            wait_accepting_kernel_dialog(page, ".js-plotly-plot .trace.bars path")
            assert "chunked" in page.locator(".js-plotly-plot .gtitle").first.text_content()
            stderr = page.locator(
                ".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"
            )
            assert stderr.count() == 0, stderr.first.text_content()  # no warning, no traceback
            before = page.evaluate(GANTT_SVG)
            assert before.count("<path") > 8
            # the figure is as wide as the notebook's output, not Plotly's default 700 px (widgets.fill_width)
            page.wait_for_function(f"() => ({PLOT_VS_OUTPUT_WIDTH})()[0] > 800", timeout=TIMEOUT_MS)
            plot_px, output_px = page.evaluate(PLOT_VS_OUTPUT_WIDTH)
            assert abs(plot_px - output_px) <= 2, (plot_px, output_px)

            handle = page.locator(".widget-slider .noUi-handle").first
            handle.focus()
            for _ in range(3):
                handle.press("ArrowRight")
            page.wait_for_function(
                f"before => ({GANTT_SVG})() !== before", arg=before, timeout=TIMEOUT_MS
            )
            assert page.locator(".widget-slider .widget-readout").first.inner_text().strip() == "3"
            page.screenshot(path=str(tmp_path / "panel.png"), full_page=True)
        except Exception:
            page.screenshot(
                path=str(tmp_path / "failure.png"), full_page=True
            )  # what the browser showed
            raise
        finally:
            browser.close()
    assert (tmp_path / "panel.png").stat().st_size > 10_000


def test_the_figure_check_reports_a_figure_that_draws_nothing():
    """Two one-row heatmaps on a category axis: plotly.js 4.1 throws and draws neither (lesson 8
    showed one); one heatmap with both rows draws, and so do a bar and a table. An empty scatter
    (widgets.states_figure's placeholder) is no visible trace to Plotly: nothing to draw."""
    split = go.Figure([go.Heatmap(z=[[0, 1, 2]], y=["a"]), go.Heatmap(z=[[2, 1, 0]], y=["b"])])
    joined = go.Figure(go.Heatmap(z=[[0, 1, 2], [2, 1, 0]], y=["a", "b"]))
    others = go.Figure([go.Scatter(x=[], y=[]), go.Bar(x=["a"], y=[1])])
    table = go.Figure(go.Table(header=dict(values=["a"]), cells=dict(values=[[1, 2]])))
    figures = [
        (name, json.loads(fig.to_json()))
        for name, fig in (
            ("split", split),
            ("joined", joined),
            ("others", others),
            ("table", table),
        )
    ]
    problems, traces = figure_problems(figures)
    assert traces == 2 + 1 + 1 + 1
    assert problems == [
        "split: Plotly.react failed: TypeError: Cannot read properties of undefined (reading 'length')",
        "split: nothing drawn for trace 0 (heatmap), trace 1 (heatmap)",
    ]
