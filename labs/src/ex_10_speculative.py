# %% [markdown]
# # Exercise 10 · Accepting draft tokens
#
# A step of speculative decoding verifies `k` draft tokens at once: the target model
# computes its distribution after the last known token and after each draft, keeps the
# drafts it agrees with, up to the first it rejects, and then adds one token of its own
# (lesson 10). Two questions decide whether that pays: how many tokens does a step keep,
# and which rule keeps the output exactly the target's?
#
# ## Part 1: tokens kept per verification
#
# Suppose each draft is accepted with probability `alpha`, independently of the others,
# and the target stops at the first rejection. Write `expected_tokens(alpha, k)`: the
# expected number of tokens one verification step keeps, its own token included. Work it
# out before you code: with `alpha = 0.5` and `k = 1`, what can a step keep, and how
# often? What must `alpha = 1` give?

# %%
from labs import checks


def expected_tokens(alpha: float, k: int) -> float:
    # BEGIN SOLUTION
    # draft i is kept only if drafts 1..i all were: probability alpha^i; the target's own token always
    return float(sum(alpha ** i for i in range(k + 1)))
    # END SOLUTION

# %%
# exercise check
checks.check_expected_tokens(expected_tokens)

# %% [markdown]
# ## Part 2: the rule that keeps the target's distribution
#
# With sampling (temperature > 0) a draft token `x` was drawn from the draft model's
# distribution `q`, and the target's is `p`. Leviathan et al. (2023) and Chen et al.
# (2023) keep `x` with probability $\min(1, p(x)/q(x))$, and after a rejection draw the
# target's token from the **residual** $\max(0, p - q)$, normalised. Then the kept token is
# distributed exactly as if the target had sampled it alone, whatever `q` is: a bad draft
# costs speed, never quality.
#
# Write `accept_probability(p, q, x)` and `residual(p, q)`. `p` and `q` are 1-D tensors of
# probabilities over the vocabulary (float64); `residual` returns a distribution (a list, an
# array or a tensor). The check does not sample: it computes, exactly, the distribution of
# the kept token that your two functions give, for eight pairs of distributions, and
# compares it with `p`.

# %%
import torch


def accept_probability(p: torch.Tensor, q: torch.Tensor, x: int) -> float:
    # BEGIN SOLUTION
    return min(1.0, float(p[x] / q[x]))
    # END SOLUTION


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # BEGIN SOLUTION
    r = (p - q).clamp_min(0)
    return r / r.sum()
    # END SOLUTION

# %%
# exercise check
checks.check_acceptance_rule(accept_probability, residual)

# %% [markdown]
# ## Part 3: how many drafts pay?
#
# Lesson 10 prices a verification step as one target step plus `k` draft steps, each `c`
# times a target step (a draft model is small; `c = 0` for an n-gram lookup). Write
# `best_draft_length(alpha, c, k_max)`: the number of drafts `k`, from `0` (no speculation)
# to `k_max`, that keeps the most tokens per unit of time (a target step is `1`); when
# several `k` keep exactly as many, the smallest. Use your `expected_tokens`.
#
# Decide first: is more drafts ever worse, and when is no speculation best? What does
# `alpha = 1` do to your formula? The check compares your `k` with a reference in
# `labs/checks.py` (exact fractions) on cases chosen so that the usual slips give another
# `k`; none of them is a near-tie that float rounding could decide.

# %%
def best_draft_length(alpha: float, c: float, k_max: int) -> int:
    # BEGIN SOLUTION
    rate = [expected_tokens(alpha, k) / (1 + k * c) for k in range(k_max + 1)]  # tokens per unit of time
    return rate.index(max(rate))  # index() gives the first, the smallest k, of equal ones
    # END SOLUTION

# %%
# exercise check
checks.check_best_draft_length(best_draft_length)

# %% [markdown]
# ## Part 4: drafts for a whole batch
#
# Part 3 priced one request alone. In a batch, one verification step serves every request:
# say it costs one target step (`1`) for the whole batch plus `w` for every draft token in
# it (drafting it and verifying it). The requests differ: request `r` has its own
# acceptance rate `alphas[r]` (its own history of kept drafts), and each may draft its own
# number `k_r`, from `0` to `k_max`.
#
# Write `batch_draft_lengths(alphas, w, k_max)`: a list with one `k_r` per request that
# keeps the most expected tokens per unit of time for the batch, that is
# $\sum_r E(\alpha_r, k_r) / (1 + w \sum_r k_r)$ with your `expected_tokens` as $E$. When
# several allocations keep exactly as many, any of them is right: the check computes the
# rate of yours and compares it with the best (exact fractions). An empty batch gives `[]`;
# `alpha = 1` and `alpha = 0` may occur. The check's last batch holds `12` requests with
# `k_max = 8`, and your function has `10 s` for it: trying every allocation is out of
# reach.
#
# Decide first: is each request's own best from Part 3 the batch's best? If not, which
# way does it err, and why?

# %%
def batch_draft_lengths(alphas: list[float], w: float, k_max: int) -> list[int]:
    # BEGIN SOLUTION
    # The j-th draft of request r adds alpha_r^j expected tokens and costs w. For a fixed total
    # of drafts the best are the ones with the largest gains, and each request's gains fall with
    # j, so the best allocation is a prefix of all the gains in falling order: try every prefix.
    gains = sorted(((a**j, r) for r, a in enumerate(alphas) for j in range(1, k_max + 1)), reverse=True)
    ks, kept = [0] * len(alphas), float(len(alphas))
    best, best_ks = kept, list(ks)
    for n, (gain, r) in enumerate(gains, start=1):
        ks[r] += 1
        kept += gain
        if kept / (1 + w * n) > best:
            best, best_ks = kept / (1 + w * n), list(ks)
    return best_ks
    # END SOLUTION

# %%
# exercise check
checks.check_batch_draft_lengths(batch_draft_lengths)

# %% [markdown]
# ## Think further
#
# - The lab's engine (and vLLM's, for n-gram and EAGLE drafts) proposes drafts
#   greedily: `q` is one-hot on the draft. What do your two functions become then?
#   Compare with `accept` in `minilm/model/sampling.py`.
# - For one position, the chance a sampled draft is kept is $\sum_x \min(p(x), q(x))$.
#   Is it larger or smaller than the one-hot draft's $p(x)$ at the draft model's most
#   likely token? When would you sample drafts rather than take the argmax?
# - Your `best_draft_length` assumes a verification step costs one target step whatever
#   `k` is: true for a decode-bound batch of one, not for a large batch (lesson 10's
#   speedup table). How would you measure the cost of a step of `k + 1` tokens instead?
#
# <details><summary>Hint for Part 4 (open it if you are stuck)</summary>
#
# Count what one more draft brings: the `j`-th draft of request `r` adds `alpha_r ** j`
# expected tokens and costs `w`, whichever request it belongs to. With a fixed number of
# drafts in the batch, which drafts would you pick? And does a request's next draft ever
# bring more than its previous one?
#
# </details>
