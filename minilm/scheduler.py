"""The scheduler: which requests run in the next step, and how many tokens each.

A step is planned as a list of `SeqWork`: request r computes `num_tokens` new tokens
starting at position `start` (a whole prompt, a prompt chunk, or 1 decode token),
plus `num_padding` dummy tokens that static batching computes and throws away. A
request samples its next token when its work reaches the end of its sequence (vLLM
V1's view: prefill and decode are the same thing, a request just has
`num_tokens - num_computed_tokens` tokens left to compute).

The policy decides; the scheduler keeps the books. A policy (policies.py) calls the
scheduler's verbs — `schedule_running`, `admit`, `schedule_padding` — and each verb
checks its request, asks the KV cache manager for slots, preempts when blocks run
out, and charges the step's token budget. So a policy cannot schedule a request
twice, overrun the budget or touch a block it does not own: the verb refuses with
an error that names the mistake (which helps exercise 3).
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from .config import EngineConfig
from .kv_cache import KVCacheManager
from .request import Request, Status


@dataclass(slots=True)
class SeqWork:
    """One request's share of a step. Fixed when scheduled: the runner and the timeline
    read it after the step has changed the request."""

    request: Request
    num_tokens: int          # real tokens: the request's sequence[start : start + num_tokens]
    num_padding: int         # dummy tokens after them, computed and discarded (static batching)
    start: int               # position of the first new token
    end: int                 # context length after this step: start + num_tokens + num_padding
    block_table: list[int]   # the request's KV blocks for this step
    kind: str                # decode | prefill (a prompt, a chunk, or recomputing a preempted sequence)
    samples: bool            # this step computes the sequence's last token, so it samples the next
    num_cached: int = 0      # tokens before `start` found in the prefix cache when admitted: no compute


@dataclass
class StepPlan:
    """What the scheduler decided for one step, and the state it left as the step runs."""

    work: list[SeqWork]
    preempted: list[Request]
    num_running: int
    num_waiting: int
    kv_blocks_used: int

    @property
    def num_tokens(self) -> int:
        return sum(w.num_tokens + w.num_padding for w in self.work)


class Scheduler:
    def __init__(self, config: EngineConfig, kv_cache: KVCacheManager, policy):
        self.config = config  # resolved: every knob has a value (builder.py)
        self.kv_cache = kv_cache
        self.policy = policy
        self.pending: list[Request] = []   # not arrived yet, sorted by arrival
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []   # in admission order: the last is the newest
        # Static batching holds a batch's KV until its last row ends (`admit(hold_kv=True)`):
        # each held request's id -> its batch (one list shared by the batch's rows).
        self.held: dict[str, list[Request]] = {}
        self._new_batch: list[Request] | None = None
        # this step
        self.now = 0.0
        self.budget = 0
        self.work: list[SeqWork] = []
        self.preempted: list[Request] = []
        self.scheduled: set[str] = set()

    # ---- queues -------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = Status.PENDING
        self.pending.insert(bisect.bisect_right(self.pending, req.arrival, key=lambda r: r.arrival), req)

    def admit_arrivals(self, now: float) -> None:
        arrived = bisect.bisect_right(self.pending, now, key=lambda r: r.arrival)
        for req in self.pending[:arrived]:
            req.status = Status.WAITING
            self.waiting.append(req)
        del self.pending[:arrived]

    def next_arrival(self) -> float:
        return self.pending[0].arrival

    def has_unfinished(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    # ---- one step -------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        self.admit_arrivals(now)
        if self.config.scheduling_policy == "lpm" and len(self.waiting) > 1:
            # SGLang's cache-aware order: the longest cached prefix first (stable: FCFS among equals)
            self.waiting = deque(sorted(self.waiting, key=lambda r: -len(self.kv_cache.get_computed_blocks(r))))
        budget = self.config.max_num_batched_tokens
        self.now, self.budget = now, budget if budget is not None else 1 << 62  # static: no budget
        self.work, self.preempted, self.scheduled = [], [], set()
        self._new_batch = None
        self.policy.schedule(self)
        return StepPlan(self.work, self.preempted, len(self.running), len(self.waiting),
                        self.kv_cache.num_used_blocks)

    def update_from_output(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]:
        """Advance computed tokens, append sampled tokens, retire finished requests and
        free their KV (a held static batch: when its last row ends)."""
        finished = []
        for w in plan.work:
            req = w.request
            req.num_computed_tokens = w.start + w.num_tokens if w.num_tokens else w.end
            token = sampled.get(req.request_id)
            if token is None:
                continue
            req.append_token(token)
            if req.finished:
                finished.append(req)
                self.running.remove(req)
                self.release(req)
        return finished

    def release(self, req: Request) -> None:
        """Free a finished request's KV, or, for a row of a held batch, the whole batch's once
        its last row has finished."""
        batch = self.held.get(req.request_id)
        if batch is None:
            self.kv_cache.free(req)
        elif all(r.finished for r in batch):
            for r in batch:
                del self.held[r.request_id]
                self.kv_cache.free(r)

    # ---- the verbs policies use -------------------------------------------------
    def unscheduled_running(self) -> Iterator[Request]:
        """Running requests not yet scheduled this step, oldest first. A request that is
        preempted while the policy walks this list is skipped."""
        for req in list(self.running):
            if req.status is Status.RUNNING and req.request_id not in self.scheduled:
                yield req

    def schedule_running(self, req: Request, num_tokens: int) -> bool:
        """Schedule `num_tokens` more tokens of a running request. When KV blocks run out,
        preempt the newest running request not yet scheduled this step, until the blocks
        fit; False when that was `req` itself (it went back to the queue)."""
        self._check(req, num_tokens, Status.RUNNING)
        self._check_budget(num_tokens)
        while (table := self.kv_cache.allocate_slots(req, num_tokens)) is None:
            victim = next(r for r in reversed(self.running) if r.request_id not in self.scheduled)
            self.preempt(victim)
            if victim is req:
                return False
        self._add_work(req, num_tokens, 0, req.num_computed_tokens, table)
        return True

    def can_admit(self, req: Request, num_tokens: int, num_padding: int = 0, reserve_tokens: int = 0) -> bool:
        """Whether `admit` would succeed: a free slot in the batch, budget and KV blocks,
        and no preemption this step (as vLLM: nobody is admitted into a step that had to
        evict someone, or the two would thrash)."""
        return self._admission(req, num_tokens, num_padding, reserve_tokens) is not None

    def _admission(self, req: Request, num_tokens: int, num_padding: int,
                   reserve_tokens: int) -> tuple[list[int], int] | None:
        """(its cached prefix blocks, the tokens left to compute) if `req` can be admitted now, else None."""
        computed = self.kv_cache.get_computed_blocks(req)
        num_tokens = self.uncached(req, num_tokens, computed)
        if (not self.preempted and len(self.running) < self.config.max_num_seqs
                and num_tokens + num_padding <= self.budget
                and self.kv_cache.can_allocate(req, num_tokens + num_padding, reserve_tokens, computed)):
            return computed, num_tokens
        return None

    def admit(self, req: Request, num_tokens: int, *, num_padding: int = 0, reserve_tokens: int = 0,
              hold_kv: bool = False) -> None:
        """Move the head of the queue into the running batch and schedule its first
        `num_tokens` (+ `num_padding`). With prefix caching, its cached prefix is shared
        and needs no compute: fewer tokens are scheduled, starting after it.
        `reserve_tokens`: KV slots to hold from now on (static batching reserves a padded
        row). `hold_kv`: keep its KV until every request admitted with it in this step
        has finished (static batching's dense batch)."""
        if not self.waiting or self.waiting[0] is not req:
            raise RuntimeError(f"policy {self.policy.name!r}: admit() takes the head of the waiting queue, "
                               f"not {req.request_id!r}")
        self._check(req, num_tokens, Status.WAITING)
        admission = self._admission(req, num_tokens, num_padding, reserve_tokens)
        if admission is None:
            raise RuntimeError(f"policy {self.policy.name!r}: cannot admit {req.request_id!r} now "
                               f"(check can_admit first)")
        computed, num_tokens = admission
        table = self.kv_cache.allocate_slots(req, num_tokens + num_padding, reserve_tokens, computed)
        self.waiting.popleft()
        req.status = Status.RUNNING
        req.num_computed_tokens = num_cached = len(computed) * self.kv_cache.block_size
        if req.t_scheduled is None:
            req.t_scheduled, req.num_cached_tokens = self.now, num_cached
        self.running.append(req)
        if hold_kv:
            if self._new_batch is None:
                self._new_batch = []
            self._new_batch.append(req)
            self.held[req.request_id] = self._new_batch
        self._add_work(req, num_tokens, num_padding, num_cached, table, num_cached)

    def uncached(self, req: Request, num_tokens: int, computed: list[int]) -> int:
        """Of the `num_tokens` a policy asks for, those left to compute after the cached prefix."""
        return min(num_tokens, req.num_tokens - len(computed) * self.kv_cache.block_size)

    def schedule_padding(self, rows: list[Request], num_padding: int) -> None:
        """Dummy tokens for the finished rows of a held batch: a dense padded batch still
        computes them until its longest row ends (lesson 2)."""
        block_size, tables = self.kv_cache.block_size, self.kv_cache.block_tables
        for req in rows:
            rid, start = req.request_id, req.num_computed_tokens
            table = tables.get(rid) if rid in self.held else None
            # one test on the hot path (a simulated static run pads a few hundred thousand rows)
            if (table is None or req.status is not Status.FINISHED or rid in self.scheduled
                    or start + num_padding > len(table) * block_size or num_padding > self.budget):
                raise RuntimeError(f"policy {self.policy.name!r}: cannot pad {rid!r} by {num_padding}: padding is "
                                   f"for finished rows of a held batch, once a step, within their KV slots and "
                                   f"the budget")
            self.scheduled.add(rid)
            self.budget -= num_padding
            self.work.append(SeqWork(req, 0, num_padding, start, start + num_padding, table, "padding", False))

    def preempt(self, req: Request) -> None:
        """Recompute-style preemption: free its blocks, back to the head of the queue, output kept."""
        self.kv_cache.free(req)
        self.running.remove(req)
        req.status = Status.WAITING
        req.num_computed_tokens = 0
        req.preemptions += 1
        self.waiting.appendleft(req)
        self.preempted.append(req)

    def abort(self, req: Request) -> None:
        """Drop an unfinished request (its client went away): out of its queue, and its KV
        freed at once (a row of a held static batch keeps it until the batch ends)."""
        {Status.PENDING: self.pending, Status.WAITING: self.waiting, Status.RUNNING: self.running}[req.status].remove(req)
        req.status, req.finish_reason = Status.FINISHED, "aborted"
        self.release(req)

    # ---- bookkeeping ------------------------------------------------------------
    def _check(self, req: Request, num_tokens: int, status: Status) -> None:
        name, rid = self.policy.name, req.request_id
        if req.status is not status:
            raise RuntimeError(f"policy {name!r}: {rid!r} is {req.status.value}, not {status.value}")
        if rid in self.scheduled:
            raise RuntimeError(f"policy {name!r}: {rid!r} is already scheduled in this step")
        if not 0 < num_tokens <= req.num_remaining:
            raise RuntimeError(f"policy {name!r}: {num_tokens} tokens for {rid!r}, which has "
                               f"{req.num_remaining} left to compute")

    def _check_budget(self, num_tokens: int) -> None:
        if num_tokens > self.budget:
            raise RuntimeError(f"policy {self.policy.name!r}: {num_tokens} tokens with {self.budget} left of "
                               f"max_num_batched_tokens={self.config.max_num_batched_tokens}")

    def _add_work(self, req: Request, num_tokens: int, num_padding: int, start: int, table: list[int],
                  num_cached: int = 0) -> None:
        samples = start + num_tokens == req.num_tokens
        decode = num_tokens == 1 and start >= req.prompt_len and samples
        self.work.append(SeqWork(req, num_tokens, num_padding, start, start + num_tokens + num_padding, table,
                                 "decode" if decode else "prefill", samples, num_cached))
        self.scheduled.add(req.request_id)
        self.budget -= num_tokens + num_padding
