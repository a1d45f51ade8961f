"""The reference attention's batched decode path equals its one-sequence path and a dense softmax."""

import random

import torch

from minilm.model.attention.reference import attend_sequence, paged_attention
from minilm.model.llama import AttentionMetadata


def test_mixed_batch_against_dense_attention():
    g = torch.Generator().manual_seed(0)
    num_blocks, bs, hkv, hq, d = 40, 4, 2, 8, 16
    kc, vc = (
        torch.randn(num_blocks, bs, hkv, d, generator=g),
        torch.randn(num_blocks, bs, hkv, d, generator=g),
    )
    seqs = [
        (1, 9),
        (5, 5),
        (1, 1),
        (3, 14),
        (1, 17),
    ]  # (new tokens, context) incl. chunks and decodes
    free = list(range(num_blocks))
    random.Random(1).shuffle(free)
    tables = [[free.pop() for _ in range(-(-ctx // bs))] for _, ctx in seqs]
    width = max(map(len, tables))
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor(
            [0] + list(torch.tensor([n for n, _ in seqs]).cumsum(0)), dtype=torch.int32
        ),
        context_lens=torch.tensor([c for _, c in seqs], dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.zeros(0, dtype=torch.int64),
    )
    for (n, ctx), table in zip(seqs, tables):  # garbage past each context must not leak in
        kc[table[-1], ctx % bs or bs :] = float("nan")
        vc[table[-1], ctx % bs or bs :] = float("nan")
    q = torch.randn(sum(n for n, _ in seqs), hq, d, generator=g)
    out = paged_attention(q, kc, vc, meta, 0.3)
    start = 0
    for (n, ctx), table in zip(seqs, tables):
        k = torch.cat([kc[b] for b in table])[:ctx].repeat_interleave(hq // hkv, 1)
        v = torch.cat([vc[b] for b in table])[:ctx].repeat_interleave(hq // hkv, 1)
        mask = torch.ones(n, ctx, dtype=torch.bool).tril(ctx - n)
        dense = torch.nn.functional.scaled_dot_product_attention(
            q[start : start + n].transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask,
            scale=0.3,
        )
        assert torch.allclose(out[start : start + n], dense.transpose(0, 1), atol=1e-5)
        assert torch.allclose(
            attend_sequence(q[start : start + n], kc, vc, torch.tensor(table), ctx, 0.3),
            dense.transpose(0, 1),
            atol=1e-5,
        )
        start += n
