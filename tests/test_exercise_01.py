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


# ---- 5. largest_chunk (issue 29.1) ------------------------------------------------------------
def chunk_solution(P, b, kv, ctx, peak, bw, overhead, limit):
    budget = limit - overhead
    by_compute = budget / (2 * P / peak) - len(ctx)
    by_memory = (budget - (P * b + kv * sum(ctx)) / bw) * bw / kv
    k = math.floor(min(by_compute, by_memory))
    return k if k >= 0 else None


def chunk_by_search(P, b, kv, ctx, peak, bw, overhead, limit):  # right: grow k while the step fits
    def fits(k):
        compute = 2 * P * (len(ctx) + k) / peak
        memory = (P * b + kv * (sum(ctx) + k)) / bw
        return overhead + max(compute, memory) <= limit

    if not fits(0):
        return None
    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return np.int64(lo)


def chunk_strict(
    P, b, kv, ctx, peak, bw, overhead, limit
):  # wrong: a step exactly at the limit refused
    k = chunk_solution(P, b, kv, ctx, peak, bw, overhead, limit)
    exact = (
        k is not None
        and overhead + max(2 * P * (len(ctx) + k) / peak, (P * b + kv * (sum(ctx) + k)) / bw)
        == limit
    )
    return (k - 1 if k > 0 else None) if exact else k


def chunk_no_overhead(P, b, kv, ctx, peak, bw, overhead, limit):  # wrong: forgets the fixed cost
    return chunk_solution(P, b, kv, ctx, peak, bw, 0.0, limit)


def chunk_added(P, b, kv, ctx, peak, bw, overhead, limit):  # wrong: compute + memory, not their max
    budget = limit - overhead - 2 * P * len(ctx) / peak - (P * b + kv * sum(ctx)) / bw
    k = math.floor(budget / (2 * P / peak + kv / bw))
    return k if k >= 0 else None


def chunk_no_decode_flops(
    P, b, kv, ctx, peak, bw, overhead, limit
):  # wrong: only the chunk is computed
    budget = limit - overhead
    by_memory = (budget - (P * b + kv * sum(ctx)) / bw) * bw / kv
    k = math.floor(min(budget / (2 * P / peak), by_memory))
    return k if k >= 0 else None


def chunk_no_chunk_kv(
    P, b, kv, ctx, peak, bw, overhead, limit
):  # wrong: the chunk's K/V write left out
    budget = limit - overhead
    if (P * b + kv * sum(ctx)) / bw > budget:
        return None
    return max(math.floor(budget / (2 * P / peak) - len(ctx)), 0)


def chunk_zero_not_none(P, b, kv, ctx, peak, bw, overhead, limit):  # wrong: 0 when nothing fits
    k = chunk_solution(P, b, kv, ctx, peak, bw, overhead, limit)
    return 0 if k is None else k


def chunk_none_at_zero(P, b, kv, ctx, peak, bw, overhead, limit):  # wrong: "no chunk fits" as None
    k = chunk_solution(P, b, kv, ctx, peak, bw, overhead, limit)
    return None if k == 0 else k


def chunk_ceil(P, b, kv, ctx, peak, bw, overhead, limit):  # wrong: rounds up
    budget = limit - overhead
    by_compute = budget / (2 * P / peak) - len(ctx)
    by_memory = (budget - (P * b + kv * sum(ctx)) / bw) * bw / kv
    k = math.ceil(min(by_compute, by_memory))
    return k if k >= 0 else None


def chunk_float(P, b, kv, ctx, peak, bw, overhead, limit):  # wrong: not a whole number of tokens
    budget = limit - overhead
    k = min(budget / (2 * P / peak) - len(ctx), (budget - (P * b + kv * sum(ctx)) / bw) * bw / kv)
    return k if k >= 0 else None


@pytest.mark.parametrize("fn", [chunk_solution, chunk_by_search])
def test_largest_chunk_accepts(fn, capsys):
    checks.check_largest_chunk(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, cause",
    [
        (chunk_strict, "exactly the limit"),
        (chunk_no_overhead, "fixed cost comes off"),
        (chunk_added, "not their sum"),
        (chunk_no_decode_flops, "decodes' own tokens"),
        (chunk_no_chunk_kv, "writes its own K and V"),
        (chunk_zero_not_none, "return None"),
        (chunk_none_at_zero, "0 would mean"),
        (chunk_ceil, "over the limit"),
        (chunk_float, "whole number"),
    ],
)
def test_largest_chunk_rejects(fn, cause):
    with pytest.raises(AssertionError, match=cause):
        checks.check_largest_chunk(fn)
