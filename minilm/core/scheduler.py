"""The scheduler: the queues a request passes through, from arrival to its end.

    pending  added, its arrival time not reached (sorted by arrival)
    waiting  arrived, queued for a place in the batch (vLLM's `waiting`)
    running  in the batch: holds KV blocks, scheduled every step (oldest first)

It lives as long as the engine; a step's own state lives on the `StepBuilder` (step.py)
made for that step alone, so nothing of one step is left behind for the next.
"""

from __future__ import annotations

import bisect
from collections import deque

from ..config import EngineConfig
from ..plan import ModelOutput, StepPlan
from ..request import Request, Status
from .kv_cache import KVCacheManager
from .step import StepBuilder


class Scheduler:
    def __init__(self, config: EngineConfig, kv_manager: KVCacheManager, policy):
        self.config = config  # resolved: every knob has a value (builder.py)
        self.kv_manager = kv_manager
        self.policy = policy
        self.pending: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest

    def add(self, req: Request) -> None:
        req.status = Status.PENDING
        self.pending.insert(
            bisect.bisect_right(self.pending, req.arrival, key=lambda r: r.arrival), req
        )

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

    # ---- one step ----------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        """The policy plans the step on a fresh StepBuilder; its plan is the step."""
        self.admit_arrivals(now)
        if self.config.scheduling_policy == "lpm" and len(self.waiting) > 1:
            # SGLang's cache-aware order: the longest cached prefix first (stable: FCFS among equals)
            key = lambda r: -len(self.kv_manager.get_computed_blocks(r))  # noqa: E731
            self.waiting = deque(sorted(self.waiting, key=key))
        step = StepBuilder(self, now)
        self.policy.schedule(step)
        return step.plan()

    def update_from_output(self, plan: StepPlan, output: ModelOutput) -> list[Request]:
        """Advance each request's computed tokens, append what it sampled, finish those that
        stop. Returns the finished requests. A rejected draft's K/V stays in its slot until
        the next step's tokens overwrite it: only the accepted count as computed (lesson 10)."""
        finished = []
        sampled = output.sampled_token_ids
        for w in plan.work:
            req, kept = w.request, sampled.get(w.request.request_id, ())
            if w.num_new_tokens:
                rejected = len(w.draft_token_ids) - (len(kept) - 1) if w.draft_token_ids else 0
                req.num_computed_tokens = w.start + w.num_new_tokens - rejected
            req.spec_token_ids = output.draft_token_ids.get(req.request_id, [])
            for i, token in enumerate(kept):
                if req.request_id in output.logprobs:
                    req.output_logprobs.append(output.logprobs[req.request_id][i])
                reason = req.append_output(token)
                if reason is not None:
                    self.finish(req, reason)
                    finished.append(req)
                    break
        return finished

    # ---- moving requests between the queues -------------------------------------------
    def move_to_running(self, req: Request, now: float, num_cached: int) -> None:
        """The head of the waiting queue joins the batch; `num_cached` of its tokens are already in the cache."""
        self.waiting.popleft()
        req.status = Status.RUNNING
        req.num_computed_tokens = num_cached
        if req.t_scheduled is None:
            req.t_scheduled, req.num_cached_tokens = now, num_cached
        self.running.append(req)

    def preempt(self, req: Request) -> None:
        """Recompute-style preemption: free its blocks, back to the head of the queue, output kept."""
        self.kv_manager.free(req)
        self.running.remove(req)
        req.status = Status.WAITING
        req.num_computed_tokens, req.spec_token_ids = 0, []
        req.preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request, reason: str) -> None:
        """The one way a request ends (stop, length, aborted): out of its queue, and its KV
        freed once the policy lets go of it (a static batch keeps its rows' KV until its
        longest row ends: `Policy.on_finish`)."""
        {Status.PENDING: self.pending, Status.WAITING: self.waiting, Status.RUNNING: self.running}[
            req.status
        ].remove(req)
        req.status, req.finish_reason = Status.FINISHED, reason
        for r in self.policy.on_finish(req):
            self.kv_manager.free(r)
