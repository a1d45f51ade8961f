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
# **Part 2: longest prefix first, with a limit on waiting.** Lesson 8b, section 2 ends with a
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
# **Part 3: the order inside the engine, judged by the oldest wait.** Write
# `MyPrefixFirstPolicy(max_wait, cached_tokens)`, a `Policy` (exercise 3) that admits in your
# `admission_order`: in-flight batching as the engine's `continuous` policy (a decode for
# every running request, then whole prompts from the head of the queue while `can_admit`
# allows), except that before it admits, it puts the waiting queue in your order.
# `cached_tokens(req)` says how many of a waiting request's prompt tokens the engine's
# prefix cache holds **now** (the check passes it in); `req.arrival` is its arrival time
# and `s.now` the step's time.
#
# What the check assumes: `admit` takes only the head of `s.waiting`, so you put the queue in
# your order with `s.reorder_waiting(order)` (`order`: every waiting request once, else an
# error), and it stays in your order: the next step's "order in the queue" is the one you
# left, as with the engine's own `lpm` order. Decide first: when in the step must the order
# be computed, and what in it can change from one step to the next? The check runs your
# policy on the simulated H100 with prefix caching (`100` requests at `30` per second behind six
# system prompts, two of them popular; `150` KV blocks, `8` seats) with `max_wait` `1.0` and
# `1.5` s, compares its steps with a reference in `labs/checks.py`, and reports the oldest
# request's wait and the median TTFT next to first-come-first-served and to the engine's
# `lpm` (no limit).

# %%
from minilm.core.policies import Policy


class MyPrefixFirstPolicy(Policy):
    name = "my-prefix-first"

    def __init__(self, max_wait: float, cached_tokens):
        self.max_wait, self.cached_tokens = max_wait, cached_tokens

    def schedule(self, s) -> None:
        # BEGIN SOLUTION
        for req in s.unscheduled_running():  # check: every running request decodes
            s.schedule_running(req, 1)
        # the order is computed every step: waits grow, and what is cached changes as requests
        # run and blocks are evicted
        queue = list(s.waiting)
        order = admission_order([(r.arrival, self.cached_tokens(r)) for r in queue], s.now,
                                self.max_wait)
        s.reorder_waiting([queue[i] for i in order])
        while s.waiting and s.can_admit(s.waiting[0], s.waiting[0].num_remaining):  # fill
            s.admit(s.waiting[0], s.waiting[0].num_remaining)
        # END SOLUTION

# %%
# exercise check
checks.check_prefix_first_policy(MyPrefixFirstPolicy)

# %% [markdown]
# **Think further (no check).** The check's line shows what the limit buys: which
# `max_wait` keeps the oldest wait near first-come-first-served's while keeping most of the
# median gain of longest-prefix-first? Why does any fixed `max_wait` stop protecting anyone
# once the load is high enough that every request waits that long (try `40` requests per
# second)? Would a limit in tokens of the cache instead of seconds do better?
