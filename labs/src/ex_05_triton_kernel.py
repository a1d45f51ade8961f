# %% [markdown]
# # Exercise 5 · Describe a ragged batch
#
# One attention call serves a whole step: prompt chunks and decode tokens of different
# lengths, flattened into one list of query tokens. `AttentionMetadata` tells the kernel
# where each sequence's tokens are and where its keys live:
#
# * `cu_seqlens_q [B+1]` (int32): offsets of each sequence's new tokens, `[0, q0, q0+q1, ...]`;
# * `context_lens [B]` (int32): cached tokens + new tokens of each sequence;
# * `block_tables [B, max_blocks]` (int32): each sequence's block ids, padded with 0;
# * `slot_mapping [T]` (int64): the cache slot of each *new* token,
#   `table[p // block_size] * block_size + p % block_size` at position `p`.
#
# Write `ragged_metadata(query_lens, cached_lens, block_tables, block_size)`. The check
# fills a paged cache with scrambled block tables, runs the reference kernel on your
# metadata, and compares with textbook attention on each sequence.

# %%
import torch
from minilm.model import AttentionMetadata
from labs import checks


def ragged_metadata(query_lens: list[int], cached_lens: list[int], block_tables: list[list[int]],
                    block_size: int) -> AttentionMetadata:
    # BEGIN SOLUTION
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    context = [c + q for q, c in zip(query_lens, cached_lens)]
    width = max(len(t) for t in block_tables)
    tables = [t + [0] * (width - len(t)) for t in block_tables]
    slots = [t[p // block_size] * block_size + p % block_size
             for q, c, t in zip(query_lens, cached_lens, block_tables) for p in range(c, c + q)]
    return AttentionMetadata(cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
                             context_lens=torch.tensor(context, dtype=torch.int32),
                             block_tables=torch.tensor(tables, dtype=torch.int32),
                             slot_mapping=torch.tensor(slots, dtype=torch.int64))
    # END SOLUTION

# %%
# exercise check
checks.check_ragged_metadata(ragged_metadata)
