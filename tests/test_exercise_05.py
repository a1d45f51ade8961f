"""Exercise 5's check rejects known-wrong ragged metadata and accepts right metadata built differently."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `labs` is a folder of the repository
from labs import checks  # noqa: E402
from minilm.model.llama import AttentionMetadata  # noqa: E402


def build(query_lens, cached_lens, block_tables, block_size, *, cu=None, context=None, tables=None, slots=None,
          dtypes=(torch.int32, torch.int32, torch.int32, torch.int64)):
    """The solution, with any one field replaced (a wrong variant changes one thing)."""
    if cu is None:
        cu = [0]
        for n in query_lens:
            cu.append(cu[-1] + n)
    if context is None:
        context = [c + q for q, c in zip(query_lens, cached_lens)]
    if tables is None:
        width = max(len(t) for t in block_tables)
        tables = [t + [0] * (width - len(t)) for t in block_tables]
    if slots is None:
        slots = [t[p // block_size] * block_size + p % block_size
                 for q, c, t in zip(query_lens, cached_lens, block_tables) for p in range(c, c + q)]
    return AttentionMetadata(*(torch.tensor(v, dtype=d) for v, d in zip((cu, context, tables, slots), dtypes)))


# ---- right ------------------------------------------------------------------------------------
def solution(q, c, t, bs):
    return build(q, c, t, bs)


def with_torch_ops(query_lens, cached_lens, block_tables, block_size):
    """Vectorised, the way runner.py builds it."""
    q = torch.tensor(query_lens)
    cu = torch.zeros(len(q) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(q, 0)
    width = max(map(len, block_tables))
    tables = torch.zeros(len(block_tables), width, dtype=torch.int32)
    for i, t in enumerate(block_tables):
        tables[i, :len(t)] = torch.tensor(t)
    rows = torch.repeat_interleave(torch.arange(len(q)), q)
    positions = torch.tensor(cached_lens)[rows] + torch.arange(int(q.sum())) - cu[:-1].long()[rows]
    slots = tables[rows, positions // block_size].long() * block_size + positions % block_size
    return AttentionMetadata(cu, (torch.tensor(cached_lens) + q).to(torch.int32), tables, slots)


def wide_tables(q, c, t, bs):
    """Block tables padded to a fixed width, wider than needed: the kernel reads only what it needs."""
    return build(q, c, t, bs, tables=[row + [0] * (8 - len(row)) for row in t])


RIGHT = [solution, with_torch_ops, wide_tables]


# ---- wrong ------------------------------------------------------------------------------------
def context_without_new_tokens(q, c, t, bs):
    return build(q, c, t, bs, context=list(c))


def context_of_new_tokens_only(q, c, t, bs):
    return build(q, c, t, bs, context=list(q))


def cu_seqlens_without_zero(q, c, t, bs):
    return build(q, c, t, bs, cu=list(torch.tensor(q).cumsum(0).tolist()))


def cu_seqlens_off_by_one(q, c, t, bs):
    return build(q, c, t, bs, cu=[0] + [x + 1 for x in torch.tensor(q).cumsum(0).tolist()])


def cu_seqlens_of_contexts(q, c, t, bs):
    return build(q, c, t, bs, cu=[0] + torch.tensor([a + b for a, b in zip(q, c)]).cumsum(0).tolist())


def slots_through_unscrambled_table(q, c, t, bs):
    """Assumes a sequence's blocks follow each other: its first block, then the next ids."""
    return build(q, c, t, bs, slots=[tab[0] * bs + p for qq, cc, tab in zip(q, c, t) for p in range(cc, cc + qq)])


def slots_from_position_zero(q, c, t, bs):
    """Writes the new tokens as if they started the sequence."""
    return build(q, c, t, bs, slots=[tab[p // bs] * bs + p % bs for qq, tab in zip(q, t) for p in range(qq)])


def slots_for_every_token(q, c, t, bs):
    """Cached tokens too: they are in the cache already."""
    return build(q, c, t, bs, slots=[tab[p // bs] * bs + p % bs for qq, cc, tab in zip(q, c, t)
                                     for p in range(cc + qq)])


def slots_block_index_as_id(q, c, t, bs):
    """Uses the index in the table instead of the block id it holds."""
    return build(q, c, t, bs, slots=[(p // bs) * bs + p % bs for qq, cc in zip(q, c) for p in range(cc, cc + qq)])


def tables_in_the_wrong_order(q, c, t, bs):
    return build(q, c, t, bs, tables=[sorted(row) + [0] * (max(map(len, t)) - len(row)) for row in t])


def int64_offsets(q, c, t, bs):
    return build(q, c, t, bs, dtypes=(torch.int64, torch.int32, torch.int32, torch.int64))


def float_context(q, c, t, bs):
    return build(q, c, t, bs, dtypes=(torch.int32, torch.float32, torch.int32, torch.int64))


WRONG = [context_without_new_tokens, context_of_new_tokens_only, cu_seqlens_without_zero, cu_seqlens_off_by_one,
         cu_seqlens_of_contexts, slots_through_unscrambled_table, slots_from_position_zero, slots_for_every_token,
         slots_block_index_as_id, tables_in_the_wrong_order, int64_offsets, float_context]


@pytest.mark.parametrize("fn", WRONG, ids=lambda f: f.__name__)
def test_check_rejects_wrong_metadata(fn):
    with pytest.raises(AssertionError):
        checks.check_ragged_metadata(fn)


@pytest.mark.parametrize("fn", RIGHT, ids=lambda f: f.__name__)
def test_check_accepts_right_metadata(fn, capsys):
    checks.check_ragged_metadata(fn)
    assert "passed:" in capsys.readouterr().out
