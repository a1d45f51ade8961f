"""The scheduler: the queues a request passes through, from arrival to its end.

    pending  added, its arrival time not reached (sorted by arrival)
    waiting  arrived, queued for a place in the batch (vLLM's `waiting`)
    running  in the batch: holds KV blocks, scheduled every step (oldest first)

A step's state, and a move between waiting and running, are the `StepBuilder`'s (step.py);
a request enters, arrives and ends here.
"""

from __future__ import annotations

import bisect
from collections import deque

from ..config import EngineConfig
from ..plan import ModelOutput, RequestOutput, StepPlan
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
        self.running: list[Request] = []  # oldest first
        self.unfinished: dict[str, Request] = {}

    def add(self, req: Request, running: bool = False) -> None:
        self.unfinished[req.request_id] = req
        if running:
            req.status = Status.RUNNING
            return self.running.append(req)
        req.status, p = Status.PENDING, self.pending
        if p and p[-1].arrival > req.arrival:
            return p.insert(bisect.bisect_right(p, req.arrival, key=lambda r: r.arrival), req)
        p.append(req)  # in arrival order (a workload's usual): no search

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

    # ---- one step ----
    def schedule(self, now: float) -> StepPlan:
        """The policy fills a fresh StepBuilder; its plan is the step."""
        self.admit_arrivals(now)
        queues = (self.waiting, self.running)
        step = StepBuilder(self.config, self.policy, self.kv_manager, queues, now)
        if self.config.scheduling_policy == "lpm" and len(self.waiting) > 1:
            # SGLang's cache-aware order: the longest cached prefix first (stable: FCFS among equals)
            key = lambda r: -len(self.kv_manager.get_computed_blocks(r))  # noqa: E731
            step.reorder_waiting(sorted(self.waiting, key=key))
        self.policy.schedule(step)
        return step.plan()

    def update_from_output(self, plan: StepPlan, output: ModelOutput) -> list[RequestOutput]:
        """Advance each request's computed tokens, append what it sampled, finish those that
        stop; what changed, per request that sampled. Only accepted drafts count as computed:
        a rejected one's K/V stays until the next step overwrites it (lesson 10)."""
        outputs = []
        sampled, logprobs = output.sampled_token_ids, output.logprobs
        for w in plan.work:
            if not w.num_new_tokens:
                continue  # padding: a finished row's
            rid = w.request_id
            req, kept = self.unfinished[rid], sampled.get(rid, ())
            drafts = len(w.draft_token_ids)
            accepted = len(kept) - 1 if drafts else 0
            req.num_computed_tokens = w.start + w.num_new_tokens - drafts + accepted
            req.spec_token_ids = output.draft_token_ids.get(rid, [])
            if not kept:
                continue  # a chunk: nothing sampled
            for n, token in enumerate(kept, 1):
                if (reason := req.append_output(token)) is not None:
                    kept = kept[:n]  # the tokens after a stop are dropped
                    break
            lps = logprobs[rid][: len(kept)] if rid in logprobs else None
            outputs.append(RequestOutput(rid, list(kept), reason, lps, accepted))
            req.output_logprobs += lps or ()
            if reason is not None:
                self.finish(req, reason)
        return outputs

    def finish(self, req: Request, reason: str) -> None:
        """The one way a request ends (stop, length, aborted): out of its queue, its KV freed
        once the policy lets go of it (`Policy.on_finish`)."""
        {Status.PENDING: self.pending, Status.WAITING: self.waiting, Status.RUNNING: self.running}[
            req.status
        ].remove(req)
        req.status, req.finish_reason = Status.FINISHED, reason
        del self.unfinished[req.request_id]
        for r in self.policy.on_finish(req):
            self.kv_manager.free(r)
