"""How a step and a request become timeline records (timeline.py): functions of the
step's plan and times, and of a request once it has finished, nothing else. The
engine calls them after the step's clock has stopped: recording is not the engine's
work a client waits for.
"""
from __future__ import annotations

from ..plan import StepPlan
from ..request import Request
from ..timeline import CACHED, RequestRecord, StepItem, StepRecord


def record_step(*, index: int, plan: StepPlan, t_start: float, t_end: float, model_time: float,
                kv_blocks_total: int) -> StepRecord:
    items = []
    for w in plan.work:
        rid = w.request.request_id
        if w.num_cached:
            items.append(StepItem(rid, CACHED, w.num_cached, w.num_cached))
        if w.num_new_tokens:
            items.append(StepItem(rid, w.kind, w.num_new_tokens, w.start + w.num_new_tokens))
        if w.num_padding:
            items.append(StepItem(rid, "padding", w.num_padding, w.end))
    return StepRecord(step=index, t_start=t_start, t_end=t_end, items=items, num_running=plan.num_running,
                      num_waiting=plan.num_waiting, kv_blocks_used=plan.kv_blocks_used,
                      kv_blocks_total=kv_blocks_total, num_preempted=len(plan.preempted),
                      kv_tokens_stored=plan.kv_tokens_stored, kv_blocks=plan.block_tables, model_time=model_time,
                      kv_cached_free=plan.cached_free_blocks)


def record_request(req: Request) -> RequestRecord:
    return RequestRecord(request_id=req.request_id, arrival=req.arrival, prompt_len=req.prompt_len,
                         max_tokens=req.params.max_tokens, t_scheduled=req.t_scheduled,
                         t_first_token=req.t_first_token, token_times=list(req.token_times),
                         t_finished=req.t_finished, output_len=len(req.output_ids), finish_reason=req.finish_reason,
                         preemptions=req.preemptions, output_ids=list(req.output_ids),
                         num_cached_tokens=req.num_cached_tokens)
