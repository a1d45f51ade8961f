"""The architecture holds: imports follow docs/DESIGN.md's layers, the documents (the READMEs,
docs/) name only files and symbols that exist, and the engine core stays small enough to read."""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the contracts, core/ and model/ without the Triton kernel (docs/DESIGN.md, "Size")
CORE_CHAR_LIMIT = 118_413  # characters (scripts/count_lines.py); history: DESIGN.md, "Size"
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
        f"the engine core has {chars:,} characters (limit {CORE_CHAR_LIMIT:,}, its size before "
        f"ruff: make room by simplifying, not by longer lines; docs/DESIGN.md, 'Size')"
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


# ---- the documents name what exists ---------------------------------------------------
# The README, bench/README.md, labs/README.md and every page under docs/: a path in backticks
# or in a layout block must exist, and a symbol in backticks must be the lab's (or, on a page
# other than the design, another tool's name that the lab's code uses).
DESIGN = ROOT / "docs" / "DESIGN.md"
DOCS = [
    ROOT / "README.md",
    ROOT / "bench" / "README.md",
    ROOT / "labs" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# the lab's code: another tool's name (OpenAI's, Plotly's) that a page names must be used here
CODE_DIRS = ("minilm", "widgets", "training", "bench", "scripts", "labs", "tests")


@functools.cache
def minilm_namespace() -> dict[str, object]:
    """Every name defined by a module of minilm, widgets or training (not imported into it),
    and Python's builtins."""
    names: dict[str, object] = dict(vars(builtins))
    for package in ("minilm", "widgets", "training"):
        root = importlib.import_module(package)
        names[package] = root
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith(("__main__", "triton_paged")):
                continue
            module = importlib.import_module(info.name)
            names.setdefault(info.name.rsplit(".", 1)[-1], module)
            for k, v in vars(module).items():
                if not k.startswith("_") and (
                    getattr(v, "__module__", None) or info.name
                ).startswith(package):
                    names.setdefault(k, v)
    return names


def fenced_blocks(text: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """The text outside fences, and each fenced block's language and lines."""
    outside, blocks, block = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is None:
                block = (line[3:].strip(), [])
            else:
                blocks.append(block)
                block = None
        elif block is None:
            outside.append(line)
        else:
            block[1].append(line)
    return "\n".join(outside), blocks


def code_spans(text: str) -> list[str]:
    """The spans in backticks outside fences (a fence is read only if it is a layout block)."""
    return re.findall(r"`([^`\n]+)`", fenced_blocks(text)[0])


LAYOUT_LINE = re.compile(r"^( *)([\w.-]+/?(?: [\w.-]+/?)*)(?: {2,}\S.*)?$")


def layout_paths(text: str) -> list[str]:
    """The files and folders of every layout block: a fence without a language whose first
    line is a folder (`minilm/`). A line is its names, one space apart, then two or more
    spaces and what they are; an indented line is inside the last folder above it."""
    paths = []
    for language, lines in fenced_blocks(text)[1]:
        if language or not lines or not re.match(r"^[\w.-]+/( {2,}|$)", lines[0]):
            continue
        folders: list[tuple[int, str]] = []  # (indent, path) of the folders we are inside
        for line in lines:
            m = LAYOUT_LINE.match(line)
            if not m:
                paths.append(f"(a layout line this check cannot read: {line.strip()!r})")
                continue
            indent, names = len(m.group(1)), m.group(2).split()
            while folders and folders[-1][0] >= indent:
                folders.pop()
            parent = folders[-1][1] if folders else ""
            paths += [parent + name for name in names]
            if names[-1].endswith("/"):
                folders.append((indent, parent + names[-1]))
    return paths


PATH = re.compile(
    r"^(\./)?[\w.-]+(/[\w.-]+)*"
    r"(/|\.(py|md|toml|json|txt|sh|html|ini|ipynb|safetensors)|/[\w-]+)$"
)
SYMBOL = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
SOURCE = "\n".join(f.read_text() for f in (ROOT / "minilm").rglob("*.py"))
CODE = "\n".join(
    f.read_text()
    for d in CODE_DIRS
    for f in sorted((ROOT / d).rglob("*"))
    if f.suffix in (".py", ".html", ".sh") and f.name != "test_architecture.py"
)
FILE_NAMES = {f.name for d in (*CODE_DIRS, "docs") for f in (ROOT / d).rglob("*")}


def exists(span: str, doc: Path) -> bool:
    """A path from the repository's root, from minilm/, or from the page's folder; a bare file
    name may be any file of the lab's with that name (`config.json` of a checkpoint)."""
    span = span.removeprefix("./")
    if any((base / span).exists() for base in (ROOT, ROOT / "minilm", doc.parent)):
        return True
    return "/" not in span and span in FILE_NAMES


def has_member(cls: type, name: str) -> bool:
    """A method, class attribute, field or annotation of `cls`, or an attribute its code sets."""
    if hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}):
        return True
    if any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    return re.search(rf"self\.{name}\b(\s*:[^=]*)?\s*[=,]", inspect.getsource(cls)) is not None


MISSING = object()  # a knob whose default is None exists all the same


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
        obj = getattr(obj, part, MISSING)
        if obj is MISSING:
            return False
    return True


def named_in_code(span: str) -> bool:
    """Another tool's name (OpenAI's `stream_options.include_usage`, `Plotly.react`) or a
    notebook's (`lecture_demo`): the lab's code, tests included, must use it, as written or by its
    last part, or a notebook of labs/ have that name."""
    return f"{span}.ipynb" in FILE_NAMES or any(
        re.search(rf"(?<![\w.]){re.escape(s)}(?!\w)", CODE) for s in {span, span.rsplit(".")[-1]}
    )


def missing_names(doc: Path, names: dict[str, object], own_only: bool = False) -> list[str]:
    """What `doc` names that does not exist; `own_only`: every symbol must be the lab's."""
    text, missing = doc.read_text(), []
    for path in layout_paths(text):  # from the repository's root
        if path.startswith("(") or not (ROOT / path).exists():
            missing.append(path)
    for span in code_spans(text):
        if PATH.match(span):
            if not exists(span, doc):
                missing.append(span)
        elif SYMBOL.match(span) and ("." in span or "_" in span or span[0].isupper()):
            head = span.split(".")[0]
            lab_name = head in names and head not in vars(builtins)
            if not resolves(span, names) and (own_only or lab_name or not named_in_code(span)):
                missing.append(span)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_documents_name_only_what_exists(doc):
    missing = missing_names(doc, minilm_namespace(), own_only=doc == DESIGN)
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


def test_a_missing_name_is_caught(tmp_path):
    """The checks above must be able to fail."""
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
        and PATH.match(".ci/run")
        and not (ROOT / "minilm/engine.py").exists()
    )
    page = tmp_path / "PAGE.md"
    page.write_text(
        "`minilm/serve/client.py` `Scheduler.held` `Engine.kv_cache` `made_up_knob`\n\n"
        "```\nminilm/\n  core/  the engine\n    engine.py scheduler.py  ok\n"
        "    held.py  gone\n  spec/\n  serve/ (the server)\n```\n"
    )
    assert missing_names(page, names) == [
        "minilm/core/held.py",
        "minilm/spec/",
        "(a layout line this check cannot read: 'serve/ (the server)')",
        "minilm/serve/client.py",
        "Scheduler.held",
        "Engine.kv_cache",
        "made_up_knob",
    ]
    page.write_text("`Plotly.react` `stream_options.include_usage` `StepBuilder.admit`")
    assert missing_names(page, names) == []  # other tools' names the lab's code uses
    assert missing_names(page, names, own_only=True) == [
        "Plotly.react",
        "stream_options.include_usage",
    ]


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
