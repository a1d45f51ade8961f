"""bench/gpu_check.py, the one command a lent GPU runs, proven here first: its dry run does every
part on this CPU (the kernel in Triton's interpreter, the tiny model), so the script cannot rot
between the rare sessions that have a GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402

pytest.importorskip(
    "triton", reason="the dry run checks the Triton kernel in its interpreter (Linux only)"
)


def test_the_dry_run_does_every_part(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--dry-run", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    res = report.load(out)  # the one bench shape, checks recomputed
    parts = {p["part"]: p for p in res["conditions"]["parts"]}
    assert list(parts) == ["environment", "kernel", "speed", "engine", "cost model", "trace"]
    assert all(p["status"] == "ok" for p in parts.values()), parts
    assert res["conditions"]["total_s"] < 180, "the dry run must stay under 3 minutes"
    checks = {c["name"]: c for c in res["checks"]}
    for name in (
        "kernel cases within tolerance of the reference (count)",
        "policies' greedy differences not at a near-tie (count)",
        "an engine runs on cpu (requests finished)",
    ):
        assert checks[name]["pass"] is True, checks[name]
    systems = {r["system"] for r in res["rows"] if r["part"] == "engine"}
    assert {
        "minilm static",
        "minilm continuous",
        "minilm chunked",
        "transformers continuous",
        "transformers static",
    } <= systems
    assert (tmp_path / "gpu_check_dry_trace.json").exists() and (
        tmp_path / "gpu_check_dry_timeline.json"
    ).exists()
    assert json.loads((tmp_path / "gpu_check_dry_trace.json").read_text())["traceEvents"]
    assert out.with_suffix(".txt").read_text().startswith("gpu_check: DRY RUN ON A CPU")


def test_the_budgets_fit_a_second_try():
    """At most 8 minutes by its own budget: a 15-minute lease (start-up included) has room to rerun."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check

    assert (
        gpu_check.TOTAL_BUDGET_S <= 480
        and sum(gpu_check.BUDGETS_S.values()) <= gpu_check.TOTAL_BUDGET_S
    )


# The GPU image has torch 2.11 and Triton 3.6; this machine newer ones. The GPU-only calls the
# check makes (through gpu_attention.py and the kernel), and the release each first appeared in:
# none is newer than the image's. A new call must be added here with its version.
GPU_CALLS = {
    "torch.cuda.get_device_properties": "torch 1.0",
    "torch.cuda.mem_get_info": "torch 1.10",
    "torch.cuda.synchronize": "torch 0.4",
    "torch.cuda.is_available": "torch 0.4",
    "torch.cuda.get_device_name": "torch 0.4",
    "torch.cuda.empty_cache": "torch 0.4",
    "torch.nn.attention.sdpa_kernel": "torch 2.3",
    "torch.nn.attention.bias.causal_lower_right": "torch 2.3",
    "enable_gqa=": "torch 2.5 (scaled_dot_product_attention)",
    "triton.testing.do_bench": "triton 2.0",
    "triton.next_power_of_2": "triton 2.0",
    "triton.cdiv": "triton 2.0",
}


def test_every_gpu_call_is_listed_with_a_release_the_gpu_image_has():
    text = "\n".join(
        (ROOT / f).read_text()
        for f in (
            "bench/gpu_check.py",
            "bench/gpu_attention.py",
            "minilm/model/attention/triton_paged.py",
            "minilm/model/attention/sdpa.py",
        )
    )
    used = set(re.findall(r"\btorch\.cuda\.\w+|\btriton\.(?:testing\.)?\w+(?=\()", text))
    used |= {"torch.nn.attention.sdpa_kernel"} if "sdpa_kernel" in text else set()
    used |= (
        {"torch.nn.attention.bias.causal_lower_right"} if "causal_lower_right" in text else set()
    )
    used |= {"enable_gqa="} if "enable_gqa=" in text else set()
    missing = used - set(GPU_CALLS)
    assert not missing, (
        f"GPU-only calls not checked against the GPU image's versions: {sorted(missing)}"
    )
