"""Sampling: filters are right, and a seeded request samples the same tokens in any batch."""

import torch
from helpers import engine, micro_model

from minilm.model.sampling import filter_logits


def test_top_k_and_top_p_filters():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [False, False, True, True, True]
    probs = logits.softmax(-1)  # [0.64, 0.24, 0.09, ...]
    kept = ~torch.isinf(filter_logits(logits, 0, 0.7))
    assert kept.tolist() == [True, True, False, False, False]
    assert probs[0] < 0.7 <= probs[:2].sum()
    assert (~torch.isinf(filter_logits(logits, 0, 0.5))).sum() == 1  # the top token is always kept


def run(max_num_seqs, policy):
    e = engine(
        policy, model=micro_model(), max_model_len=128, max_num_seqs=max_num_seqs, block_size=4
    )
    for i in range(6):
        e.add_request(
            f"s{i}",
            [1 + i, 2, 3],
            max_tokens=12,
            temperature=0.9,
            top_k=20,
            top_p=0.95,
            seed=100 + i,
        )
    return {r.request_id: r.output_ids for r in e.run().requests}


def test_seeded_sampling_is_independent_of_batching():
    alone = run(1, "continuous")
    assert run(6, "chunked") == alone == run(3, "static")
    assert len({tuple(v) for v in alone.values()}) > 1  # really sampling, not greedy constants
