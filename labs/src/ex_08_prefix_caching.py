# %% [markdown]
# # Exercise 8 · The longest cached prefix
#
# With prefix caching on, a request that arrives looks in a table of cached KV blocks
# (`cache`: key -> block id) for the longest stretch at the start of its prompt that
# an earlier request already computed. The engine shares those blocks and computes only
# the rest. Write the two pieces vLLM's design needs (lesson 8 shows them at work):
#
# * `block_keys(tokens, block_size)`: the key under which each block of a sequence is
#   named in the cache, one key per block that may be named, in order;
# * `cached_prefix_len(tokens, block_size, cache)`: how many leading tokens of a new
#   prompt the engine can take from `cache` instead of computing them. The check builds
#   `cache` from earlier prompts with *your* `block_keys`, and may have evicted blocks
#   from it since.
#
# A hit must never change what the model computes: the engine may skip a token only if
# the K/V it would compute is exactly what sits in the cached block. Before you write
# code, answer three questions for yourself (lesson 8 has the pieces):
#
# 1. A token's K/V in layer 0 depends on the token and its position. What does it depend
#    on in the layers above? So what must a block's key cover, and how can a key cover it
#    without hashing the whole prompt again for every block?
# 2. A request keeps writing the K/V of its new tokens into its last, partly filled block.
#    Which of its blocks can another request safely share, and which can a new request
#    take over?
# 3. The cache stores K and V, not logits. A new prompt that is entirely cached: what must
#    the engine still compute before it can sample the first output token, and how many
#    tokens can it therefore take from the cache?
#
# Blocks are evicted one by one, so the table can hold a block whose parent is gone.
# The check tries hand-made cases (a partial block, a prompt seen before, equal tokens
# after a different start, an evicted block), checks that every key names exactly one
# prefix, and replays two real runs of the engine: your lookup must find, request by
# request, the hits the engine recorded.

# %%
from labs import checks


def block_keys(tokens: list[int], block_size: int) -> list:
    # BEGIN SOLUTION
    keys, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):  # full blocks only
        parent = (hash(parent) if parent is not None else None, tuple(tokens[start:start + block_size]))
        keys.append(parent)
    return keys
    # END SOLUTION


def cached_prefix_len(tokens: list[int], block_size: int, cache: dict) -> int:
    # BEGIN SOLUTION
    num_blocks = 0
    for key in block_keys(tokens[:-1], block_size):  # the last token is computed: it samples
        if key not in cache:
            break  # later blocks, even if cached, follow a block this request must compute
        num_blocks += 1
    return num_blocks * block_size
    # END SOLUTION

# %%
# exercise check
checks.check_prefix_lookup(block_keys, cached_prefix_len)
