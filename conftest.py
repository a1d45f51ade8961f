"""For every test run, tests/ and labs/ alike (nbval's notebook cells are pytest items too)."""

import os
from pathlib import Path

import pytest

# Tests run tiny tensors: one torch thread avoids OpenMP barrier spinning on a shared 2-core
# machine. Set before torch loads, for this process, the servers it starts and the notebook
# kernels nbval starts (EngineConfig.cpu_threads's default is $OMP_NUM_THREADS, else the
# machine's physical cores).
os.environ["OMP_NUM_THREADS"] = "1"

PLOTLY_MIME = "application/vnd.plotly.v1+json"  # what JupyterLab's plotly extension draws
figure_page = (
    None  # one Chromium page (tests/chromium.py) for every notebook's figures: plotly.js loads once
)


def triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class FiguresDrawInChromium(pytest.Item):
    """After a notebook's cells, one more item: every Plotly figure they showed draws in headless
    Chromium as JupyterLab would draw it (tests/chromium.py), no page error, no trace left undrawn.

    The figures are the cells' own outputs, as nbval received them, so the lessons run once.
    A `FigureWidget` (the control panel, the live Gantt, the lecture demo's comparison) sends its
    figure in widget messages, which nbval drops: tests/test_browser.py draws the panel in JupyterLab."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.figures: list[
            tuple[str, dict]
        ] = []  # (label, figure JSON) in the order the cells showed them
        self.cells_run = 0

    def collect_figures(self, cell) -> None:
        self.cells_run += 1
        shown = [
            o["data"][PLOTLY_MIME]
            for o in cell.test_outputs or ()
            if PLOTLY_MIME in o.get("data", {})
        ]
        for fig in shown:
            title = (fig.get("layout", {}).get("title") or {}).get("text")
            label = f"{cell.name} (id {cell.cell.get('id')})" + (f" {title!r}" if title else "")
            self.figures.append((label, fig))

    def runtest(self) -> None:
        from labs import build_site
        from tests.chromium import CHROMIUM, FigurePage

        global figure_page

        if not self.cells_run:
            pytest.skip("none of this notebook's cells ran")
        rel = Path(self.parent.path).resolve().relative_to(build_site.LABS)
        build_site.save_executed(self.parent.nb, self.parent.outputs_seen, str(rel))
        if not self.figures:
            pytest.skip("the notebook shows no Plotly figure")
        if not Path(CHROMIUM).exists():
            pytest.skip(f"{CHROMIUM} is absent: install it with `apt-get install -y chromium`")
        figure_page = figure_page or FigurePage()
        try:
            problems, traces = figure_page.problems(self.figures)
        except BaseException:
            close_figure_page()  # the next notebook gets a fresh page
            raise
        print(f"{len(self.figures)} figures, {traces} traces drawn")  # shown by `pytest -rA`
        if problems:
            pytest.fail(
                f"of {len(self.figures)} figures ({traces} traces):\n" + "\n".join(problems),
                pytrace=False,
            )

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: {self.name}"


# Lessons whose asserts read times measured on this CPU (a step's milliseconds, a server's TTFT):
# scripts/test.sh runs them one after the other with nothing beside them (`--notebooks timed`),
# and every other notebook beside the tests, on two workers (`--notebooks untimed`). Their other
# measured outputs are never compared (nbval-lax), so a neighbour changes numbers, not verdicts.
TIMED_NOTEBOOKS = (
    "01_prefill_decode.ipynb",
    "06_chunked_prefill.ipynb",
    "08_prefix_caching.ipynb",
    "09_serving.ipynb",
)


def pytest_addoption(parser):
    parser.addoption(
        "--notebooks",
        choices=("all", "timed", "untimed"),
        default="all",
        help="which notebooks run: all, only the lessons that assert on times measured here "
        "(TIMED_NOTEBOOKS in conftest.py), or all the others",
    )
    parser.addoption(
        "--site",
        action="store_true",
        help="build and check the site after this run, from the notebooks it ran and those "
        "an earlier run left in labs/site/executed (scripts/test.sh's second run)",
    )


def pytest_collection_modifyitems(config, items):
    skip_triton_cells(items)
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # no notebooks collected
        return
    keep_notebooks(config, items, IPyNbCell)
    add_figure_checks(items, IPyNbCell)
    add_site_check(config, items, IPyNbCell)


def keep_notebooks(config, items, cell_type) -> None:
    """Deselect the notebooks `--notebooks` leaves out (tests/ are kept either way)."""
    which = config.getoption("notebooks")
    if which == "all":
        return
    here = Path(__file__).parent
    timed = {here / "labs" / name for name in TIMED_NOTEBOOKS}
    dropped = [
        i
        for i in items
        if isinstance(i, cell_type) and (Path(i.parent.path) in timed) != (which == "timed")
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [i for i in items if id(i) not in gone]


def add_figure_checks(items, cell_type) -> None:
    """One FiguresDrawInChromium after the last cell of each notebook."""
    last = {}
    for i, item in enumerate(items):
        if isinstance(item, cell_type):
            last[item.parent] = i
    for notebook, i in sorted(
        last.items(), key=lambda kv: -kv[1]
    ):  # from the end: indices stay valid
        notebook.figure_check = FiguresDrawInChromium.from_parent(
            notebook, name="figures draw in Chromium"
        )
        notebook.outputs_seen = {}  # cell number: what it showed, for the site's executed copy
        items.insert(i + 1, notebook.figure_check)


def pytest_runtest_makereport(item, call):
    check = getattr(item.parent, "figure_check", None)
    if call.when == "call" and check is not None and item is not check:
        check.collect_figures(item)
        item.parent.outputs_seen[item.cell_num] = item.test_outputs


class SiteBuilds(pytest.Item):
    """After every notebook, one more item: the site (labs/build_site.py) builds from the notebooks
    as nbval ran them, and every page loads in headless Chromium with no console error, no request
    off the machine, its figures drawn at the page's width and its links to pages that exist
    (tests/chromium.py). Added when every notebook of the site was collected, or with `--site`:
    then the ones this run did not hold come from the executed copies an earlier run wrote
    (scripts/test.sh clears them first, so they are its own first run's)."""

    def __init__(self, notebooks, **kwargs):
        super().__init__(**kwargs)
        self.notebooks = notebooks  # {path relative to labs/: its nbval file node, None: not here}

    def runtest(self) -> None:
        from labs import build_site
        from tests.chromium import CHROMIUM, site_problems

        unrun = [
            rel for rel, nb in self.notebooks.items() if nb is not None and not nb.outputs_seen
        ]
        if unrun:
            pytest.skip(f"these notebooks did not run: {unrun}")
        absent = [
            rel
            for rel, nb in self.notebooks.items()
            if nb is None and not (build_site.EXECUTED / rel).exists()
        ]
        if absent:
            pytest.fail(
                f"no executed copy in {build_site.EXECUTED} of {absent}: run them first "
                f"(scripts/test.sh's first run does)",
                pytrace=False,
            )
        seconds = build_site.build()
        print(f"site built in {seconds:.1f} s")
        if not Path(CHROMIUM).exists():
            pytest.skip(f"{CHROMIUM} is absent: install it with `apt-get install -y chromium`")
        problems, pages = site_problems(build_site.HTML)
        print(f"{pages} pages checked")
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)

    def reportinfo(self):
        return self.path, None, "the lab's site builds and its pages work in Chromium"


def add_site_check(config, items, cell_type) -> None:
    """One SiteBuilds after everything, when the run holds every notebook the site shows (or
    `--site` asks for it)."""
    from labs.build_site import LABS, site_notebooks

    files = {item.parent for item in items if isinstance(item, cell_type)}
    by_rel = {str(Path(f.path).relative_to(LABS)): f for f in files if LABS in Path(f.path).parents}
    wanted = site_notebooks()
    if not config.getoption("site") and not all(rel in by_rel for rel in wanted):
        return
    session = items[0].session if items else None
    if session is None:
        return
    items.append(
        SiteBuilds.from_parent(
            session, name="site", notebooks={rel: by_rel.get(rel) for rel in wanted}
        )
    )


def close_figure_page() -> None:
    global figure_page
    if figure_page is not None:
        figure_page.close()
        figure_page = None


def pytest_runtest_setup(item):
    """Playwright's sync API runs one instance at a time: free it for a test that starts its own."""
    if getattr(item.parent, "figure_check", None) is None:
        close_figure_page()


def pytest_sessionfinish(session):
    close_figure_page()


def skip_triton_cells(items) -> None:
    """Without Triton (a Mac: Triton has wheels for Linux only), lesson 5's checked cells that use
    the kernel show a one-line skip message instead of their stored output: nbval skips them
    (tests/test_without_triton.py checks that these are exactly the cells whose output differs)."""
    if triton_installed():
        return
    skip = pytest.mark.skip(
        reason="runs the Triton kernel; Triton is not installed here (Linux only)"
    )
    for item in items:
        source = getattr(item, "cell", {}).get("source", "")
        if (
            "triton_paged" in source
            and "NBVAL_CHECK_OUTPUT" in source
            and "triton_paged = None" not in source
        ):
            item.add_marker(skip)


# the site's build folder holds executed copies of the notebooks (labs/build_site.py): not tests
collect_ignore_glob = ["labs/site/*"]
