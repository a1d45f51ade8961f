"""The site's builder (labs/build_site.py) and its browser check (tests/chromium.py site_problems)
on three small notebooks: what a page shows, and that the check catches a console error, a
request off the machine and a link to a missing page. The lab's own site is built and checked
by the last item of a run that holds every notebook, or of one run with `--site` (conftest.py
SiteBuilds)."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
from chromium import CHROMIUM, site_problems
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labs import build_site

FIGURE = {"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}], "layout": {"width": 300}}
BAD_HTML = (
    "<script>console.error('broken')</script><img src='https://example.com/x.png'>"
    "<a href='nowhere.html'>a missing page</a><p>TeX as text: \\frac{a}{b}</p>"
)


def notebook(*cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def shown(code: str, *outputs, hidden=False):
    cell = new_code_cell(code, outputs=list(outputs))
    if hidden:
        cell.metadata["jupyter"] = {"source_hidden": True}
    return cell


def lesson() -> nbformat.NotebookNode:
    return notebook(
        new_markdown_cell(
            "# Lesson\n\nA step costs $12 d^2$ FLOPs, a decode $P \\cdot b\n+ c$ bytes."
        ),
        shown("fig", new_output("display_data", data={build_site.PLOTLY_MIME: FIGURE})),
        shown(
            "say(f'{x} wins')",
            new_output("execute_result", data={"text/markdown": "static wins"}),
            hidden=True,
        ),
        shown("1 / 0", new_output("error", ename="ZeroDivisionError", evalue="x", traceback=[])),
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    executed = tmp_path_factory.mktemp("executed")
    for rel, nb in (
        ("00_start_here.ipynb", lesson()),
        (
            "01_prefill_decode.ipynb",
            notebook(
                new_markdown_cell("# Bad"),
                shown("x", new_output("display_data", data={"text/html": BAD_HTML})),
            ),
        ),
        ("exercises/00_start_here.ipynb", notebook(new_markdown_cell("# Exercise 0"))),
    ):
        (executed / rel).parent.mkdir(exist_ok=True)
        nbformat.write(nb, executed / rel)
    out = executed.parent / "site" / "html"
    build_site.build(executed, out)
    return out


def test_a_page_shows_figures_math_and_sentences_not_tracebacks(site):
    page = (site / "00_start_here.html").read_text()
    assert page.count('class="plotly-graph-div"') == 1 and "_static/plotly.min.js" in page
    assert '"width"' not in page.split('class="plotly-graph-div"')[1]  # drawn at the page's width
    assert page.count("<math") == 2 and "$" not in page.split("<article")[1].split("<script")[0]
    assert "static wins" in page and "say(f" not in page  # a takeaway: its sentence alone
    assert "ZeroDivisionError" not in page
    assert "plotly.min.js" not in (site / "exercises" / "00_start_here.html").read_text()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent")
def test_the_check_passes_good_pages_and_names_each_problem_of_a_bad_one(site):
    problems, pages = site_problems(site, search="lesson")
    assert pages == 6  # three notebooks, the index, search, the general index
    assert all(p.startswith("01_prefill_decode.html: ") for p in problems), problems
    text = "\n".join(problems)
    assert "console error: broken" in text
    assert "asked the network for https://example.com/x.png" in text
    assert "a link to a missing page" in text and "nowhere.html" in text
    assert "TeX left as text" in text


def test_the_lecture_demo_page_stops_before_part_2():
    nb = notebook(
        new_markdown_cell("# Demo"), new_markdown_cell("## Part 2: live"), shown("serve()")
    )
    assert [c.source for c in build_site.page_notebook(nb, "lecture_demo.ipynb").cells] == [
        "# Demo"
    ]


def test_a_stored_cell_keeps_its_text_and_figure_json_and_no_other_cell_keeps_anything():
    """labs/build_notebooks.py: a `# %% [stored]` cell keeps what a reader needs before running
    the notebook (no plotly.js copy, no stderr, no widget without its state)."""
    import sys

    sys.path.insert(0, str(build_site.LABS))
    from build_notebooks import keep_checked_outputs, make_notebook, split_cells

    cells = split_cells("# %% [stored]\nfig\n\n# %%\nfig\n")
    nb = make_notebook(cells, "lesson")
    figure = new_output(
        "display_data",
        data={build_site.PLOTLY_MIME: FIGURE, "text/html": "<script>plotly.js</script>"},
    )
    outputs = [
        new_output("stream", name="stdout", text="a "),
        new_output("stream", name="stdout", text="b\n"),
        new_output("stream", name="stderr", text="a warning"),
        figure,
        new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {}}),
    ]
    for cell in nb.cells[1:]:
        cell.outputs = copy.deepcopy(outputs)
    assert keep_checked_outputs(nb, "lesson") == []
    stored, unmarked = nb.cells[1], nb.cells[2]
    assert stored.metadata["tags"] == ["stored"]
    assert [o.get("text") or dict(o.data) for o in stored.outputs] == [
        "a b\n",
        {build_site.PLOTLY_MIME: FIGURE},
    ]
    assert unmarked.outputs == []

    big = {"data": [{"type": "scatter", "y": list(range(10_000))}]}
    nb.cells[1].outputs = [new_output("display_data", data={build_site.PLOTLY_MIME: big})]
    assert any("over the 32 KB" in e for e in keep_checked_outputs(nb, "lesson"))


def collected(*args: str) -> set[str]:
    """The item ids `pytest --collect-only` finds with these arguments (no notebook runs)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--nbval-lax", *args],
        cwd=build_site.LABS.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line for line in out.splitlines() if "::" in line}


def test_the_two_runs_of_the_test_command_hold_every_notebook_once_and_the_site_last():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "root_conftest", build_site.LABS.parent / "conftest.py"
    )
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    def notebooks(items: set[str]) -> set[str]:
        return {i.split("::")[0] for i in items if i.startswith("labs/")}

    every = notebooks(collected("labs"))
    timed = collected("labs", "--notebooks", "timed", "--site")
    untimed = collected("labs", "--notebooks", "untimed")
    assert notebooks(timed) == {f"labs/{n}" for n in conftest.TIMED_NOTEBOOKS}  # each exists
    assert notebooks(timed) | notebooks(untimed) == every
    assert not notebooks(timed) & notebooks(untimed)
    assert "::site" in timed and "::site" not in untimed  # the site: once, after both
    script = (build_site.LABS.parent / "scripts" / "test.sh").read_text()
    assert "--notebooks untimed -n 2" in script and "--notebooks timed --site" in script
