# %% [markdown]
# # Exercise 8 · The longest cached prefix, and an order that cannot starve
#
# With prefix caching on, a request that arrives looks in a table of cached KV blocks
# (`cache`: key -> block id) for the longest stretch at the start of its prompt that
# an earlier request already computed. The engine shares those blocks and computes only
# the rest. **Part 1:** write the two pieces vLLM's design needs (lesson 8 shows them at
# work; the engine's own are `block_keys` and `PrefixCachingBlockPool.lookup` in
# `minilm/core/prefix_cache.py`: write yours before you read them):
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

# %% [markdown]
# **Part 2: longest prefix first, with a limit on waiting.** Lesson 8, section 5 ends with a
# warning: ordering the queue by the longest cached prefix (SGLang's cache-aware
# scheduling) keeps the popular prompts' cache warm, but it can pass over a request with
# a rare prompt again and again, so "an engine that orders by prefix needs a limit on
# how long a request may wait its turn". The engine's `lpm` order has no such limit:
# write one.
#
# `admission_order(waiting, now, max_wait)`: `waiting` is the queue, head first, as
# `(arrival, cached_tokens)` pairs (its arrival time in seconds, and what your
# `cached_prefix_len` found for it); `now` is the time. Return the positions in the
# queue (`0` is the head), in the order to admit them:
#
# * first every request that has waited `max_wait` seconds or more, in the order they
#   stand in the queue (which need not be their order of arrival: a preempted request
#   goes back to the head of the queue);
# * then the others, the longest cached prefix first; equal ones keep their order in
#   the queue.
#
# The check compares your order with a reference in `labs/checks.py` on hand-made queues
# (a request that has waited exactly `max_wait`, equal prefixes, a queue out of arrival
# order) and random ones.

# %%
def admission_order(waiting: list[tuple[float, int]], now: float, max_wait: float) -> list[int]:
    # BEGIN SOLUTION
    too_long = [i for i, (arrival, _) in enumerate(waiting) if now - arrival >= max_wait]
    others = [i for i in range(len(waiting)) if i not in too_long]
    return too_long + sorted(others, key=lambda i: -waiting[i][1])  # sorted() keeps equal ones in order
    # END SOLUTION

# %%
# exercise check
checks.check_admission_order(admission_order)

# %% [markdown]
# **Think further (no check).** Put your order into the engine: a `Policy` (exercise 3) can
# reorder `s.waiting` before it admits (`items = sorted(...)`, then `s.waiting.clear()` and
# `s.waiting.extend(items)`), with the engine's `scheduling_policy="fcfs"`. On lesson 8's
# stream of popular and rare system prompts, which `max_wait` keeps the rare prompts'
# worst TTFT near first-come-first-served's while keeping most of the popular prompts'
# gain? Why does any fixed `max_wait` stop protecting anyone once the load is high enough
# that every request waits that long?
