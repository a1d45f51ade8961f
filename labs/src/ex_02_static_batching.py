# %% [markdown]
# # Exercise 2 · Predict static batching's padding, then sort the queue
#
# Lesson 2, section 1 printed a static batch step by step: which rows computed a prompt
# token, a decode token or a padding token in each step. From that table, work out the
# rule, then predict the padding of any workload from its lengths alone.
#
# The workload: requests with prompt lengths `prompt_lens[i]` and output lengths
# `output_lens[i]` (with `ignore_eos`, request i generates exactly `output_lens[i]`
# tokens), all waiting from the start, served in order by `policy="static"` with
# `max_num_seqs` rows per batch (the KV cache is big enough for any batch).
#
# **Part 1.** Write `static_padding(prompt_lens, output_lens, max_num_seqs)`: the number of
# padding tokens the engine computes over the whole run. Questions to settle first:
#
# * Which requests share a batch?
# * What decides the length of every row in the prefill step?
# * What decides how many steps a batch runs after its prefill, and in how many of them
#   a row computes a real token? (Where does a request's first output token come from?)
#
# The check runs the real engine on workloads you have not seen and compares. Your
# function itself must reason, not run: while it runs, the engine is unavailable (a
# function that builds one fails, and the check says so).

# %%
from labs import checks


def static_padding(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int) -> int:
    # BEGIN SOLUTION
    total = 0
    for start in range(0, len(prompt_lens), max_num_seqs):  # batches form in arrival order
        prompts = prompt_lens[start:start + max_num_seqs]
        outputs = output_lens[start:start + max_num_seqs]
        total += sum(max(prompts) - p for p in prompts)  # prompts padded to the batch's longest
        # the batch runs max(outputs) - 1 decode steps; row i is real in output_lens[i] - 1 of them
        total += sum(max(outputs) - o for o in outputs)
    return total
    # END SOLUTION

# %%
# exercise check
checks.check_static_padding(static_padding)

# %% [markdown]
# **Part 2: sort the queue.** The engine forms static batches in arrival order. A server that
# may reorder its queue can do better: it knows every prompt's length when the request
# arrives (not the output's, which only EOS decides). Suppose it sorts the waiting
# requests by prompt length, shortest first — requests with equal prompts keep their
# arrival order — and then cuts batches of `max_num_seqs` from that order. Write
# `sorted_padding(prompt_lens, output_lens, max_num_seqs)`: the padding tokens of that
# run. (The engine does not sort; the check gives it the sorted queue.)

# %%
def sorted_padding(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int) -> int:
    # BEGIN SOLUTION
    order = sorted(range(len(prompt_lens)), key=lambda i: prompt_lens[i])  # stable: equal prompts keep their order
    return static_padding([prompt_lens[i] for i in order], [output_lens[i] for i in order], max_num_seqs)
    # END SOLUTION

# %%
# exercise check
checks.check_sorted_padding(sorted_padding)

# %% [markdown]
# **Part 3: cut where it pays.** Full batches are not the only way to cut the sorted queue.
# A batch of one long prompt pads nothing; the same prompt in a batch with short ones pads
# every short row. Suppose the server keeps the sorted order of Part 2 and the same
# **number** of batches as full ones would make (`ceil(n / max_num_seqs)`: more batches
# would cost more steps), but may choose where each batch ends, none larger than
# `max_num_seqs`. Write `least_padding(prompt_lens, output_lens, max_num_seqs)`: the least
# padding any such cut gives. (The engine always fills its batches: this is what a
# smarter static scheduler could save, so the check compares with a reference in
# `labs/checks.py`, with the engine unavailable while your function runs.)
#
# Decide first: how many ways to cut are there, and do you need to try them all? When
# you move one request from a batch to the next, which padding changes: only its prompt's?

# %%
def least_padding(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int) -> int:
    # BEGIN SOLUTION
    n = len(prompt_lens)
    order = sorted(range(n), key=lambda i: prompt_lens[i])
    prompts, outputs = [prompt_lens[i] for i in order], [output_lens[i] for i in order]
    num_batches = -(-n // max_num_seqs)
    # best[j][m]: the least padding of the first j requests in m batches (a dynamic programme:
    # the last batch is prompts[i:j] for some i, and the rest is the best of j - i fewer)
    inf = float("inf")
    best = [[inf] * (num_batches + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for j in range(1, n + 1):
        for m in range(1, num_batches + 1):
            for i in range(max(0, j - max_num_seqs), j):
                pad = static_padding(prompts[i:j], outputs[i:j], j - i)  # one batch
                best[j][m] = min(best[j][m], best[i][m - 1] + pad)
    return int(best[n][num_batches])
    # END SOLUTION

# %%
# exercise check
checks.check_least_padding(least_padding)

# %% [markdown]
# **Think further (no check).** Sorting removes prompt padding, but the bubbles of
# finished rows come from output lengths, which the server cannot know. On lesson 2's
# `mixed` workload, what share of static batching's padding can sorting remove at best?
# And what does sorting do to the longest prompt's wait, when requests keep arriving and
# shorter ones keep jumping ahead of it?
