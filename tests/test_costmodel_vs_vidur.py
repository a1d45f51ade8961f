"""bench/costmodel_vs_vidur.py's data and comparison: Vidur's matmul profiles read as the cost
model's terms, a published point's time cut into terms, its same-shape twin in a fit source
(the refits themselves are the benchmark's, not a test's: they take minutes)."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import calibrate_gpu as cal  # noqa: E402
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


def point(**kw) -> dict:
    base = {"model": "llama-2-7b", "device": "a100", "dtype": "float16", "tp": 1}
    shape = {"batch": 1, "input_len": 128, "output_len": 128, "metric": "ttft_s"}
    return base | {"engine_kind": "cpp"} | shape | kw


def shares_of(shape: list[tuple[int, int]], **kw) -> dict[str, float]:
    return vidur.term_shares(point(**kw), cal.Trace([shape], np.ones(1), [[0]], 1))


def test_a_steps_time_is_cut_into_the_terms_that_dominate_it():
    """A batch-1 decode is weights and overhead; a 4,096-token prefill is linear FLOPs, with
    attention's share growing with the prompt; only tensor parallelism pays all-reduces."""
    decode = shares_of([(1, 129)])
    prefill = shares_of([(4096, 4096)])
    tp4 = shares_of([(1, 129)], model="llama-2-70b", tp=4)
    for s in (decode, prefill, tp4):
        assert sum(s.values()) == pytest.approx(1.0)
        assert all(v >= 0 for v in s.values())
    assert decode["weights"] > 0.5 and decode["overhead"] > 0.2 and decode["linear"] < 0.05
    assert prefill["linear"] > 0.8 and prefill["attention"] > shares_of([(512, 512)])["attention"]
    assert decode["ar_latency"] == 0 and tp4["ar_latency"] > 0.1


def test_a_twin_is_the_same_work_on_the_same_engine_kind_and_its_gap_is_a_time_ratio():
    assert vidur.same_shape_key(point(model="llama-3-8b")) == vidur.same_shape_key(
        point(model="llama-3.1-8b")
    )
    assert vidur.same_shape_key(point()) != vidur.same_shape_key(point(engine_kind="compiled"))
    faster = {"metric": "output_tok_per_s", "value": 200.0}
    assert vidur.twin_time_ratio({"metric": "output_tok_per_s", "value": 100.0}, faster) == 0.5
    assert vidur.twin_time_ratio({"metric": "ttft_s", "value": 0.02}, {"value": 0.01}) == 0.5


def test_a_layer_latency_adds_layers_times_it_to_every_step():
    p = point(id="x")
    f = cal.Features(np.ones(3), np.ones(3), np.zeros(3), 0, 32)
    g = vidur.with_latency({"x": f}, [p], {"a100": 2e-5})["x"]
    assert np.allclose(g.comm_bw_s, 32 * 2e-5) and np.array_equal(g.bytes, f.bytes)
    assert vidur.with_latency({"x": f}, [p], {"h100": 2e-5})["x"].comm_bw_s.sum() == 0
