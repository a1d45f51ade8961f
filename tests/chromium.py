"""Headless Debian Chromium for the tests, and the check that a lesson's Plotly figures draw in it.

JupyterLab shows a figure a lesson displays (a `go.Figure` as a cell's value, `display(fig)`)
through the `jupyterlab-plotly` extension: the kernel sends the figure's JSON as
`application/vnd.plotly.v1+json` and the extension calls `Plotly.react` on it (its default
height 360 px). `figure_problems` does the same with the plotly.js that plotly.py ships
(`plotly.min.js`, also what the lab's site and `fig.write_html` embed), after checking that it
is the plotly.js version the extension bundles, and reports every figure that raised an error
in the page or left a visible trace undrawn. `site_problems` opens every page of the lab's
site (labs/build_site.py) as a reader would, from disk and with no network.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import plotly

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
LABEXTENSION = (
    Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterlab-plotly" / "static"
)
TIMEOUT_MS = 30_000

# Plotly draws each trace as an SVG group bound (d3's __data__) to the trace's calcdata, whose
# first point holds the trace: a visible trace with no such group drew nothing. The legend binds
# its entries the same way, so it is left out. A table binds its own object, keyed by the trace's uid.
DRAW = """async fig => {
  const gd = document.createElement('div');
  document.body.appendChild(gd);
  const layout = {...fig.layout};
  if (!layout.height) layout.height = 360;  // as jupyterlab-plotly's renderer
  let error = null;
  try {
    await Plotly.react(gd, fig.data || [], layout, fig.config || {});
    if (fig.frames) await Plotly.addFrames(gd, fig.frames);
    await new Promise(done => requestAnimationFrame(() => setTimeout(done)));  // what Plotly left for the next frame
  } catch (e) {
    error = String((e && e.stack) || e);
  }
  const visible = (gd._fullData || []).filter(t => t.visible === true);
  const drawn = new Set();
  for (const g of gd.querySelectorAll('g')) {
    const d = g.__data__;
    if (!d || g.closest('.legend')) continue;
    if (Array.isArray(d) && d[0] && d[0].trace) drawn.add(d[0].trace.uid);
    if (g.classList.contains('table')) visible.filter(t => String(d.key).startsWith(t.uid)).forEach(t => drawn.add(t.uid));
  }
  const undrawn = visible.filter(t => !drawn.has(t.uid))
    .map(t => `trace ${t.index} (${t.type}${t._input.name ? ' ' + JSON.stringify(t._input.name) : ''})`);
  Plotly.purge(gd);
  gd.remove();
  return {error, undrawn, traces: visible.length};
}"""


def plotly_js_version(text: str) -> str:
    """The version a plotly.js bundle declares (its `src/version.js` module, or its header)."""
    m = re.search(r'src/version\.js"\S{0,40}?version\s*=\s*"([\d.]+)"', text) or re.search(
        r"plotly\.js v([\d.]+)", text
    )
    if not m:
        raise ValueError("no plotly.js version found in the bundle")
    return m.group(1)


def check_same_plotly_js() -> None:
    """The figures are drawn with plotly.min.js as a stand-in for the JupyterLab extension's copy."""
    ours = plotly_js_version(PLOTLY_JS.read_text()[:2000])
    bundles = sorted(LABEXTENSION.glob("*.js"), key=lambda p: p.stat().st_size)
    if not bundles:
        raise FileNotFoundError(
            f"jupyterlab-plotly is not installed in {LABEXTENSION} (it comes with plotly)"
        )
    lab = plotly_js_version(
        bundles[-1].read_text()
    )  # the largest chunk is the one with plotly.js in it
    if lab != ours:
        raise AssertionError(
            f"JupyterLab draws with plotly.js {lab}, this check with {ours} ({PLOTLY_JS})"
        )


class FigurePage:
    """One headless Chromium page with plotly.js loaded, drawing figures one after another.
    Loading plotly.js takes seconds (5 s on 2 busy cores): keep one page for many figures.
    Playwright's sync API runs one instance at a time: `close` it before another test starts one."""

    def __init__(self):
        from playwright.sync_api import sync_playwright

        check_same_plotly_js()
        self.errors: list[str] = []  # console errors and uncaught page errors since the last figure
        self.playwright = sync_playwright().start()
        try:
            self.browser = self.playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=TIMEOUT_MS
            )
            self.page = self.browser.new_page(viewport={"width": 1200, "height": 900})
            self.page.set_default_timeout(TIMEOUT_MS)
            self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
            self.page.on(
                "console",
                lambda m: m.type == "error" and self.errors.append(f"console error: {m.text}"),
            )
            self.page.set_content(
                "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body></body></html>"
            )
            self.page.add_script_tag(path=str(PLOTLY_JS))
            if self.errors:
                raise RuntimeError(f"loading {PLOTLY_JS}: {self.errors}")
        except BaseException:
            self.close()
            raise

    def problems(self, figures: list[tuple[str, dict]]) -> tuple[list[str], int]:
        """Draw each (label, figure JSON); return the problems ("label: what went wrong") and the
        number of visible traces checked. An error in the page is charged to the figure drawn."""
        problems, traces = [], 0
        for label, fig in figures:
            self.errors.clear()
            result = self.page.evaluate(DRAW, fig)
            traces += result["traces"]
            problems += [f"{label}: {e}" for e in self.errors]
            if result["error"]:
                problems.append(f"{label}: Plotly.react failed: {result['error'].splitlines()[0]}")
            if result["undrawn"]:
                problems.append(f"{label}: nothing drawn for {', '.join(result['undrawn'])}")
        return problems, traces

    def close(self) -> None:
        if getattr(self, "browser", None):
            self.browser.close()
        self.playwright.stop()


def figure_problems(figures: list[tuple[str, dict]]) -> tuple[list[str], int]:
    """`FigurePage.problems` in a page of its own."""
    page = FigurePage()
    try:
        return page.problems(figures)
    finally:
        page.close()


# The site (labs/build_site.py): every figure drawn (Plotly sets .js-plotly-plot) and as wide as
# its place in the page; no TeX left in the prose as text; every link's target a file of the site.
PAGE_CHECK = r"""() => {
  const figures = [...document.querySelectorAll('.plotly-graph-div')].map(div => {
    const svg = div.querySelector('svg.main-svg');
    const article = div.closest('article') || document.body;
    return {id: div.id, drawn: div.classList.contains('js-plotly-plot') && !!svg,
            width: div.getBoundingClientRect().width, svg: svg ? svg.getBoundingClientRect().width : 0,
            room: article.getBoundingClientRect().width};
  });
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  const prose = (document.querySelector('article') || document.body).cloneNode(true);
  prose.querySelectorAll('pre, code, math, script, style').forEach(e => e.remove());
  const tex = prose.textContent.match(/.{0,30}(\\[a-zA-Z]+\{|\\(cdot|times|approx|sum|frac)\b).{0,30}/);
  return {figures, links, tex: tex && tex[0]};
}"""


def site_problems(root: Path, search: str = "prefill") -> tuple[list[str], int]:
    """Open every page of the built site at `root` from disk; return the problems and the number
    of pages. A page must load with no console error or page error and ask nothing of the network;
    each figure must be drawn, its SVG as wide as its div and the div as wide as the article
    (within a pixel; no wider); each link must point to a file of the site; searching for `search` must find a page."""
    from urllib.parse import unquote, urlsplit

    from playwright.sync_api import sync_playwright

    pages = sorted(p for p in root.rglob("*.html") if p.parts[len(root.parts)] != "_static")
    problems: list[str] = []
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=TIMEOUT_MS
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.set_default_timeout(TIMEOUT_MS)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on(
            "console", lambda m: m.type == "error" and errors.append(f"console error: {m.text}")
        )
        aborted = "console error: Failed to load resource: net::ERR_FAILED"  # off_the_machine's

        def off_the_machine(route):  # charged to the page that asked, which may be gone by now
            asker = unquote(urlsplit(route.request.frame.url).path)
            name = Path(asker).relative_to(root) if asker.startswith(str(root)) else asker
            problems.append(f"{name}: asked the network for {route.request.url}")
            route.abort()

        page.route(lambda url: not url.startswith(("file:", "data:", "blob:")), off_the_machine)
        for path in pages:
            name = str(path.relative_to(root))
            errors.clear()
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_timeout(50)  # what Plotly left for the next frame
            found = page.evaluate(PAGE_CHECK)
            problems += [f"{name}: {e}" for e in errors if e != aborted]
            for fig in found["figures"]:
                if not fig["drawn"]:
                    problems.append(f"{name}: {fig['id']} not drawn")
                elif abs(fig["svg"] - fig["width"]) > 1 or fig["width"] > fig["room"] + 1:
                    problems.append(
                        f"{name}: {fig['id']} drawn {fig['svg']:.0f} px wide in a div of "
                        f"{fig['width']:.0f} px, the page's article {fig['room']:.0f} px"
                    )
            if found["tex"]:
                problems.append(f"{name}: TeX left as text, not drawn as math: {found['tex']!r}")
            for href in found["links"]:
                parts = urlsplit(href)
                if parts.scheme == "file" and not Path(unquote(parts.path)).exists():
                    problems.append(f"{name}: a link to a missing page: {href}")
        errors.clear()
        page.goto((root / "search.html").as_uri() + f"?q={search}", wait_until="load")
        try:
            page.wait_for_selector("#search-results li", timeout=TIMEOUT_MS)
        except Exception:
            problems.append(f"search.html?q={search}: no result")
        problems += [f"search.html: {e}" for e in errors if e != aborted]
        browser.close()
    return list(dict.fromkeys(problems)), len(pages)  # a request asked again, said once
