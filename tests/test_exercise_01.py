"""Exercise 1's checks reject known-wrong answers and accept right ones written differently."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


# ---- the reference answers, and right ones written differently ----------------------------
def flops(num_params, num_tokens):
    return 2.0 * num_params * num_tokens


def flops_int(num_params, num_tokens):  # integer arithmetic where it can be
    return int(num_params) * num_tokens * 2


def bytes_reads(weight_bytes, kv, ctx):  # the cached K/V only
    return weight_bytes + kv * sum(ctx)


def bytes_with_write(weight_bytes, kv, ctx):  # plus the new token's K/V written
    return weight_bytes + sum(kv * (c + 1) for c in ctx)


def bytes_cost_model(
    weight_bytes, kv, ctx
):  # written, then read back with the cache (minilm/sim/costmodel.py)
    read = kv * sum(c + 1 for c in ctx)
    write = kv * len(ctx)
    return weight_bytes + read + write


def bytes_numpy(weight_bytes, kv, ctx):
    return weight_bytes + kv * np.sum(np.asarray(ctx, dtype=np.int64))


def time_max(f, b, peak, bw):
    return max(f / peak, b / bw)


def time_branch(f, b, peak, bw):
    compute, memory = f / peak, b / bw
    if compute > memory:
        return compute
    return memory


def batch_formula(p, b, kv, ctx, peak, bw):  # the solution: 2P/peak·B >= (P·b + B·ctx·kv)/bw
    gain = 2 * p / peak - ctx * kv / bw
    return max(1, math.ceil(p * b / bw / gain)) if gain > 0 else None


def batch_loop(
    p, b, kv, ctx, peak, bw
):  # grow the batch; first make sure a sequence adds net compute
    if 2 * p / peak <= ctx * kv / bw:
        return None
    batch = 1
    while time_max(flops(p, batch), 0, peak, bw) < (p * b + batch * ctx * kv) / bw:
        batch += 1
    return batch


def batch_numpy(p, b, kv, ctx, peak, bw):  # numpy, a numpy float holding a whole number
    per_seq = np.float64(2 * p / peak) - np.float64(ctx * kv / bw)
    return np.maximum(1.0, np.ceil(p * b / bw / per_seq)) if per_seq > 0 else None


def batch_intensity(
    p, b, kv, ctx, peak, bw
):  # through intensity: the step's FLOP/byte reaches the ridge
    ridge = peak / bw
    if 2 * p <= ridge * ctx * kv:  # even an endless batch stays below the ridge
        return None
    return max(1, math.ceil(ridge * p * b / (2 * p - ridge * ctx * kv)))


# ---- wrong answers -----------------------------------------------------------------------
def flops_one_per_weight(num_params, num_tokens):  # a multiply-add counted as one FLOP
    return num_params * num_tokens


def flops_no_tokens(num_params, num_tokens):  # the weights' work once, whatever the tokens
    return 2.0 * num_params


def flops_plus_one(num_params, num_tokens):  # one token too many
    return 2.0 * num_params * (num_tokens + 1)


def bytes_weights_per_sequence(
    weight_bytes, kv, ctx
):  # every sequence reads its own copy of the weights
    return weight_bytes * max(len(ctx), 1) + kv * sum(ctx)


def bytes_weights_only(weight_bytes, kv, ctx):  # the KV cache forgotten
    return weight_bytes


def bytes_longest_only(weight_bytes, kv, ctx):  # only the longest sequence's context
    return weight_bytes + kv * max(ctx, default=0)


def bytes_new_tokens_only(weight_bytes, kv, ctx):  # only the new token's K/V, not the cache
    return weight_bytes + kv * len(ctx)


def bytes_padded_to_longest(
    weight_bytes, kv, ctx
):  # every sequence read as if as long as the longest
    return weight_bytes + kv * len(ctx) * max(ctx, default=0)


def time_sum(f, b, peak, bw):  # no overlap: a different (slower) machine than the roofline's
    return f / peak + b / bw


def time_min(f, b, peak, bw):
    return min(f / peak, b / bw)


def time_compute_only(f, b, peak, bw):
    return f / peak


def time_memory_only(f, b, peak, bw):
    return b / bw


def batch_floor_plus_one(p, b, kv, ctx, peak, bw):
    # wrong where the crossing is a whole batch: that batch already is compute-bound ("at least")
    gain = 2 * p / peak - ctx * kv / bw
    return max(1, int(p * b / bw / gain) + 1) if gain > 0 else None


def batch_strict(p, b, kv, ctx, peak, bw):  # wrong: compute must exceed memory (">"), not reach it
    if 2 * p / peak <= ctx * kv / bw:
        return None
    batch = 1
    while 2 * p * batch / peak <= (p * b + batch * ctx * kv) / bw:
        batch += 1
    return batch


def batch_ignores_kv(p, b, kv, ctx, peak, bw):  # wrong: lesson 1's crossover, the KV cache left out
    return math.ceil(peak * b / (2 * bw))


def batch_kv_read_once(
    p, b, kv, ctx, peak, bw
):  # wrong: one sequence's cache read per step, not each one's
    return max(1, math.ceil((p * b + ctx * kv) / bw / (2 * p / peak)))


def batch_no_none(
    p, b, kv, ctx, peak, bw
):  # wrong: when compute never catches up it returns a negative batch
    return math.ceil(p * b / bw / (2 * p / peak - ctx * kv / bw + 1e-30))


def batch_divides_by_zero(p, b, kv, ctx, peak, bw):  # wrong: only a negative gain means "never"
    gain = 2 * p / peak - ctx * kv / bw
    return max(1, math.ceil(p * b / bw / gain)) if gain >= 0 else None


def batch_loops_forever(p, b, kv, ctx, peak, bw):  # wrong: no way out when compute never catches up
    batch = 1
    while 2 * p * batch / peak < (p * b + batch * ctx * kv) / bw:
        batch += 1
    return batch


def batch_zero_allowed(
    p, b, kv, ctx, peak, bw
):  # wrong: rounds the crossing down (and gives 0 below one sequence)
    gain = 2 * p / peak - ctx * kv / bw
    return math.floor(p * b / bw / gain) if gain > 0 else None


def batch_float(p, b, kv, ctx, peak, bw):  # wrong: where the two times are equal, not a whole batch
    gain = 2 * p / peak - ctx * kv / bw
    return p * b / bw / gain if gain > 0 else None


def batch_no_factor_two(p, b, kv, ctx, peak, bw):  # wrong: one FLOP per weight per token
    gain = p / peak - ctx * kv / bw
    return max(1, math.ceil(p * b / bw / gain)) if gain > 0 else None


def batch_round(
    p, b, kv, ctx, peak, bw
):  # wrong: the nearest batch, which may still be memory-bound
    gain = 2 * p / peak - ctx * kv / bw
    return max(1, round(p * b / bw / gain)) if gain > 0 else None


RIGHT = dict(linear_flops=flops, decode_bytes=bytes_reads, roofline_time=time_max)


@pytest.mark.parametrize(
    "fns",
    [
        {},
        {"linear_flops": flops_int},
        {"decode_bytes": bytes_with_write},
        {"decode_bytes": bytes_cost_model},
        {"decode_bytes": bytes_numpy},
        {"roofline_time": time_branch},
    ],
    ids=lambda d: "-".join(f.__name__ for f in d.values()) or "reference",
)
def test_roofline_accepts(fns, capsys):
    checks.check_roofline(**{**RIGHT, **fns})
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fns",
    [
        {"linear_flops": flops_one_per_weight},
        {"linear_flops": flops_no_tokens},
        {"linear_flops": flops_plus_one},
        {"decode_bytes": bytes_weights_per_sequence},
        {"decode_bytes": bytes_weights_only},
        {"decode_bytes": bytes_longest_only},
        {"decode_bytes": bytes_new_tokens_only},
        {"decode_bytes": bytes_padded_to_longest},
        {"roofline_time": time_sum},
        {"roofline_time": time_min},
        {"roofline_time": time_compute_only},
        {"roofline_time": time_memory_only},
    ],
    ids=lambda d: next(iter(d.values())).__name__,
)
def test_roofline_rejects(fns):
    with pytest.raises(AssertionError):
        checks.check_roofline(**{**RIGHT, **fns})


def test_roofline_says_which_kv_definition(capsys):
    checks.check_roofline(flops, bytes_cost_model, time_max)
    assert "as the cost model counts" in capsys.readouterr().out


@pytest.mark.parametrize("fn", [batch_formula, batch_loop, batch_numpy, batch_intensity])
def test_compute_bound_batch_accepts(fn, capsys):
    checks.check_compute_bound_batch(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn",
    [
        batch_floor_plus_one,
        batch_strict,
        batch_ignores_kv,
        batch_kv_read_once,
        batch_no_none,
        batch_divides_by_zero,
        batch_loops_forever,
        batch_zero_allowed,
        batch_float,
        batch_no_factor_two,
        batch_round,
    ],
)
def test_compute_bound_batch_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_compute_bound_batch(fn)


@pytest.mark.parametrize(
    "fn, cause",
    [
        (batch_floor_plus_one, "exactly equal"),
        (batch_strict, "exactly equal"),
        (batch_no_none, "return None"),
        (batch_divides_by_zero, "ZeroDivisionError"),
        (batch_loops_forever, "never end"),
        (batch_zero_allowed, "still memory-bound"),
        (batch_float, "whole number"),
    ],
)
def test_compute_bound_batch_names_the_cause(fn, cause):
    with pytest.raises(AssertionError, match=cause):
        checks.check_compute_bound_batch(fn)
