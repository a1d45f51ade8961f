"""Exercise 0's checks reject known-wrong answers and accept right ones written differently."""
from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


# ---- 1. tokens_by_kind -----------------------------------------------------------------
def tokens_loop(tl):
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals[item.kind] += item.num_tokens
    return totals


def tokens_counter(tl):  # a Counter is a dict; numbers summed a different way
    c = Counter()
    for step in tl.steps:
        for item in step.items:
            c[item.kind] += item.num_tokens
    return c


def tokens_from_items_df(tl):  # the pandas way, numpy integers in the values
    from minilm import items_df

    sums = items_df(tl).groupby("kind").num_tokens.sum()
    return {k: sums.get(k, 0) for k in ("prefill", "decode", "padding")}


def tokens_step_method(tl):  # StepRecord.tokens(kind)
    return {k: sum(s.tokens(k) for s in tl.steps) for k in ("prefill", "decode", "padding")}


def counts_items(tl):  # wrong: one per item, not its tokens (a prompt is one item of many tokens)
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals[item.kind] += 1
    return totals


def forgets_padding(tl):  # wrong: no "padding" key
    out = defaultdict(int)
    for step in tl.steps:
        for item in step.items:
            if item.kind != "padding":
                out[item.kind] += item.num_tokens
    return dict(out)


def padding_as_decode(tl):  # wrong: a padding token counted as a decode token
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals["prefill" if item.kind == "prefill" else "decode"] += item.num_tokens
    return totals


def first_step_only(tl):  # wrong: only the first step's items
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for item in tl.steps[0].items:
        totals[item.kind] += item.num_tokens
    return totals


def as_list(tl):  # wrong: not a dict
    d = tokens_loop(tl)
    return [d["prefill"], d["decode"], d["padding"]]


@pytest.mark.parametrize("fn", [tokens_loop, tokens_counter, tokens_from_items_df, tokens_step_method])
def test_tokens_by_kind_accepts(fn):
    checks.check_tokens_by_kind(fn)


@pytest.mark.parametrize("fn", [counts_items, forgets_padding, padding_as_decode, first_step_only, as_list])
def test_tokens_by_kind_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_tokens_by_kind(fn)


# ---- 2. predict_tokens -----------------------------------------------------------------
def predict(specs):
    return {"prefill": sum(len(s.prompt_ids) for s in specs),
            "decode": sum(s.max_tokens - 1 for s in specs), "padding": 0}


def predict_per_request(specs):  # the same, request by request, with a dict comprehension at the end
    prefill = decode = 0
    for s in specs:
        prefill += len(s.prompt_ids)
        decode += max(s.max_tokens - 1, 0)
    return {k: v for k, v in (("prefill", prefill), ("decode", decode), ("padding", 0))}


def predict_total_minus_count(specs):  # all output tokens, less the one per request that prefill makes
    return {"padding": 0, "prefill": sum(map(len, (s.prompt_ids for s in specs))),
            "decode": sum(s.max_tokens for s in specs) - len(specs)}


def decode_is_max_tokens(specs):  # wrong: forgets that the first token comes out of the prefill step
    return {"prefill": sum(len(s.prompt_ids) for s in specs), "decode": sum(s.max_tokens for s in specs),
            "padding": 0}


def prefill_includes_first_token(specs):  # wrong: moves the first output token into the prefill count
    return {"prefill": sum(len(s.prompt_ids) + 1 for s in specs), "decode": sum(s.max_tokens - 1 for s in specs),
            "padding": 0}


def counts_requests_not_tokens(specs):  # wrong: one prefill per request
    return {"prefill": len(specs), "decode": sum(s.max_tokens - 1 for s in specs), "padding": 0}


def no_padding_key(specs):  # wrong: misses a key
    return {"prefill": sum(len(s.prompt_ids) for s in specs), "decode": sum(s.max_tokens - 1 for s in specs)}


def decode_steps_not_tokens(specs):  # wrong: the longest request's decode steps (steps, not tokens)
    return {"prefill": sum(len(s.prompt_ids) for s in specs), "decode": max(s.max_tokens for s in specs) - 1,
            "padding": 0}


@pytest.mark.parametrize("fn", [predict, predict_per_request, predict_total_minus_count])
def test_predict_tokens_accepts(fn):
    checks.check_predict_tokens(fn)


@pytest.mark.parametrize("fn", [decode_is_max_tokens, prefill_includes_first_token, counts_requests_not_tokens,
                                no_padding_key, decode_steps_not_tokens])
def test_predict_tokens_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_predict_tokens(fn)
