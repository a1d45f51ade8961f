"""Speculative decoding in the simulator (lesson 10): no model guesses and none checks, so how
many drafts the target keeps comes from an acceptance model, and what drafting costs from the
cost model of the draft.

    engine = simulated_engine("llama-3-8b", "h100", speculative_config={"method": "draft_model",
                              "model": "llama-3.2-1b", "num_speculative_tokens": 4}, acceptance=0.7)

Acceptance, given apart from `speculative_config` (whose keys stay vLLM's):
- a number alpha in [0, 1]: each draft is kept with probability alpha, independently, until the
  first rejection (Leviathan et al. 2023), so a step that verifies k drafts keeps
  (1 - alpha^(k+1)) / (1 - alpha) tokens on average (`expected_acceptance_length`); drawn from a
  generator seeded with the engine's `seed`, so a simulated run is reproducible bit for bit;
- a `Timeline` of a measured run with speculation: its decodes' (drafts, accepted), all requests
  pooled in step order, replayed in a cycle (`acceptance_trace`, `ReplayedAcceptance`).

What drafting costs, per step (`SimulatedSpeculation.draft_time`):
- ngram: nothing. Prompt lookup runs on the CPU over token ids (spec_decode/ngram.py); its
  microseconds per request are not priced.
- draft_model: what spec_decode/draft_model.py runs, priced by a CostModel of the draft on the same
  device: one forward over every sequence's tokens the draft has not seen (the tokens the target
  kept; a new or preempted request's whole sequence), then k - 1 one-token forwards over the
  sequences still drafting. A draft forward runs inside the engine's step: it pays the engine's
  per-layer and per-sequence costs but not its per-step overhead (scheduling and sampling, which
  the target's step pays once); on a GPU, where that overhead is all per step, a draft forward
  costs its roofline time alone (vLLM replays its drafting loop as CUDA graphs). The draft's
  weights and its own K/V come out of the memory the target's KV cache would have had.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import asdict, dataclass

from ..config import InvalidValue
from ..plan import StepPlan
from ..spec_decode.config import SpeculativeConfig, check_same_vocabulary
from ..spec_decode.proposal import max_drafts
from ..timeline import Timeline
from .costmodel import MODEL_SPECS, CostModel, EngineKind, get_model_spec


def expected_acceptance_length(alpha: float, k: int) -> float:
    """Tokens a step that verifies k drafts keeps on average when each is accepted with
    probability alpha until the first rejection: 1 + alpha + ... + alpha^k."""
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


class IIDAcceptance:
    """Each draft accepted with probability `alpha`, independently, until the first rejection."""

    def __init__(self, alpha: float, seed: int = 0):
        self.alpha, self.rng = alpha, random.Random(seed)

    def describe(self) -> dict:
        return {"acceptance": {"model": "iid", "alpha": self.alpha}}

    def propose(self, request_id: str, num_drafts: int) -> int:
        return num_drafts

    def accept(self, request_id: str, num_drafts: int) -> int:
        accepted = 0
        while accepted < num_drafts and self.rng.random() < self.alpha:
            accepted += 1
        return accepted

    def forget(self, request_id: str) -> None:
        pass


class ReplayedAcceptance:
    """A measured run's (drafts, accepted) pairs, replayed in order and in a cycle. Each proposal
    takes the next pair: it proposes that many drafts (an n-gram miss: none) and keeps that many of
    them, capped by what the simulated step can propose and verify."""

    def __init__(self, trace: list[tuple[int, int]]):
        self.trace, self.next = trace, 0
        self.pending: dict[str, int] = {}  # request -> drafts its next verification keeps

    def describe(self) -> dict:
        drafts = sum(d for d, _ in self.trace)
        return {
            "acceptance": {
                "model": "replayed",
                "decodes": len(self.trace),
                "acceptance_rate": sum(a for _, a in self.trace) / drafts,
            }
        }

    def propose(self, request_id: str, num_drafts: int) -> int:
        drafts, accepted = self.trace[self.next % len(self.trace)]
        self.next += 1
        self.pending[request_id] = accepted
        return min(drafts, num_drafts)

    def accept(self, request_id: str, num_drafts: int) -> int:
        return min(self.pending.pop(request_id, 0), num_drafts)

    def forget(self, request_id: str) -> None:
        self.pending.pop(request_id, None)


def acceptance_trace(timeline: Timeline) -> list[tuple[int, int]]:
    """(drafts verified, drafts accepted) of every decode of a run with speculation, in step order,
    all requests pooled; decodes with none verified count (an n-gram lookup that found nothing).
    Left out: decodes whose drafts were capped by the request's end (fewer than k could still be
    kept), since the simulator caps its own."""
    k = (timeline.meta.get("speculative_config") or {}).get("num_speculative_tokens")
    if not k:
        raise InvalidValue(
            "acceptance",
            "Timeline",
            "a timeline of a run with speculation to replay; its meta names no speculative_config",
        )
    requests = {r.request_id: r for r in timeline.requests}
    trace = []
    for s in timeline.steps:
        for i in s.items:
            r = requests.get(i.request_id)
            # tokens it had before this step: those stamped before its end
            if (
                i.kind == "decode"
                and r is not None
                and r.max_tokens - bisect_left(r.token_times, s.t_end) - 1 >= k
            ):
                trace.append((i.num_draft, i.num_accepted))
    if not any(d for d, _ in trace):
        raise InvalidValue(
            "acceptance", "Timeline", "its decodes verified no drafts: nothing to replay"
        )
    return trace


def acceptance_model(value, seed: int = 0):
    """An acceptance model from what the user gave: alpha in [0, 1], a Timeline to replay, or a model."""
    if isinstance(value, (IIDAcceptance, ReplayedAcceptance)):
        return value
    if isinstance(value, Timeline):
        return ReplayedAcceptance(acceptance_trace(value))
    if (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1
    ):  # NaN fails too
        raise InvalidValue(
            "acceptance",
            value,
            "a per-token acceptance rate in [0, 1], or a Timeline of a run "
            "with speculation to replay",
        )
    return IIDAcceptance(float(value), seed)


@dataclass
class SpecOutcome:
    """What one simulated step keeps and proposes, per request that samples."""

    num_kept: dict[str, int]  # accepted drafts + the target's own token
    num_drafts: dict[str, int]  # drafts proposed for its next step
    draft_time: float  # seconds the draft model spends proposing them


class SimulatedSpeculation:
    """The simulator's proposer and verifier: how many drafts each step keeps (the acceptance
    model) and proposes (the real executor's rule, spec_decode/proposal.py), and the draft model's time."""

    def __init__(self, speculative: SpeculativeConfig, acceptance, draft: CostModel | None):
        self.speculative, self.acceptance, self.draft = speculative, acceptance, draft
        self.draft_seen: dict[str, int] = {}  # tokens of each sequence whose draft K/V are computed
        self.max_len: dict[str, int] = {}  # of each request, from the plan that first scheduled it
        self._plan: StepPlan | None = None
        self._outcome: SpecOutcome | None = None

    def describe(self) -> dict:
        return {"speculative_config": asdict(self.speculative), **self.acceptance.describe()}

    def outcome(self, plan: StepPlan) -> SpecOutcome:
        """Decided once per plan: the clock prices the step before the executor runs it."""
        if plan is not self._plan:
            self._plan, self._outcome = plan, self._decide(plan)
        return self._outcome

    def _decide(self, plan: StepPlan) -> SpecOutcome:
        for rid in plan.preempted:
            self.drop_drafts(rid)
        kept, drafts, drafting = {}, {}, []
        for w in plan.work:
            rid = w.request_id
            if w.new is not None:
                self.max_len[rid] = len(w.new.prompt_ids) + w.new.params.max_tokens
            if not w.samples:
                continue
            kept[rid] = 1 + (
                self.acceptance.accept(rid, len(w.draft_token_ids)) if w.draft_token_ids else 0
            )
            length = w.start + len(w.token_ids) + kept[rid]  # its tokens once they are kept
            n = max_drafts(self.speculative.num_speculative_tokens, self.max_len[rid] - length)
            n = self.acceptance.propose(rid, n) if n > 0 else 0
            if n > 0:
                drafts[rid] = n
                drafting.append((length - self.draft_seen.get(rid, 0), length, n))
                self.draft_seen[rid] = length
        return SpecOutcome(kept, drafts, self.draft_time(drafting))

    def draft_time(self, drafting: list[tuple[int, int, int]]) -> float:
        """Seconds the draft model takes for (unseen tokens, sequence length, drafts) per sequence:
        a catch-up forward that also guesses the first draft, then one forward per further draft."""
        if self.draft is None or not drafting:
            return 0.0
        t = self.draft.cost([(new, length) for new, length, _ in drafting]).time
        for i in range(1, max(n for *_, n in drafting)):
            t += self.draft.cost([(1, length + i) for _, length, n in drafting if n > i]).time
        return t

    def drop_drafts(self, request_id: str) -> None:
        """A preempted request: its blocks, and the draft's K/V in them, are gone."""
        self.draft_seen.pop(request_id, None)
        self.acceptance.forget(request_id)

    def forget(self, request_id: str) -> None:
        self.drop_drafts(request_id)
        self.max_len.pop(request_id, None)


def make_speculation(
    speculative: SpeculativeConfig | None, target: CostModel, acceptance, seed: int = 0
) -> SimulatedSpeculation | None:
    """The simulator's speculation for `speculative` (None: off), the draft priced on the target's device."""
    if speculative is None:
        if acceptance is not None:
            raise InvalidValue("acceptance", acceptance, "only with a speculative_config")
        return None
    if acceptance is None:
        raise InvalidValue(
            "acceptance",
            None,
            "the simulator needs an acceptance model to speculate: a per-token "
            "acceptance rate in [0, 1], or a Timeline of a run with speculation",
        )
    model = acceptance_model(acceptance, seed)
    return SimulatedSpeculation(
        speculative,
        model,
        None if speculative.method == "ngram" else draft_cost(speculative, target),
    )


def draft_cost(speculative: SpeculativeConfig, target: CostModel) -> CostModel:
    """The draft model on the target's device, dtype, quantization and tensor parallelism; its forwards pay the
    engine's costs per layer and per sequence, not per step (the module's docstring says why)."""
    try:
        draft_model = get_model_spec(speculative.model)
    except InvalidValue:
        raise InvalidValue(
            "speculative_config.model",
            speculative.model,
            f"the simulator prices a draft from its sizes: "
            f"a model spec ({', '.join(MODEL_SPECS)}) or a config.json",
        ) from None
    check_same_vocabulary(speculative.model, draft_model.vocab_size, target.model.vocab_size)
    layer = (target.engine or target.device).layer_overhead
    draft = CostModel(
        draft_model,
        target.device,
        dtype=target.dtype,
        tp=target.tp,  # quantized as the target
        engine=EngineKind("draft forward", 0.0, layer),
        quantization=target.quantization,
        kv_cache_dtype=target.kv_cache_dtype,
    )
    draft.name = speculative.model
    return draft


def kv_num_blocks(
    target: CostModel,
    draft: CostModel | None,
    block_size: int,
    gpu_memory_utilization: float,
    kv_cache_bytes: int | None = None,
) -> int:
    """KV blocks that fit in `kv_cache_bytes`, or beside the weights; with a draft model its weights
    take memory too, and every block also holds the draft's own K/V of its tokens (spec_decode/draft_model.py)."""
    free = kv_cache_bytes
    if free is None:
        free = target.kv_cache_bytes(gpu_memory_utilization) - (draft.weight_bytes if draft else 0)
    per_token = target.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0)
    blocks = free // (block_size * per_token)
    if blocks < 1:
        raise ValueError(
            f"no room for a KV cache of {block_size}-token blocks on {target.device.name}"
            + (
                f" beside the draft model {draft.name}'s weights; raise tp or use a bigger device"
                if draft and kv_cache_bytes is None
                else ""
            )
        )
    return blocks
