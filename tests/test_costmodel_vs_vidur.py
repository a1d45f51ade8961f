"""bench/costmodel_vs_vidur.py's data and comparison: Vidur's matmul profiles read as the cost
model's terms (the refit itself is the benchmark's, not a test's: it takes a minute)."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import costmodel_vs_vidur as vidur  # noqa: E402
from minilm.sim.costmodel import get_model_spec  # noqa: E402

ROWS = vidur.load_rows()


def test_the_data_file_has_one_row_per_shape_on_both_gpus():
    keys = [(r["device"], r["model"], r["tp"], r["num_tokens"]) for r in ROWS]
    assert len(keys) == len(set(keys))
    assert {r["device"] for r in ROWS} == set(vidur.DEVICES)
    assert all(r["matmul_ms"] > 0 and r["elementwise_ms"] > 0 for r in ROWS)


def test_a_layers_linear_parameters_are_the_cost_models():
    """Llama-3-8B's q/k/v/o and gated MLP, counted from Vidur's shape columns, are the cost
    model's P_lin / L: the comparison prices the same matrices."""
    row = next(r for r in ROWS if r["model"] == "meta-llama/Meta-Llama-3-8B")
    m = get_model_spec("llama-3-8b")
    d, hq, hkv, D = m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim
    per_layer = d * (hq + 2 * hkv) * D + hq * D * d + 3 * d * m.intermediate_size
    assert vidur.layer_params(row) == per_layer


def test_more_tokens_cost_more_and_tp_divides_the_work():
    pts = {
        (r["device"], r["model"], r["tp"], r["num_tokens"]): p
        for r, p in zip(ROWS, vidur.operator_points(ROWS))
    }
    a = pts["a100", "meta-llama/Llama-2-7b-hf", 1, 4096]
    b = pts["a100", "meta-llama/Llama-2-7b-hf", 2, 4096]
    assert b.flops_s == pytest.approx(a.flops_s / 2) and b.bytes_s == pytest.approx(a.bytes_s / 2)
    assert a.predicted(1.5, 0.7, 0.8) > pts["a100", "meta-llama/Llama-2-7b-hf", 1, 1024].predicted(
        1.5, 0.7, 0.8
    )


def test_the_committed_model_prices_compute_bound_matmuls_within_ten_percent():
    """A units slip (ms for s, a missing factor 2 in the FLOPs, tp not dividing) is off by 2x or
    1000x; the fitted roofline is within 10% of Vidur's kernels where they are compute-bound."""
    pick = [r for r in ROWS if r["num_tokens"] >= 1024]
    pred = vidur.committed_predictions(vidur.operator_points(pick))
    err = pred / np.array([r["matmul_ms"] / 1e3 for r in pick]) - 1
    assert abs(np.median(err)) < 0.10
