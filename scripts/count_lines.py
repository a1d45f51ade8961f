"""Lines of code per part of the lab, as the README's "Layout" table shows them.

    python scripts/count_lines.py            # print the table
    python scripts/count_lines.py --readme   # and put it in README.md (tests/test_architecture.py checks it)

`wc -l` of every Python file (docstrings, comments and blank lines included), which is
how nano-vllm's 1,385 lines in 19 files are counted. The engine core is the contracts,
`core/` and `model/` without the Triton kernel (docs/DESIGN.md, "Size").
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
M = ROOT / "minilm"
KERNEL = M / "model" / "attention" / "triton_paged.py"

PARTS = {  # name -> files; the first three are the engine core
    "contracts (config, request, plan, timeline)": [M / f for f in ("config.py", "request.py", "plan.py", "timeline.py")],
    "core/ (engine, scheduler, step, policies, KV cache, prefix cache, clocks, builder)": sorted((M / "core").rglob("*.py")),
    "model/ (Llama, attention reference + sdpa, runner, sampling, loader, tokenizer, quantization)":
        [f for f in sorted((M / "model").rglob("*.py")) if f != KERNEL],
    "Triton kernel (model/attention/triton_paged.py)": [KERNEL],
    "workload, metrics, trace": [M / f for f in ("workload.py", "metrics.py", "trace.py")],
    "spec/ (speculative decoding: config, proposers, executor)": sorted((M / "spec").rglob("*.py")),
    "sim/ (cost model, simulated executor, simulated speculation)": sorted((M / "sim").rglob("*.py")),
    "serve/ (server, engine thread, OpenAI API, metrics, bench client, result files)": sorted((M / "serve").rglob("*.py")),
    "command line (cli.py, __main__.py, __init__.py)": [M / f for f in ("cli.py", "__main__.py", "__init__.py")],
    "training/ (trainer, dense forward, checkpoint writer)": sorted((ROOT / "training").rglob("*.py")),
    "widgets/ (views)": sorted((ROOT / "widgets").rglob("*.py")),
}
CORE = list(PARTS)[:3]


def lines(files: list[Path]) -> int:
    return sum(len(f.read_text().splitlines()) for f in files)


def table() -> str:
    rows = [(name, len(files), lines(files)) for name, files in PARTS.items()]
    core = [r for r in rows if r[0] in CORE]
    rows.insert(3, ("engine core (the three above)", sum(r[1] for r in core), sum(r[2] for r in core)))
    rows.append(("nano-vllm, for comparison (its nanovllm/ package)", 19, 1385))
    width = max(len(r[0]) for r in rows)
    out = [f"{'part':<{width}}  files  lines"]
    out += [f"{name:<{width}}  {n:>5}  {count:>5,}" for name, n, count in rows]
    return "\n".join(out)


def update_readme() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    start = text.index("```\npart ") + 4
    end = text.index("```", start)
    readme.write_text(text[:start] + table() + "\n" + text[end:])


if __name__ == "__main__":
    import sys

    print(table())
    if "--readme" in sys.argv:
        update_readme()
