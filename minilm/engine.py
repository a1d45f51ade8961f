"""The engine loop: schedule -> run -> sample -> update -> record (DESIGN.md "One engine step").

    engine = Engine("tiny", EngineConfig(policy="chunked"))
    engine.add_request("a", prompt_ids=[1, 2, 3], max_tokens=8)
    timeline = engine.run()

`run_workload` does the same for a whole workload in one call.
"""
from __future__ import annotations

import gc
from collections import Counter
from dataclasses import replace
from typing import Iterable

import torch

from .attention import BACKENDS
from .clock import MeasuredClock
from .config import EngineConfig, ModelConfig
from .kv_cache import BlockAllocator, allocate_kv_tensor, cdiv, num_blocks_for_budget
from .loader import load_model, resolve_dtype
from .model import LlamaModel
from .policies import make_policy
from .request import Request, SamplingParams
from .runner import ModelExecutor
from .scheduler import Scheduler, StepPlan
from .timeline import RequestRecord, StepItem, StepRecord, Timeline
from .tokenizer import ByteTokenizer, load_tokenizer
from .workload import RequestSpec


def default_backend(device: str) -> str:
    return "triton" if torch.device(device).type == "cuda" else "reference"


class Engine:
    """One engine: a model (or a simulator), a paged KV cache, a scheduler and a timeline.

    `model` is a preset name ("tiny"), a checkpoint directory, or a `LlamaModel`.
    Pass `executor` and `clock` to run without a model (the simulator, costmodel.py);
    then `model_config` describes the model being simulated.
    """

    def __init__(self, model: str | LlamaModel | None = "tiny", config: EngineConfig | None = None, *,
                 tokenizer=None, executor=None, clock=None, model_config: ModelConfig | None = None,
                 model_name: str | None = None, **knobs):
        config = replace(config or EngineConfig(), **knobs)
        config.validate()
        if config.attention_backend is not None and config.attention_backend not in BACKENDS:
            raise ValueError(f"attention_backend={config.attention_backend!r}; allowed: {', '.join(BACKENDS)}")
        self.policy = make_policy(config.policy)
        if executor is None:
            if not isinstance(model, LlamaModel):
                model_name = model_name or str(model)
                tokenizer = tokenizer or load_tokenizer(_checkpoint_dir(model))
                model = load_model(model, device=config.device, dtype=config.dtype, seed=config.seed)
            model_config = model.config
        self.model_config = model_config
        self.model_name = model_name or getattr(model_config, "name", "model")
        self.config = config
        self.tokenizer = tokenizer or ByteTokenizer()
        num_blocks = self.resolve_num_blocks(config, model_config)
        self.allocator = BlockAllocator(num_blocks, config.block_size)
        if executor is None:
            if torch.device(config.device).type == "cpu":
                torch.set_num_threads(config.cpu_threads)
            backend = config.attention_backend or default_backend(config.device)
            kv = allocate_kv_tensor(model_config, num_blocks, config.block_size,
                                    resolve_dtype(config.dtype), config.device)
            executor = ModelExecutor(model, kv, self.allocator, backend, pad_token_id=0)
            self.backend = backend
        else:
            self.backend = getattr(executor, "kind", "custom")
        self.executor = executor
        self.clock = clock or MeasuredClock(config.device)
        self.scheduler = Scheduler(config, self.allocator, self.policy)
        self.requests: dict[str, Request] = {}
        self._table_copies: dict[str, list[int]] = {}
        self.timeline = Timeline(meta=self.describe())

    @staticmethod
    def resolve_num_blocks(config: EngineConfig, model_config: ModelConfig) -> int:
        if config.num_blocks is not None:
            return config.num_blocks
        if config.kv_cache_bytes is not None:
            return num_blocks_for_budget(model_config, config.block_size,
                                         resolve_dtype(config.dtype).itemsize, config.kv_cache_bytes)
        return config.max_num_seqs * cdiv(config.max_model_len, config.block_size)

    def describe(self) -> dict:
        c = self.config
        return {"policy": self.policy.name, "model": self.model_name, "clock": self.clock.kind,
                "backend": self.backend, "device": c.device, "dtype": c.dtype,
                "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.token_budget(),
                "block_size": c.block_size, "num_blocks": self.allocator.num_blocks,
                "max_model_len": c.max_model_len, "kv_mode": c.kv_mode}

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
        blocks = cdiv(req.max_len, c.block_size)
        if blocks > self.allocator.num_blocks:
            raise ValueError(f"request {rid!r} needs {blocks} KV blocks at its longest but the cache has "
                             f"{self.allocator.num_blocks}; it could never run")
        if self.policy.name == "continuous" and req.max_len - 1 > c.token_budget():
            raise ValueError(
                f"request {rid!r}: prompt ({req.prompt_len}) + max_tokens - 1 = {req.max_len - 1} tokens > "
                f"max_num_batched_tokens={c.token_budget()}; the continuous policy runs a whole prompt (or a "
                f"whole preempted sequence) in one step; raise the budget or use policy='chunked'")

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

    # ---- the loop ----------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepRecord | None:
        s, clock = self.scheduler, self.clock
        if not s.has_unfinished():
            return None
        s.admit_arrivals(clock.now)
        if not s.waiting and not s.running:
            clock.wait_until(s.next_arrival())  # idle: jump to the next arrival
        t_start = clock.now
        clock.start_step()
        plan = s.schedule(t_start)
        if not plan.work:
            if s.pending and not s.running:
                clock.wait_until(s.next_arrival())
                return self.step()
            raise RuntimeError(f"policy {self.policy.name!r} scheduled nothing while "
                               f"{len(s.waiting)} request(s) wait and {len(s.running)} run")
        counts = self.snapshot(plan)
        items = self.step_items(plan)  # before update: a work item's kind reads the request's state
        sampled = self.executor.execute(plan)
        finished = s.update(plan, sampled)
        clock.now = t_start + clock.end_step(plan)
        return self.record(items, sampled, finished, t_start, clock.now, counts)

    def snapshot(self, plan: StepPlan) -> dict:
        """Queue and KV state as the step runs (after scheduling, before anything is freed)."""
        a, s = self.allocator, self.scheduler
        ends = {w.request.request_id: w.end for w in plan.work}
        stored = sum(ends.get(rid, self.requests[rid].num_computed_tokens) for rid in a.tables)
        return dict(num_running=len(s.running), num_waiting=len(s.waiting), kv_blocks_used=a.num_used,
                    kv_blocks_total=a.num_blocks, num_preempted=len(plan.preempted), kv_tokens_stored=stored,
                    kv_blocks=self.copy_block_tables() if self.config.record_kv_blocks else None)

    def copy_block_tables(self) -> dict[str, list[int]]:
        """This step's block tables. Most do not change from one step to the next, so a copy
        that still equals the table is shared between step records instead of copied again."""
        copies = self._table_copies
        for rid, table in self.allocator.tables.items():
            if copies.get(rid) != table:
                copies[rid] = list(table)
        return {rid: copies[rid] for rid in self.allocator.tables}

    @staticmethod
    def step_items(plan: StepPlan) -> list[StepItem]:
        items = []
        for w in plan.work:
            rid = w.request.request_id
            if w.num_tokens:
                items.append(StepItem(rid, w.kind, w.num_tokens, w.start + w.num_tokens))
            if w.num_padding:
                items.append(StepItem(rid, "padding", w.num_padding, w.end))
        return items

    def record(self, items: list[StepItem], sampled: dict[str, int], finished: list[Request],
               t_start: float, t_end: float, counts: dict) -> StepRecord:
        for rid in sampled:
            req = self.requests[rid]
            req.token_times.append(t_end)
            if req.t_first_token is None:
                req.t_first_token = t_end
        for req in finished:
            req.t_finished = t_end
            self.timeline.requests.append(self.request_record(req))
            if hasattr(self.executor, "forget"):
                self.executor.forget(req.request_id)
        rec = StepRecord(len(self.timeline.steps), t_start, t_end, items, **counts)
        self.timeline.steps.append(rec)
        return rec

    @staticmethod
    def request_record(req: Request) -> RequestRecord:
        return RequestRecord(req.request_id, req.arrival, req.prompt_len, req.params.max_tokens, req.t_scheduled,
                             req.t_first_token, list(req.token_times), req.t_finished, len(req.output_ids),
                             req.finish_reason, req.preemptions, list(req.output_ids))

    def run(self, progress: bool = False) -> Timeline:
        """Step until every request has finished; returns the timeline."""
        total = len(self.requests)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, desc=self.policy.name, unit="req", delay=2.0)
        # The timeline grows by many small records that form no reference cycles; Python's
        # cyclic GC would re-scan all of them on every full pass (a simulated run of 1,000
        # requests spent more than half its time there), so it pauses during the run.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            while self.has_unfinished():
                rec = self.step()
                done = len(self.timeline.requests)
                if bar is not None and rec is not None and done != bar.n:
                    bar.update(done - bar.n)
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


def _checkpoint_dir(model):
    from .loader import resolve_model_path

    return resolve_model_path(model)


def run_workload(specs: list[RequestSpec], model="tiny", policy="continuous", progress: bool = False,
                 sampling: dict | None = None, **knobs) -> Timeline:
    """Run one workload under one policy and return its timeline (the lab's one-liner)."""
    engine = Engine(model, policy=policy, **knobs)
    engine.add_workload(specs, **(sampling or {}))
    return engine.run(progress=progress)
