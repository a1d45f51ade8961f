"""The scheduler: which requests run in the next step, and how many tokens each.

Each step is planned as a list of `SeqWork`: request r computes `num_tokens` new
tokens starting at position `start` (a whole prompt, a prompt chunk, or 1 decode
token), plus `num_padding` dummy tokens that static batching computes and throws
away. A request samples its next token when its work reaches the end of its
sequence (vLLM V1's view: prefill and decode are the same thing, a request just has
`num_tokens - num_computed_tokens` tokens left to compute).

A policy is a small class with one method, `schedule(scheduler) -> list[SeqWork]`,
that uses the scheduler's helpers (`admit`, `make_room`, `preempt`) so the block
bookkeeping stays in one place. Lesson 3's exercise writes one.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

from .config import EngineConfig
from .kv_cache import BlockAllocator
from .request import Request, Status


@dataclass(slots=True)
class SeqWork:
    request: Request
    num_tokens: int          # real tokens: the request's sequence[start : start + num_tokens]
    num_padding: int = 0     # dummy tokens after them, computed and discarded (static batching)
    start: int = -1          # position of the first new token; -1: request.num_computed_tokens

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.request.num_computed_tokens

    @property
    def end(self) -> int:
        """Context length after this step (real and padding tokens)."""
        return self.start + self.num_tokens + self.num_padding

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so it samples the next."""
        r = self.request
        return self.num_tokens > 0 and not r.finished and self.start + self.num_tokens == r.num_tokens

    @property
    def kind(self) -> str:
        r = self.request
        if self.num_tokens == 1 and self.start >= r.prompt_len and self.start == r.num_tokens - 1:
            return "decode"
        return "prefill"  # a prompt, a prompt chunk, or recomputing a preempted sequence


@dataclass
class StepPlan:
    work: list[SeqWork]
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(w.num_tokens + w.num_padding for w in self.work)

    @property
    def num_real_tokens(self) -> int:
        return sum(w.num_tokens for w in self.work)


class Policy(ABC):
    """Base class of scheduling policies: a subclass defines `schedule`."""

    name = "policy"
    frees_on_finish = True  # static batching keeps a finished row's KV until its batch ends
    # The scheduler checks every plan of a policy you write (a wrong plan would corrupt the
    # KV cache silently); the built-in ones turn it off for speed, the property tests cover them.
    check_plans = True

    @abstractmethod
    def schedule(self, s: "Scheduler") -> list[SeqWork]:
        """The step's work: which requests run and how many tokens each."""

    def on_step_end(self, s: "Scheduler") -> None:
        pass


class Scheduler:
    def __init__(self, config: EngineConfig, allocator: BlockAllocator, policy: Policy):
        self.config = config
        self.allocator = allocator
        self.policy = policy
        self.pending: list[Request] = []   # not arrived yet, sorted by arrival
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []   # in admission order: the last is the newest
        self._preempted: list[Request] = []

    # ---- queues -------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = Status.PENDING
        i = len(self.pending)
        while i > 0 and self.pending[i - 1].arrival > req.arrival:
            i -= 1
        self.pending.insert(i, req)

    def admit_arrivals(self, now: float) -> None:
        while self.pending and self.pending[0].arrival <= now:
            req = self.pending.pop(0)
            req.status = Status.WAITING
            self.waiting.append(req)

    def next_arrival(self) -> float | None:
        return self.pending[0].arrival if self.pending else None

    @property
    def preempted_this_step(self) -> bool:
        """Policies admit nobody in a step that had to preempt (as vLLM does): no thrashing."""
        return bool(self._preempted)

    def has_unfinished(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    # ---- helpers for policies ----------------------------------------------
    @property
    def reserved_kv(self) -> bool:
        return self.config.kv_mode == "reserved"

    def can_admit(self, req: Request, num_tokens: int) -> bool:
        """A free slot in the batch and KV for `num_tokens` (all of `max_len` in reserved mode)."""
        need = req.max_len if self.reserved_kv else req.num_computed_tokens + num_tokens
        return len(self.running) < self.config.max_num_seqs and self.allocator.can_allocate(req.request_id, need)

    def admit(self, req: Request, num_tokens: int, now: float | None = None) -> None:
        """Move the head of the queue into the running batch and give it KV blocks."""
        assert self.waiting and self.waiting[0] is req, "admit() takes the head of the waiting queue"
        self.waiting.popleft()
        need = req.max_len if self.reserved_kv else req.num_computed_tokens + num_tokens
        self.allocator.allocate(req.request_id, need)
        req.status = Status.RUNNING
        if req.t_scheduled is None:
            req.t_scheduled = self._now if now is None else now
        self.running.append(req)

    def preempt(self, req: Request) -> None:
        """Recompute-style preemption: free its blocks, back to the head of the queue, output kept."""
        self.allocator.release(req.request_id)
        self.running.remove(req)
        req.status = Status.WAITING
        req.num_computed_tokens = 0
        req.preemptions += 1
        self.waiting.appendleft(req)
        self._preempted.append(req)

    def make_room(self, req: Request, num_tokens: int, protected: set[int]) -> bool:
        """Blocks for `num_tokens` more tokens of a running request, preempting the newest
        running requests not yet scheduled this step (`protected` holds the ids of those that
        are). Returns False when `req` itself was the newest and got preempted."""
        need = req.num_computed_tokens + num_tokens
        while not self.allocator.can_allocate(req.request_id, need):
            candidates = [r for r in self.running if id(r) not in protected]
            victim = candidates[-1]
            self.preempt(victim)
            if victim is req:
                return False
        self.allocator.allocate(req.request_id, need)
        return True

    # ---- one step -------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        self._now = now
        self._preempted = []
        self.admit_arrivals(now)
        work = self.policy.schedule(self)
        if self.policy.check_plans:
            self._check_plan(work)
        return StepPlan(work, self._preempted)

    def update(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]:
        """Advance computed tokens, append sampled tokens, retire finished requests."""
        finished = []
        for w in plan.work:
            req = w.request
            if w.num_tokens:
                req.num_computed_tokens = w.start + w.num_tokens
            if req.request_id in sampled:
                req.append_token(sampled[req.request_id])
                if req.finished:
                    finished.append(req)
                    self.running.remove(req)
                    if self.policy.frees_on_finish:
                        self.allocator.release(req.request_id)
        self.policy.on_step_end(self)
        return finished

    def _check_plan(self, work: list[SeqWork]) -> None:
        """Catch a policy's mistakes before they corrupt the cache (helps the exercises)."""
        name, tables, block_size = self.policy.name, self.allocator.tables, self.allocator.block_size
        if len({id(w.request) for w in work}) != len(work):
            raise RuntimeError(f"policy {name!r} scheduled a request twice in one step")
        for w in work:
            r = w.request
            if w.num_tokens < 0 or w.num_padding < 0 or w.num_tokens + w.num_padding == 0:
                raise RuntimeError(f"policy {name!r}: empty or negative work for {r.request_id}")
            if w.num_tokens and (r.status is not Status.RUNNING or w.start != r.num_computed_tokens
                                 or w.start + w.num_tokens > r.num_tokens):
                raise RuntimeError(
                    f"policy {name!r}: bad work for {r.request_id} (status {r.status.value}, "
                    f"start {w.start}, computed {r.num_computed_tokens}, tokens {w.num_tokens}, "
                    f"sequence length {r.num_tokens})")
            end = w.start + w.num_tokens + w.num_padding
            if end > len(tables.get(r.request_id, ())) * block_size:
                raise RuntimeError(f"policy {name!r}: {r.request_id} needs KV for {end} tokens but holds "
                                   f"{len(tables.get(r.request_id, ())) * block_size} slots")
        if len(self.running) > self.config.max_num_seqs:
            raise RuntimeError(f"policy {name!r}: {len(self.running)} running > "
                               f"max_num_seqs={self.config.max_num_seqs}")
