"""Pinned behaviour: exact values of small hand-made runs, so that a redesign of the engine
that changes what it does (not just how) fails here.

Every run uses the simulated clock with a step cost of 1 s + 1 s per computed token
(padding included, cached tokens not), so every time on the timeline is a whole number
of seconds and exact in floating point. Each expected value is derived by hand in the
comments next to it; nothing here compares one policy with another.

Only the helpers in the first section reach past the public API (Engine, EngineConfig,
the Timeline and its records, summarize, the sampling functions); update them when the
internals are renamed.
"""

from __future__ import annotations

import pytest
import torch

from minilm import Engine, EngineConfig, Timeline, summarize
from minilm.core.clock import SimulatedClock
from minilm.metrics import e2e_latencies, itls, tpots, ttfts, worst_itls
from minilm.model.sampling import accept, filter_logits
from minilm.request import SamplingParams
from minilm.timeline import RequestRecord, StepItem, StepRecord


# ---- the only places that touch engine internals -----------------------------------------
def step_seconds(plan) -> float:
    """The simulated cost of a step: 1 s + 1 s per token it computes (real and padding)."""
    return 1 + plan.num_scheduled_tokens


def prefill_only_steps_policy():
    """vLLM v0's default: a step that admits prompts runs only prompts."""
    from minilm.core.policies import ContinuousPolicy

    return ContinuousPolicy(prefill_only_steps=True)


def sampler_probs(logits: torch.Tensor, params: list[SamplingParams]) -> list[torch.Tensor]:
    """The distribution `sample` draws each non-greedy row from (it hands it to torch.multinomial)."""
    seen = []
    real = torch.multinomial

    def spy(probs, num_samples, *args, **kwargs):
        seen.append(probs.detach().clone().double())
        return real(probs, num_samples, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "multinomial", spy)
        sample(logits, params, [torch.Generator().manual_seed(0) for _ in params])
    return seen


def sample(logits, params, generators) -> list[int]:
    """One token per row, as the runner samples a sequence that has no draft tokens."""
    return [
        accept(logits[i : i + 1], [], p, g)[0] for i, (p, g) in enumerate(zip(params, generators))
    ]


# ---- public-API helpers -----------------------------------------------------------------
def make_engine(policy="continuous", **knobs) -> Engine:
    """The real `tiny` model (random weights, seed 0) on the simulated clock."""
    knobs.setdefault("max_model_len", 64)
    return Engine("tiny", EngineConfig(policy=policy, **knobs), clock=SimulatedClock(step_seconds))


def run(policy, requests, **knobs) -> Timeline:
    """requests: (id, prompt_ids, max_tokens, arrival); every request runs to max_tokens."""
    e = make_engine(policy, **knobs)
    for rid, prompt, max_tokens, arrival in requests:
        e.add_request(rid, prompt, max_tokens=max_tokens, arrival=arrival, ignore_eos=True)
    return e.run()


def solo_outputs(requests) -> dict[str, list[int]]:
    """Each request alone in a roomy engine: no batching, no preemption, no prefix cache."""
    return {
        rid: run("continuous", [(rid, p, m, 0.0)]).requests[0].output_ids
        for rid, p, m, _ in requests
    }


def items(tl: Timeline) -> list[list[tuple]]:
    return [
        [(i.request_id, i.kind, i.num_tokens, i.context_len) for i in s.items] for s in tl.steps
    ]


def col(tl: Timeline, name: str) -> list:
    return [getattr(s, name) for s in tl.steps]


def times(tl: Timeline) -> list[tuple[float, float]]:
    return [(s.t_start, s.t_end) for s in tl.steps]


def recs(tl: Timeline) -> dict[str, RequestRecord]:
    return {r.request_id: r for r in tl.requests}


def life(tl: Timeline) -> dict[str, tuple]:
    """Each request's (arrival, t_scheduled, t_first_token, token_times, t_finished, output_len, preemptions)."""
    return {
        r.request_id: (
            r.arrival,
            r.t_scheduled,
            r.t_first_token,
            r.token_times,
            r.t_finished,
            r.output_len,
            r.preemptions,
        )
        for r in tl.requests
    }


def preempted_ids(tl: Timeline) -> dict[int, list[str]]:
    """Step -> requests preempted in it: they ran in the step before, had not finished, and
    are missing from this step (valid for these runs, where every running request that
    keeps its KV is scheduled every step)."""
    fin = {r.request_id: r.t_finished for r in tl.requests}
    out = {}
    for prev, s in zip(tl.steps, tl.steps[1:]):
        if s.num_preempted:
            here = {i.request_id for i in s.items}
            out[s.step] = sorted(
                {i.request_id for i in prev.items if fin[i.request_id] > prev.t_end} - here
            )
    return out


# ---- 1. preemption: which request is the victim -------------------------------------------
PREEMPT = [("a", [11, 12, 13], 5, 0.0), ("b", [21, 22, 23], 5, 0.0), ("c", [31, 32], 4, 0.0)]


def test_preemption_evicts_the_newest_running_request():
    """block_size 2, 6 blocks. a, b, c grow until the blocks run out; the request that needs
    a block preempts the newest running request not yet scheduled this step."""
    tl = run("continuous", PREEMPT, block_size=2, num_blocks=6)
    assert items(tl) == [
        # 0: three whole prompts; a [0,1], b [2,3], c [4]: 5 blocks, 8 tokens -> 9 s
        [("a", "prefill", 3, 3), ("b", "prefill", 3, 3), ("c", "prefill", 2, 2)],
        # 1: c's context 3 takes the 6th block (5)
        [("a", "decode", 1, 4), ("b", "decode", 1, 4), ("c", "decode", 1, 3)],
        # 2: a (context 5) needs a 3rd block, none free: the newest unscheduled running request,
        #    c, is preempted; its blocks go to a (5) and b (4); c is not readmitted in a step
        #    that preempted
        [("a", "decode", 1, 5), ("b", "decode", 1, 5)],
        # 3: no new block needed; c (5 tokens to recompute = 3 blocks) cannot be admitted
        [("a", "decode", 1, 6), ("b", "decode", 1, 6)],
        # 4: a (context 7) needs a 4th block: b, now the newest running, is preempted
        #    (not a itself, the oldest); a's 5th token ends it
        [("a", "decode", 1, 7)],
        # 5: the queue is b, c (a preempted request goes back to its head): each recomputes
        #    prompt + output so far: b 3 + 4 = 7 (samples its 5th and last token), c 2 + 2 = 4
        [("b", "prefill", 7, 7), ("c", "prefill", 4, 4)],
        # 6: c's 4th and last token
        [("c", "decode", 1, 5)],
    ]
    assert preempted_ids(tl) == {2: ["c"], 4: ["b"]}
    assert col(tl, "num_preempted") == [0, 0, 1, 0, 1, 0, 0]
    assert col(tl, "num_running") == [3, 3, 2, 2, 1, 2, 1]
    assert col(tl, "num_waiting") == [0, 0, 1, 1, 2, 0, 0]
    assert col(tl, "kv_blocks_used") == [5, 6, 6, 6, 4, 6, 3]
    # each scheduled request's context after the step (no unscheduled running requests here)
    assert col(tl, "kv_tokens_stored") == [8, 11, 10, 12, 7, 11, 5]
    # block tables: a freed block is the next handed out, and a request frees its table tail first
    assert col(tl, "kv_blocks") == [
        {"a": [0, 1], "b": [2, 3], "c": [4]},
        {"a": [0, 1], "b": [2, 3], "c": [4, 5]},
        {"a": [0, 1, 5], "b": [2, 3, 4]},
        {"a": [0, 1, 5], "b": [2, 3, 4]},
        {"a": [0, 1, 5, 4]},
        {"b": [4, 5, 1, 0], "c": [3, 2]},
        {"c": [3, 2, 0]},
    ]
    # durations 1 + tokens: 9, 4, 3, 3, 2, 12, 2
    assert times(tl) == [(0, 9), (9, 13), (13, 16), (16, 19), (19, 21), (21, 33), (33, 35)]
    assert life(tl) == {
        # t_scheduled is the first admission; a readmission after preemption does not move it
        "a": (0, 0, 9, [9, 13, 16, 19, 21], 21, 5, 0),
        "b": (0, 0, 9, [9, 13, 16, 19, 33], 33, 5, 1),
        "c": (0, 0, 9, [9, 13, 33, 35], 35, 4, 1),
    }
    assert [r.request_id for r in tl.requests] == ["a", "b", "c"]  # records in finishing order
    assert {r.request_id: r.finish_reason for r in tl.requests} == dict.fromkeys("abc", "length")
    outputs = {rid: r.output_ids for rid, r in recs(tl).items()}
    assert outputs == solo_outputs(PREEMPT), "recompute after preemption must not change the output"
    # greedy tokens of the tiny model (random weights, seed 0)
    assert outputs == {
        "a": [121, 22, 396, 467, 467],
        "b": [501, 501, 501, 501, 385],
        "c": [159, 159, 159, 159],
    }
    assert summarize(tl)["preemptions"] == 2


def test_preemption_skips_a_request_already_scheduled_this_step():
    """Chunked, block_size 2, 7 blocks, budget 8, chunks of at most 4. When x's prompt chunk
    needs a block, the newest running request (y) has already had its decode scheduled this
    step, so the victim is x itself."""
    reqs = [("x", list(range(10, 20)), 2, 0.0), ("y", [5, 6, 7], 4, 0.0)]
    tl = run(
        "chunked",
        reqs,
        block_size=2,
        num_blocks=7,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        long_prefill_token_threshold=4,
    )
    assert items(tl) == [
        [("x", "prefill", 4, 4), ("y", "prefill", 3, 3)],  # x: cap 4; y: 3 of the 4 left
        [("y", "decode", 1, 4), ("x", "prefill", 4, 8)],  # x takes blocks 4, 5: 6 of 7 used
        # y's decode takes the last block (6); x's 2-token chunk needs one more: the newest
        # running request not yet scheduled is x itself, so x goes back to the queue
        [("y", "decode", 1, 5)],
        [("y", "decode", 1, 6), ("x", "prefill", 4, 4)],  # x starts over (nothing kept)
        [("x", "prefill", 4, 8)],
        [("x", "prefill", 2, 10)],  # samples x's first token
        [("x", "decode", 1, 11)],
    ]
    assert preempted_ids(tl) == {2: ["x"]}
    assert col(tl, "num_preempted") == [0, 0, 1, 0, 0, 0, 0]
    assert col(tl, "kv_blocks_used") == [4, 6, 3, 5, 4, 5, 6]
    assert col(tl, "kv_blocks") == [
        {"x": [0, 1], "y": [2, 3]},
        {"x": [0, 1, 4, 5], "y": [2, 3]},
        {"y": [2, 3, 6]},
        {"x": [5, 4], "y": [2, 3, 6]},
        {"x": [5, 4, 6, 3]},
        {"x": [5, 4, 6, 3, 2]},
        {"x": [5, 4, 6, 3, 2, 1]},
    ]
    # durations 1 + tokens: 8, 6, 2, 6, 5, 3, 2
    assert times(tl) == [(0, 8), (8, 14), (14, 16), (16, 22), (22, 27), (27, 30), (30, 32)]
    assert life(tl) == {
        "x": (0, 0, 30, [30, 32], 32, 2, 1),
        "y": (0, 0, 8, [8, 14, 16, 22], 22, 4, 0),
    }
    assert {rid: r.output_ids for rid, r in recs(tl).items()} == solo_outputs(reqs)


# ---- 2. static batching --------------------------------------------------------------------
def test_static_batch_pads_prompts_and_finished_rows_and_holds_kv_until_it_ends():
    """max_num_seqs 3, block_size 4. The first batch is r0, r1, r2; r3 (and r4, arriving at 3)
    wait for the whole batch to finish. Rows are padded to the longest prompt (4); each row
    reserves the padded length 4 + 5 (the largest max_tokens) = 9 slots = 3 blocks; a finished
    row computes 1 padding token per step, at its own growing context, until the longest
    row ends, and its KV is held until then."""
    reqs = [
        ("r0", [11, 12], 3, 0.0),
        ("r1", [21, 22, 23, 24], 1, 0.0),
        ("r2", [31, 32, 33], 5, 0.0),
        ("r3", [41, 42, 43], 2, 0.0),
        ("r4", [51], 2, 3.0),
    ]
    tl = run("static", reqs, block_size=4, num_blocks=12, max_num_seqs=3)
    assert items(tl) == [
        # 0: padded prefill, every row 4 long; each row samples its first token (r1 ends: max_tokens 1)
        [
            ("r0", "prefill", 2, 2),
            ("r0", "padding", 2, 4),
            ("r1", "prefill", 4, 4),
            ("r2", "prefill", 3, 3),
            ("r2", "padding", 1, 4),
        ],
        # 1: decodes continue from each row's real length; r1 is dead: 1 padding token at 4 + 1
        [("r0", "decode", 1, 3), ("r2", "decode", 1, 4), ("r1", "padding", 1, 5)],
        # 2: r0's 3rd and last token
        [("r0", "decode", 1, 4), ("r2", "decode", 1, 5), ("r1", "padding", 1, 6)],
        # 3: r0 is dead too: padding from its own length 4
        [("r2", "decode", 1, 6), ("r0", "padding", 1, 5), ("r1", "padding", 1, 7)],
        # 4: r2's 5th and last token ends the batch
        [("r2", "decode", 1, 7), ("r0", "padding", 1, 6), ("r1", "padding", 1, 8)],
        # 5: the next batch: r3 and r4 (prompt 1, padded to 3); reserve 3 + 2 = 5 slots = 2 blocks each
        [("r3", "prefill", 3, 3), ("r4", "prefill", 1, 1), ("r4", "padding", 2, 3)],
        [("r3", "decode", 1, 4), ("r4", "decode", 1, 2)],
    ]
    assert len(tl.steps) == 7
    # 9 blocks held through step 4 (r1 ended in step 0, r0 in step 2); then 2 + 2
    assert col(tl, "kv_blocks_used") == [9, 9, 9, 9, 9, 4, 4]
    first = {"r0": [0, 1, 2], "r1": [3, 4, 5], "r2": [6, 7, 8]}
    assert col(tl, "kv_blocks") == [first] * 5 + [{"r3": [8, 7], "r4": [6, 5]}] * 2
    # every row's context after the step, padding included: 4+4+4, 3+4+5, 4+5+6, 6+5+7, 7+6+8, 3+3, 4+2
    assert col(tl, "kv_tokens_stored") == [12, 12, 15, 18, 21, 6, 6]
    assert col(tl, "num_running") == [3, 2, 2, 1, 1, 2, 2]
    assert col(tl, "num_waiting") == [
        1,
        2,
        2,
        2,
        2,
        0,
        0,
    ]  # r4 joins the queue in step 1 (t = 13 >= 3)
    # durations 1 + tokens (padding counts): 13, 4, 4, 4, 4, 7, 3
    assert times(tl) == [(0, 13), (13, 17), (17, 21), (21, 25), (25, 29), (29, 36), (36, 39)]
    assert life(tl) == {
        "r0": (0, 0, 13, [13, 17, 21], 21, 3, 0),
        "r1": (0, 0, 13, [13], 13, 1, 0),
        "r2": (0, 0, 13, [13, 17, 21, 25, 29], 29, 5, 0),
        "r3": (
            0,
            29,
            36,
            [36, 39],
            39,
            2,
            0,
        ),  # scheduled only when the first batch has fully finished
        "r4": (3, 29, 36, [36, 39], 39, 2, 0),
    }
    m = summarize(tl)
    # padding 2+1 + 1 + 1 + 2 + 2 + 2 = 11 of 12+3+3+3+3+6+2 = 32 computed tokens
    assert m["padding_fraction"] == 11 / 32
    # real rows per step: 3, 2, 2, 1, 1, 2, 2
    assert m["mean_batch_size"] == pytest.approx(13 / 7, abs=1e-12)


# ---- 3. chunked prefill ----------------------------------------------------------------------
def test_chunked_prefill_chunk_sizes_budget_and_cap():
    """Budget 6 tokens a step, chunks of at most 4 (long_prefill_token_threshold), block_size 4.
    A chunk is min(tokens left, budget left, cap); decodes are scheduled first (q, newer,
    decodes before p, older, continues its prompt), then running prompts oldest first, then
    new prompts."""
    reqs = [
        ("p", list(range(1, 13)), 2, 0.0),
        ("q", [20, 21], 3, 0.0),
        ("r", list(range(30, 37)), 2, 10.0),
    ]
    tl = run(
        "chunked",
        reqs,
        block_size=4,
        num_blocks=16,
        max_num_seqs=3,
        max_num_batched_tokens=6,
        long_prefill_token_threshold=4,
    )
    assert items(tl) == [
        [("p", "prefill", 4, 4), ("q", "prefill", 2, 2)],  # p: cap 4; q: all 2 (budget 2)
        [("q", "decode", 1, 3), ("p", "prefill", 4, 8)],  # r not arrived (10 > 7)
        [
            ("q", "decode", 1, 4),
            ("p", "prefill", 4, 12),
            ("r", "prefill", 1, 1),
        ],  # r: the 1 token left
        [("p", "decode", 1, 13), ("r", "prefill", 4, 5)],  # r: cap 4 of 6 left
        [("r", "prefill", 2, 7)],  # r's last 2: samples
        [("r", "decode", 1, 8)],
    ]
    assert [s.tokens() for s in tl.steps] == [6, 5, 6, 5, 2, 1]
    assert times(tl) == [(0, 7), (7, 13), (13, 20), (20, 26), (26, 29), (29, 31)]
    # blocks of 4: p 1, 2, 3, 4 (context 13 takes q's freed block 1); q 1; r 1, 2
    assert col(tl, "kv_blocks_used") == [2, 3, 5, 6, 2, 2]
    assert col(tl, "kv_tokens_stored") == [4 + 2, 8 + 3, 12 + 4 + 1, 13 + 5, 7, 8]
    assert life(tl) == {
        "p": (0, 0, 20, [20, 26], 26, 2, 0),
        "q": (0, 0, 7, [7, 13, 20], 20, 3, 0),
        "r": (10, 13, 29, [29, 31], 31, 2, 0),
    }


# ---- 4 and 8. continuous batching with staggered arrivals; KV per step; request times ------
STAGGERED = [
    ("a", [1, 2, 3, 4], 3, 0.0),
    ("b", [5, 6], 3, 3.0),
    ("c", [7, 8, 9], 2, 4.0),
    ("d", [10], 2, 100.0),
]


def test_continuous_staggered_arrivals():
    """max_num_seqs 2, block_size 4. b and c arrive during step 0; c waits for a free row;
    d arrives after everything has finished and the clock jumps to it."""
    tl = run("continuous", STAGGERED, block_size=4, num_blocks=16, max_num_seqs=2)
    assert items(tl) == [
        [("a", "prefill", 4, 4)],  # [0, 5]: b, c not arrived yet
        [("a", "decode", 1, 5), ("b", "prefill", 2, 2)],  # [5, 9]: c waits: 2 rows running
        [("a", "decode", 1, 6), ("b", "decode", 1, 3)],  # [9, 12]: a's last token
        [
            ("b", "decode", 1, 4),
            ("c", "prefill", 3, 3),
        ],  # [12, 17]: c takes a's row; b's last token
        [("c", "decode", 1, 4)],  # [17, 19]
        [("d", "prefill", 1, 1)],  # [100, 102]: idle until d arrives
        [("d", "decode", 1, 2)],  # [102, 104]
    ]
    assert times(tl) == [(0, 5), (5, 9), (9, 12), (12, 17), (17, 19), (100, 102), (102, 104)]
    assert col(tl, "num_running") == [1, 2, 2, 2, 1, 1, 1]
    assert col(tl, "num_waiting") == [0, 1, 1, 0, 0, 0, 0]
    # blocks of 4: a 1 -> 2 (context 5); b 1; c takes a's freed block 1 (the last a freed first)
    assert col(tl, "kv_blocks_used") == [1, 3, 3, 2, 1, 1, 1]
    assert col(tl, "kv_tokens_stored") == [4, 5 + 2, 6 + 3, 4 + 3, 4, 1, 2]
    assert col(tl, "kv_blocks") == [
        {"a": [0]},
        {"a": [0, 1], "b": [2]},
        {"a": [0, 1], "b": [2]},
        {"b": [2], "c": [1]},
        {"c": [1]},
        {"d": [1]},
        {"d": [1]},
    ]
    assert life(tl) == {
        "a": (0, 0, 5, [5, 9, 12], 12, 3, 0),
        "b": (3, 5, 9, [9, 12, 17], 17, 3, 0),
        "c": (4, 12, 17, [17, 19], 19, 2, 0),
        "d": (100, 100, 102, [102, 104], 104, 2, 0),
    }
    assert [r.request_id for r in tl.requests] == ["a", "b", "c", "d"]
    m = summarize(tl)
    # ttft: a 5, b 6, c 13, d 2; e2e: 12, 14, 15, 4; span 104 - 0; 10 output tokens
    assert (m["ttft_p50"], m["e2e_p50"], m["wall_s"], m["output_tok_per_s"]) == (
        5.5,
        13.0,
        104.0,
        10 / 104,
    )
    # unused slots: 4-4, 12-7, 12-9, 8-7, 4-4, 4-1, 4-2 -> 14 / 7
    assert m["kv_unused_slots_mean"] == 2.0


def test_reserved_kv_allocates_the_longest_length_up_front():
    """kv_mode="reserved": a request gets blocks for prompt + max_tokens when admitted:
    a 7 -> 2 blocks, b 5 -> 2, c 5 -> 2, d 3 -> 1 (block_size 4); the steps are unchanged."""
    tl = run(
        "continuous", STAGGERED, block_size=4, num_blocks=16, max_num_seqs=2, kv_mode="reserved"
    )
    assert items(tl) == items(
        run("continuous", STAGGERED, block_size=4, num_blocks=16, max_num_seqs=2)
    )
    assert col(tl, "kv_blocks_used") == [2, 4, 4, 4, 2, 1, 1]
    assert col(tl, "kv_tokens_stored") == [4, 7, 9, 7, 4, 1, 2]
    # c takes a's freed blocks, the last of a's table first
    assert col(tl, "kv_blocks")[3] == {"b": [2, 3], "c": [1, 0]}
    # unused slots: 8-4, 16-7, 16-9, 16-7, 8-4, 4-1, 4-2 -> 38 / 7
    assert summarize(tl)["kv_unused_slots_mean"] == pytest.approx(38 / 7, abs=1e-12)


def test_kv_of_running_requests_not_scheduled_in_a_step_is_counted():
    """Prefill-only steps (vLLM v0): the step that admits b runs only b's prompt; a keeps its
    3 tokens of KV without being scheduled, and kv_tokens_stored counts them."""
    reqs = [("a", [1, 2, 3], 3, 0.0), ("b", [4, 5], 2, 1.0)]
    tl = run(prefill_only_steps_policy(), reqs, block_size=4, num_blocks=16)
    assert items(tl) == [
        [("a", "prefill", 3, 3)],
        [("b", "prefill", 2, 2)],  # a's decode waits a step
        [("a", "decode", 1, 4), ("b", "decode", 1, 3)],
        [("a", "decode", 1, 5)],
    ]
    assert col(tl, "kv_tokens_stored") == [3, 2 + 3, 4 + 3, 5]
    assert col(tl, "kv_blocks_used") == [1, 2, 2, 2]
    assert times(tl) == [(0, 4), (4, 7), (7, 10), (10, 12)]
    assert life(tl) == {"a": (0, 0, 4, [4, 10, 12], 12, 3, 0), "b": (1, 4, 7, [7, 10], 10, 2, 0)}
    # a's worst gap is the stall: 10 - 4
    assert summarize(tl)["itl_max"] == 6.0


# ---- 5. prefix caching -------------------------------------------------------------------------
def test_prefix_caching_hits_and_blocks():
    """block_size 4, 16 blocks. Full blocks are named when allocated; a new request shares the
    longest cached run of full blocks of its first num_tokens - 1 tokens (its last token is
    always computed, so it can sample)."""
    P = [3, 1, 4, 1, 5, 9, 2, 6]
    reqs = [
        ("s0", P + [50, 51], 3, 0.0),
        ("s1", P + [60], 2, 0.0),  # s1 hits s0's blocks in s0's own step
        ("s2", P[:4] + [70, 71, 72], 2, 20.0),  # shares the first block only
        ("s3", P + [50, 51], 2, 20.0),  # s0's prompt again: 2 full blocks (its 3rd is not full)
        ("s4", list(P), 2, 20.0),
    ]  # exactly 2 blocks: only (8 - 1) // 4 = 1 can be shared
    tl = run(
        "continuous", reqs, block_size=4, num_blocks=16, max_num_seqs=4, enable_prefix_caching=True
    )
    assert items(tl) == [
        [
            ("s0", "prefill", 10, 10),
            ("s1", "cached", 8, 8),
            ("s1", "prefill", 1, 9),
        ],  # 11 tokens -> 12 s
        [("s0", "decode", 1, 11), ("s1", "decode", 1, 10)],
        [("s0", "decode", 1, 12)],
        [
            ("s2", "cached", 4, 4),
            ("s2", "prefill", 3, 7),
            ("s3", "cached", 8, 8),
            ("s3", "prefill", 2, 10),
            ("s4", "cached", 4, 4),
            ("s4", "prefill", 4, 8),
        ],  # 9 tokens -> 10 s
        [("s2", "decode", 1, 8), ("s3", "decode", 1, 11), ("s4", "decode", 1, 9)],
    ]
    assert {r.request_id: r.num_cached_tokens for r in tl.requests} == {
        "s0": 0,
        "s1": 8,
        "s2": 4,
        "s3": 8,
        "s4": 4,
    }
    assert times(tl) == [(0, 12), (12, 15), (15, 17), (20, 30), (30, 34)]
    # Fresh blocks come from the head of the LRU free queue 0..15; a freed block joins its tail
    # (tail of the table first) and keeps its name: s1 frees 3 (0, 1 still held by s0), s0 frees
    # 2, 1, 0 -> queue 4..15, 3, 2, 1, 0. s2, s3, s4 reuse 0 (and 1) and take 4, 5, 6; s4 then 7.
    assert col(tl, "kv_blocks") == [
        {"s0": [0, 1, 2], "s1": [0, 1, 3]},
        {"s0": [0, 1, 2], "s1": [0, 1, 3]},
        {"s0": [0, 1, 2]},
        {"s2": [0, 4], "s3": [0, 1, 5], "s4": [0, 6]},
        {"s2": [0, 4], "s3": [0, 1, 5], "s4": [0, 6, 7]},
    ]
    assert col(tl, "kv_blocks_used") == [4, 4, 3, 5, 6]  # a shared block counts once
    # tokens held, a shared block's once: the contexts' sum (10 + 9, 11 + 10, 12, 7 + 10 + 8, 8 + 11 + 9)
    # less the full shared blocks' extra copies (0 and 1 twice in steps 0-1; 0 three times in 3-4)
    assert col(tl, "kv_tokens_stored") == [19 - 8, 21 - 8, 12, 25 - 8, 28 - 8]
    # free blocks that keep a name, as each step ran (a step's finishers free theirs after it):
    # s1's block 3 never filled; s0's blocks 0, 1, 2 (2 filled with its outputs) are free from
    # step 3 on, where s2, s3, s4 take 0 and 1 back; 2 stays free and named
    assert col(tl, "kv_cached_free") == [[], [], [], [2], [2]]
    m = summarize(tl)
    assert m["prefix_cache_hit_rate"] == (8 + 4 + 8 + 4) / (10 + 9 + 7 + 10 + 8)
    # unused slots, allocated - held: 16-11, 16-13, 12-12, 20-17, 24-20 -> 15 / 5
    assert m["kv_unused_slots_mean"] == 3.0
    assert {rid: r.output_ids for rid, r in recs(tl).items()} == solo_outputs(reqs)


# ---- 6. sampling ---------------------------------------------------------------------------
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_top_k_and_top_p_masks():
    lg = torch.tensor([3.0, 2.0, 2.0, 1.0, 0.0])
    kept = lambda k, p: (~torch.isinf(filter_logits(lg, k, p))).tolist()  # noqa: E731
    assert kept(1, 1.0) == [True, False, False, False, False]
    assert kept(2, 1.0) == [True, True, True, False, False]  # a tie with the k-th is kept
    assert kept(0, 1.0) == kept(5, 1.0) == kept(9, 1.0) == [True] * 5
    # probs of lg: [.5206, .1915, .1915, .0705, .0259]; a token is dropped once those before
    # it reach top_p: cumulative before each: 0, .5206, .7121, .9036, .9741
    assert kept(0, 0.5) == [True, False, False, False, False]  # the first is always kept
    assert kept(0, 0.6) == [True, True, False, False, False]
    assert kept(0, 0.8) == [True, True, True, False, False]
    assert kept(0, 0.95) == [True, True, True, True, False]
    assert kept(0, 0.99) == [True] * 5
    # top-k first, then top-p of what is left: softmax([3, 2, 2]) = [.5761, .2119, .2119], cumulative
    # before: 0, .5761, .7881 -> .75 keeps 2 (top-p alone would keep 3)
    assert kept(2, 0.75) == [True, True, False, False, False]


@pytest.mark.parametrize(
    "temperature,top_k,top_p,kept",
    [
        (0.5, 0, 1.0, [0, 1, 2, 3, 4]),
        (1.0, 0, 1.0, [0, 1, 2, 3, 4]),
        (2.0, 0, 1.0, [0, 1, 2, 3, 4]),
        (2.0, 2, 1.0, [0, 1]),
        # top-p acts on the tempered distribution: softmax(LOGITS / 2) = [.3745, .2272, .1769, .1378, .0836];
        # cumulative before each: 0, .3745, .6017, .7786, .9164 -> top_p .75 keeps 3 (softmax(LOGITS):
        # 0, .5630, .7701, ... would keep 2)
        (2.0, 0, 0.75, [0, 1, 2]),
        (0.5, 0, 0.75, [0]),  # softmax(LOGITS / .5)[0] = .8292 >= .75 already after the first
    ],
)
def test_sampling_distribution_is_softmax_of_tempered_filtered_logits(
    temperature, top_k, top_p, kept
):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    (probs,) = sampler_probs(LOGITS[None], [params])
    tempered = LOGITS.double() / temperature
    expected = torch.zeros(5, dtype=torch.float64)
    expected[kept] = torch.softmax(tempered[kept], -1)
    assert torch.allclose(probs, expected, atol=1e-6, rtol=0), (probs, expected)
    # the test can tell the plausible mistakes apart from the real thing
    for wrong in (LOGITS.double(), LOGITS.double() * temperature):
        if temperature != 1.0:
            alt = torch.zeros(5, dtype=torch.float64)
            alt[kept] = torch.softmax(wrong[kept], -1)
            assert (alt - expected).abs().max() > 1e-2 or len(kept) == 1


def test_seeded_sampling_draws_exact_tokens():
    """Rows: greedy (its generator untouched), T=0.7 seed 1234, T=5 with top_k=1 (always the argmax).
    12 steps of the same request draw from its one generator."""
    logits = torch.stack([LOGITS, LOGITS.flip(0), torch.tensor([0.0, 0.1, 0.3, 0.2, 0.0])])
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7, seed=1234),
        SamplingParams(temperature=5.0, top_k=1),
    ]
    g_greedy, g_hot, g_top1 = (torch.Generator().manual_seed(s) for s in (7, 1234, 99))
    fresh = torch.Generator().manual_seed(7).get_state()
    drawn = [sample(logits, params, [g_greedy, g_hot, g_top1]) for _ in range(12)]
    assert [d[0] for d in drawn] == [0] * 12
    assert [d[2] for d in drawn] == [2] * 12
    assert torch.equal(g_greedy.get_state(), fresh), "a greedy row draws nothing"
    # the same draws, derived with torch directly: softmax(logits / T) in float32
    g = torch.Generator().manual_seed(1234)
    probs = torch.softmax(LOGITS.flip(0).float() / 0.7, -1)
    expected = [int(torch.multinomial(probs, 1, generator=g).item()) for _ in range(12)]
    assert [d[1] for d in drawn] == expected
    # the literal draws with this torch (if only this fails after a torch upgrade, torch's
    # multinomial changed, not minilm)
    assert expected == [4, 3, 4, 4, 4, 4, 4, 4, 3, 4, 2, 0]


# ---- 7. metrics on a hand-built timeline --------------------------------------------------------
def hand_timeline() -> Timeline:
    steps = [
        # unused slots = blocks * 4 - stored: 2*4-5 = 3, 4*4-11 = 5, 3*4-10 = 2
        StepRecord(
            0, 0.0, 2.0, [StepItem("A", "prefill", 5, 5)], 1, 2, 2, 10, 0, kv_tokens_stored=5
        ),
        StepRecord(
            1,
            2.0,
            4.0,
            [
                StepItem("A", "decode", 1, 6),
                StepItem("B", "prefill", 3, 3),
                StepItem("B", "padding", 2, 5),
            ],
            2,
            1,
            4,
            10,
            0,
            kv_tokens_stored=11,
        ),
        StepRecord(
            2,
            4.0,
            8.0,
            [
                StepItem("A", "decode", 1, 7),
                StepItem("B", "cached", 4, 4),
                StepItem("C", "padding", 3, 3),
            ],
            1,
            0,
            3,
            10,
            1,
            kv_tokens_stored=10,
        ),
    ]
    requests = [
        #             arrival prompt max  sched  first  token_times         finished out
        RequestRecord("A", 0.0, 5, 4, 0.0, 2.0, [2.0, 3.0, 7.0, 8.0], 8.0, 4, "length", 1),
        RequestRecord(
            "B", 1.0, 3, 2, 1.0, 4.0, [4.0, 5.0], 5.0, 2, "length", 0, num_cached_tokens=2
        ),
        RequestRecord("C", 2.0, 2, 1, 2.0, 6.0, [6.0], 6.0, 1, "length", 0),
    ]
    return Timeline(steps, requests, {"policy": "hand", "clock": "simulated", "block_size": 4})


def test_metrics_exact_values():
    tl = hand_timeline()
    assert ttfts(tl) == [2.0, 3.0, 4.0]  # first token - arrival
    assert itls(tl) == [1.0, 4.0, 1.0, 1.0]  # A: 3-2, 7-3, 8-7; B: 5-4; C has one token
    assert worst_itls(tl) == [4.0, 1.0]  # each request's longest gap (C has none)
    assert tpots(tl) == [2.0, 1.0]  # A (8-2)/(4-1); B (5-4)/(2-1); C (1 token) has none
    assert e2e_latencies(tl) == [8.0, 4.0, 4.0]  # finished - arrival
    m = summarize(tl, ttft_slo=3.0, tpot_slo=1.5)
    expected = {
        "requests": 3,
        "steps": 3,
        "prompt_tokens": 10,
        "output_tokens": 7,
        "failed": 0,
        "incomplete": 0,  # an engine's run: every request completed (or was aborted)
        "wall_s": 8.0,  # last step's end 8 - first arrival 0
        "output_tok_per_s": 7 / 8,
        "total_tok_per_s": 17 / 8,
        # padding 2 + 3 = 5 of computed 5 + (1+3+2) + (1+3) = 15 (cached tokens are not computed)
        "padding_fraction": 5 / 15,
        # requests with real (prefill/decode) work: {A}, {A, B}, {A} (B cached, C padding only)
        "mean_batch_size": 4 / 3,
        "peak_kv_blocks": 4,
        "kv_blocks_total": 10,
        "kv_unused_slots_mean": (3 + 5 + 2) / 3,
        "preemptions": 1,
        "prefix_cache_hit_rate": 2 / 10,
        "spec_draft_tokens": 0,  # no drafts: no acceptance rate or length
        # numpy's linear percentiles: p of sorted x at index q/100 * (n-1)
        "ttft_p50": 3.0,
        "ttft_p90": 3.8,
        "ttft_p99": 3.98,  # [2, 3, 4]
        "itl_p50": 1.0,
        "itl_p90": 3.1,
        "itl_p99": 3.91,  # [1, 1, 1, 4]: 1 + .7*3, 1 + .97*3
        "tpot_p50": 1.5,
        "tpot_p90": 1.9,
        "tpot_p99": 1.99,  # [1, 2]
        "e2e_p50": 4.0,
        "e2e_p90": 7.2,
        "e2e_p99": 7.92,  # [4, 4, 8]: 4 + .8*4, 4 + .98*4
        "itl_max": 4.0,  # the longest gap of the run
        "itl_worst_p99": 3.97,  # p99 of the worst gaps [1, 4]: 1 + .99*3
        # A misses TPOT (2 > 1.5), C misses TTFT (4 > 3; its TPOT counts as 0); B meets both
        "slo_attainment": 1 / 3,
        "goodput_req_per_s": 1 / 8,
    }
    assert m["policy"] == "hand" and m["clock"] == "simulated"
    assert set(expected) | {
        "policy",
        "clock",
        "spec_acceptance_rate",
        "spec_mean_acceptance_length",
    } == set(m)
    assert m["spec_acceptance_rate"] is None and m["spec_mean_acceptance_length"] is None
    for k, v in expected.items():
        assert m[k] == pytest.approx(v, abs=1e-9, rel=0), k
