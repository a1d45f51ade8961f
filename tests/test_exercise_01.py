"""Exercise 1's checks reject known-wrong answers and accept right ones written differently."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `labs` is a folder of the repository
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


def bytes_cost_model(weight_bytes, kv, ctx):  # written, then read back with the cache (minilm/sim/costmodel.py)
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


def batch_loop(p, b, peak, bw):  # the solution's way: grow the batch until compute catches up
    batch = 1
    while time_max(flops(p, batch), 0, peak, bw) < p * b / bw:
        batch += 1
    return batch


def batch_formula(p, b, peak, bw):  # on paper: 2·P·B / peak >= P·b / bw  <=>  B >= peak·b / (2·bw)
    return math.ceil(peak * b / (2 * bw))


def batch_numpy(p, b, peak, bw):  # a numpy float holding a whole number
    return np.ceil(peak * b / 2 / bw)


def batch_floor_plus_one(p, b, peak, bw):  # right whenever the crossing is not a whole number
    return int(peak * b / (2 * bw)) + 1


# ---- wrong answers -----------------------------------------------------------------------
def flops_one_per_weight(num_params, num_tokens):  # a multiply-add counted as one FLOP
    return num_params * num_tokens


def flops_no_tokens(num_params, num_tokens):  # the weights' work once, whatever the tokens
    return 2.0 * num_params


def flops_plus_one(num_params, num_tokens):  # one token too many
    return 2.0 * num_params * (num_tokens + 1)


def bytes_weights_per_sequence(weight_bytes, kv, ctx):  # every sequence reads its own copy of the weights
    return weight_bytes * max(len(ctx), 1) + kv * sum(ctx)


def bytes_weights_only(weight_bytes, kv, ctx):  # the KV cache forgotten
    return weight_bytes


def bytes_longest_only(weight_bytes, kv, ctx):  # only the longest sequence's context
    return weight_bytes + kv * max(ctx, default=0)


def bytes_new_tokens_only(weight_bytes, kv, ctx):  # only the new token's K/V, not the cache
    return weight_bytes + kv * len(ctx)


def bytes_padded_to_longest(weight_bytes, kv, ctx):  # every sequence read as if as long as the longest
    return weight_bytes + kv * len(ctx) * max(ctx, default=0)


def time_sum(f, b, peak, bw):  # no overlap: a different (slower) machine than the roofline's
    return f / peak + b / bw


def time_min(f, b, peak, bw):
    return min(f / peak, b / bw)


def time_compute_only(f, b, peak, bw):
    return f / peak


def time_memory_only(f, b, peak, bw):
    return b / bw


def batch_ridge_flop_per_byte(p, b, peak, bw):  # the ridge in FLOP/byte is not a batch size (unless b = 2)
    return math.ceil(peak / bw)


def batch_no_factor_two(p, b, peak, bw):  # one FLOP per weight per token
    return math.ceil(peak * b / bw)


def batch_floor(p, b, peak, bw):  # the last memory-bound batch, not the first compute-bound one
    return math.floor(peak * b / (2 * bw))


def batch_round(p, b, peak, bw):
    return round(peak * b / (2 * bw))


def batch_float(p, b, peak, bw):  # where the two times are equal: not a whole batch
    return peak * b / (2 * bw)


def batch_ignores_bytes_per_param(p, b, peak, bw):  # a weight taken as one byte
    return math.ceil(peak / (2 * bw))


RIGHT = dict(linear_flops=flops, decode_bytes=bytes_reads, roofline_time=time_max)


@pytest.mark.parametrize("fns", [
    {}, {"linear_flops": flops_int}, {"decode_bytes": bytes_with_write}, {"decode_bytes": bytes_cost_model},
    {"decode_bytes": bytes_numpy}, {"roofline_time": time_branch}], ids=lambda d: "-".join(f.__name__ for f in d.values()) or "reference")
def test_roofline_accepts(fns, capsys):
    checks.check_roofline(**{**RIGHT, **fns})
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("fns", [
    {"linear_flops": flops_one_per_weight}, {"linear_flops": flops_no_tokens}, {"linear_flops": flops_plus_one},
    {"decode_bytes": bytes_weights_per_sequence}, {"decode_bytes": bytes_weights_only},
    {"decode_bytes": bytes_longest_only}, {"decode_bytes": bytes_new_tokens_only},
    {"decode_bytes": bytes_padded_to_longest},
    {"roofline_time": time_sum}, {"roofline_time": time_min}, {"roofline_time": time_compute_only},
    {"roofline_time": time_memory_only}], ids=lambda d: next(iter(d.values())).__name__)
def test_roofline_rejects(fns):
    with pytest.raises(AssertionError):
        checks.check_roofline(**{**RIGHT, **fns})


def test_roofline_says_which_kv_definition(capsys):
    checks.check_roofline(flops, bytes_cost_model, time_max)
    assert "as the cost model counts" in capsys.readouterr().out


@pytest.mark.parametrize("fn", [batch_loop, batch_formula, batch_numpy, batch_floor_plus_one])
def test_compute_bound_batch_accepts(fn):
    checks.check_compute_bound_batch(fn)


@pytest.mark.parametrize("fn", [batch_ridge_flop_per_byte, batch_no_factor_two, batch_floor, batch_round, batch_float,
                                batch_ignores_bytes_per_param])
def test_compute_bound_batch_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_compute_bound_batch(fn)
