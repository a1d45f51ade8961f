"""The simulator's fast path: decodes taken in bulk, with the records the step-by-step loop
makes (docs/SIMULATOR.md, "Speed"). Most of a simulated run's Python goes to decodes: every
running request, every step, the same few lines.

`fast_forward`: between two events (an arrival that could be admitted, a request that
finishes, a KV block that might not be there) a continuous or chunked batch does the same
thing every step: each running request decodes one token. Which steps those are follows from
the state the last real step left: when the next arrival comes (the step times are the cost
model's, known ahead), when the first request reaches its `max_tokens`, and at which steps a
request fills its last block and needs a fresh one. They are taken without asking the policy,
through the same KV cache manager calls in the same order.

`bulk_step`: any other step with decodes in it has them scheduled, run and recorded in one
loop; the policy schedules the rest (partial prompts, admissions) on the step's StepBuilder.

Both append the `StepRecord`s, request records and token times `Engine.step` would; whatever
the policy could decide otherwise is left to the scheduler. tests/test_sim_fast.py checks the
two timelines are equal, field by field. `simulated_engine(..., fast_forward=False)` runs
every step through the scheduler.
"""

from __future__ import annotations

import gc
from dataclasses import fields
from functools import cached_property

from ..core.engine import Engine
from ..core.policies import ChunkedPolicy, ContinuousPolicy
from ..core.step import StepBuilder
from ..timeline import StepItem, StepRecord
from .costmodel import plan_shape


class DecodeStep(StepRecord):
    """A `StepRecord` whose decodes are kept as the batch's request ids and their contexts
    before step 0 of a run (shared by the run's steps), and this step's offset in it: the
    decodes' `StepItem`s, then `rest` (the policy's other work), are made when `items` is first
    read: the list the scheduler's step makes. `bulk_decodes` gives their number and `rest`,
    which `summarize` reads instead. It equals the `StepRecord` with the same fields."""

    def __init__(self, ids: list[str], starts: list[int], offset: int, rest: list, **record):
        self.__dict__.update(record)  # every StepRecord field but items
        self.ids, self.starts, self.offset, self.rest = ids, starts, offset, rest

    def bulk_decodes(self) -> tuple[int, list[StepItem]]:
        return len(self.ids), self.rest

    @cached_property
    def items(self) -> list[StepItem]:
        j = self.offset + 1
        return [StepItem(rid, "decode", 1, p + j) for rid, p in zip(self.ids, self.starts)] + [
            *self.rest
        ]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepRecord):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(StepRecord))

    __hash__ = None


class SimulatedEngine(Engine):
    """An `Engine` that takes decode-only stretches in one go and each step's decodes in bulk
    (`fast = False`: neither); `fast_steps` and `bulk_steps` count the steps taken each way."""

    fast, fast_steps, bulk_steps = True, 0, 0

    def add_workload(self, specs, **sampling) -> list:
        """`Engine.add_workload` with the cyclic GC paused, as `run` pauses it: a simulated
        workload's many token lists form no cycles, but every pass re-scanned them all."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return super().add_workload(specs, **sampling)
        finally:
            if was_enabled:
                gc.enable()

    @property
    def shortcuts(self) -> bool:
        """Both price steps with the executor's cost model: not where the clock prices them its
        own way (disaggregation.py's decode replicas price a received prompt by its last token)."""
        return self.fast and self.clock.step_time == self.executor.step_time

    def step(self) -> StepRecord | None:
        record = bulk_step(self) if self.shortcuts else None
        if record is None:
            return super().step()
        self.bulk_steps += 1
        return record

    def fast_forward(self) -> None:
        if self.shortcuts:
            self.fast_steps += fast_forward(self)


def bulk_step(engine: Engine) -> StepRecord | None:
    """One step as `Engine.step` takes it, with the decodes scheduled, run and recorded in one
    loop and the policy left to schedule the rest (partial prompts, admissions) on the step's
    StepBuilder. None, with nothing changed, where the policy might decide a decode otherwise:
    another policy, speculation, LPM order, a decode that could need a preemption."""
    s, c, kv, clock, policy = (
        engine.scheduler,
        engine.config,
        engine.kv_manager,
        engine.clock,
        engine.policy,
    )
    if (
        not s.running
        or type(policy) not in (ContinuousPolicy, ChunkedPolicy)
        or getattr(policy, "prefill_only_steps", False)
        or c.speculative_config is not None
        or c.scheduling_policy == "lpm"
    ):
        return None
    bs, tables, caching = kv.block_size, kv.block_tables, kv.caching
    decodes, starts, touch, grow = [], [], [], 0
    for r in s.running:
        p, num_prompt = r.num_computed_tokens, len(r.prompt_ids)
        if p == num_prompt + len(r.output_ids) - 1:
            if p < num_prompt:
                return None  # a prompt's last token: schedule_decodes takes it, as a prefill
            decodes.append(r)
            starts.append(p)
            if p % bs == 0 or (caching and (p + 1) % bs == 0):
                touch.append(r)
                grow += len(tables[r.request_id]) * bs <= p
    ids = [r.request_id for r in decodes]
    if not decodes or grow > kv.num_free_blocks:
        return None
    t_start = clock.start_step()
    s.admit_arrivals(t_start)
    step = StepBuilder(c, policy, kv, (s.waiting, s.running), t_start)
    # what schedule_decodes does: one token each, oldest first, KV slots from the manager
    for r in touch:
        kv.allocate_slots(r, 1)
    n = len(decodes)
    step.scheduled.update(ids)
    step.budget -= n
    step.owed -= n
    policy.schedule(step)
    plan = step.plan()  # the rest of the step's work; its stored tokens miss the decodes' new ones
    plan.kv_tokens_stored += n
    shape = plan_shape(plan)
    decoded = sum(starts) + n  # the decodes' context after the step
    context = decoded + sum(e for _, e in shape)  # shape: (tokens, context after) of the rest
    pairs = decoded + sum(q * e - q * (q - 1) // 2 for q, e in shape)
    dt = float(
        engine.executor.cost.cost_of_sums(
            n + len(shape), n + sum(q for q, _ in shape), context, pairs
        ).time
    )
    output = engine.executor.execute(plan)
    clock.now = t_end = t_start + dt
    token, finished = engine.executor.token_id, []
    # update_from_output's work for a decode (no drafts: spec_token_ids stays empty), then the engine's
    for r, p in zip(decodes, starts):
        r.num_computed_tokens = p + 1
        r.token_times.append(t_end)
        out, params = r.output_ids, r.params
        if len(out) + 1 < params.max_tokens and not params.stop_token_ids:
            out.append(token)  # the placeholder is never EOS: nothing else can stop it
        elif (reason := r.append_output(token)) is not None:
            s.finish(r, reason)
            finished.append(r)
    outputs = s.update_from_output(plan, output)
    record = engine.stamp(plan, outputs, output, t_start, t_end, dt)
    record = DecodeStep(
        ids,
        starts,
        0,
        record.items,
        **{f.name: getattr(record, f.name) for f in fields(StepRecord) if f.name != "items"},
    )
    engine.timeline.steps.append(record)
    engine.num_steps += 1
    finished += [engine.requests[o.request_id] for o in outputs if o.finish_reason]
    engine._retire(finished, t_end)
    return record


def decode_run(engine: Engine) -> list | None:
    """The running requests, oldest first, if the next step is a plain decode of all of them
    whatever the policy's details: an in-flight policy (ours, not a subclass), no speculation,
    every running request one token from its next sample, past its prompt, and nothing the
    waiting queue could change (empty, or every seat taken)."""
    s, c = engine.scheduler, engine.config
    running, full = s.running, len(s.running) >= c.max_num_seqs
    if (
        not running
        or (not full and (s.waiting or (s.pending and s.pending[0].arrival <= engine.clock.now)))
        or type(engine.policy) not in (ContinuousPolicy, ChunkedPolicy)
        or c.speculative_config is not None
        or len(engine.kv_manager.block_tables) != len(running)
        or (c.scheduling_policy == "lpm" and len(s.waiting) + len(s.pending) > 1)
    ):
        return None
    for r in running:
        p, num_prompt = r.num_computed_tokens, len(r.prompt_ids)
        if p != num_prompt + len(r.output_ids) - 1 or p < num_prompt or r.spec_token_ids:
            return None
    return running


def fast_forward(engine: Engine) -> int:
    """Take the steps that are plain decodes of the whole batch, up to and including the first
    in which a request finishes; how many were taken (0: the next step is the scheduler's)."""
    running = decode_run(engine)
    if running is None:
        return 0
    running = list(running)  # finishing takes requests out of the scheduler's list
    s, kv, clock, c = engine.scheduler, engine.kv_manager, engine.clock, engine.config
    executor = engine.executor
    token, cost, bs = executor.token_id, executor.cost, kv.block_size
    B, full = len(running), len(running) >= c.max_num_seqs
    # steps until each request's last token: its max_tokens, or 1 if the placeholder stops it
    left = [
        1 if token in r.params.stop_token_ids else r.params.max_tokens - len(r.output_ids)
        for r in running
    ]
    k_max = min(left)
    start = [r.num_computed_tokens for r in running]  # each one's position at step 0
    tables = [kv.block_tables[r.request_id] for r in running]
    context0 = sum(start) + B
    # a step that needs a fresh block (position at a block's start) or names a full one
    # (prefix caching) calls the KV cache manager as the scheduler would, in running order;
    # which requests depends on the step's place in a block: step j touches touch_at[j % bs]
    touch_at: dict[int, list[int]] = {}
    for i, p in enumerate(start):
        touch_at.setdefault(-p % bs, []).append(i)
        if kv.caching:
            touch_at.setdefault(-(p + 1) % bs, []).append(i)
    if kv.caching:
        touch_at = {q: sorted(set(v)) for q, v in touch_at.items()}
    repeats = sum(map(len, kv.block_tables.values())) - kv.num_used_blocks if kv.caching else 0
    ids = [r.request_id for r in running]
    done = [0] * B  # steps applied to each request's state so far
    t_ends: list[float] = []
    records: list[StepRecord] = []
    pending, record_blocks = s.pending, c.record_kv_blocks
    step_index = engine.num_steps

    def catch_up(i: int, j: int) -> None:
        """Bring request i's state to the start of step j (steps before it applied)."""
        r, d = running[i], j - done[i]
        if d:
            r.num_computed_tokens += d
            r.output_ids += [token] * d
            r.token_times += t_ends[done[i] : j]
            done[i] = j

    for j in range(k_max):
        t_start = clock.now
        if pending and pending[0].arrival <= t_start:
            if not full:
                break  # an arrival the policy may admit: the scheduler's step
            s.admit_arrivals(t_start)
        touched = touch_at.get(j % bs, ())
        if touched:
            need = sum(1 for i in touched if len(tables[i]) * bs <= start[i] + j)
            if need > kv.num_free_blocks:
                break  # a block may run out: the scheduler preempts
            for i in touched:
                catch_up(i, j)
                tables[i] = kv.allocate_slots(running[i], 1)
        blocks, cached_free = kv.snapshot() if record_blocks else (None, None)
        context = context0 + j * B
        dt = float(cost.cost_of_sums(B, B, context, context).time)
        clock.now = t_end = t_start + dt
        t_ends.append(t_end)
        records.append(
            DecodeStep(
                ids,
                start,
                j,
                [],
                step=step_index + j,
                t_start=t_start,
                t_end=t_end,
                num_running=B,
                num_waiting=len(s.waiting),
                kv_blocks_used=kv.num_used_blocks,
                kv_blocks_total=c.num_blocks,
                num_preempted=0,
                kv_blocks=blocks,
                kv_tokens_stored=context - repeats * bs,
                model_time=dt,
                kv_cached_free=cached_free,
                draft_time=0.0,
            )
        )
    k = len(records)
    if not k:
        return 0
    for i in range(B):
        catch_up(i, k)
    engine.timeline.steps += records
    engine.num_steps += k
    if k == k_max:  # the last step's finishes, as update_from_output makes them
        finished = [r for r, n in zip(running, left) if n == k]
        for r in finished:
            s.finish(r, "stop" if token in r.params.stop_token_ids else "length")
        engine._retire(finished, t_ends[-1])
    return k
