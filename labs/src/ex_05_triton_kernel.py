# %% [markdown]
# # Exercise 5 · Describe a ragged batch
#
# One attention call serves a whole step: prompt chunks and decode tokens of different
# lengths, flattened into one list of query tokens. `AttentionMetadata` tells the kernel
# where each sequence's tokens are and where its keys live. Sequence `i` brings
# `query_lens[i]` new tokens and already has `cached_lens[i]` tokens in the cache (a
# whole prompt has none cached; a decode has one new token):
#
# * `cu_seqlens_q [B+1]` (int32): where each sequence's new tokens start and end in the
#   flat list of the step's tokens;
# * `context_lens [B]` (int32): how many keys each sequence attends to in this step —
#   does a new token see the other new tokens of its own sequence, and itself?
# * `block_tables [B, max_blocks]` (int32): each sequence's block ids, in order, padded
#   with 0 to one width;
# * `slot_mapping [T]` (int64): the cache slot where each *new* token's K and V are
#   written — at which positions of its sequence do the new tokens sit? (A slot is
#   found through the block table, as in exercise 4.)
#
# Write `ragged_metadata(query_lens, cached_lens, block_tables, block_size)`. The check
# fills a paged cache through scrambled block tables, runs the reference kernel on your
# metadata, and compares with textbook attention on each sequence.

# %%
import torch
from minilm.model.llama import AttentionMetadata
from labs import checks


def ragged_metadata(query_lens: list[int], cached_lens: list[int], block_tables: list[list[int]],
                    block_size: int) -> AttentionMetadata:
    # BEGIN SOLUTION
    # offsets: a running sum of the new tokens, starting at 0
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    # keys: the cached tokens and the new ones (a new token attends to itself and the new ones before it)
    context = [c + q for q, c in zip(query_lens, cached_lens)]
    width = max(len(t) for t in block_tables)
    tables = [t + [0] * (width - len(t)) for t in block_tables]
    # the new tokens sit at positions c .. c + q - 1, after the cached ones
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
