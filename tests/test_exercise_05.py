"""Exercise 5's check rejects known-wrong segment attentions and merges, and accepts right ones
written differently."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


# ---- right: attend_segment ------------------------------------------------------------------
def attend(q, k, v, scale):  # the solution
    scores = torch.einsum("hd,nhd->hn", q, k) * scale
    lse = torch.logsumexp(scores, dim=-1)
    if k.shape[0] == 0:
        return torch.zeros_like(q), lse
    return torch.einsum("hn,nhd->hd", torch.exp(scores - lse[:, None]), v), lse


def attend_max_shift(
    q, k, v, scale
):  # right: the max taken out by hand, a softmax that handles n = 0
    scores = (k * q).sum(-1).T * scale  # [heads, n]
    if scores.shape[1] == 0:
        return torch.zeros_like(q), torch.full(q.shape[:1], -math.inf)
    m = scores.max(-1, keepdim=True).values
    e = torch.exp(scores - m)
    return torch.einsum("hn,nhd->hd", e / e.sum(-1, keepdim=True), v), m[:, 0] + e.sum(-1).log()


def attend_float64(q, k, v, scale):  # right: computed in float64, without a special case for n = 0
    scores = torch.einsum("hd,nhd->hn", q.double(), k.double()) * scale
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), v.double()), scores.logsumexp(-1)


# ---- right: merge_segments ------------------------------------------------------------------
def merge(outs, lses):  # the solution
    weights = torch.exp(lses - torch.logsumexp(lses, dim=0))
    return (weights[:, :, None] * outs).sum(dim=0)


def merge_softmax(outs, lses):  # right: the weights are a softmax over the segments
    return torch.einsum("sh,shd->hd", lses.softmax(dim=0), outs)


def merge_online(outs, lses):  # right: folds in one segment at a time, as an online softmax does
    out, lse = outs[0], lses[0]
    for o, l in zip(outs[1:], lses[1:]):
        total = torch.logaddexp(lse, l)
        a = torch.exp(lse - total).nan_to_num(0.0)  # both -inf so far: nothing to keep
        b = torch.exp(l - total).nan_to_num(0.0)
        out, lse = a[:, None] * out + b[:, None] * o, total
    return out


def merge_max_shift(outs, lses):  # right: subtract the largest lse, then normalise
    w = torch.exp(lses - lses.max(dim=0).values)
    return (w[:, :, None] * outs).sum(0) / w.sum(0)[:, None]


RIGHT = [
    (attend, merge),
    (attend_max_shift, merge_softmax),
    (attend_float64, merge_online),
    (attend, merge_max_shift),
]


# ---- wrong: attend_segment ------------------------------------------------------------------
def attend_naive_lse(q, k, v, scale):  # wrong: log(sum(exp)) overflows to inf for large scores
    scores = torch.einsum("hd,nhd->hn", q, k) * scale
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), v), torch.exp(scores).sum(-1).log()


def attend_lse_base_two(
    q, k, v, scale
):  # wrong: log2 of the sum of exp2, as the kernel's inner loop keeps it
    scores = torch.einsum("hd,nhd->hn", q, k) * scale
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), v), torch.logsumexp(
        scores * math.log(2), -1
    ) / math.log(2)


def attend_no_scale(q, k, v, scale):  # wrong: the scale forgotten
    return attend(q, k, v, 1.0)


def attend_softmax_over_heads(q, k, v, scale):  # wrong: normalises across heads, not across keys
    scores = torch.einsum("hd,nhd->hn", q, k) * scale
    return torch.einsum("hn,nhd->hd", scores.softmax(0), v), torch.logsumexp(scores, dim=-1)


def attend_crashes_when_empty(q, k, v, scale):  # wrong: max() of an empty segment raises
    scores = torch.einsum("hd,nhd->hn", q, k) * scale
    m = scores.max(-1).values
    e = torch.exp(scores - m[:, None])
    return torch.einsum("hn,nhd->hd", e / e.sum(-1, keepdim=True), v), m + e.sum(-1).log()


def attend_nan_when_empty(q, k, v, scale):  # wrong: 0 / 0 for an empty segment's output
    scores = torch.einsum("hd,nhd->hn", q, k) * scale
    lse = torch.logsumexp(scores, dim=-1)
    e = torch.exp(scores - scores.max(-1, keepdim=True).values) if k.shape[0] else scores
    return torch.einsum("hn,nhd->hd", e, v) / e.sum(-1)[:, None], lse


def attend_empty_lse_zero(
    q, k, v, scale
):  # wrong: an empty segment's lse 0, as if it held exp(0) = 1
    out, lse = attend(q, k, v, scale)
    return out, lse.nan_to_num(neginf=0.0)


# ---- wrong: merge_segments ------------------------------------------------------------------
def merge_mean(outs, lses):  # wrong: every segment weighs the same
    return outs.mean(0)


def merge_naive(
    outs, lses
):  # wrong: exp(lse) without the largest taken out: inf/inf or 0/0 at the extremes
    w = torch.exp(lses)
    return (w[:, :, None] * outs).sum(0) / w.sum(0)[:, None]


def merge_unnormalised(outs, lses):  # wrong: the weights do not sum to one
    return (torch.exp(lses - lses.max(0).values)[:, :, None] * outs).sum(0)


def merge_largest_only(outs, lses):  # wrong: takes the segment with the largest lse
    return outs[lses.argmax(0), torch.arange(outs.shape[1])]


def merge_over_heads(outs, lses):  # wrong: a softmax across heads instead of across segments
    return (lses.softmax(dim=1)[:, :, None] * outs).sum(0)


def merge_empty_as_zero(
    outs, lses
):  # wrong: an empty segment's -inf replaced by 0, so it weighs in
    return merge(outs, lses.nan_to_num(neginf=0.0))


WRONG = [
    (attend_naive_lse, merge),
    (attend_lse_base_two, merge),
    (attend_no_scale, merge),
    (attend_softmax_over_heads, merge),
    (attend_crashes_when_empty, merge),
    (attend_nan_when_empty, merge),
    (attend_empty_lse_zero, merge),
    (attend, merge_mean),
    (attend, merge_naive),
    (attend, merge_unnormalised),
    (attend, merge_largest_only),
    (attend, merge_over_heads),
    (attend, merge_empty_as_zero),
]


def name(case) -> str:
    return "-".join(f.__name__ for f in case)


@pytest.mark.parametrize("case", WRONG, ids=name)
def test_check_rejects_wrong_parts(case):
    with pytest.raises(AssertionError):
        checks.check_flash_decoding(*case)


@pytest.mark.parametrize("case", RIGHT, ids=name)
def test_check_accepts_right_parts(case, capsys):
    checks.check_flash_decoding(*case)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case, words",
    [
        ((attend_naive_lse, merge), "large scores"),
        ((attend_crashes_when_empty, merge), "empty segment"),
        ((attend_nan_when_empty, merge), "finite placeholder"),
        ((attend_lse_base_two, merge), "natural log"),
        ((attend, merge_naive), "large scores"),
        ((attend, merge_empty_as_zero), "one of them empty"),
        ((attend, merge_mean), "share of the softmax"),
    ],
)
def test_the_message_names_the_cause(case, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_flash_decoding(*case)


# ---- part 3: the kernel's fold ----------------------------------------------------------------
def fold(state, part):  # the solution
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    a, b = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, a * l1 + b * l2, a[:, None] * acc1 + b[:, None] * acc2


def fold_skips_empty(state, part):  # right: a part that holds nothing changes nothing
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    if not torch.isfinite(m2).any():
        return state
    if not torch.isfinite(m1).any():
        return part
    m = torch.maximum(m1, m2)
    a, b = (m1 - m).exp(), (m2 - m).exp()
    return m, a * l1 + b * l2, a.unsqueeze(-1) * acc1 + b.unsqueeze(-1) * acc2


def fold_nan_to_num(state, part):  # right: nan where both hold nothing, then made 0
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m).nan_to_num(0.0), torch.exp(m2 - m).nan_to_num(0.0)
    return m, a * l1 + b * l2, a[:, None] * acc1 + b[:, None] * acc2


def fold_nan_on_empty(state, part):  # wrong: exp(-inf - -inf) is nan when both hold nothing
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * acc1 + b[:, None] * acc2


def fold_acc_not_rescaled(state, part):  # wrong: l rescaled, acc added as it is
    m, l, _ = fold(state, part)
    return m, l, state[2] + part[2]


def fold_last_max(state, part):  # wrong: takes the new part's max, right only in rising order
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.where(torch.isfinite(m2), m2, m1)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    a, b = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, a * l1 + b * l2, a[:, None] * acc1 + b[:, None] * acc2


def fold_inverted(state, part):  # wrong: rescales by exp(m - m_i), the wrong way round
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.maximum(m1, m2)
    a = torch.exp(m - m1).nan_to_num(0.0, posinf=0.0)
    b = torch.exp(m - m2).nan_to_num(0.0, posinf=0.0)
    return m, a * l1 + b * l2, a[:, None] * acc1 + b[:, None] * acc2


def fold_divided(state, part):  # wrong: keeps acc divided by l (the output), not the kernel's acc
    m, l, acc = fold(state, part)
    return m, l, acc / l.clamp_min(1e-300)[:, None]


def fold_in_exp_space(state, part):  # wrong: back to exp(score) sums, which overflow near 1000
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.maximum(m1, m2)
    l = l1 * m1.exp() + l2 * m2.exp()
    acc = acc1 * m1.exp()[:, None] + acc2 * m2.exp()[:, None]
    return m, l / m.exp(), acc / m.exp()[:, None]


FOLD_RIGHT = [fold, fold_skips_empty, fold_nan_to_num]
FOLD_WRONG = [
    (fold_nan_on_empty, "inf or nan"),
    (fold_acc_not_rescaled, "relative to its own m"),
    (fold_last_max, "rising order"),
    (fold_inverted, "l is the sum of exp"),
    (fold_divided, "not divided by l"),
    (fold_in_exp_space, "inf or nan"),
]


@pytest.mark.parametrize("answer", FOLD_RIGHT, ids=lambda f: f.__name__)
def test_fold_accepts_a_right_fold(answer, capsys):
    checks.check_fold(answer)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", FOLD_WRONG, ids=lambda x: getattr(x, "__name__", ""))
def test_fold_rejects_a_wrong_fold(answer, words):
    with pytest.raises(AssertionError, match=words):
        checks.check_fold(answer)
