"""The engine loop: schedule -> execute -> update -> record (DESIGN.md "One engine step").

    engine = Engine("tiny", EngineConfig(policy="chunked"))
    engine.add_request("a", prompt_ids=[1, 2, 3], max_tokens=8)
    timeline = engine.run()

`run_workload` does the same for a whole workload in one call. Building the parts
(model or simulator, KV cache, clock) happens in builder.py.
"""
from __future__ import annotations

import gc
from collections import Counter
from dataclasses import replace
from typing import Iterable

from .builder import build
from .config import EngineConfig
from .request import Request, SamplingParams
from .scheduler import Scheduler, StepPlan
from .timeline import RequestRecord, StepItem, StepRecord, Timeline
from .workload import RequestSpec


class Engine:
    """One engine: an executor (the model or the simulator), a paged KV cache, a
    scheduler with its policy, a clock and a timeline.

    `model` is a preset name ("tiny"), a shipped checkpoint ("docstrings"), a checkpoint
    directory, a `LlamaModel`, a `CostModel` (simulated; see `simulated_engine`) or an
    executor. Keyword knobs override fields of `config`.
    """

    def __init__(self, model="tiny", config: EngineConfig | None = None, *, tokenizer=None, clock=None,
                 block_pool=None, **knobs):
        parts = build(model, replace(config or EngineConfig(), **knobs), tokenizer=tokenizer, clock=clock,
                      block_pool=block_pool)
        self.config, self.policy, self.tokenizer = parts.config, parts.policy, parts.tokenizer
        self.kv_cache, self.executor, self.clock = parts.kv_cache, parts.executor, parts.clock
        self.model_config = self.executor.model_config
        self.scheduler = Scheduler(self.config, self.kv_cache, self.policy)
        self.requests: dict[str, Request] = {}
        self.timeline = Timeline(meta=self.describe())

    def describe(self) -> dict:
        c = self.config
        return {"policy": self.policy.name, "clock": self.clock.kind, "device": c.device, "dtype": c.dtype,
                **self.executor.describe(),
                "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
                "block_size": c.block_size, "num_blocks": c.num_blocks, "max_model_len": c.max_model_len,
                "kv_mode": c.kv_mode, "enable_prefix_caching": c.enable_prefix_caching,
                "scheduling_policy": c.scheduling_policy}

    # ---- requests --------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int] | None = None, *, prompt: str | None = None,
                    max_tokens: int = 16, arrival: float = 0.0, **sampling) -> Request:
        """Validate and queue one request. Raises ValueError (engine state untouched) on bad input."""
        return self.add_workload([RequestSpec(str(request_id), prompt_ids, max_tokens, arrival, prompt)], **sampling)[0]

    def make_request(self, spec: RequestSpec, **sampling) -> Request:
        if spec.prompt_ids is None and spec.prompt is None:
            raise ValueError(f"request {spec.id!r}: give prompt_ids or prompt")
        prompt_ids = spec.prompt_ids if spec.prompt_ids is not None else self.tokenizer.encode(spec.prompt)
        eos = self.model_config.eos_token_id
        return Request(spec.id, list(prompt_ids), SamplingParams(max_tokens=spec.max_tokens, **sampling),
                       float(spec.arrival), eos_token_id=self.tokenizer.eos_token_id if eos is None else eos)

    def check_request(self, req: Request) -> None:
        rid, c = req.request_id, self.config
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use; request ids must be unique")
        req.params.validate()
        if not req.prompt_ids:
            raise ValueError(f"request {rid!r}: empty prompt; a prompt needs at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in req.prompt_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {rid!r}: token id {bad[0]!r} outside the vocabulary [0, {vocab})")
        if req.max_len > c.max_model_len:
            raise ValueError(f"request {rid!r}: prompt ({req.prompt_len}) + max_tokens ({req.params.max_tokens}) "
                             f"= {req.max_len} > max_model_len={c.max_model_len}")
        if req.arrival < 0:
            raise ValueError(f"request {rid!r}: arrival={req.arrival} must be >= 0 seconds")
        blocks = self.kv_cache.blocks_needed(req, req.max_len)
        if blocks > c.num_blocks:
            raise ValueError(f"request {rid!r} needs {blocks} KV blocks at its longest but the cache has "
                             f"{c.num_blocks}; it could never run")
        self.policy.check_request(req, c)

    def add_workload(self, specs: Iterable[RequestSpec], **sampling) -> list[Request]:
        """Queue many requests; all are checked before any is added."""
        specs = list(specs)
        dup = next((i for i, n in Counter(s.id for s in specs).items() if n > 1), None)
        if dup is not None:
            raise ValueError(f"request id {dup!r} appears twice in the workload; ids must be unique")
        staged = [self.make_request(s, **sampling) for s in specs]
        for req in staged:
            self.check_request(req)
        for req in staged:
            self.requests[req.request_id] = req
            self.scheduler.add(req)
        return staged

    def abort(self, request_id: str) -> bool:
        """Stop an unfinished request now (between steps): its KV is freed and the timeline
        records it as finished with reason "aborted". False if it had already finished."""
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"request id {request_id!r} is unknown")
        if req.finished:
            return False
        self.scheduler.abort(req)
        req.t_finished = self.clock.now
        self.timeline.requests.append(request_record(req))
        self.executor.forget(request_id)
        return True

    # ---- the loop ----------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepRecord | None:
        """One engine step; None when every request has finished."""
        s, clock = self.scheduler, self.clock
        if not s.has_unfinished():
            return None
        if not s.waiting and not s.running:
            clock.wait_until(s.next_arrival())  # idle: jump to the next arrival
        t_start = clock.start_step()
        plan = s.schedule(t_start)
        if not plan.work:
            raise RuntimeError(f"policy {self.policy.name!r} scheduled nothing while "
                               f"{len(s.waiting)} request(s) wait and {len(s.running)} run")
        sampled, model_time = clock.run_model(self.executor.execute, plan)
        finished = s.update_from_output(plan, sampled)
        t_end = clock.end_step()
        return self.record(plan, sampled, finished, t_start, t_end, model_time)

    def record(self, plan: StepPlan, sampled: dict[str, int], finished: list[Request],
               t_start: float, t_end: float, model_time: float) -> StepRecord:
        """The step on the timeline (after the clock stopped: recording is not the engine's work)."""
        for rid in sampled:
            req = self.requests[rid]
            req.token_times.append(t_end)
            if req.t_first_token is None:
                req.t_first_token = t_end
        for req in finished:
            req.t_finished = t_end
            self.timeline.requests.append(request_record(req))
            self.executor.forget(req.request_id)
        items, stored = [], 0
        tables = dict(self.kv_cache.block_tables) if self.config.record_kv_blocks else None
        for w in plan.work:
            rid = w.request.request_id
            if w.num_cached:
                items.append(StepItem(rid, "cached", w.num_cached, w.num_cached))
            if w.num_tokens:
                items.append(StepItem(rid, w.kind, w.num_tokens, w.start + w.num_tokens))
            if w.num_padding:
                items.append(StepItem(rid, "padding", w.num_padding, w.end))
            stored += w.end
            if tables is not None:
                tables[rid] = w.block_table  # the table as the step ran (a finished request's is freed now)
        # KV slots holding a token: the step's requests up to their new end, the others as they were
        unscheduled = self.kv_cache.block_tables.keys() - self.scheduler.scheduled
        stored += sum(self.requests[rid].num_computed_tokens for rid in unscheduled)
        cached_free = self.kv_cache.pool.cached_free_blocks() if tables is not None and self.kv_cache.caching else None
        rec = StepRecord(len(self.timeline.steps), t_start, t_end, items, plan.num_running, plan.num_waiting,
                         plan.kv_blocks_used, self.config.num_blocks, len(plan.preempted), stored,
                         tables, model_time, cached_free)
        self.timeline.steps.append(rec)
        return rec

    def run(self, progress: bool = False) -> Timeline:
        """Step until every request has finished; returns the timeline."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(self.requests), desc=self.policy.name, unit="req", delay=2.0)
        # The timeline grows by many small records that form no reference cycles; Python's
        # cyclic GC would re-scan all of them on every full pass (a simulated run of 1,000
        # requests spent more than half its time there), so it pauses during the run.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            while self.step() is not None:
                if bar is not None:
                    bar.update(len(self.timeline.requests) - bar.n)
        finally:
            if gc_was_enabled:
                gc.enable()
        if bar is not None:
            bar.close()
        return self.timeline

    def generate(self, prompts: list[str], max_tokens: int = 32, **sampling) -> list[str]:
        """Complete a few prompts (batched by the engine's policy) and return the texts."""
        base = len(self.requests)
        reqs = self.add_workload([RequestSpec(f"gen{base + i}", None, max_tokens, prompt=p)
                                  for i, p in enumerate(prompts)], **sampling)
        while not all(r.finished for r in reqs):
            self.step()
        return [self.tokenizer.decode(r.output_ids) for r in reqs]

    def text(self, request_id: str) -> str:
        return self.tokenizer.decode(self.requests[request_id].output_ids)


def request_record(req: Request) -> RequestRecord:
    return RequestRecord(req.request_id, req.arrival, req.prompt_len, req.params.max_tokens, req.t_scheduled,
                         req.t_first_token, list(req.token_times), req.t_finished, len(req.output_ids),
                         req.finish_reason, req.preemptions, list(req.output_ids), req.num_cached_tokens)


def run_workload(specs: list[RequestSpec], model="tiny", policy="continuous", progress: bool = False,
                 sampling: dict | None = None, **knobs) -> Timeline:
    """Run one workload under one policy and return its timeline (the lab's one-liner)."""
    engine = Engine(model, policy=policy, **knobs)
    engine.add_workload(specs, **(sampling or {}))
    return engine.run(progress=progress)
