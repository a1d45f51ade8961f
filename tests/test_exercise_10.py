"""Exercise 10's checks reject known-wrong acceptance rules and expected lengths, accept right
ones written differently, and agree with the engine (model/sampling.py accept, sim/speculative.py)."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from labs import checks  # noqa: E402
from minilm.model.sampling import accept, target_probs  # noqa: E402
from minilm.request import SamplingParams  # noqa: E402
from minilm.sim.speculative import expected_acceptance_length  # noqa: E402


# ---- part 1: expected tokens ---------------------------------------------------------------
def closed_form(alpha, k):
    return k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def by_loop(alpha, k):
    total, p = 0.0, 1.0
    for _ in range(k + 1):
        total += p
        p *= alpha
    return total


def with_numpy(alpha, k):
    return np.polyval(np.ones(k + 1), alpha)  # 1 + alpha + ... + alpha^k, a numpy float


def exact(alpha, k):
    return float(sum(Fraction(alpha) ** i for i in range(k + 1)))


def by_distribution(alpha, k):
    """P(exactly n drafts kept) * (n + 1), summed."""
    return sum((n + 1) * alpha**n * (1 - alpha if n < k else 1) for n in range(k + 1))


@pytest.mark.parametrize(
    "right", [closed_form, by_loop, with_numpy, exact, by_distribution, expected_acceptance_length]
)
def test_right_expected_tokens_pass(right, capsys):
    checks.check_expected_tokens(right)
    assert "passed" in capsys.readouterr().out


WRONG_TOKENS = {
    "drafts only": (lambda a, k: sum(a**i for i in range(1, k + 1)), "accepted drafts only"),
    "one short": (lambda a, k: sum(a**i for i in range(k)), "up to k + 1 tokens"),
    "independent drafts": (lambda a, k: 1 + k * a, "stops at the first rejection"),
    "all or nothing": (lambda a, k: (k + 1) * a**k, "chance all k drafts are kept"),
    "closed form everywhere": (lambda a, k: (1 - a ** (k + 1)) / (1 - a), "divides by zero"),
    "alpha = 1 wrong": (lambda a, k: k if a == 1 else closed_form(a, k), "every draft is kept"),
    "k drafts": (lambda a, k: closed_form(a, k - 1) + a**k * 0.5, "for each of the k + 1 places"),
    "integer": (lambda a, k: int(closed_form(a, k)), "for each of the k + 1 places"),
    "no end to the series": (lambda a, k: 1 / (1 - a) if a < 1 else k + 1, "the series has an end"),
    "k times alpha": (
        lambda a, k: k * a,
        "judged on its own",
    ),  # found with the infinite series' hint before
    "one term too many": (lambda a, k: sum(a**i for i in range(k + 2)), "one term too far"),
}


def test_a_wrong_sum_gets_a_hint_not_the_answer():
    """Issue 29.4: 'you got 2.0, expected 1.9375' alone teaches nothing; the message says what the
    series counts, and never its formula."""
    # the 2.0 at alpha 0.5, k 4 is both 1 / (1 - alpha) and k * alpha: the first case, alpha 0.7,
    # tells them apart, so neither gets the other's hint
    with pytest.raises(AssertionError, match="the series has an end"):
        checks.check_expected_tokens(lambda a, k: 1 / (1 - a) if a < 1 else k + 1)
    with pytest.raises(AssertionError, match="judged on its own"):
        checks.check_expected_tokens(lambda a, k: k * a)
    with pytest.raises(AssertionError, match="for each of the k \\+ 1 places"):
        checks.check_expected_tokens(lambda a, k: 2.0)
    with pytest.raises(AssertionError) as err:
        checks.check_expected_tokens(lambda a, k: 2.5)
    assert "for each of the k + 1 places" in str(err.value)
    assert "1 - alpha" not in str(err.value) and "alpha^" not in str(err.value)


@pytest.mark.parametrize("name", WRONG_TOKENS)
def test_wrong_expected_tokens_fail_with_the_reason(name):
    wrong, reason = WRONG_TOKENS[name]
    with pytest.raises(AssertionError) as err:
        checks.check_expected_tokens(wrong)
    assert reason in str(err.value)


# ---- part 2: the acceptance rule ---------------------------------------------------------------
def ap_torch(p, q, x):
    return torch.clamp(p[x] / q[x], max=1.0)  # a 0-d tensor


def res_torch(p, q):
    r = torch.relu(p - q)
    return r / r.sum()


def ap_python(p, q, x):
    p, q = p.tolist(), q.tolist()
    return 1.0 if p[x] >= q[x] else p[x] / q[x]


def res_python(p, q):
    r = [max(0.0, a - b) for a, b in zip(p.tolist(), q.tolist())]
    return [v / sum(r) for v in r]


def ap_numpy(p, q, x):
    return np.minimum(1.0, p.numpy()[x] / q.numpy()[x])


def res_numpy(p, q):
    r = np.clip(p.numpy() - q.numpy(), 0, None)
    return r / r.sum()


def res_via_min(p, q):
    r = p - torch.minimum(p, q)  # the same thing: what p has beyond what q already gave
    return r / (1 - torch.minimum(p, q).sum())


@pytest.mark.parametrize(
    "ap, res",
    [
        (ap_torch, res_torch),
        (ap_python, res_python),
        (ap_numpy, res_numpy),
        (ap_torch, res_via_min),
    ],
)
def test_right_acceptance_rules_pass(ap, res, capsys):
    checks.check_acceptance_rule(ap, res)
    assert "passed" in capsys.readouterr().out


WRONG_RULES = {
    "residual is p": (ap_torch, lambda p, q: p, "not from p"),
    "residual not normalised": (ap_torch, lambda p, q: (p - q).clamp_min(0), "sums to"),
    "residual q - p": (ap_torch, lambda p, q: res_torch(q, p), "distribution"),
    "no min": (lambda p, q, x: float(p[x] / q[x]), res_torch, "min(1, p(x)/q(x))"),
    "q over p": (
        lambda p, q, x: min(1.0, float(q[x] / p[x])) if p[x] > 0 else 1.0,
        res_torch,
        "distribution",
    ),
    "one-hot rule for any q": (lambda p, q, x: float(p[x]), res_torch, "distribution"),
    "always keep": (lambda p, q, x: 1.0, res_torch, "distribution"),
    "residual uniform": (ap_torch, lambda p, q: torch.full_like(p, 1 / len(p)), "distribution"),
    "residual as a scalar": (ap_torch, lambda p, q: 1.0, "numbers"),
}


@pytest.mark.parametrize("name", WRONG_RULES)
def test_wrong_acceptance_rules_fail_with_the_reason(name):
    ap, res, reason = WRONG_RULES[name]
    with pytest.raises(AssertionError) as err:
        checks.check_acceptance_rule(ap, res)
    assert reason in str(err.value)


def test_the_engines_rule_is_the_one_hot_case():
    """model/sampling.py accept keeps a one-hot draft x with probability p(x): the rule of part 2
    with q one-hot. Its keep rate over many draws matches p(x)."""
    logits = torch.tensor([[0.5, 1.0, -0.3, 0.2, 0.0, -1.0], [0.0] * 6])
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    kept = (
        sum(accept(logits, [1], params, gen)[0] == 1 for _ in range(4000)) / 4000
    )  # kept iff the first is 1
    p = target_probs(logits[0], params)
    assert abs(kept - float(p[1])) < 4 * (float(p[1]) * (1 - float(p[1])) / 4000) ** 0.5  # 4 sigma
    assert checks.close(
        ap_torch(p.double(), torch.eye(6, dtype=torch.float64)[1], 1), float(p[1]), 1e-6
    )


# ---- part 3: how many drafts pay --------------------------------------------------------------
def kept(alpha, k):
    return sum(alpha**i for i in range(k + 1))


def best_by_index(alpha, c, k_max):  # the solution
    rate = [kept(alpha, k) / (1 + k * c) for k in range(k_max + 1)]
    return rate.index(max(rate))


def best_by_max_key(alpha, c, k_max):  # right: max() with the smaller k winning ties
    return max(range(k_max + 1), key=lambda k: (kept(alpha, k) / (1 + k * c), -k))


def best_stops_when_it_falls(alpha, c, k_max):  # right: the rate rises, then falls (unimodal)
    k = 0
    while k < k_max and kept(alpha, k + 1) / (1 + (k + 1) * c) > kept(alpha, k) / (1 + k * c):
        k += 1
    return k


def best_closed_form(
    alpha, c, k_max
):  # wrong: (1 - alpha^(k+1)) / (1 - alpha) divides by zero at 1
    rate = [(1 - alpha ** (k + 1)) / (1 - alpha) / (1 + k * c) for k in range(k_max + 1)]
    return rate.index(max(rate))


WRONG_BEST = {
    "tokens per step, not per time": (
        lambda a, c, m: max(range(m + 1), key=lambda k: (kept(a, k), -k)),
        "tokens per unit of time",
    ),
    "no target step in the cost": (
        lambda a, c, m: max(range(1, m + 1), key=lambda k: (kept(a, k) / (k * c or 1), -k)),
        "plus the k draft steps",
    ),
    "never k = 0": (lambda a, c, m: best_by_index(a, c, m) or 1, "k = 0"),
    "k_max left out": (lambda a, c, m: best_by_index(a, c, m - 1), "k_max itself"),
    "largest of equal ones": (
        lambda a, c, m: max(range(m + 1), key=lambda k: (kept(a, k) / (1 + k * c), k)),
        "the smallest",
    ),
    "closed form": (best_closed_form, "ZeroDivisionError"),
}


@pytest.mark.parametrize("fn", [best_by_index, best_by_max_key, best_stops_when_it_falls])
def test_best_draft_length_accepts(fn, capsys):
    checks.check_best_draft_length(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("case", WRONG_BEST.values(), ids=WRONG_BEST.keys())
def test_best_draft_length_rejects_and_names_the_cause(case):
    fn, words = case
    with pytest.raises(AssertionError, match=words):
        checks.check_best_draft_length(fn)


# ---- part 4: drafts for a whole batch ------------------------------------------------------------
def batch_by_prefix(alphas, w, k_max):  # the solution: every prefix of the gains in falling order
    gains = sorted(
        ((a**j, r) for r, a in enumerate(alphas) for j in range(1, k_max + 1)), reverse=True
    )
    ks, kept, best, best_ks = (
        [0] * len(alphas),
        float(len(alphas)),
        float(len(alphas)),
        [0] * len(alphas),
    )
    for n, (gain, r) in enumerate(gains, start=1):
        ks[r] += 1
        kept += gain
        if kept / (1 + w * n) > best:
            best, best_ks = kept / (1 + w * n), list(ks)
    return best_ks


def batch_by_threshold(alphas, w, k_max):
    """Right, written differently: at the best rate R a draft pays when its gain is at least R * w;
    iterate R (Dinkelbach's method) until the allocation stops changing."""
    rate, ks = float(len(alphas)), [0] * len(alphas)
    for _ in range(100):
        new = [sum(1 for j in range(1, k_max + 1) if a**j >= rate * w) for a in alphas]
        new_rate = sum(kept(a, k) for a, k in zip(alphas, new)) / (1 + w * sum(new))
        if new_rate <= rate:
            break
        rate, ks = new_rate, new
    return ks


def batch_one_at_a_time(alphas, w, k_max):
    """Right: add the single draft of largest gain while it raises the rate (the rate along the
    sorted gains rises, then falls)."""
    ks = [0] * len(alphas)

    def rate(ks):
        return sum(kept(a, k) for a, k in zip(alphas, ks)) / (1 + w * sum(ks))

    while True:
        free = [r for r in range(len(alphas)) if ks[r] < k_max]
        if not free:
            return ks
        r = max(free, key=lambda r: alphas[r] ** (ks[r] + 1))
        trial = ks[:r] + [ks[r] + 1] + ks[r + 1 :]
        if rate(trial) < rate(ks):
            return ks
        ks = trial


def batch_exhaustive(alphas, w, k_max):  # wrong: right answers, but 9^12 allocations take forever
    import itertools

    return list(
        max(
            itertools.product(range(k_max + 1), repeat=len(alphas)),
            key=lambda ks: sum(kept(a, k) for a, k in zip(alphas, ks)) / (1 + w * sum(ks)),
        )
    )


WRONG_BATCH = {
    "each request's own best": (
        lambda a, w, m: [best_by_index(x, w, m) for x in a],
        "each request's best on its own",
    ),
    "one k for all": (
        lambda a, w, m: (
            [
                max(
                    range(m + 1),
                    key=lambda k: (sum(kept(x, k) for x in a) / (1 + w * k * len(a)), -k),
                )
            ]
            * len(a)
        ),
        "the best k shared by all",
    ),
    "a target step per request": (  # B + w * sum(k): the shared step priced once per request
        lambda a, w, m: batch_by_prefix(a, w * len(a), m) if a else [],
        "a better allocation keeps",
    ),
    "k_max drafts for every accepted one": (
        lambda a, w, m: [m if x > 0 else 0 for x in a],
        "a better allocation keeps",
    ),
    "a draft pays when it keeps more than w": (  # the gain compared with the cost, not the rate
        lambda a, w, m: [sum(1 for j in range(1, m + 1) if x**j >= w) for x in a],
        "a better allocation keeps",
    ),
    "an int for an empty batch": (lambda a, w, m: batch_by_prefix(a, w, m) if a else 0, "a list"),
    "exhaustive search": (batch_exhaustive, "more than 10 s"),
}


@pytest.mark.parametrize("fn", [batch_by_prefix, batch_by_threshold, batch_one_at_a_time])
def test_batch_draft_lengths_accepts(fn, capsys):
    checks.check_batch_draft_lengths(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize("case", WRONG_BATCH.values(), ids=WRONG_BATCH.keys())
def test_batch_draft_lengths_rejects_and_names_the_symptom(case):
    fn, words = case
    with pytest.raises(AssertionError, match=words):
        checks.check_batch_draft_lengths(fn)
