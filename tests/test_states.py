"""The state-machine figure counts every transition of a run, each exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import engine as make_engine

from minilm import RequestSpec
from minilm.timeline import Timeline
from widgets.states import states_figure, transition_counts

# prompt, max_tokens: long enough prompts to be chunked, outputs long enough to outgrow a small cache
REQUESTS = [(30, 12), (5, 20), (17, 9), (44, 6), (9, 16), (12, 14), (26, 10)]


def run(policy: str, **knobs) -> Timeline:
    e = make_engine(policy, max_num_seqs=3, max_model_len=64, **knobs)
    e.add_workload(
        [
            RequestSpec(f"r{i}", [(7 * i + j) % 90 + 1 for j in range(p)], m)
            for i, (p, m) in enumerate(REQUESTS)
        ],
        ignore_eos=True,
    )
    return e.run()


def work_items(tl: Timeline) -> Counter:
    return Counter(i.kind for s in tl.steps for i in s.items if i.kind in ("prefill", "decode"))


RUNS = {
    "static": dict(),
    "continuous": dict(),
    "chunked, tight KV": dict(max_num_batched_tokens=8, num_blocks=10, block_size=8),
    "chunked, tight KV, prefix caching": dict(
        max_num_batched_tokens=8,
        num_blocks=10,
        block_size=8,
        enable_prefix_caching=True,
        scramble=False,
    ),
}


@pytest.mark.parametrize("name", RUNS)
def test_every_item_is_one_transition_and_every_preemption_is_counted(name):
    policy = name.split(",")[0]
    tl = run(policy, **RUNS[name])
    c = transition_counts(tl)
    items = work_items(tl)
    preempted = sum(r.preemptions for r in tl.requests)
    if "tight" in name:
        assert preempted > 0, "the tight cache should force preemptions"
    assert c["arrive", "waiting"] == len(tl.requests)
    assert c["prefill", "waiting"] + c["decode", "waiting"] == preempted
    assert c["waiting", "prefill"] == len(tl.requests) + preempted
    assert c["prefill", "finished"] + c["decode", "finished"] == len(tl.requests)
    for kind in ("prefill", "decode"):  # each item enters a state once and leaves it once
        assert sum(n for (a, b), n in c.items() if b == kind) == items[kind]
        assert sum(n for (a, b), n in c.items() if a == kind) == items[kind]
    if policy != "chunked":  # whole prompts: no chunk follows a chunk
        assert c["prefill", "prefill"] == 0
    assert set(c) <= {
        ("arrive", "waiting"),
        ("waiting", "prefill"),
        ("prefill", "prefill"),
        ("prefill", "decode"),
        ("decode", "decode"),
        ("prefill", "waiting"),
        ("decode", "waiting"),
        ("prefill", "finished"),
        ("decode", "finished"),
    }


def test_a_one_token_request_goes_from_prefill_to_finished():
    e = make_engine("continuous", max_num_seqs=2, max_model_len=64)
    e.add_workload(
        [RequestSpec("one", [1, 2, 3], 1), RequestSpec("two", [4, 5], 3)], ignore_eos=True
    )
    c = transition_counts(e.run())
    assert (
        c["prefill", "finished"] == 1
        and c["decode", "finished"] == 1
        and c["decode", "decode"] == 1
    )


def test_figure_labels_show_the_counts():
    tl = run("chunked", **RUNS["chunked, tight KV"])
    c = transition_counts(tl)
    text = " ".join(a.text for a in states_figure(tl).layout.annotations)
    assert f"{c['decode', 'decode']:,} next token" in text
    assert f"{c['prefill', 'prefill']:,} next chunk" in text
    assert f"{c['decode', 'waiting']:,} preempted in decode" in text
    assert f"max_tokens: {len(tl.requests)}" in text
