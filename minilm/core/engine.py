"""The engine loop: schedule -> execute -> update -> record (docs/DESIGN.md, "One step").

engine = Engine("tiny", EngineConfig(policy="chunked"))
engine.add_request("a", prompt_ids=[1, 2, 3], max_tokens=8)
timeline = engine.run()
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
from tqdm.auto import tqdm

from ..config import EngineConfig, InvalidValue
from ..gcpause import gc_paused
from ..plan import RequestOutput, StepPlan
from ..record import AGGREGATE, AggregateStep, note_gaps
from ..request import Request, SamplingParams
from ..timeline import CACHED, RequestRecord, StepItem, StepRecord, Timeline
from ..workload import RequestSpec
from .builder import build
from .scheduler import Scheduler

META_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_blocks",
    "max_model_len",
    "kv_mode",
    "enable_prefix_caching",
    "scheduling_policy",
    "record",
)


class Engine:
    """An executor (the model or the simulator), a paged KV cache, a scheduler with its
    policy, a clock and a timeline, made by builder.py. Keyword knobs override `config`."""

    def __init__(
        self,
        model="tiny",
        config: EngineConfig | None = None,
        *,
        tokenizer=None,
        clock=None,
        block_pool=None,
        **knobs,
    ):
        self.config, self.policy, self.tokenizer, self.kv_manager, self.executor, self.clock = (
            build(
                model,
                replace(config or EngineConfig(), **knobs),
                tokenizer=tokenizer,
                clock=clock,
                block_pool=block_pool,
            )
        )
        self.model_config = self.executor.model_config
        self.scheduler = Scheduler(self.config, self.kv_manager, self.policy)
        self.requests: dict[str, Request] = {}
        self.aggregate = self.config.record == AGGREGATE  # minilm/record.py
        self.finished_ids: set[str] = set()
        self.timeline = Timeline(meta=self.describe())
        self.num_steps = 0

    def describe(self) -> dict:
        """The timeline's meta: what ran, on what, with which knobs."""
        c = self.config
        return {
            "policy": self.policy.name,
            "clock": self.clock.kind,
            "device": c.device,
            "dtype": c.dtype,
            **self.executor.describe(),
            **{k: getattr(c, k) for k in META_KNOBS},
        }

    # ---- what a server asks ----
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:  # arrived or not yet
        return len(self.scheduler.waiting) + len(self.scheduler.pending)

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks in use (vLLM's `kv_cache_usage_perc`, as a fraction)."""
        return self.kv_manager.num_used_blocks / self.kv_manager.num_blocks

    # ---- requests ----
    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int] | None = None,
        *,
        prompt: str | None = None,
        max_tokens: int = 16,
        arrival: float = 0.0,
        **sampling,
    ) -> Request:
        """Validate and queue one request; InvalidValue (engine untouched) on bad input."""
        return self.add_workload(
            [RequestSpec(str(request_id), prompt_ids, max_tokens, arrival, prompt)], **sampling
        )[0]

    def add_workload(self, specs: Iterable[RequestSpec], **sampling) -> list[Request]:
        """Queue many requests; all are checked before any is added."""
        specs = list(specs)
        dup = next((i for i, n in Counter(s.id for s in specs).items() if n > 1), None)
        if dup is not None:
            raise InvalidValue(
                "request_id", dup, "appears twice in the workload; ids must be unique"
            )
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
        ids = spec.prompt_ids
        eos = self.model_config.eos_token_id
        ids = self.tokenizer.encode(spec.prompt) if ids is None else ids
        return Request(
            spec.id,
            ids if isinstance(ids, np.ndarray) else list(ids),
            SamplingParams(max_tokens=spec.max_tokens, **sampling),
            float(spec.arrival),
            eos_token_id=self.tokenizer.eos_token_id if eos is None else eos,
        )

    def check_request(self, req: Request) -> None:
        """Every check of a request, in one place (docs/DESIGN.md, "Bad input")."""
        rid, c = req.request_id, self.config
        if rid in self.requests or rid in self.finished_ids:
            raise InvalidValue("request_id", rid, "already in use; request ids must be unique")
        req.params.validate(rid)
        if len(req.prompt_ids) == 0:
            raise InvalidValue(
                "prompt", req.prompt_ids, "empty; a prompt needs at least one token", rid
            )
        vocab = self.model_config.vocab_size
        for name, ids in (
            ("prompt", req.prompt_ids),
            ("stop_token_ids", req.params.stop_token_ids),
        ):
            if isinstance(ids, np.ndarray):  # compact: in C
                if ids.dtype.kind in "iu" and 0 <= ids.min() and ids.max() < vocab:
                    continue
                ids = ids.tolist()
            if set(map(type, ids)) <= {int} and (not ids or 0 <= min(ids) and max(ids) < vocab):
                continue  # in C: a simulation checks millions
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                    why = f"a token id outside the vocabulary [0, {vocab})"
                    raise InvalidValue(name, t, why, rid)
        if req.max_len > c.max_model_len:  # OpenAI's words, which clients look for
            long_prompt = req.prompt_len >= c.max_model_len
            raise InvalidValue(
                "prompt" if long_prompt else "max_tokens",
                req.prompt_len if long_prompt else req.params.max_tokens,
                f"prompt ({req.prompt_len}) + max_tokens ({req.params.max_tokens}) = "
                f"{req.max_len} tokens > max_model_len={c.max_model_len}, this model's maximum "
                f"context length",
                rid,
                "context_length_exceeded",
            )
        if req.arrival < 0:
            raise InvalidValue("arrival", req.arrival, "must be >= 0 seconds", rid)
        blocks = self.kv_manager.blocks_needed(req, req.max_len)
        if blocks > c.num_blocks:
            raise InvalidValue(
                "max_tokens",
                req.params.max_tokens,
                f"the request needs {blocks} KV blocks at its longest but the cache has "
                f"{c.num_blocks}; it could never run",
                rid,
            )
        self.policy.check_request(req, c)

    def abort(self, request_id: str, reason: str = "aborted") -> bool:
        """Finish an unfinished request now, between steps, with `reason` (False if it had
        already finished)."""
        req = self.requests.get(request_id)
        if req is None and request_id not in self.finished_ids:
            raise InvalidValue("request_id", request_id, "unknown")
        if req is None or req.finished:
            return False
        self.scheduler.finish(req, reason)
        self._retire([req], self.clock.now)
        return True

    # ---- the loop ----
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepRecord | None:
        """One engine step; None when every request has finished."""
        done = self.step_outputs()
        return None if done is None else done[0]

    def step_outputs(self) -> tuple[StepRecord, list[RequestOutput]] | None:
        """One engine step: its record, and a RequestOutput for each request that sampled;
        None when every request has finished."""
        s, clock = self.scheduler, self.clock
        if not s.has_unfinished():
            return None
        if not s.waiting and not s.running:
            clock.wait_until(s.next_arrival())  # idle: jump to the next arrival
        t_start = clock.start_step()
        plan = s.schedule(t_start)
        if not plan.work:
            raise RuntimeError(
                f"policy {self.policy.name!r} scheduled nothing while "
                f"{len(s.waiting)} request(s) wait and {len(s.running)} run"
            )
        output, model_time = clock.timed(self.executor.execute, plan)
        outputs = s.update_from_output(plan, output)
        t_end = clock.end_step()
        record = self.stamp(plan, outputs, output, t_start, t_end, model_time)
        self.timeline.steps.append(record)
        self.num_steps += 1
        finished = [self.requests[o.request_id] for o in outputs if o.finish_reason]
        self._retire(finished, t_end)
        return record, outputs

    def stamp(self, plan, outputs, output, t_start, t_end, model_time) -> StepRecord:
        """Bookkeeping once the clock stopped: token times (or gaps), then the step's record."""
        tl, follows = self.timeline, 0
        for out in outputs:
            req, n = self.requests[out.request_id], len(out.new_token_ids)
            if self.aggregate:
                follows += note_gaps(tl, req, n, t_end, tl.steps[-1].t_end if tl.steps else None)
            else:
                req.token_times += [t_end] * n
            if req.t_first_token is None:
                req.t_first_token = t_end
        record = record_step(
            index=self.num_steps,
            plan=plan,
            outputs=outputs,
            t_start=t_start,
            t_end=t_end,
            model_time=model_time,
            kv_blocks_total=self.config.num_blocks,
            draft_time=output.draft_time,
        )
        return AggregateStep.of(record, num_follow=follows) if self.aggregate else record

    def _retire(self, finished: list[Request], t: float) -> None:
        """Finished requests (by a stop rule or an abort) leave for the timeline."""
        for req in finished:
            req.t_finished = t
            self.timeline.requests.append(record_request(req, keep_tokens=not self.aggregate))
            self.executor.forget(req.request_id)
            if self.aggregate:
                self.finished_ids.add(self.requests.pop(req.request_id).request_id)

    def release(self, rid: str) -> None:
        """A server forgets a finished request (serve/history.py)."""
        if rid in self.finished_ids:
            return self.finished_ids.remove(rid)
        if not getattr(self.requests.get(rid), "finished", False):
            raise InvalidValue("request_id", rid, "not a finished request")
        del self.requests[rid]

    def run(self, progress: bool = False) -> Timeline:
        """Step until every request has finished; returns the timeline."""
        # The timeline's records form no cycles, yet the cyclic GC re-scanned them all on
        # every pass: paused.
        with (
            gc_paused(),
            tqdm(
                total=len(self.requests),
                desc=self.policy.name,
                unit="req",
                delay=2,
                disable=not progress,
            ) as bar,
        ):
            while self.step() is not None:
                bar.update(len(self.timeline.requests) - bar.n)
        return self.timeline

    def generate(self, prompts: list[str], max_tokens: int = 32, **sampling) -> list[str]:
        """Complete a few prompts (batched by the engine's policy); their texts."""
        n = len(self.requests)
        specs = [
            RequestSpec(f"gen{n + i}", None, max_tokens, prompt=p) for i, p in enumerate(prompts)
        ]
        reqs = self.add_workload(specs, **sampling)
        while not all(r.finished for r in reqs):
            self.step()
        return [self.tokenizer.decode(r.output_ids) for r in reqs]

    def text(self, request_id: str) -> str:
        return self.tokenizer.decode(self.requests[request_id].output_ids)


# ---- recording, after the clock stopped ----
def record_step(
    *,
    index: int,
    plan: StepPlan,
    outputs: list[RequestOutput],
    t_start: float,
    t_end: float,
    model_time: float,
    kv_blocks_total: int,
    draft_time: float = 0.0,
) -> StepRecord:
    items, accepted_of = [], {o.request_id: o.num_accepted for o in outputs}
    for w in plan.work:
        rid = w.request_id
        if w.num_cached:
            items.append(StepItem(rid, CACHED, w.num_cached, w.num_cached))
        if w.num_new_tokens:
            drafts, accepted = len(w.draft_token_ids), accepted_of.get(rid, 0)
            end = w.start + w.num_new_tokens - drafts + accepted  # its verified tokens
            items.append(StepItem(rid, w.kind, w.num_new_tokens, end, drafts, accepted))
        if w.num_padding:
            items.append(StepItem(rid, "padding", w.num_padding, w.end))
    return StepRecord(
        step=index,
        t_start=t_start,
        t_end=t_end,
        items=items,
        num_running=plan.num_running,
        num_waiting=plan.num_waiting,
        kv_blocks_used=plan.kv_blocks_used,
        kv_blocks_total=kv_blocks_total,
        num_preempted=len(plan.preempted),
        kv_blocks=plan.block_tables,
        # a draft the target rejected leaves no token of the sequence in its slot
        kv_tokens_stored=plan.kv_tokens_stored - sum(i.num_draft - i.num_accepted for i in items),
        model_time=model_time,
        kv_cached_free=plan.cached_free_blocks,
        draft_time=draft_time,
    )


def record_request(req: Request, keep_tokens: bool = True) -> RequestRecord:
    return RequestRecord(
        request_id=req.request_id,
        arrival=req.arrival,
        prompt_len=req.prompt_len,
        max_tokens=req.params.max_tokens,
        t_scheduled=req.t_scheduled,
        t_first_token=req.t_first_token,
        token_times=list(req.token_times) if keep_tokens else [],
        t_finished=req.t_finished,
        output_len=len(req.output_ids),
        finish_reason=req.finish_reason,
        preemptions=req.preemptions,
        output_ids=list(req.output_ids) if keep_tokens else [],
        num_cached_tokens=req.num_cached_tokens,
        worst_gap=req.worst_gap,
    )


def run_workload(
    specs: list[RequestSpec],
    model="tiny",
    policy="continuous",
    progress: bool = False,
    sampling: dict | None = None,
    **knobs,
) -> Timeline:
    """Run one workload under one policy and return its timeline (the lab's one-liner)."""
    engine = Engine(model, policy=policy, **knobs)
    engine.add_workload(specs, **(sampling or {}))
    return engine.run(progress=progress)
