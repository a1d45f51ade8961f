"""Size of each part of the lab, as the README's "Layout" table shows it.

    python scripts/count_lines.py            # print the table
    python scripts/count_lines.py --readme   # and put it in README.md (tests/test_architecture.py checks it)

Lines are `wc -l` of every Python file (docstrings, comments and blank lines included),
characters those of the lines (newlines not counted); "chars/line" is the mean length of the non-blank lines, which a line
cap alone would let grow. nano-vllm's nanovllm/ package, counted the same way at commit
bb823b3: 19 files, 1,385 lines, 49,342 characters, 41.2 per line. The engine core is the
contracts, `core/` and `model/` without the Triton kernel (docs/DESIGN.md, "Size").
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
M = ROOT / "minilm"
KERNEL = M / "model" / "attention" / "triton_paged.py"

PARTS = {  # name -> files; the first three are the engine core
    "contracts (config, request, plan, timeline)": [
        M / f for f in ("config.py", "request.py", "plan.py", "timeline.py")
    ],
    "core/ (engine, scheduler, step, policies, KV cache, prefix cache, clocks, builder)": sorted(
        (M / "core").rglob("*.py")
    ),
    "model/ (Llama, attention reference + sdpa, runner, sampling, loader, tokenizer, quantization)": [
        f for f in sorted((M / "model").rglob("*.py")) if f != KERNEL
    ],
    "Triton kernel (model/attention/triton_paged.py)": [KERNEL],
    "workload, metrics, record, trace, router, quiet, gcpause": [
        M / f
        for f in (
            "workload.py",
            "metrics.py",
            "record.py",
            "trace.py",
            "router.py",
            "quiet.py",
            "gcpause.py",
        )
    ],
    "spec_decode/ (speculative decoding: config, proposers, executor)": sorted(
        (M / "spec_decode").rglob("*.py")
    ),
    "sim/ (cost model, simulated executor, simulated speculation, fleets)": sorted(
        (M / "sim").rglob("*.py")
    ),
    "serve/ (server, engine core and thread, OpenAI API, metrics)": sorted(
        (M / "serve").rglob("*.py")
    ),
    "client/ (bench-serve, its result files, a server in a child process)": sorted(
        (M / "client").rglob("*.py")
    ),
    "command line (cli.py, __main__.py, __init__.py)": [
        M / f for f in ("cli.py", "__main__.py", "__init__.py")
    ],
    "training/ (trainer, dense forward, checkpoint writer)": sorted(
        (ROOT / "training").rglob("*.py")
    ),
    "widgets/ (views)": sorted((ROOT / "widgets").rglob("*.py")),
}
CORE = list(PARTS)[:3]
NANO_VLLM = ("nano-vllm, for comparison (its nanovllm/ package)", 19, 1385, 49342, 41.2)


def size(files: list[Path]) -> tuple[int, int, int, float]:
    """(files, lines, characters, mean characters per non-blank line)."""
    lines = [line for f in files for line in f.read_text().splitlines()]
    filled = [len(line) for line in lines if line.strip()]
    return len(files), len(lines), sum(filled), sum(filled) / len(filled)


def core_files() -> list[Path]:
    return [f for name in CORE for f in PARTS[name]]


def table() -> str:
    rows = [(name, *size(files)) for name, files in PARTS.items()]
    rows.insert(3, ("engine core (the three above)", *size(core_files())))
    rows.append(NANO_VLLM)
    width = max(len(r[0]) for r in rows)
    out = [f"{'part':<{width}}  files  lines  characters  chars/line"]
    out += [f"{r[0]:<{width}}  {r[1]:>5}  {r[2]:>5,}  {r[3]:>10,}  {r[4]:>10.1f}" for r in rows]
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
