# %% [markdown]
# # Exercise 5 · Split a long context: flash-decoding's merge
#
# Lesson 5, section 4: a decode step of few sequences gives the kernel too few programs
# to fill a GPU, so it cuts each sequence's context into **segments** that run side by
# side, and a second small kernel merges their partial results (flash-decoding). The
# merge must give *exactly* the attention over the whole context, although no segment
# saw the others' keys. How?
#
# Think of one decode token and one head. Over the keys of a segment, softmax attention
# gives an output (the values averaged with weights `exp(score)`, divided by their sum)
# and that sum. Keep the sum as its log, `lse = log(sum(exp(score)))`: it says how much
# of the whole softmax the segment holds, and it stays a moderate number where `exp` of a
# score would overflow.
#
# **Part 1.** `attend_segment(q, k, v, scale)`: `q` is one decode token's query `[heads,
# dim]`, `k` and `v` a segment's keys and values `[n, heads, dim]`; score `=` `q · k *
# scale`. Return `(out, lse)`: `out` `[heads, dim]` the softmax-weighted average of the
# values, `lse` `[heads]`. An empty segment (`n = 0`: a context shorter than the split
# leaves some) has `lse = -inf` and, as its output, zeros.
#
# **Part 2.** `merge_segments(outs, lses)`: `outs` `[segments, heads, dim]`, `lses`
# `[segments, heads]` → the output `[heads, dim]` of attention over all the segments'
# keys together. Work it out on paper for two segments first: by how much must each
# segment's output be weighted? Then make it survive scores near `1000` and near `-1000`,
# and empty segments.
#
# The engine's merge is a Triton kernel, `_merge_segments_kernel` in
# `minilm/model/attention/triton_paged.py`, on a slightly different form (each segment's
# max and sum kept apart): write yours before you read it. The check tests each part on
# its own, then splits decodes of many context lengths into segments and compares your
# merged result with the engine's reference attention over a paged cache.

# %%
import torch
from labs import checks


def attend_segment(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    # BEGIN SOLUTION
    scores = torch.einsum("hd,nhd->hn", q, k) * scale  # [heads, n]
    lse = torch.logsumexp(scores, dim=-1)                # -inf for an empty segment, never overflows
    if k.shape[0] == 0:
        return torch.zeros_like(q), lse
    return torch.einsum("hn,nhd->hd", torch.exp(scores - lse[:, None]), v), lse
    # END SOLUTION


def merge_segments(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    # BEGIN SOLUTION
    # each segment holds exp(lse_s) of the whole sum: weight = exp(lse_s - lse_total), in [0, 1]
    weights = torch.exp(lses - torch.logsumexp(lses, dim=0))  # an empty segment (-inf) weighs 0
    return (weights[:, :, None] * outs).sum(dim=0)
    # END SOLUTION

# %%
# exercise check
checks.check_flash_decoding(attend_segment, merge_segments)

# %% [markdown]
# **Part 3: the kernel's own form, one segment at a time.** The kernel does not keep
# `(out, lse)`. Per segment it keeps `m`, the largest score `[heads]`; `l`, the sum of
# `exp(score - m)` `[heads]`; and `acc`, the values weighted by `exp(score - m)` and **not
# yet divided** by `l` `[heads, dim]`. It divides once, at the very end. The same form
# serves the online softmax that the kernel runs over its tiles of keys: it folds in one
# tile at a time and never holds all the scores.
#
# Write `fold(state, part)`: `state` and `part` are each such a triple `(m, l, acc)` over
# some keys; return the triple over the keys of both, in the same form. The check starts
# from the empty state `(-inf, 0, 0)` (no keys yet: that is also what an empty segment
# gives) and folds a context's segments in **any order**, not only left to right, then
# compares your state after every fold with the one over the keys folded so far (`m`
# included), and `acc / l` at the end with attention over the whole context. Derive it on
# paper first: when a new part has a larger maximum, what happens to the `l` and the `acc`
# you already hold? Then make it survive two parts that hold nothing, and scores near
# `1000` and `-1000`.

# %%
def fold(state, part):
    # BEGIN SOLUTION
    (m1, l1, acc1), (m2, l2, acc2) = state, part
    m = torch.maximum(m1, m2)
    # each side was weighted relative to its own max: rescale it to the new one. A side that holds
    # nothing has m = -inf; where both do, m stays -inf and exp(-inf - -inf) would be nan: use 0.
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    a, b = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, a * l1 + b * l2, a[:, None] * acc1 + b[:, None] * acc2
    # END SOLUTION

# %%
# exercise check
checks.check_fold(fold)

# %% [markdown]
# **Think further (no check).** The kernel splits only when a step has few sequences. For
# `8` decodes of `4096` tokens on a GPU with `132` SMs and eight KV heads, how many
# programs does a split into `16` segments give, and what does the merge cost in memory
# traffic against reading the K/V itself? Compare your `fold` with the loop over tiles in
# `_attend_tiles` and with `_merge_segments_kernel` (`minilm/model/attention/triton_paged.py`).
