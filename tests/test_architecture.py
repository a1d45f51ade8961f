"""The architecture holds: imports follow docs/DESIGN.md's layers, the design document names
only files and symbols that exist, and the engine core stays small enough to read."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import minilm

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
# the contracts, core/ and model/ without the Triton kernel (docs/DESIGN.md, "Size")
CORE_CHAR_LIMIT = 123_136  # issue 25's goal, 116,547, not reached yet; characters, as scripts/count_lines.py counts them
CORE_CHARS_PER_LINE = 50  # mean length of a non-blank line: no density bought with long lines


def core_size() -> tuple[int, int, int, float]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from count_lines import core_files, size

    return size(core_files())


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed (requirements.txt)"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_engine_core_is_small_and_not_dense():
    _, _, chars, per_line = core_size()
    assert chars <= CORE_CHAR_LIMIT, (
        f"the engine core has {chars:,} characters (limit {CORE_CHAR_LIMIT:,})"
    )
    assert per_line <= CORE_CHARS_PER_LINE, (
        f"the engine core's lines average {per_line:.1f} characters (limit {CORE_CHARS_PER_LINE})"
    )


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_is_happy(command):
    """`ruff format` and `ruff check`, configured in pyproject.toml (fix: run them without --check)."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is not installed (requirements.txt)"
    result = subprocess.run([ruff, *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


# ---- the design document names what exists ---------------------------------------------
def minilm_namespace() -> dict[str, object]:
    """Every name defined by a minilm module (not imported into it), and Python's builtins."""
    names: dict[str, object] = dict(vars(builtins))
    for info in pkgutil.walk_packages(minilm.__path__, "minilm."):
        if info.name.endswith(("__main__", "triton_paged")):
            continue
        module = importlib.import_module(info.name)
        names[info.name.rsplit(".", 1)[-1]] = module
        names.update(
            {
                k: v
                for k, v in vars(module).items()
                if not k.startswith("_")
                and (getattr(v, "__module__", None) or info.name).startswith("minilm")
            }
        )
    return names


def code_spans(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # fenced blocks are pictures, not references
    return re.findall(r"`([^`\n]+)`", text)


PATH = re.compile(r"^[\w.-]+(/[\w.-]*)*(/|\.(py|md|toml|json|txt|sh|html))$")
SYMBOL = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
SOURCE = "\n".join(f.read_text() for f in (ROOT / "minilm").rglob("*.py"))


def has_member(cls: type, name: str) -> bool:
    """A method, class attribute, field or annotation of `cls`, or an attribute its code sets."""
    if hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}):
        return True
    if any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    return re.search(rf"self\.{name}\b(\s*:[^=]*)?\s*[=,]", inspect.getsource(cls)) is not None


def resolves(span: str, names: dict[str, object]) -> bool:
    head, *rest = span.split(".")
    if head not in names:  # a bare field, attribute or argument name: defined somewhere in minilm
        return (
            not rest
            and re.search(rf"(self\.{head}\s*[:=]|def {head}\b|^\s+{head}\s*:)", SOURCE, re.M)
            is not None
        )
    obj = names[head]
    for part in rest:
        if isinstance(obj, type) and not hasattr(obj, part):
            return part == rest[-1] and has_member(obj, part)
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True


def test_design_document_names_only_what_exists():
    names = minilm_namespace()
    missing = []
    for span in code_spans(DESIGN.read_text()):
        if PATH.match(span):
            if not ((ROOT / span).exists() or (ROOT / "minilm" / span).exists()):
                missing.append(span)
        elif SYMBOL.match(span) and ("." in span or "_" in span or span[0].isupper()):
            if not resolves(span, names) and span != "TRITON_INTERPRET":
                missing.append(span)
    assert not missing, f"docs/DESIGN.md names what does not exist: {missing}"


def test_a_missing_name_is_caught():
    """The check above must be able to fail."""
    names = minilm_namespace()
    assert resolves("Scheduler.finish", names) and resolves("SeqWork.num_new_tokens", names)
    assert resolves("ModelRunner.kv_cache", names) and resolves("max_num_batched_tokens", names)
    for gone in (
        "Scheduler.held",
        "Clock.run_model",
        "SeqWork.num_tokens",
        "Engine.kv_cache",
        "schedule_padding_rows",
        "Request.append_token",
    ):
        assert not resolves(gone, names), gone
    assert (
        not PATH.match("minilm")
        and PATH.match("minilm/core/")
        and not (ROOT / "minilm/engine.py").exists()
    )


@pytest.mark.parametrize(
    "module", ["minilm.core", "minilm.model", "minilm.plan", "minilm.timeline"]
)
def test_the_engine_core_imports_no_server_or_views(module):
    """A direct look, besides the linter: importing the engine core pulls in neither FastAPI nor Plotly."""
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "bad = [m for m in ('fastapi', 'uvicorn', 'plotly', 'widgets', 'training') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_shows_the_line_counts_as_they_are():
    """The README's table is what scripts/count_lines.py prints for this tree."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from count_lines import table

    assert table() in (ROOT / "README.md").read_text(), (
        "run `python scripts/count_lines.py` and update the README"
    )
