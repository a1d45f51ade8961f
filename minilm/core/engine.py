"""The engine loop: schedule -> execute -> update -> record (docs/DESIGN.md, "One step").

    engine = Engine("tiny", EngineConfig(policy="chunked"))
    engine.add_request("a", prompt_ids=[1, 2, 3], max_tokens=8)
    timeline = engine.run()

`run_workload` does the same for a whole workload in one call. Building the parts
(model or simulator, KV cache, clock) happens in builder.py; the loop reads only each
step's plan and output.
"""
from __future__ import annotations

import gc
from collections import Counter
from dataclasses import replace
from typing import Iterable

from ..config import EngineConfig, InvalidValue
from ..request import Request, SamplingParams
from ..timeline import StepRecord, Timeline
from ..workload import RequestSpec
from .builder import build
from .record import record_request, record_step
from .scheduler import Scheduler


class Engine:
    """One engine: an executor (the model or the simulator), a paged KV cache, a
    scheduler with its policy, a clock and a timeline.

    `model` is a preset name ("tiny"), a shipped checkpoint ("docstrings"), a checkpoint
    directory, a `LlamaModel`, or an executor (the simulator: `minilm.sim.simulated_engine`).
    Keyword knobs override fields of `config`.
    """

    def __init__(self, model="tiny", config: EngineConfig | None = None, *, tokenizer=None, clock=None,
                 block_pool=None, **knobs):
        parts = build(model, replace(config or EngineConfig(), **knobs), tokenizer=tokenizer, clock=clock,
                      block_pool=block_pool)
        self.config, self.policy, self.tokenizer = parts.config, parts.policy, parts.tokenizer
        self.kv_manager, self.executor, self.clock = parts.kv_manager, parts.executor, parts.clock
        self.model_config = self.executor.model_config
        self.scheduler = Scheduler(self.config, self.kv_manager, self.policy)
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

    # ---- what a server asks -------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for a place in the batch, including those whose arrival time is still ahead."""
        return len(self.scheduler.waiting) + len(self.scheduler.pending)

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks in use (vLLM's `kv_cache_usage_perc`, as a fraction)."""
        return self.kv_manager.usage

    # ---- requests --------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int] | None = None, *, prompt: str | None = None,
                    max_tokens: int = 16, arrival: float = 0.0, **sampling) -> Request:
        """Validate and queue one request. Raises InvalidValue (a ValueError; engine state
        untouched) on bad input."""
        return self.add_workload([RequestSpec(str(request_id), prompt_ids, max_tokens, arrival, prompt)], **sampling)[0]

    def add_workload(self, specs: Iterable[RequestSpec], **sampling) -> list[Request]:
        """Queue many requests; all are checked before any is added."""
        specs = list(specs)
        dup = next((i for i, n in Counter(s.id for s in specs).items() if n > 1), None)
        if dup is not None:
            raise InvalidValue("request_id", dup, "appears twice in the workload; ids must be unique")
        staged = [self.make_request(s, **sampling) for s in specs]
        for req in staged:
            self.check_request(req)
        for req in staged:
            self.requests[req.request_id] = req
            self.scheduler.add(req)
        return staged

    def make_request(self, spec: RequestSpec, **sampling) -> Request:
        if spec.prompt_ids is None and spec.prompt is None:
            raise InvalidValue("prompt", None, "give prompt_ids or prompt", spec.id)
        prompt_ids = spec.prompt_ids if spec.prompt_ids is not None else self.tokenizer.encode(spec.prompt)
        eos = self.model_config.eos_token_id
        return Request(spec.id, list(prompt_ids), SamplingParams(max_tokens=spec.max_tokens, **sampling),
                       float(spec.arrival), eos_token_id=self.tokenizer.eos_token_id if eos is None else eos)

    def check_request(self, req: Request) -> None:
        """Every check of a request, in one place: the first that fails raises InvalidValue."""
        rid, c = req.request_id, self.config
        if rid in self.requests:
            raise InvalidValue("request_id", rid, "already in use; request ids must be unique")
        req.params.validate(rid)
        if not req.prompt_ids:
            raise InvalidValue("prompt", req.prompt_ids, "empty; a prompt needs at least one token", rid)
        vocab = self.model_config.vocab_size
        bad = [t for t in req.prompt_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise InvalidValue("prompt", bad[0], f"a token id outside the vocabulary [0, {vocab})", rid)
        bad = [t for t in req.params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidValue("stop_token_ids", bad[0], f"a token id outside the vocabulary [0, {vocab})", rid)
        if req.max_len > c.max_model_len:  # OpenAI's words, which clients look for
            name, value = ("prompt", req.prompt_len) if req.prompt_len >= c.max_model_len else \
                ("max_tokens", req.params.max_tokens)
            raise InvalidValue(name, value, f"prompt ({req.prompt_len}) + max_tokens ({req.params.max_tokens}) = "
                               f"{req.max_len} tokens > max_model_len={c.max_model_len}, this model's maximum "
                               f"context length", rid, "context_length_exceeded")
        if req.arrival < 0:
            raise InvalidValue("arrival", req.arrival, "must be >= 0 seconds", rid)
        blocks = self.kv_manager.blocks_needed(req, req.max_len)
        if blocks > c.num_blocks:
            raise InvalidValue("max_tokens", req.params.max_tokens,
                               f"the request needs {blocks} KV blocks at its longest but the cache has "
                               f"{c.num_blocks}; it could never run", rid)
        self.policy.check_request(req, c)

    def abort(self, request_id: str) -> bool:
        """Stop an unfinished request now (between steps): its KV is freed and the timeline
        records it as finished with reason "aborted". False if it had already finished."""
        req = self.requests.get(request_id)
        if req is None:
            raise InvalidValue("request_id", request_id, "unknown")
        if req.finished:
            return False
        self.scheduler.finish(req, "aborted")
        self._retire([req], self.clock.now)
        return True

    # ---- the loop --------------------------------------------------------------------
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
        output, model_time = clock.timed(self.executor.execute, plan)
        finished = s.update_from_output(plan, output)
        t_end = clock.end_step()
        # the clock has stopped: what follows is bookkeeping, not the engine's work
        for rid in output.sampled_token_ids:
            req = self.requests[rid]
            req.token_times += [t_end] * (len(req.output_ids) - len(req.token_times))
            if req.t_first_token is None:
                req.t_first_token = t_end
        record = record_step(index=len(self.timeline.steps), plan=plan, t_start=t_start, t_end=t_end,
                             model_time=model_time, kv_blocks_total=self.config.num_blocks)
        self.timeline.steps.append(record)
        self._retire(finished, t_end)
        return record

    def _retire(self, finished: list[Request], t: float) -> None:
        """Finished requests (by a stop rule or an abort) leave for the timeline."""
        for req in finished:
            req.t_finished = t
            self.timeline.requests.append(record_request(req))
            self.executor.forget(req.request_id)

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


def run_workload(specs: list[RequestSpec], model="tiny", policy="continuous", progress: bool = False,
                 sampling: dict | None = None, **knobs) -> Timeline:
    """Run one workload under one policy and return its timeline (the lab's one-liner)."""
    engine = Engine(model, policy=policy, **knobs)
    engine.add_workload(specs, **(sampling or {}))
    return engine.run(progress=progress)
