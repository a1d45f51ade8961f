"""Exercise 0's checks reject known-wrong answers and accept right ones written differently."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # `labs` is a folder of the repository
from labs import checks  # noqa: E402


# ---- 1. tokens_by_kind -----------------------------------------------------------------
def tokens_loop(tl):
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals[item.kind] += item.num_tokens
    return totals


def tokens_counter(tl):  # a Counter is a dict; numbers summed a different way
    c = Counter()
    for step in tl.steps:
        for item in step.items:
            c[item.kind] += item.num_tokens
    return c


def tokens_from_items_df(tl):  # the pandas way, numpy integers in the values
    from minilm import items_df

    sums = items_df(tl).groupby("kind").num_tokens.sum()
    return {k: sums.get(k, 0) for k in ("prefill", "decode", "padding")}


def tokens_step_method(tl):  # StepRecord.tokens(kind)
    return {k: sum(s.tokens(k) for s in tl.steps) for k in ("prefill", "decode", "padding")}


def counts_items(tl):  # wrong: one per item, not its tokens (a prompt is one item of many tokens)
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals[item.kind] += 1
    return totals


def forgets_padding(tl):  # wrong: no "padding" key
    out = defaultdict(int)
    for step in tl.steps:
        for item in step.items:
            if item.kind != "padding":
                out[item.kind] += item.num_tokens
    return dict(out)


def padding_as_decode(tl):  # wrong: a padding token counted as a decode token
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals["prefill" if item.kind == "prefill" else "decode"] += item.num_tokens
    return totals


def first_step_only(tl):  # wrong: only the first step's items
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for item in tl.steps[0].items:
        totals[item.kind] += item.num_tokens
    return totals


def as_list(tl):  # wrong: not a dict
    d = tokens_loop(tl)
    return [d["prefill"], d["decode"], d["padding"]]


def from_the_requests(tl):
    # wrong: what the requests asked for (prompt, outputs after the first, padding from the steps);
    # a preempted request computes its prompt and output so far again
    return {
        "prefill": sum(r.prompt_len for r in tl.requests),
        "decode": sum(max(r.output_len - 1, 0) for r in tl.requests),
        "padding": sum(s.tokens("padding") for s in tl.steps),
    }


def prefill_context_len(
    tl,
):  # wrong: a prefill item's context_len taken for its tokens (issue 29.3: passed before)
    totals = {"prefill": 0, "decode": 0, "padding": 0}
    for step in tl.steps:
        for item in step.items:
            totals[item.kind] += item.context_len if item.kind == "prefill" else item.num_tokens
    return totals


def test_tokens_by_kind_names_context_len():
    with pytest.raises(AssertionError, match="context_len"):
        checks.check_tokens_by_kind(prefill_context_len)


def tokens_from_steps_df(tl):  # right: the engine's own counters
    from minilm import steps_df

    df = steps_df(tl)
    return {k: int(df[f"{k}_tokens"].sum()) for k in ("prefill", "decode", "padding")}


def only_kinds_seen(tl):  # right: a plain dict with only the kinds that occur would miss a key...
    out = {}
    for step in tl.steps:
        for item in step.items:
            out[item.kind] = out.get(item.kind, 0) + item.num_tokens
    return {k: out.get(k, 0) for k in ("prefill", "decode", "padding")}  # ...so it fills them in


def drops_absent_kinds(tl):  # wrong: no "padding" key on a run without padding
    out = {}
    for step in tl.steps:
        for item in step.items:
            out[item.kind] = out.get(item.kind, 0) + item.num_tokens
    return out


@pytest.mark.parametrize(
    "fn",
    [
        tokens_loop,
        tokens_counter,
        tokens_from_items_df,
        tokens_step_method,
        tokens_from_steps_df,
        only_kinds_seen,
    ],
)
def test_tokens_by_kind_accepts(fn, capsys):
    checks.check_tokens_by_kind(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn",
    [
        counts_items,
        forgets_padding,
        padding_as_decode,
        first_step_only,
        as_list,
        from_the_requests,
        drops_absent_kinds,
        prefill_context_len,
    ],
)
def test_tokens_by_kind_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_tokens_by_kind(fn)


def test_tokens_by_kind_names_preemption():
    with pytest.raises(AssertionError, match="preempted request computes its prompt"):
        checks.check_tokens_by_kind(from_the_requests)


# ---- 2. predict_tokens -----------------------------------------------------------------
def predict(specs):
    return {
        "prefill": sum(len(s.prompt_ids) for s in specs),
        "decode": sum(s.max_tokens - 1 for s in specs),
        "padding": 0,
    }


def predict_per_request(
    specs,
):  # the same, request by request, with a dict comprehension at the end
    prefill = decode = 0
    for s in specs:
        prefill += len(s.prompt_ids)
        decode += max(s.max_tokens - 1, 0)
    return {k: v for k, v in (("prefill", prefill), ("decode", decode), ("padding", 0))}


def predict_total_minus_count(
    specs,
):  # all output tokens, less the one per request that prefill makes
    return {
        "padding": 0,
        "prefill": sum(map(len, (s.prompt_ids for s in specs))),
        "decode": sum(s.max_tokens for s in specs) - len(specs),
    }


def decode_is_max_tokens(
    specs,
):  # wrong: forgets that the first token comes out of the prefill step
    return {
        "prefill": sum(len(s.prompt_ids) for s in specs),
        "decode": sum(s.max_tokens for s in specs),
        "padding": 0,
    }


def prefill_includes_first_token(
    specs,
):  # wrong: moves the first output token into the prefill count
    return {
        "prefill": sum(len(s.prompt_ids) + 1 for s in specs),
        "decode": sum(s.max_tokens - 1 for s in specs),
        "padding": 0,
    }


def counts_requests_not_tokens(specs):  # wrong: one prefill per request
    return {"prefill": len(specs), "decode": sum(s.max_tokens - 1 for s in specs), "padding": 0}


def no_padding_key(specs):  # wrong: misses a key
    return {
        "prefill": sum(len(s.prompt_ids) for s in specs),
        "decode": sum(s.max_tokens - 1 for s in specs),
    }


def decode_steps_not_tokens(specs):  # wrong: the longest request's decode steps (steps, not tokens)
    return {
        "prefill": sum(len(s.prompt_ids) for s in specs),
        "decode": max(s.max_tokens for s in specs) - 1,
        "padding": 0,
    }


@pytest.mark.parametrize("fn", [predict, predict_per_request, predict_total_minus_count])
def test_predict_tokens_accepts(fn):
    checks.check_predict_tokens(fn)


@pytest.mark.parametrize(
    "fn",
    [
        decode_is_max_tokens,
        prefill_includes_first_token,
        counts_requests_not_tokens,
        no_padding_key,
        decode_steps_not_tokens,
    ],
)
def test_predict_tokens_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_predict_tokens(fn)


# ---- 3. predict_steps -------------------------------------------------------------------
def steps_seats(specs, max_num_seqs):  # the solution: when each seat is free again
    seats = [0] * min(max_num_seqs, len(specs))
    for spec in specs:
        seat = seats.index(min(seats))
        seats[seat] += spec.max_tokens
    return max(seats, default=0)


def steps_heap(specs, max_num_seqs):  # right: a heap of finishing steps, numpy int out
    import heapq

    import numpy as np

    free = [0] * max_num_seqs
    last = 0
    for spec in specs:
        start = heapq.heappop(free)
        heapq.heappush(free, start + spec.max_tokens)
        last = max(last, start + spec.max_tokens)
    return np.int64(last)


def steps_simulated(specs, max_num_seqs):  # right: step by step, as the engine does
    queue, running, step = [s.max_tokens for s in specs], [], 0
    while queue or running:
        while queue and len(running) < max_num_seqs:
            running.append(queue.pop(0))  # admitted: its prefill step makes its first token
        running = [
            left - 1 for left in running if left > 1
        ]  # those with tokens left after this step
        step += 1
    return step


def steps_longest_only(specs, max_num_seqs):  # wrong: as if every request had a seat
    return max(s.max_tokens for s in specs)


def steps_in_waves(
    specs, max_num_seqs
):  # wrong: batches that wait for their longest, like static batching
    lengths = [s.max_tokens for s in specs]
    return sum(max(lengths[i : i + max_num_seqs]) for i in range(0, len(lengths), max_num_seqs))


def steps_average(specs, max_num_seqs):  # wrong: the work spread evenly over the seats
    return -(-sum(s.max_tokens for s in specs) // max_num_seqs)


def steps_round_robin(specs, max_num_seqs):  # wrong: request i always takes seat i % max_num_seqs
    seats = [0] * max_num_seqs
    for i, spec in enumerate(specs):
        seats[i % max_num_seqs] += spec.max_tokens
    return max(seats)


def steps_idle_step_between(specs, max_num_seqs):  # wrong: a freed seat is filled one step late
    seats = [0] * min(max_num_seqs, len(specs))
    for spec in specs:
        seat = seats.index(min(seats))
        seats[seat] += spec.max_tokens + (1 if seats[seat] else 0)
    return max(seats)


def steps_prefill_apart(specs, max_num_seqs):  # wrong: a prefill step, then max_tokens decode steps
    seats = [0] * min(max_num_seqs, len(specs))
    for spec in specs:
        seat = seats.index(min(seats))
        seats[seat] += spec.max_tokens + 1
    return max(seats)


def steps_shortest_first(specs, max_num_seqs):  # wrong: the queue served shortest first
    return steps_seats(sorted(specs, key=lambda s: s.max_tokens), max_num_seqs)


@pytest.mark.parametrize("fn", [steps_seats, steps_heap, steps_simulated])
def test_predict_steps_accepts(fn, capsys):
    checks.check_predict_steps(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn",
    [
        steps_longest_only,
        steps_in_waves,
        steps_average,
        steps_round_robin,
        steps_idle_step_between,
        steps_prefill_apart,
        steps_shortest_first,
    ],
)
def test_predict_steps_rejects(fn):
    with pytest.raises(AssertionError):
        checks.check_predict_steps(fn)


# ---- no pass by running the engine (issue 29.2) ----------------------------------------------
def tokens_by_running(specs):  # wrong: runs the engine and counts, instead of predicting
    from minilm import run_workload

    tl = run_workload(specs, policy="continuous", max_num_seqs=4, sampling={"ignore_eos": True})
    return tokens_loop(tl)


def steps_by_running(specs, max_num_seqs):  # wrong: runs the engine, and hides a failure
    from minilm import run_workload

    try:
        return len(run_workload(specs, policy="continuous", max_num_seqs=max_num_seqs).steps)
    except Exception:  # noqa: BLE001 - what a learner might write; the check must still say why
        return 0


def steps_by_simulating(specs, max_num_seqs):  # wrong: the simulator is an engine too
    from minilm.sim import simulated_engine

    engine = simulated_engine("llama-3-8b", "h100", policy="continuous", max_num_seqs=max_num_seqs)
    engine.add_workload(specs, ignore_eos=True)
    return len(engine.run().steps)


@pytest.mark.parametrize(
    "check, fn",
    [
        (checks.check_predict_tokens, tokens_by_running),
        (checks.check_predict_steps, steps_by_running),
        (checks.check_predict_steps, steps_by_simulating),
    ],
    ids=["tokens_by_running", "steps_by_running", "steps_by_simulating"],
)
def test_a_prediction_cannot_run_the_engine(check, fn):
    with pytest.raises(AssertionError, match="tried to run the engine"):
        check(fn)
    from minilm import run_workload

    assert run_workload(  # and the engine works again afterwards
        [checks.RequestSpec("r", [1, 2], 2)], policy="continuous"
    ).steps


# ---- 4. predict_finish_times (issue 29.1) -----------------------------------------------------
def finish_simulated(
    specs, max_num_seqs, step_time, *, tokens=None, at_start=False, one_token_decodes=False
):
    """The solution's simulation, with a switch for each slip the tests try."""
    queue, running, clock, done = list(specs), [], 0.0, {}
    while queue or running:
        new = []
        while queue and len(running) + len(new) < max_num_seqs:
            new.append(queue.pop(0))
        n = (tokens or (lambda new, running: sum(len(s.prompt_ids) for s in new) + len(running)))(
            new, running
        )
        start, clock = clock, clock + step_time(n)
        left = [
            [s, s.max_tokens + (1 if one_token_decodes and s.max_tokens == 1 else 0)] for s in new
        ]
        running = [[s, k - 1] for s, k in running] + [[s, k - 1] for s, k in left]
        for s, k in running:
            if k == 0:
                done[s.id] = start if at_start else clock
        running = [(s, k) for s, k in running if k > 0]
    return done


def finish_solution(specs, max_num_seqs, step_time):
    return finish_simulated(specs, max_num_seqs, step_time)


def finish_by_seat_events(
    specs, max_num_seqs, step_time
):  # right: a step index per request, priced after
    seats = [0] * min(max_num_seqs, len(specs))
    first, last = {}, {}
    for s in specs:
        seat = seats.index(min(seats))
        first[s.id], last[s.id] = seats[seat], seats[seat] + s.max_tokens - 1
        seats[seat] += s.max_tokens
    tokens = [0] * max(seats)
    for s in specs:
        tokens[first[s.id]] += len(s.prompt_ids)
        for k in range(first[s.id] + 1, last[s.id] + 1):
            tokens[k] += 1
    ends = np.cumsum([step_time(n) for n in tokens])
    return {s.id: float(ends[last[s.id]]) for s in specs}


def finish_counts_sequences(
    specs, max_num_seqs, step_time
):  # wrong: a step priced by its batch size
    return finish_simulated(
        specs, max_num_seqs, step_time, tokens=lambda new, running: len(new) + len(running)
    )


def finish_at_step_start(specs, max_num_seqs, step_time):  # wrong: the last step's start
    return finish_simulated(specs, max_num_seqs, step_time, at_start=True)


def finish_prefill_plus_decode(
    specs, max_num_seqs, step_time
):  # wrong: a prefill also counted as a decode
    return finish_simulated(
        specs,
        max_num_seqs,
        step_time,
        tokens=lambda new, running: sum(len(s.prompt_ids) + 1 for s in new) + len(running),
    )


def finish_one_token_needs_a_decode(
    specs, max_num_seqs, step_time
):  # wrong: max_tokens=1 still decodes once
    return finish_simulated(specs, max_num_seqs, step_time, one_token_decodes=True)


def finish_prefill_steps_apart(specs, max_num_seqs, step_time):
    # wrong: a step prefills the newcomers alone, and the running decodes wait for the next step
    queue, running, clock, done = list(specs), [], 0.0, {}
    while queue or running:
        new = []
        while queue and len(running) + len(new) < max_num_seqs:
            new.append(queue.pop(0))
        if new:
            clock += step_time(sum(len(s.prompt_ids) for s in new))
            for s in new:
                if s.max_tokens == 1:
                    done[s.id] = clock
            running += [[s, s.max_tokens - 1] for s in new if s.max_tokens > 1]
            continue
        clock += step_time(len(running))
        for entry in running:
            entry[1] -= 1
            if entry[1] == 0:
                done[entry[0].id] = clock
        running = [e for e in running if e[1] > 0]
    return done


def finish_per_request(
    specs, max_num_seqs, step_time
):  # wrong: each request priced alone, no batch shared
    return {s.id: step_time(len(s.prompt_ids)) + (s.max_tokens - 1) * step_time(1) for s in specs}


def finish_as_list(specs, max_num_seqs, step_time):  # wrong: not keyed by id
    return list(finish_solution(specs, max_num_seqs, step_time).values())


@pytest.mark.parametrize("fn", [finish_solution, finish_by_seat_events])
def test_predict_finish_times_accepts(fn, capsys):
    checks.check_predict_finish_times(fn)
    assert "passed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, message",
    [
        (finish_counts_sequences, "not on how many sequences"),
        (finish_at_step_start, "when its step ends"),
        (finish_prefill_plus_decode, "adds no decode token"),
        (finish_one_token_needs_a_decode, "done at"),
        (finish_prefill_steps_apart, "done at"),
        (finish_per_request, "done at"),
        (finish_as_list, "return a dict"),
    ],
)
def test_predict_finish_times_rejects(fn, message):
    with pytest.raises(AssertionError, match=message):
        checks.check_predict_finish_times(fn)
