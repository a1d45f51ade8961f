"""One shape for every benchmark's results, and one way to print them.

Every script in bench/ writes the same JSON object:

    {"bench": "cpu_policies",                    # the script's name
     "command": "python bench/cpu_policies.py",  # the command line that produced it
     "conditions": {...},                        # machine, versions, threads, load, knobs
     "rows": [{...}, ...],                       # what was measured, one dict per row
     "checks": [{"name": ..., "value": 2.9, "target": ">= 2.5", "pass": true}, ...]}

so a reader, a test or another script opens any result the same way, and every script
prints its rows with `print_table` and its checks with `print_checks`. A script's
`--show FILE` prints a saved result again without rerunning it, with the same code that
printed it after the run: a table in bench/README.md is what the script printed for the
committed JSON.

A check's `target` is a string "<op> <number>" (or null when a number is reported for
reference only) so that `pass` can be recomputed from `value` and `target` alone: `load`
does, and refuses a file where they disagree.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import operator
import os
import platform
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEYS = ("bench", "command", "conditions", "rows", "checks")
CHECK_KEYS = ("name", "value", "target", "pass")
OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}


class ShapeError(ValueError):
    """A result file that is not in the shape above; the message names the file."""


# ---- checks -----------------------------------------------------------------------------
def target_text(op: str, target: float | bool) -> str:
    """The target as the JSON stores it and the table prints it: ">= 2.5"."""
    if op not in OPS:
        raise ValueError(f"unknown comparison {op!r}: one of {', '.join(OPS)}")
    if not _is_value(target):
        raise ValueError(f"a target is a number or a bool, not {target!r}")
    return f"{op} {target!r}"


def parse_target(text: str) -> tuple[str, float | bool]:
    """The inverse of `target_text`: ">= 2.5" -> (">=", 2.5)."""
    m = re.fullmatch(r"(>=|<=|==|>|<) (True|False|[-+0-9.eE]+)", text)
    if m is None:
        raise ValueError(f"a target reads '<op> <number>', e.g. '>= 2.5', not {text!r}")
    op, raw = m.groups()
    return op, raw == "True" if raw in ("True", "False") else float(raw)


def passes(value: float | bool, target: str | None) -> bool | None:
    """Whether `value` meets `target`; None when there is no target (reported for reference)."""
    if target is None:
        return None
    op, bound = parse_target(target)
    return bool(OPS[op](value, bound))


def check(
    name: str,
    value: float | bool,
    op: str | None = None,
    target: float | bool | None = None,
    **detail: Any,
) -> dict:
    """One check as the JSON stores it; `pass` is computed here, never by hand. Without `op`
    the value is reported with no target ("pass": null). `detail` (e.g. every repeat's value)
    is printed after the verdict and kept under "detail"."""
    if not name:
        raise ValueError("a check needs a name")
    if not _is_value(value):
        raise ValueError(f"check {name!r}: value must be a number or a bool, not {value!r}")
    if (op is None) != (target is None):
        raise ValueError(f"check {name!r}: give both op and target, or neither")
    text = None if op is None else target_text(op, target)
    out = {"name": name, "value": value, "target": text, "pass": passes(value, text)}
    return out | ({"detail": detail} if detail else {})


def _is_value(x: Any) -> bool:
    return isinstance(x, bool) or (isinstance(x, (int, float)) and not math.isnan(x))


# ---- tables -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One column of a printed table. A numeric column's header names its unit in
    parentheses ("TTFT p50 (ms)"): a number without a unit is half a number. `scale`
    converts the row's unit to the header's (1e3: seconds stored, milliseconds shown)."""

    header: str
    key: str  # the row's key; "a.b" reads row["a"]["b"]
    fmt: str = ""  # a format spec for numbers (".3f", ".0f", ".1%", "d"); "" for text
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.fmt:
            if self.scale != 1.0:
                raise ValueError(f"column {self.header!r}: a text column cannot be scaled")
            return
        if not re.search(r"\([^()]+\)$", self.header):
            raise ValueError(
                f"column {self.header!r}: a numeric column's header ends with its unit, "
                f"e.g. 'TTFT p50 (ms)' or 'steps (count)'"
            )
        try:
            format(0, self.fmt)
        except ValueError:
            raise ValueError(
                f"column {self.header!r}: {self.fmt!r} is not a number format"
            ) from None

    @property
    def numeric(self) -> bool:
        return bool(self.fmt)

    def cell(self, row: dict) -> str:
        value = lookup(row, self.key)
        if isinstance(value, list):
            return " ".join(self.format(v) for v in value)
        return self.format(value)

    def format(self, value: Any) -> str:
        if value is None:
            return "-"
        if not self.numeric or isinstance(value, (bool, str)):
            return str(value)
        if self.scale == 1.0:
            if isinstance(value, int) and self.fmt.endswith("f"):
                return format(value, "d")  # a count stays whole in a column of decimals
            return format(value, self.fmt)
        return format(value * self.scale, self.fmt)


def lookup(row: dict, key: str) -> Any:
    """row["a"]["b"] for "a.b"; a KeyError that names the key and the row's keys."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"no {key!r} in row with keys {sorted(row)}")
        value = value[part]
    return value


def table(rows: list[dict], columns: list[Column]) -> str:
    """Rows under their headers: text columns left-aligned, numbers right-aligned."""
    cells = [[c.cell(r) for c in columns] for r in rows]
    widths = [max([len(c.header)] + [len(x[i]) for x in cells]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if c.numeric else v.ljust(w) for v, w, c in zip(values, widths, columns)
        ).rstrip()

    return "\n".join([line([c.header for c in columns])] + [line(x) for x in cells])


def print_table(rows: list[dict], columns: list[Column]) -> None:
    print(table(rows, columns))


def value_text(v: Any) -> str:
    """A check's value, rounded for reading: three significant digits, whole from 100 up."""
    if isinstance(v, bool) or isinstance(v, int) or isinstance(v, str):
        return str(v)
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:#.3g}"


def checks_text(checks: list[dict]) -> str:
    """The checks as a block: name, value, target, PASS/FAIL, then any detail."""
    if not checks:
        return "checks: none (this benchmark reports numbers, it has no targets)"
    width = max(len(c["name"]) for c in checks)
    values = [value_text(c["value"]) for c in checks]
    vwidth = max(len(v) for v in values)
    twidth = max(len(c["target"] or "") for c in checks)
    lines = []
    for c, v in zip(checks, values):
        verdict = (
            "(no target)"
            if c["target"] is None
            else f"target {c['target']:{twidth}}  {'PASS' if c['pass'] else 'FAIL'}"
        )
        detail = "; ".join(
            f"{k} " + (" ".join(map(value_text, d)) if isinstance(d, list) else value_text(d))
            for k, d in c.get("detail", {}).items()
        )
        lines.append(
            f"{c['name']:{width}}  {v:>{vwidth}}  {verdict}" + (f"  [{detail}]" if detail else "")
        )
    return "\n".join(lines)


def print_checks(checks: list[dict]) -> None:
    print(checks_text(checks))


# ---- conditions -------------------------------------------------------------------------
def machine() -> dict:
    """What every result says about where it ran: the machine, its cores, the versions."""
    out = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    for package in ("torch", "triton", "transformers"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass  # only what is installed: triton and transformers are optional
    return out


def about(conditions: dict) -> str:
    """What `machine` recorded, for a table's first line ("x86_64, 2 CPUs, python 3.11.7,
    torch 2.13.0+cpu"); only what the file has (older results recorded less)."""
    c = conditions
    parts = [c.get("machine"), c.get("cpus") and f"{c['cpus']} CPUs"]
    parts += [
        f"{k} {c[k]}"
        for k in ("python", "torch", "triton", "transformers")
        if isinstance(c.get(k), str)
    ]
    return joined(*parts, sep=", ")


def joined(*parts: Any, sep: str = "; ") -> str:
    """The parts that are there (not None, "" or False), joined: a header line from
    conditions that older results may lack."""
    return sep.join(str(p) for p in parts if p)


def command_line() -> str:
    """The command that is running, as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parents[1]
    shown = script.relative_to(root) if script.is_relative_to(root) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


# ---- files ------------------------------------------------------------------------------
def result(
    bench: str, command: str, conditions: dict, rows: list[dict], checks: list[dict]
) -> dict:
    """The JSON object, checked for shape before anything is written."""
    out = {
        "bench": bench,
        "command": command,
        "conditions": conditions,
        "rows": rows,
        "checks": checks,
    }
    validate(out, f"result of {bench}")
    return out


def write(path: str | Path, res: dict) -> Path:
    """Write a result (from `result`) as JSON, one space of indent, as the committed files are."""
    validate(res, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    return path


def load(path: str | Path) -> dict:
    """Read a result back; a ShapeError naming the file if it is not in the shape."""
    try:
        res = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShapeError(f"{path}: cannot read a JSON result: {e}") from e
    validate(res, str(path))
    return res


def validate(res: Any, where: str) -> None:
    """The shape of the module docstring; `where` (a file name) starts every message."""

    def fail(msg: str) -> None:
        raise ShapeError(f"{where}: {msg}")

    if not isinstance(res, dict):
        fail(f"a result is a JSON object, not {type(res).__name__}")
    missing = [k for k in KEYS if k not in res]
    if missing:
        fail(f"missing {', '.join(missing)} (a result has {', '.join(KEYS)})")
    extra = sorted(set(res) - set(KEYS))
    if extra:
        fail(f"unexpected top-level keys {extra}: put them under conditions")
    for key, kind in (
        ("bench", str),
        ("command", str),
        ("conditions", dict),
        ("rows", list),
        ("checks", list),
    ):
        if not isinstance(res[key], kind):
            fail(f"{key} is a {kind.__name__}, not {type(res[key]).__name__}")
    if not all(isinstance(r, dict) for r in res["rows"]):
        fail("every row is a JSON object")
    for i, c in enumerate(res["checks"]):
        if not isinstance(c, dict) or [k for k in CHECK_KEYS if k not in c]:
            fail(f"check {i} needs {', '.join(CHECK_KEYS)}: {c!r}")
        if not _is_value(c["value"]):
            fail(f"check {c['name']!r}: value {c['value']!r} is not a number or a bool")
        try:
            expected = passes(c["value"], c["target"])
        except (ValueError, TypeError) as e:
            fail(f"check {c['name']!r}: {e}")
        if c["pass"] is not expected:
            fail(
                f"check {c['name']!r}: pass is {c['pass']!r} but {c['value']!r} {c['target']} gives {expected!r}"
            )


# ---- the --show option ------------------------------------------------------------------
def add_show_option(parser: argparse.ArgumentParser) -> None:
    """--show FILE: every script prints a saved result with the code that prints a new one."""
    parser.add_argument(
        "--show",
        metavar="FILE",
        type=Path,
        help="print a saved result (e.g. bench/results/<name>.json) as the script prints it; "
        "runs nothing",
    )
