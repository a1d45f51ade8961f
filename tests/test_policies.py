"""Batching must never change what is generated; each policy does what docs/DESIGN.md's table says."""

from dataclasses import replace

import pytest
from helpers import MICRO, engine, micro_model

from minilm import make_workload
from minilm.core.policies import ChunkedPolicy, Policy, admit_prompts, schedule_decodes
from minilm.metrics import summarize
from minilm.request import Request, SamplingParams

# mixed lengths, shortened so the whole file runs in seconds
WORKLOAD = [
    replace(s, prompt_ids=s.prompt_ids[:40], max_tokens=min(s.max_tokens, 20))
    for s in make_workload(
        "mixed", num_requests=12, seed=5, vocab_size=MICRO.vocab_size, max_model_len=256
    )
]


def outputs(policy, **knobs):
    e = engine(policy, model=micro_model(), max_model_len=256, **knobs)
    e.add_workload(WORKLOAD, ignore_eos=True)
    tl = e.run()
    return {r.request_id: r.output_ids for r in tl.requests}, tl


@pytest.fixture(scope="module")
def reference_outputs():
    return outputs("continuous", max_num_seqs=1)[0]  # one request at a time: no batching at all


@pytest.mark.parametrize(
    "policy,knobs",
    [
        ("static", dict(max_num_seqs=4)),
        ("static", dict(max_num_seqs=8, block_size=8)),
        ("continuous", dict(max_num_seqs=6, block_size=4)),
        ("continuous", dict(max_num_seqs=8, num_blocks=14, block_size=8)),  # tight KV: preemption
        ("chunked", dict(max_num_seqs=8, max_num_batched_tokens=16, block_size=4)),
        ("chunked", dict(max_num_seqs=5, max_num_batched_tokens=37, block_size=16)),
        ("chunked", dict(max_num_seqs=8, max_num_batched_tokens=64, num_blocks=24, block_size=4)),
    ],
)
def test_greedy_outputs_do_not_depend_on_batching(reference_outputs, policy, knobs):
    got, tl = outputs(policy, **knobs)
    assert got == reference_outputs
    assert all(len(got[s.id]) == s.max_tokens for s in WORKLOAD)


def test_tight_kv_really_preempts():
    _, tl = outputs("continuous", max_num_seqs=8, num_blocks=14, block_size=8)
    assert summarize(tl)["preemptions"] > 0


def test_static_pads_and_waits_for_whole_batch():
    _, tl = outputs("static", max_num_seqs=4)
    padding = [i for s in tl.steps for i in s.items if i.kind == "padding"]
    assert padding, "static batching computes padding"
    # a new batch starts only when every row of the previous one is done
    finish = {r.request_id: r.t_finished for r in tl.requests}
    starts = {r.request_id: r.t_scheduled for r in tl.requests}
    batches = {}
    for r in tl.requests:
        batches.setdefault(r.t_scheduled, []).append(r.request_id)
    ordered = sorted(batches)
    for a, b in zip(ordered, ordered[1:]):
        assert max(finish[x] for x in batches[a]) <= b
        assert all(starts[x] == b for x in batches[b])
    # padding rows: prompt padding in the first step of each batch, dead rows after
    first = tl.steps[0]
    lens = {i.request_id: i.num_tokens for i in first.items if i.kind == "prefill"}
    pads = {i.request_id: i.num_tokens for i in first.items if i.kind == "padding"}
    longest = max(lens.values())
    assert all(lens[r] + pads.get(r, 0) == longest for r in lens)


def test_continuous_runs_whole_prompts_and_decodes_together():
    _, tl = outputs("continuous", max_num_seqs=6)
    by_id = {s.id: s for s in WORKLOAD}
    for step in tl.steps:
        for it in step.items:
            assert it.kind != "padding"
            if it.kind == "prefill":
                assert it.num_tokens == len(by_id[it.request_id].prompt_ids)
    assert any({i.kind for i in s.items} == {"prefill", "decode"} for s in tl.steps)


@pytest.mark.parametrize("budget", [8, 16, 50])
def test_chunked_schedules_decodes_first_within_budget(budget):
    _, tl = outputs("chunked", max_num_seqs=8, max_num_batched_tokens=budget)
    for step in tl.steps:
        assert step.tokens() <= budget
        kinds = [i.kind for i in step.items]
        assert kinds == sorted(kinds, key=lambda k: k != "decode"), "decodes come first"
    assert (
        any(i.kind == "prefill" and i.num_tokens == budget for s in tl.steps for i in s.items)
        or budget == 50
    )


def test_prefill_only_steps_option():
    from minilm.core.policies import ContinuousPolicy

    e = engine(
        ContinuousPolicy(prefill_only_steps=True),
        model=micro_model(),
        max_model_len=256,
        max_num_seqs=6,
    )
    e.add_workload(WORKLOAD, ignore_eos=True)
    tl = e.run()
    assert all(len({i.kind for i in s.items}) == 1 for s in tl.steps)


def test_reserved_kv_holds_more_blocks_than_paged():
    _, paged = outputs("continuous", max_num_seqs=6)
    _, reserved = outputs("continuous", max_num_seqs=6, kv_mode="reserved")
    assert summarize(reserved)["peak_kv_blocks"] > summarize(paged)["peak_kv_blocks"]
    assert summarize(reserved)["kv_unused_slots_mean"] > summarize(paged)["kv_unused_slots_mean"]


def test_a_budget_equal_to_the_batch_serves_every_decode_every_step():
    """max_num_batched_tokens == max_num_seqs: no running request ever skips a step."""
    _, tl = outputs("chunked", max_num_seqs=6, max_num_batched_tokens=6)
    for r in tl.requests:
        decode_steps = [
            s.step
            for s in tl.steps
            for i in s.items
            if i.request_id == r.request_id and i.kind == "decode"
        ]
        assert decode_steps == list(range(decode_steps[0], decode_steps[0] + len(decode_steps)))


class WholePrompts(Policy):
    """A user's policy under another name (like exercise 3's): the rules come from the class."""

    name = "my-continuous"

    def schedule(self, s):
        schedule_decodes(s)
        admit_prompts(s, chunked=False)


def test_a_users_policy_gets_its_classes_rules():
    e = engine(WholePrompts(), model=micro_model(), max_model_len=64, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        e.add_request("long", [1] * 20, max_tokens=2)  # could never run whole in one step
    e.add_request("short", [1] * 10, max_tokens=2)
    assert e.run().requests[0].output_len == 2


def test_default_budget_comes_from_the_policy_class_not_its_name():
    by_name = engine("chunked", model=micro_model(), max_model_len=256).config
    by_object = engine(ChunkedPolicy(), model=micro_model(), max_model_len=256).config

    class Renamed(ChunkedPolicy):
        name = "renamed"

    renamed = engine(Renamed(), model=micro_model(), max_model_len=256).config
    assert (
        by_name.max_num_batched_tokens
        == by_object.max_num_batched_tokens
        == renamed.max_num_batched_tokens
    )
    assert (
        engine("static", model=micro_model(), max_model_len=256).config.max_num_batched_tokens
        is None
    )
    _, chunked = outputs("chunked", max_num_seqs=8, max_num_batched_tokens=16)
    _, mine = outputs(Renamed(), max_num_seqs=8, max_num_batched_tokens=16)
    assert [[(i.request_id, i.kind, i.num_tokens) for i in s.items] for s in mine.steps] == [
        [(i.request_id, i.kind, i.num_tokens) for i in s.items] for s in chunked.steps
    ]


def test_a_policy_mistake_is_refused_with_its_name():
    class Greedy(Policy):
        name = "greedy"

        def schedule(self, s):
            for req in s.unscheduled_running():
                s.schedule_running(req, 1)
                s.schedule_running(req, 1)  # twice in one step
            admit_prompts(s, chunked=False)

    e = engine(Greedy(), model=micro_model(), max_model_len=64)
    e.add_request("a", [1, 2, 3], max_tokens=4)
    e.step()
    with pytest.raises(
        RuntimeError, match="policy 'greedy': 'a' is already scheduled in this step"
    ):
        e.step()


@pytest.mark.parametrize(
    "order, words",
    [
        (lambda q: q[1:], "left out 'a'"),
        (lambda q: q + q[:1], "got 'a' twice"),
        (lambda q: q[1:] + [Request("a", [1], SamplingParams())], r"got 'a' \(not waiting\)"),
    ],
    ids=["missing", "twice", "stranger"],
)
def test_reorder_waiting_refuses_what_is_not_the_queue_and_changes_nothing(order, words):
    class Reorders(Policy):
        name = "reorders"

        def schedule(self, s):
            before = list(s.waiting)
            with pytest.raises(RuntimeError, match="policy 'reorders': reorder_waiting.. " + words):
                s.reorder_waiting(order(before))
            assert list(s.waiting) == before
            s.reorder_waiting(before[::-1])  # a permutation: the queue in that order
            admit_prompts(s, chunked=False)

    e = engine(Reorders(), model=micro_model(), max_model_len=64, max_num_seqs=1)
    for rid in "abc":
        e.add_request(rid, [1, 2, 3], max_tokens=1)
    first = e.step()
    assert [i.request_id for i in first.items] == ["c"]


def test_long_prefill_token_threshold_caps_each_chunk():
    """The sources' example: a 4,096-token prompt, a 1,024-token budget, 512-token chunks."""
    from minilm.sim import simulated_engine

    e = simulated_engine(
        "llama-3-8b",
        "h100",
        policy="chunked",
        max_num_batched_tokens=1024,
        long_prefill_token_threshold=512,
    )
    e.add_request("long", [1] * 4096, max_tokens=2)
    e.add_request("short", [1] * 100, max_tokens=2)
    tl = e.run()
    chunks = [
        (i.request_id, i.num_tokens) for s in tl.steps for i in s.items if i.kind == "prefill"
    ]
    assert chunks[:3] == [("long", 512), ("short", 100), ("long", 512)]
    assert [n for r, n in chunks if r == "long"] == [512] * 8
