"""The simulator's fast path: decodes kept in bulk, with the records the step-by-step loop
makes (docs/SIMULATOR.md, "Speed"). Most of a simulated run's Python goes to decodes: every
running request, every step, the same few lines.

`Lanes`: the running requests that decode, oldest first. Each step decodes every one of them
by one token, so a lane's state follows from the step it was last brought up to date and the
steps' end times: its new tokens are applied only when something needs them (a KV block to
fill, its last token, a step the scheduler takes whole). A step's work is then proportional
to what changes in it: the lanes that reach a block boundary or finish, and what the policy
schedules beside the decodes (partial prompts, admissions) on the step's own StepBuilder. The
policy is not asked where it could schedule nothing more (no partial prompt, and nobody
waiting or no free seat).

A lane step appends the `StepRecord`s, request records and token times `Engine.step` would,
through the same KV cache manager calls in the same order; whatever the policy could decide
otherwise (another policy, speculation, LPM order, a decode that could need a preemption) is
the scheduler's, with every lane brought up to date first. tests/test_sim_fast.py checks the
two timelines are equal, field by field. `simulated_engine(..., fast_forward=False)` runs
every step through the scheduler.
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import fields
from functools import cached_property

from ..core.engine import Engine
from ..core.kv_cache import BlockPool
from ..core.policies import ChunkedPolicy, ContinuousPolicy, StaticPolicy
from ..core.step import StepBuilder
from ..gcpause import gc_paused
from ..record import AggregateStep, StepTotals
from ..request import Request, Status
from ..timeline import StepItem, StepRecord
from .costmodel import plan_shape


class DecodeStep(StepRecord):
    """A `StepRecord` whose decodes are kept as the lanes' request ids and bases (a lane's
    context before step `offset` of the run is its base + offset: the lists are shared by
    every step the lanes did not change), and `rest` (the policy's other work): the decodes'
    `StepItem`s, then `rest`, are made when `items` is first read: the list the scheduler's
    step makes. `bulk_decodes` gives their number and `rest`, which `summarize` reads
    instead. It equals the `StepRecord` with the same fields."""

    def __init__(self, ids: list[str], starts: list[int], offset: int, rest: list, record: dict):
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
    """An `Engine` that keeps its decodes in `Lanes` (`fast = False`: never); `fast_steps`
    and `bulk_steps` count the lane steps taken without and with the policy."""

    fast, fast_steps, bulk_steps = True, 0, 0
    lanes: Lanes | None = None

    def add_workload(self, specs, **sampling) -> list:
        """`Engine.add_workload` with the cyclic GC paused, as `run` pauses it: a simulated
        workload's many token lists form no cycles, but every pass re-scanned them all."""
        with gc_paused():
            return super().add_workload(specs, **sampling)

    @property
    def shortcuts(self) -> bool:
        """Lane steps price steps with the executor's cost model: not where the clock prices
        them its own way (disaggregation.py's decode replicas price a received prompt by its
        last token), and only for our in-flight policies without speculation or LPM order."""
        c = self.config
        return (
            self.fast
            and self.clock.step_time == self.executor.step_time
            and type(self.policy) in (ContinuousPolicy, ChunkedPolicy, StaticPolicy)
            and c.speculative_config is None
            and c.scheduling_policy != "lpm"
        )

    def step(self) -> StepRecord | None:
        if self.shortcuts:
            if self.lanes is None:
                self.lanes = Lanes(self)
            record = self.lanes.step()
            if record is not None:
                return record
        return super().step()

    def step_outputs(self):
        """The scheduler's step, with every lane brought up to date first."""
        if self.lanes is not None:
            self.lanes.flush()
        return super().step_outputs()

    def abort(self, request_id: str, reason: str = "aborted") -> bool:
        if self.lanes is not None:
            self.lanes.flush()
        return super().abort(request_id, reason)


class Scheduled(set):
    """A lane step's scheduled ids: the lanes, read from their state rather than copied into
    the set every step, and what the policy schedules."""

    def __init__(self, lanes: dict[str, list[int]]):
        super().__init__()
        self.lanes = lanes

    def __contains__(self, rid: object) -> bool:
        return rid in self.lanes or set.__contains__(self, rid)


class LaneStep(StepBuilder):
    """A lane step's StepBuilder: the lanes are scheduled already, and the KV slots holding a
    token once it has run are counted from the lanes' sum and the policy's work, not read from
    every running request (whose decodes the lanes have not all applied yet)."""

    num_lanes = lanes_stored = lanes_lag = 0  # the lanes; their tokens after it; not applied
    dead_rows = False  # a static batch's: finished requests whose KV the policy keeps
    others: list[Request] = []  # the running requests that are not lanes, in running order

    def unscheduled_running(self):
        """As StepBuilder's: the lanes are scheduled, so only the others are read."""
        for req in list(self.others):
            if req.status is Status.RUNNING and req.request_id not in self.scheduled:
                yield req

    def _stored_tokens(self) -> int:
        # a prompt left out, or a static batch's dead rows, which hold KV and run no token
        if len(self.work) != len(self._running) - self.num_lanes or self.dead_rows:
            return super()._stored_tokens() + self.lanes_lag
        kv = self._kv
        repeats = sum(map(len, kv.block_tables.values())) - kv.num_used_blocks if kv.caching else 0
        return self.lanes_stored + sum(w.end for w in self.work) - repeats * kv.block_size


class Lanes:
    """The running requests that decode, in running order, each with the step `k0` its state
    was last brought to, its `base` (its context before lane step g is base + g) and the step
    in which it takes its last token. Lane step g ends at `t_ends[g]`."""

    def __init__(self, engine: Engine):
        # a weak reference: the engine holds its lanes, and lanes holding the engine back
        # would make a cycle, so a dropped engine (a 10,000-request run's millions of
        # objects) would wait for the cyclic GC, in whatever code runs next, not go at once
        self._engine, self.g, self.t_ends = weakref.ref(engine), 0, []
        self.token = engine.executor.token_id
        # record="aggregate": lane steps keep totals; a lane's token gaps are lane steps' gaps
        # (step_gaps[g]: t_ends[g] - t_ends[g - 1]), its first one its own
        self.aggregate, self.step_gaps = engine.aggregate, []
        self.flush()

    @property
    def engine(self) -> Engine:
        return self._engine()

    def flush(self) -> None:
        """Bring every lane up to date and let go of them: the scheduler takes the next step."""
        for r in getattr(self, "reqs", ()):
            self.catch_up(r, self.g)
        self.reqs: list[Request] = []  # running order; ids and bases beside them
        self.others: list[Request] = []  # the running requests that do not decode next
        self.ids: list[str] = []
        self.bases: list[int] = []
        self.keys: list[int] = []  # their serials
        self.state: dict[str, list[int]] = {}  # lane: [k0, base, last step]
        self.serial: dict[str, int] = {}  # every running request's place in running order
        self.next_serial = 0
        self.finish_at: dict[int, list[Request]] = {}
        self.touch_at: dict[int, list[Request]] = {}  # steps that call the KV cache manager
        self.sum_base = self.sum_k0 = 0
        self.synced = self.shared = False
        self.dead_kv: int | None = None  # a static batch's dead rows' KV tokens, while none dies

    def sync(self) -> None:
        """Take the running requests as the scheduler left them."""
        for r in self.engine.scheduler.running:
            self.serial[r.request_id] = self.next_serial
            self.next_serial += 1
            if not self.add(r):
                self.others.append(r)
        self.synced = True

    def add(self, r: Request) -> bool:
        """Make `r` a lane if it decodes next (one token from its next sample, past its prompt),
        from step g on; whether it became one."""
        p, g = r.num_computed_tokens, self.g
        num_prompt = len(r.prompt_ids)
        if p != num_prompt + len(r.output_ids) - 1 or p < num_prompt or r.spec_token_ids:
            return False
        if self.aggregate:  # its next gap must be the step's own (note_gaps'), else the policy's
            steps = self.engine.timeline.steps
            if not steps or r.t_last_token != steps[-1].t_end:
                return False
        self.own()
        rid, key, base = r.request_id, self.serial[r.request_id], p - g
        i = bisect.bisect(self.keys, key)
        self.reqs.insert(i, r)
        self.ids.insert(i, rid)
        self.bases.insert(i, base)
        self.keys.insert(i, key)
        params = r.params
        left = 1 if self.token in params.stop_token_ids else params.max_tokens - len(r.output_ids)
        last = g + left - 1
        self.state[rid] = [g, base, last]
        self.sum_base += base
        self.sum_k0 += g
        self.finish_at.setdefault(last, []).append(r)
        self.schedule_touch(r, base, g, last)
        return True

    def schedule_touch(self, r: Request, base: int, h: int, last: int) -> None:
        """The next step from h on in which lane r calls the KV cache manager: its position at
        a block's start (a fresh block) or, with prefix caching, at a block's end (named)."""
        kv = self.engine.kv_manager
        p, bs = base + h, kv.block_size
        d = -p % bs
        if kv.caching:
            d = min(d, -(p + 1) % bs)
        if h + d <= last:
            self.touch_at.setdefault(h + d, []).append(r)

    def own(self) -> None:
        """The lists are about to change: copy them if a record holds them."""
        if self.shared:
            self.reqs, self.ids, self.bases, self.keys = (
                self.reqs[:],
                self.ids[:],
                self.bases[:],
                self.keys[:],
            )
            self.shared = False

    def catch_up(self, r: Request, h: int) -> None:
        """Apply lane r's decodes before step h."""
        st = self.state[r.request_id]
        d = h - st[0]
        if d:
            r.num_computed_tokens += d
            r.output_ids += [self.token] * d
            if self.aggregate:  # its gaps: to its first lane step, then lane steps' own
                first = self.t_ends[st[0]] - r.t_last_token
                worst = max(first, max(self.step_gaps[st[0] + 1 : h], default=first))
                r.worst_gap = worst if r.worst_gap is None else max(r.worst_gap, worst)
                r.t_last_token = self.t_ends[h - 1]
            else:
                r.token_times += self.t_ends[st[0] : h]
            self.sum_k0 += d
            st[0] = h

    def in_order(self, reqs: list[Request]) -> list[Request]:
        if len(reqs) < 2:  # most steps: none or one
            return list(reqs)
        serial = self.serial
        return sorted(reqs, key=lambda r: serial[r.request_id])

    def step(self) -> StepRecord | None:
        """One step with every lane decoding, as `Engine.step` takes it; None, with nothing
        changed, where the scheduler must take it."""
        e = self.engine
        s, c, kv, clock, policy = e.scheduler, e.config, e.kv_manager, e.clock, e.policy
        if not self.synced:
            self.sync()
        if not self.reqs:
            return None
        g, bs, n = self.g, kv.block_size, len(self.reqs)
        state, tables = self.state, kv.block_tables
        touched = self.in_order(self.touch_at.get(g, ()))
        full = [r for r in touched if len(tables[r.request_id]) * bs <= state[r.request_id][1] + g]
        if len(full) > kv.num_free_blocks:
            return None  # a decode may need a preemption: the scheduler's
        t_start = clock.start_step()
        if s.pending and s.pending[0].arrival <= t_start:
            s.admit_arrivals(t_start)
        # a static batch admits only once its last row is done (the scheduler's step), and its
        # dead rows' padding is taken here, the policy's own list (the rows' KV is kept)
        static = type(policy) is StaticPolicy
        ask = self.others or (not static and s.waiting and len(s.running) < c.max_num_seqs)
        if ask and getattr(policy, "prefill_only_steps", False):
            return None  # a step that admits runs only prompts: the scheduler's
        # what schedule_decodes does: one token each, oldest first, KV slots from the manager;
        # without prefix caching its one change is a fresh block for a lane whose table is full
        # (allocate_slots' own test), which the pool hands out without the lane's tokens
        self.touch_at.pop(g, None)
        if kv.caching:
            for r in touched:
                self.catch_up(r, g)
                kv.allocate_slots(r, 1)
                st = state[r.request_id]
                self.schedule_touch(r, st[1], g + 1, st[2])
        else:  # each touched lane is at a block's start: its next touch is a block on
            pool = kv.pool
            if type(pool) is BlockPool:  # n blocks at once: the ones n calls of one would give
                for r, block in zip(full, pool.get_new_blocks(len(full))):
                    tables[r.request_id] = tables[r.request_id] + [block]
            else:  # a pool of your own (exercise 4): asked as schedule_running asks it
                for r in full:
                    tables[r.request_id] = tables[r.request_id] + pool.get_new_blocks(1)
            if on := [r for r in touched if state[r.request_id][2] >= g + bs]:
                self.touch_at.setdefault(g + bs, []).extend(on)
        decoded = self.sum_base + (g + 1) * n  # the lanes' context after the step
        if ask:
            step = LaneStep(c, policy, kv, (s.waiting, s.running), t_start)
            step.scheduled = Scheduled(state)
            step.budget -= n
            step.owed -= n
            step.num_lanes, step.lanes_stored = n, decoded
            step.lanes_lag, step.others = n * (g + 1) - self.sum_k0, self.others
            step.dead_rows = static
            policy.schedule(step)
            plan = step.plan()
            shape = plan_shape(plan)
            pairs = sum(q * end - q * (q - 1) // 2 for q, end in shape)
            cost = e.executor.cost.cost_of_sums(
                n + len(shape),
                n + sum(q for q, _ in shape),
                decoded + sum(end for _, end in shape),
                decoded + pairs,
            )
            output = e.executor.execute(plan)
            dt = float(cost.time)
        else:  # the plan's figures, as the KV cache stands before the finishes
            pads = policy.pad_dead_rows() if static else []
            m = len(pads)
            padded = sum(start for _, start in pads) + m  # the padded rows' context
            if static:  # each padded row holds one token more; counted again when one dies
                known = self.dead_kv
                self.dead_kv = sum(policy.kept_kv().values()) if known is None else known + m
            dt = float(
                e.executor.cost.cost_of_sums(n + m, n + m, decoded + padded, decoded + padded).time
            )
            blocks, cached_free = kv.snapshot() if c.record_kv_blocks else (None, None)
            repeats = sum(map(len, tables.values())) - kv.num_used_blocks if kv.caching else 0
            rest, fixed = (
                []
                if self.aggregate
                else [StepItem(r.request_id, "padding", 1, start + 1) for r, start in pads],
                {
                    "step": e.num_steps,
                    "t_start": t_start,
                    "t_end": t_start + dt,
                    "num_running": n,
                    "num_waiting": len(s.waiting),
                    "kv_blocks_used": kv.num_used_blocks,
                    "kv_blocks_total": c.num_blocks,
                    "num_preempted": 0,
                    "kv_blocks": blocks,
                    "kv_tokens_stored": decoded + (self.dead_kv or 0) - repeats * bs,
                    "model_time": dt,
                    "kv_cached_free": cached_free,
                    "draft_time": 0.0,
                },
            )
        clock.now = t_end = t_start + dt
        if self.aggregate:
            self.step_gaps.append(t_end - self.t_ends[-1] if self.t_ends else 0.0)
        self.t_ends.append(t_end)
        # the lanes' last tokens, as update_from_output makes them (oldest first)
        finished = self.in_order(self.finish_at.pop(g, ()))
        if finished or ask:  # a row died, or the policy padded
            self.dead_kv = None
        for r in finished:
            self.catch_up(r, g + 1)
            s.finish(r, "stop" if self.token in r.params.stop_token_ids else "length")
        if ask:
            outputs = s.update_from_output(plan, output)
            record = e.stamp(plan, outputs, output, t_start, t_end, dt)
            if not self.aggregate:
                fixed = vars(record)
                rest = fixed.pop("items")
            finished += [e.requests[o.request_id] for o in outputs if o.finish_reason]
            e.bulk_steps += 1
        else:
            e.fast_steps += 1
        if self.aggregate:  # totals: the lanes' n decodes (each gap the step's own), the policy's
            if ask:
                record.sums.decode += n
                record.sums.batch_size += n
                record.num_follow += n
            else:
                record = AggregateStep(fixed, StepTotals(decode=n, padding=m, batch_size=n), n)
        else:
            record = DecodeStep(self.ids, self.bases, g, rest, fixed)
            self.shared = True
        e.timeline.steps.append(record)
        e.num_steps += 1
        e._retire(finished, t_end)
        self.g = g + 1
        for r in finished:
            self.drop(r)
        if ask:
            for rid in plan.preempted:
                self.serial.pop(rid, None)
            admitted = []
            for w in plan.work:
                r = e.requests.get(w.request_id)  # None: finished (record="aggregate" forgets)
                if r is None or r.status is not Status.RUNNING:
                    self.serial.pop(w.request_id, None)
                    continue
                if r.request_id not in self.serial:  # admitted: at the end of the running list
                    self.serial[r.request_id] = self.next_serial
                    self.next_serial += 1
                    admitted.append(r)
                self.add(r)
            self.others = [
                r
                for r in self.others + admitted
                if r.status is Status.RUNNING and r.request_id not in self.state
            ]
        return record

    def drop(self, r: Request) -> None:
        """A finished request leaves (a lane, or one the policy scheduled)."""
        rid = r.request_id
        self.serial.pop(rid, None)
        st = self.state.pop(rid, None)
        if st is None:
            return
        self.own()
        i = self.ids.index(rid)
        del self.reqs[i], self.ids[i], self.bases[i], self.keys[i]
        self.sum_base -= st[1]
        self.sum_k0 -= st[0]
