"""The radix-tree view: the tree holds exactly the prompts' shared structure, and the
hits it lists are the ones the engine's prefix cache finds."""

import random

import pytest
from helpers import engine as real_engine

from minilm import RequestSpec, make_workload
from minilm.sim import simulated_engine
from widgets.radix import build_radix_tree, prefix_hits, radix_figure, walk


def shape(prompts: dict) -> set[tuple]:
    """Each node as (its tokens, the requests through it)."""
    return {
        (node.tokens, tuple(sorted(node.requests))) for node, _ in walk(build_radix_tree(prompts))
    }


def test_tree_of_hand_made_prompts():
    prompts = {
        "a": [1, 2, 3, 4],
        "b": [1, 2, 3, 5, 6],
        "c": [1, 2, 7],
        "d": [8, 9],
        "e": [1, 2, 3, 4],
    }
    assert shape(prompts) == {
        ((1, 2), ("a", "b", "c", "e")),
        ((3,), ("a", "b", "e")),
        ((4,), ("a", "e")),  # a duplicate prompt adds no node
        ((5, 6), ("b",)),
        ((7,), ("c",)),
        ((8, 9), ("d",)),
    }


def test_a_prompt_that_ends_inside_an_edge_splits_it():
    assert shape({"long": [1, 2, 3, 4, 5], "short": [1, 2]}) == {
        ((1, 2), ("long", "short")),
        ((3, 4, 5), ("long",)),
    }
    # the same tree whichever comes first
    assert shape({"short": [1, 2], "long": [1, 2, 3, 4, 5]}) == shape(
        {"long": [1, 2, 3, 4, 5], "short": [1, 2]}
    )


def test_node_count_is_the_number_of_branch_points_and_ends():
    """k system prompts with disjoint first tokens, each with m different turns: k shared
    nodes and k * m leaves."""
    rng = random.Random(0)
    k, m = 3, 4
    systems = [[100 * s + 1] + [rng.randrange(50) for _ in range(30)] for s in range(k)]
    prompts = {
        f"s{s}t{t}": systems[s] + [1000 + 10 * t + j for j in range(5)]
        for s in range(k)
        for t in range(m)
    }
    nodes = [n for n, _ in walk(build_radix_tree(prompts))]
    assert len(nodes) == k + k * m
    assert sorted(len(n.requests) for n in nodes if n.children) == [m] * k
    assert all(len(n.tokens) == 31 for n in nodes if n.children)


def test_hits_of_hand_made_prompts():
    prompts = {
        "a": list(range(10)),
        "b": list(range(10)) + [50, 51],  # a + 2 more tokens
        "c": list(range(10)),  # a again
        "d": [0, 1, 2, 99, 4, 5, 6, 7, 8, 9],  # leaves a after 3 tokens
        "e": [9, 1, 2, 3],
    }
    hits = prefix_hits(prompts, block_size=4).set_index("request")
    assert hits.radix_hit.to_dict() == {
        "a": 0,
        "b": 10,
        "c": 9,
        "d": 3,
        "e": 0,
    }  # c: its last token is computed
    assert hits.block_hit.to_dict() == {"a": 0, "b": 8, "c": 8, "d": 0, "e": 0}
    assert (hits.radix_hit - hits.block_hit).between(0, 3).all()


def test_equal_tokens_after_a_different_prefix_are_no_hit():
    """Block 1 of `y` has the tokens of `x`'s block 1, but after a different block 0."""
    x, y = [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 2, 3, 4, 5, 6, 7, 8, 9]
    hits = prefix_hits({"x": x, "y": y}, block_size=4)
    assert hits.block_hit.tolist() == [0, 0] and hits.radix_hit.tolist() == [0, 0]


@pytest.mark.parametrize(
    "preset,block_size", [("shared-prefix", 16), ("multi-turn", 16), ("shared-prefix", 7)]
)
def test_hits_agree_with_the_engine_when_nothing_is_evicted(preset, block_size):
    specs = make_workload(preset, num_requests=40, seed=3, vocab_size=128256, rate=20.0)
    engine = simulated_engine(
        "llama-3-8b",
        "h100",
        policy="continuous",
        enable_prefix_caching=True,
        block_size=block_size,
        max_model_len=2048,
        record_kv_blocks=False,
    )
    engine.add_workload(specs)
    tl = engine.run()
    assert engine.kv_manager.num_blocks > sum(
        -(-(r.prompt_len + r.max_tokens) // block_size) for r in tl.requests
    ), "the cache must hold every block of the run: then nothing is evicted"
    recorded = {r.request_id: r.num_cached_tokens for r in tl.requests}
    hits = prefix_hits(specs, block_size)
    assert hits.block_hit.sum() > 0
    assert dict(zip(hits.request, hits.block_hit)) == recorded
    assert ((hits.radix_hit - hits.block_hit) < block_size).all()


def test_hits_agree_with_the_real_engine():
    """The same on the real (micro) model, whose outputs are real tokens, with a scrambled free list."""
    specs = make_workload(
        "shared-prefix", num_requests=16, seed=4, vocab_size=97, rate=50.0, max_model_len=512
    )
    e = real_engine(
        "continuous", enable_prefix_caching=True, max_num_seqs=4, max_model_len=512, num_blocks=256
    )
    e.add_workload(specs, ignore_eos=True)
    tl = e.run()
    assert e.config.num_blocks > sum(
        -(-(r.prompt_len + r.max_tokens) // e.config.block_size) for r in tl.requests
    )
    recorded = {r.request_id: r.num_cached_tokens for r in tl.requests}
    hits = prefix_hits(specs, e.config.block_size)
    assert hits.block_hit.sum() > 0 and dict(zip(hits.request, hits.block_hit)) == recorded


def test_text_prompts_need_a_tokenizer():
    specs = [RequestSpec("a", None, 4, prompt="hello")]
    with pytest.raises(ValueError, match="encode"):
        prefix_hits(specs, 16)
    with pytest.raises(ValueError, match="block_size"):
        prefix_hits({"a": [1, 2]}, 0)


def test_figure_has_a_marker_per_node_and_labels():
    prompts = {"a": [1, 2, 3, 4], "b": [1, 2, 3, 5, 6], "c": [1, 2, 7]}
    fig = radix_figure(prompts, decode=lambda ids: "".join(chr(96 + i) for i in ids))
    nodes = fig.data[2]
    assert len(nodes.x) == 5
    assert "2 tok · 3 req" in nodes.text
    assert any("'abc'" not in h and "'ab'" in h for h in nodes.hovertext)
