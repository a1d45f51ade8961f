"""Every committed benchmark result is in bench/report.py's shape, and the shape's helpers
refuse what they should: a check whose `pass` disagrees with its value and target, a
numeric column without a unit, a result missing a key."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402

RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))


def test_there_are_results():
    assert RESULTS, "bench/results/ holds no JSON"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_committed_result_has_the_shape(path):
    res = report.load(path)  # checks the keys, the types and every check's pass
    assert list(res) == list(report.KEYS)
    assert res["bench"] == path.stem
    assert res["command"].startswith(f"python bench/{path.stem}.py")
    assert res["rows"], "a result with no rows"
    for c in res["checks"]:
        assert set(report.CHECK_KEYS) <= set(c)
        assert c["pass"] is report.passes(c["value"], c["target"])
        assert (c["target"] is None) == (c["pass"] is None)


# ---- check ------------------------------------------------------------------------------
def test_check_computes_pass():
    assert report.check("speedup", 2.9, ">=", 2.5) == {
        "name": "speedup",
        "value": 2.9,
        "target": ">= 2.5",
        "pass": True,
    }
    assert report.check("loss", 0.16, "<=", 0.15)["pass"] is False
    assert report.check("gap", 5.0, "<", 5)["pass"] is False
    assert report.check("same", True, "==", True)["pass"] is True
    assert report.check("identical", 47, "==", 48)["pass"] is False
    ref = report.check("simulated gain", 1.19)
    assert (ref["target"], ref["pass"]) == (None, None)
    assert report.check("g", 2.0, ">=", 1.5, pairs=[1.9, 2.0])["detail"] == {"pairs": [1.9, 2.0]}


@pytest.mark.parametrize(
    "args",
    [
        ("x", 1.0, "=>", 2),  # not an operator
        ("x", 1.0, ">=", None),  # an operator without a target
        ("x", 1.0, None, 2),  # a target without an operator
        ("x", "2.9", ">=", 2.5),  # a value that is text
        ("x", None, ">=", 2.5),  # no value
        ("x", float("nan"), ">=", 2.5),  # not a number
        ("x", 1.0, ">=", "2.5"),  # a target that is text
        ("", 1.0, ">=", 2.5),  # no name
    ],
)
def test_check_rejects(args):
    with pytest.raises(ValueError):
        report.check(*args)


def test_target_round_trip():
    for op, t in ((">=", 2.5), ("<", 5), ("==", True), ("<=", 0.15), (">", 1e-3)):
        assert report.parse_target(report.target_text(op, t)) == (op, t)
    for bad in ("2.5", ">= ", ">=2.5", "at least 2.5", ">= two"):
        with pytest.raises(ValueError):
            report.parse_target(bad)


# ---- tables -----------------------------------------------------------------------------
def test_table_units_and_rounding():
    cols = [
        report.Column("policy", "policy"),
        report.Column("out (tok/s)", "tps", ".0f"),
        report.Column("ITL p99 (ms)", "itl", ".1f", 1e3),
        report.Column("padding (%)", "pad", ".1%"),
        report.Column("steps (count)", "steps", "d"),
        report.Column("rounds (s)", "rounds", ".2f"),
        report.Column("mean step (ms)", "m.step", ".2f"),
    ]
    rows = [
        {
            "policy": "static",
            "tps": 808.2553,
            "itl": 0.018980336,
            "pad": 0.70191,
            "steps": 689,
            "rounds": [3.148, 3.3668],
            "m": {"step": 451},
        }
    ]
    header, line = report.table(rows, cols).splitlines()
    assert header.split("  ")[0].strip() == "policy"
    for h in ("out (tok/s)", "ITL p99 (ms)", "padding (%)", "steps (count)", "rounds (s)"):
        assert h in header
    assert line.split() == ["static", "808", "19.0", "70.2%", "689", "3.15", "3.37", "451"]
    assert len(header) >= len(line)  # numbers right-aligned under their headers


def test_table_prints_missing_values_as_dash():
    assert (
        report.table([{"a": None}], [report.Column("a (s)", "a", ".2f")]).splitlines()[1].strip()
        == "-"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(header="TTFT p50", key="ttft", fmt=".3f"),  # a number without a unit
        dict(header="TTFT p50 (ms", key="ttft", fmt=".3f"),  # a unit not closed
        dict(header="TTFT p50 (ms)", key="ttft", fmt=".3q"),  # not a number format
        dict(header="run", key="run", fmt="", scale=1e3),  # a text column cannot be scaled
    ],
)
def test_column_rejects(kwargs):
    with pytest.raises(ValueError):
        report.Column(**kwargs)


def test_table_names_a_missing_key():
    with pytest.raises(KeyError, match="ttft_p50"):
        report.table([{"ttft": 1.0}], [report.Column("TTFT p50 (s)", "ttft_p50", ".3f")])


def test_checks_block():
    text = report.checks_text(
        [
            report.check("speedup", 2.8999, ">=", 2.5, runs=[2.7, 2.9]),
            report.check("loss", 0.16, "<=", 0.15),
            report.check("gain", 1.19),
        ]
    )
    speedup, loss, gain = text.splitlines()
    assert "2.90" in speedup and "target >= 2.5" in speedup and speedup.split()[-4] == "PASS"
    assert "[runs 2.70 2.90]" in speedup
    assert loss.endswith("FAIL") and "0.160" in loss
    assert gain.endswith("(no target)")


# ---- files ------------------------------------------------------------------------------
def good() -> dict:
    return report.result(
        "demo",
        "python bench/demo.py",
        {"threads": 1},
        [{"x": 1.0}],
        [report.check("x", 1.0, ">=", 0.5)],
    )


def test_write_then_load(tmp_path):
    path = report.write(tmp_path / "demo.json", good())
    assert report.load(path) == good()
    assert path.read_text().startswith('{\n "bench"')  # indent 1


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda r: r.pop("checks"), "missing checks"),
        (lambda r: r.pop("command"), "missing command"),
        (lambda r: r.update(results={}), "unexpected top-level keys"),
        (lambda r: r.update(rows={}), "rows is a list"),
        (lambda r: r["checks"][0].pop("target"), "needs name, value, target, pass"),
        (lambda r: r["checks"][0].update({"pass": False}), "pass is False"),
        (lambda r: r["checks"][0].update({"pass": None}), "pass is None"),
        (lambda r: r["checks"][0].update(target=">= 2"), "pass is True"),
        (lambda r: r["checks"][0].update(target="at least 0.5"), "a target reads"),
        (lambda r: r["checks"][0].update(value="1.0"), "not a number"),
    ],
)
def test_load_rejects_and_names_the_file(tmp_path, spoil, message):
    res = good()
    spoil(res)
    path = tmp_path / "spoiled.json"
    path.write_text(json.dumps(res))
    with pytest.raises(report.ShapeError, match=message) as e:
        report.load(path)
    assert str(path) in str(e.value)


def test_load_names_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(report.ShapeError, match="broken.json"):
        report.load(path)
