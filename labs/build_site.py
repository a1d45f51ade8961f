"""The lab as a website that opens offline: every lesson, the lecture demo's first part and the
exercises' instructions, executed, with interactive Plotly figures, navigation and search.

    bash scripts/site.sh        # then open labs/site/html/index.html

Built by Sphinx with MyST-NB and sphinx-book-theme (the parts of Jupyter Book 1; all on PyPI,
no theme fetched at build time). The notebooks come executed by nbval: conftest.py writes each
one, with the outputs its cells showed, to `labs/site/executed/`, and its last test item calls
`build` and checks the pages in Chromium (tests/chromium.py), so the lessons run once.

What the pages get, for a reader with no kernel and no internet:
- a Plotly figure is drawn by the plotly.js that plotly.py ships, copied into the site (no CDN),
  at the width of the page;
- math is MathML, converted at build time (latex2mathml), which browsers draw without MathJax;
- a takeaway cell (say(), its source hidden in JupyterLab) shows only its sentence;
- a live widget (a `FigureWidget`, the control panel) needs a kernel: a line says so;
- an exercise's unsolved cells show no traceback; the lecture demo stops before its part 2
  (a server for the room).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from pathlib import Path

import nbformat

LABS = Path(__file__).resolve().parent
SITE = LABS / "site"  # git ignores it
EXECUTED = SITE / "executed"
HTML = SITE / "html"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
DEMO_PART_2 = "## Part 2"


def site_notebooks() -> list[str]:
    """The notebooks the site shows, as paths relative to labs/, in the order of its navigation."""
    lessons = sorted(p.name for p in LABS.glob("[0-9]*.ipynb"))
    exercises = sorted(f"exercises/{p.name}" for p in (LABS / "exercises").glob("*.ipynb"))
    return [*lessons, "lecture_demo.ipynb", *exercises]


def save_executed(nb: nbformat.NotebookNode, outputs: dict[int, list], rel: str) -> Path:
    """Write a copy of `nb` whose n-th code cell has `outputs[n]` (what it showed when run)."""
    nb = copy.deepcopy(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for n, cell in enumerate(code):
        cell.outputs = [nbformat.from_dict(o) for o in outputs.get(n) or []]
    path = EXECUTED / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def figure_html(fig: dict, div_id: str) -> str:
    """A div that plotly.js fills with the figure, as wide as the page (its height as set)."""
    layout = {k: v for k, v in fig.get("layout", {}).items() if k != "width"}
    layout.setdefault("height", 360)  # as jupyterlab-plotly draws it
    figure = {"data": fig.get("data", []), "layout": layout, "frames": fig.get("frames", [])}
    config = {**fig.get("config", {}), "responsive": True}
    payload = json.dumps(figure).replace("</", "<\\/")  # no "</script>" inside the script
    return (
        f'<div id="{div_id}" class="plotly-graph-div" style="width:100%;height:{layout["height"]}px"></div>\n'
        f'<script>Plotly.newPlot("{div_id}", Object.assign({payload}, {{config: {json.dumps(config)}}}));</script>'
    )


def page_output(output: dict, div_id: str) -> dict | None:
    """The output as the page shows it; None to leave it out."""
    if output.get("output_type") == "error":
        return None  # an exercise left to do, or a cell that must raise
    data = output.get("data", {})
    if PLOTLY_MIME in data:
        return nbformat.v4.new_output(
            "display_data", data={"text/html": figure_html(data[PLOTLY_MIME], div_id)}
        )
    if WIDGET_MIME in data:
        note = "<p><em>A live widget: run the notebook in JupyterLab to use it.</em></p>"
        return nbformat.v4.new_output("display_data", data={"text/html": note})
    return output


INLINE_MATH = re.compile(r"(?<![$\\])\$[^$\s][^$]*?\$(?!\$)")


def one_line_math(markdown: str) -> str:
    """Inline math that spans lines, on one line. JupyterLab takes out the math before it reads
    the Markdown; MyST reads the Markdown first, so a continuation line that begins with `+`
    or `-` would start a list and cut the formula in two."""
    return INLINE_MATH.sub(lambda m: m.group(0).replace("\n", " "), markdown)


def page_notebook(nb: nbformat.NotebookNode, rel: str) -> nbformat.NotebookNode:
    """The executed notebook as its page shows it (see the module's docstring)."""
    nb = copy.deepcopy(nb)
    if rel == "lecture_demo.ipynb":
        part_2 = [
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and c.source.startswith(DEMO_PART_2)
        ]
        if not part_2:
            raise ValueError(
                f"{rel}: no Markdown cell starts with {DEMO_PART_2!r}, where its page ends"
            )
        nb.cells = nb.cells[: part_2[0]]
    figures = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = one_line_math(cell.source)
        if cell.cell_type != "code":
            continue
        if cell.metadata.get("jupyter", {}).get("source_hidden"):
            cell.metadata["tags"] = ["remove-input"]  # a takeaway: the sentence alone
        shown = []
        for output in cell.outputs:
            figures += PLOTLY_MIME in output.get("data", {})
            kept = page_output(output, f"figure-{figures}")
            if kept is not None:
                shown.append(kept)
        cell.outputs = shown
    nb.metadata.pop("widgets", None)
    return nb


INDEX = """\
# minilm lab

A Jupyter lab for learning how LLM serving engines batch requests, by running a real one
and watching it. These pages are the lab's notebooks as they ran when the site was built
(on a CPU; simulated numbers say so): read them here, then run them in JupyterLab
(`bash scripts/lab.sh`), where the widgets are live. Start with lesson 0.

```{{toctree}}
:caption: Lessons
:maxdepth: 1

{lessons}
```

```{{toctree}}
:caption: Exercises
:maxdepth: 1

{exercises}
```
"""

CONF = """\
project = "minilm lab"
extensions = ["myst_nb", "labs.build_site"]
html_theme = "sphinx_book_theme"
html_title = "minilm lab"
html_static_path = [{plotly_js!r}]
html_math_renderer = "mathml"
myst_enable_extensions = ["dollarmath", "amsmath"]
nb_execution_mode = "off"  # executed by nbval already
nb_output_stderr = "remove"
nb_render_markdown_format = "myst"  # a say() sentence's math drawn like the prose's
exclude_patterns = ["_build"]
suppress_warnings = ["mystnb.unknown_mime_type"]
html_theme_options = {{"show_navbar_depth": 2, "home_page_in_toc": True}}
html_context = {{"default_mode": "auto"}}  # pydata-sphinx-theme's; left empty, its script logs an error
html_show_search_summary = False  # a summary is fetched from the page, which file:// forbids
"""


def write_sources(executed: Path, src: Path) -> None:
    """A Sphinx project in `src`: the pages' notebooks, an index and conf.py."""
    import plotly

    shutil.rmtree(src, ignore_errors=True)
    rels = [r for r in site_notebooks() if (executed / r).exists()]
    for rel in rels:
        nb = page_notebook(nbformat.read(executed / rel, as_version=4), rel)
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, src / rel)
    entries = [r.removesuffix(".ipynb") for r in rels]
    (src / "index.md").write_text(
        INDEX.format(
            lessons="\n".join(e for e in entries if not e.startswith("exercises/")),
            exercises="\n".join(e for e in entries if e.startswith("exercises/")),
        )
    )
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    (src / "conf.py").write_text(CONF.format(plotly_js=str(plotly_js)))


def build(executed: Path = EXECUTED, out: Path = HTML) -> float:
    """Build the site from the executed notebooks into `out`; return the seconds it took.
    Sphinx's warnings are errors: a broken link or reference fails the build."""
    import sys

    from sphinx.cmd.build import build_main

    t0 = time.perf_counter()
    src = out.parent / "src"  # beside the pages: the Sphinx project, then its doctrees
    write_sources(executed, src)
    sys.path.insert(0, str(LABS.parent))  # conf.py names this module as an extension
    shutil.rmtree(out, ignore_errors=True)
    args = [str(src), str(out), "-b", "html", "-q", "-W", "--keep-going", "-E"]
    args += ["-d", str(out.parent / "doctrees")]
    if build_main(args) != 0:
        raise RuntimeError(f"sphinx-build {' '.join(args)} failed (its warnings are above)")
    return time.perf_counter() - t0


# --- the Sphinx extension (conf.py's "labs.build_site"): math as MathML, plotly.js where a page draws


def visit_math(translator, node) -> None:
    from docutils import nodes
    from latex2mathml.converter import convert

    translator.body.append(convert(node.astext()))
    raise nodes.SkipNode


def visit_displaymath(translator, node) -> None:
    from docutils import nodes
    from latex2mathml.converter import convert

    tex = node.astext()
    translator.body.append(f'<div class="math">{convert(tex, display="block")}</div>')
    raise nodes.SkipNode


def add_plotly_js(app, pagename, templatename, context, doctree) -> None:
    if "plotly-graph-div" in context.get("body", ""):
        app.add_js_file("plotly.min.js")  # before the page's figures: it loads in <head>


def setup(app) -> dict:
    app.add_html_math_renderer(
        "mathml", inline_renderers=(visit_math, None), block_renderers=(visit_displaymath, None)
    )
    app.connect("html-page-context", add_plotly_js)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def main() -> None:
    seconds = build()
    print(f"{HTML / 'index.html'}: built in {seconds:.1f} s from {EXECUTED}")


if __name__ == "__main__":
    main()
