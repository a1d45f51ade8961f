"""One step being planned: its token budget, its work, and the verbs a policy calls to
fill it. A StepBuilder lives for one step; `plan()` is its result.

A policy (policies.py) decides; the StepBuilder keeps the books, so a policy cannot
schedule a request twice, overrun the budget or touch a block it does not own: the verb
refuses with an error that names the mistake (exercise 3). Handed the scheduler's queues,
it alone moves a request between waiting and running and reorders the waiting queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from ..config import EngineConfig
from ..plan import NewRequest, SeqWork, StepPlan
from ..request import Request, Status
from .kv_cache import KVCacheManager


class StepBuilder:
    def __init__(
        self,
        config: EngineConfig,
        policy,
        kv: KVCacheManager,
        queues: tuple[deque[Request], list[Request]],
        now: float,
    ):
        self.config, self._policy, self._kv, self.now = config, policy, kv, now
        self._who = f"policy {policy.name!r}"
        self._waiting, self._running = queues
        budget = config.max_num_batched_tokens  # None: static has no budget
        self.budget = 1 << 62 if budget is None else budget  # tokens left
        self.work: list[SeqWork] = []
        self.preempted: list[Request] = []
        self.scheduled: set[str] = set()
        # running requests not yet scheduled: drafts leave each a token
        self.owed = len(self._running)
        speculative = config.speculative_config
        self.lookahead = speculative.num_lookahead_tokens if speculative else 0

    # ---- what a policy reads ----
    @property
    def waiting(self):
        """The waiting queue, head first, to read: `admit` and `reorder_waiting` move it."""
        return self._waiting

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_free_blocks(self) -> int:
        return self._kv.num_free_blocks

    def blocks_needed(self, req: Request, num_slots: int) -> int:
        """KV blocks a request that holds none would need for `num_slots` slots."""
        return self._kv.blocks_needed(req, 0, num_slots)

    def unscheduled_running(self) -> Iterator[Request]:
        """Running requests not yet scheduled, oldest first (one preempted meanwhile: skipped)."""
        for req in list(self._running):
            if req.status is Status.RUNNING and req.request_id not in self.scheduled:
                yield req

    # ---- the verbs ----
    def schedule_running(self, req: Request, num_tokens: int) -> bool:
        """Schedule `num_tokens` more tokens of a running request (a decode: and its drafts, as
        many as the budget allows). When KV blocks run out, preempt the newest running request
        not yet scheduled, until they fit; False when that was `req` itself."""
        self._check(req, num_tokens, Status.RUNNING)
        if num_tokens > self.budget:
            raise RuntimeError(
                f"{self._who}: {num_tokens} tokens with {self.budget} left of "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens}"
            )
        samples = num_tokens == req.num_remaining
        room = max(0, self.budget - num_tokens - (self.owed - 1))
        drafts = req.spec_token_ids[:room] if samples else []
        n = num_tokens + len(drafts)
        while (
            table := self._kv.allocate_slots(
                req, n, self._lookahead(req, req.num_computed_tokens + n, samples)
            )
        ) is None:
            victim = next(r for r in reversed(self._running) if r.request_id not in self.scheduled)
            self._preempt(victim)
            if victim is req:
                return False
        self.owed -= 1
        self._add_work(req, num_tokens, 0, table, drafts=drafts)
        return True

    def can_admit(
        self, req: Request, num_tokens: int, num_padding: int = 0, reserve_tokens: int = 0
    ) -> bool:
        """A free seat, budget, KV blocks, and no preemption in this step (vLLM's rule:
        admitting into a step that evicted would thrash)."""
        return self._admission(req, num_tokens, num_padding, reserve_tokens) is not None

    def admit(
        self, req: Request, num_tokens: int, *, num_padding: int = 0, reserve_tokens: int = 0
    ) -> None:
        """Move the head of the waiting queue into the batch with its first `num_tokens` after
        its cached prefix (+ `num_padding` dummies), holding at least `reserve_tokens` KV slots."""
        if not self.waiting or self.waiting[0] is not req:
            raise RuntimeError(
                f"{self._who}: admit() takes the head of the waiting queue, not {req.request_id!r}"
            )
        self._check(req, num_tokens, Status.WAITING)
        admission = self._admission(req, num_tokens, num_padding, reserve_tokens)
        if admission is None:
            raise RuntimeError(
                f"{self._who}: cannot admit {req.request_id!r} now (check can_admit first)"
            )
        computed, num_tokens, reserve_tokens = admission
        table = self._kv.allocate_slots(req, num_tokens + num_padding, reserve_tokens, computed)
        num_cached = len(computed) * self._kv.block_size
        new = None
        if req.t_scheduled is None:  # first time: the executor learns of it
            new = NewRequest(req.prompt_ids, req.params, req.eos_token_id)
            req.t_scheduled, req.num_cached_tokens = self.now, num_cached
        self._waiting.popleft()
        req.status, req.num_computed_tokens = Status.RUNNING, num_cached
        self._running.append(req)
        self._add_work(req, num_tokens, num_padding, table, num_cached, new=new)

    def reorder_waiting(self, order: list[Request]) -> None:
        """Put the waiting queue in `order`, which holds every waiting request once."""
        order, queued = list(order), {r.request_id: r for r in self._waiting}
        seen: set[str] = set()
        for req in order:
            rid = req.request_id
            if rid in seen or queued.get(rid) is not req:
                why = "twice" if rid in seen else "(not waiting)"
                raise RuntimeError(f"{self._who}: reorder_waiting() got {rid!r} {why}")
            seen.add(rid)
        if len(seen) < len(queued):
            left_out = next(rid for rid in queued if rid not in seen)
            raise RuntimeError(
                f"{self._who}: reorder_waiting() left out {left_out!r}; "
                f"the order must hold every waiting request once"
            )
        self._waiting.clear()
        self._waiting.extend(order)

    def schedule_padding(self, req: Request, start: int, num_padding: int) -> None:
        """Dummy tokens at `start : start + num_padding` of a finished request that still holds
        its KV: a dense padded batch computes them until its longest row ends (lesson 2)."""
        rid, table = req.request_id, self._kv.block_tables.get(req.request_id)
        if (
            table is None
            or req.status is not Status.FINISHED
            or rid in self.scheduled
            or start + num_padding > len(table) * self._kv.block_size
            or num_padding > self.budget
        ):
            raise RuntimeError(
                f"{self._who}: cannot pad {rid!r} by {num_padding} at {start}: only a finished "
                f"request that holds its KV, once a step, within its slots and the budget"
            )
        self.scheduled.add(rid)
        self.budget -= num_padding
        self.work.append(SeqWork(rid, [], num_padding, start, table, "padding", False))

    def plan(self) -> StepPlan:
        """The step, with the state it leaves as it runs."""
        kv = self._kv
        tables, cached_free = kv.snapshot() if self.config.record_kv_blocks else (None, None)
        return StepPlan(
            self.work,
            [r.request_id for r in self.preempted],
            len(self._running),
            len(self._waiting),
            kv.num_used_blocks,
            self._stored_tokens(),
            tables,
            cached_free,
        )

    def _stored_tokens(self) -> int:
        """KV slots holding a token once the step has run, a block shared by several tables once.
        A request ends where the policy keeps it (dead rows), where it runs, or at its new end."""
        ends = self._policy.kept_kv()
        ends.update((r.request_id, r.num_computed_tokens) for r in self._running)
        ends.update((w.request_id, w.end) for w in self.work)
        kv, bs = self._kv, self._kv.block_size
        repeats = sum(map(len, kv.block_tables.values())) - kv.num_used_blocks if kv.caching else 0
        stored = sum(ends.get(rid, len(table) * bs) for rid, table in kv.block_tables.items())
        return stored - repeats * bs

    # ---- bookkeeping ----
    def _admission(
        self, req: Request, num_tokens: int, num_padding: int, reserve_tokens: int
    ) -> tuple[list[int], int, int] | None:
        """(cached prefix blocks, tokens to compute after them, KV slots to hold), if `req`
        can be admitted now."""
        computed = self._kv.get_computed_blocks(req)
        end = len(computed) * self._kv.block_size + num_tokens
        num_tokens -= max(0, end - req.num_tokens)
        reserve_tokens = max(
            reserve_tokens, self._lookahead(req, min(end, req.num_tokens), end >= req.num_tokens)
        )
        if (
            not self.preempted
            and len(self._running) < self.config.max_num_seqs
            and num_tokens + num_padding <= self.budget
            and self._kv.can_allocate(req, num_tokens + num_padding, reserve_tokens, computed)
        ):
            return computed, num_tokens, reserve_tokens
        return None

    def _lookahead(self, req: Request, end: int, samples: bool) -> int:
        """KV slots a step ending at `end` must hold: a draft model writes its drafts' K/V past
        `end` after the step samples (lesson 10)."""
        return min(end + self.lookahead, req.max_len) if samples and self.lookahead else 0

    def _check(self, req: Request, num_tokens: int, status: Status) -> None:
        who, rid = self._who, req.request_id
        if req.status is not status:
            raise RuntimeError(f"{who}: {rid!r} is {req.status.value}, not {status.value}")
        if rid in self.scheduled:
            raise RuntimeError(f"{who}: {rid!r} is already scheduled in this step")
        if not 0 < num_tokens <= req.num_remaining:
            raise RuntimeError(
                f"{who}: {num_tokens} tokens for {rid!r}, which has "
                f"{req.num_remaining} left to compute"
            )

    def _preempt(self, req: Request) -> None:
        """Recompute-style: its blocks freed, back to the head of the queue, output kept."""
        self._kv.free(req)
        self._running.remove(req)
        req.status, req.num_computed_tokens, req.spec_token_ids = Status.WAITING, 0, []
        req.preemptions += 1
        self._waiting.appendleft(req)
        self.preempted.append(req)
        self.owed -= 1

    def _add_work(
        self,
        req: Request,
        num_tokens: int,
        num_padding: int,
        table: list[int],
        num_cached: int = 0,
        drafts: list[int] | None = None,
        new: NewRequest | None = None,
    ) -> None:
        start, rid = req.num_computed_tokens, req.request_id
        samples = start + num_tokens == req.num_tokens
        decode = num_tokens == 1 and start >= req.prompt_len and samples
        ids, kind = req.token_ids(start, num_tokens), "decode" if decode else "prefill"
        w = SeqWork(
            rid, ids, num_padding, start, table, kind, samples, num_cached, drafts or [], new
        )
        self.work.append(w)
        self.scheduled.add(rid)
        self.budget -= w.num_new_tokens + num_padding
