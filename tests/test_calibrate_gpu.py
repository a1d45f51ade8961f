"""bench/calibrate_gpu.py's data and result: every published point is cited and readable, and
the committed model still gives the held-out error that bench/results/calibrate_gpu.json
reports (recomputed from the data: a few seconds of simulated runs)."""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import calibrate_gpu as cal  # noqa: E402
from bench import report  # noqa: E402

RESULT = ROOT / "bench" / "results" / "calibrate_gpu.json"


@pytest.fixture(scope="module")
def data():
    return cal.load_data()


def test_the_data_file_is_well_formed_and_every_point_is_cited(data):
    assert cal.problems(data) == []
    points = cal.used(data)
    assert len(points) >= 30 and len({p["source"] for p in points}) >= 4
    for source in data["sources"].values():
        assert (
            source["citation"].startswith("https://") and source["engine"] and source["conditions"]
        )
    for p in data["points"]:
        assert p["citation"].startswith("https://") and p["source"] in data["sources"]
        assert "excluded" not in p or len(p["excluded"]) > 20  # a reason, in words
    held = [p for p in points if cal.is_held_out(p)]
    assert held and len(held) < len(points)


@pytest.mark.parametrize(
    "change",
    [
        {"citation": ""},
        {"citation": "gpt-fast README"},
        {"source": "a blog"},
        {"metric": "tokens"},
        {"value": -1.0},
        {"model": "llama-9b"},
        {"device": "tpu"},
        {"engine_kind": "sglang"},
        {"unit": "ms"},
        {"policy": "fast"},
    ],
)
def test_problems_names_a_bad_point(data, change):
    bad = copy.deepcopy(data)
    bad["points"][0].update(change)
    found = cal.problems(bad)
    assert found and all(f.startswith(bad["points"][0]["id"]) for f in found)


def test_the_committed_model_gives_the_held_out_error_the_result_reports(data):
    res = report.load(RESULT)
    checks = {c["name"]: c for c in res["checks"]}
    assert res["conditions"]["committed"] == cal.jsonable(cal.committed()), (
        "costmodel.py changed: rerun calibrate_gpu"
    )
    assert checks["costmodel.py holds this fit (3 digits)"]["pass"] is True
    assert tuple(res["conditions"]["held_out_sources"]) == cal.HELD_OUT_SOURCES
    held = [p for p in cal.used(data) if cal.is_held_out(p)]
    errors = [abs(cal.error(p, cal.run_point(p)[0])) for p in held]
    assert float(np.median(errors)) == pytest.approx(
        checks["held-out median |err| (fraction)"]["value"], rel=1e-9
    )
    assert float(np.percentile(errors, 90)) == pytest.approx(
        checks["held-out p90 |err| (fraction)"]["value"], rel=1e-9
    )
