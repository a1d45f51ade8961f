"""One step with speculation: the target verifies the drafts proposed in the step before, then
the proposer guesses the next ones for every sequence that sampled (vLLM V1's order: drafting
is part of the step, after sampling), so they are ready when the scheduler plans the next.
"""

from __future__ import annotations

from dataclasses import asdict

from ..config import MODEL_PRESETS, EngineConfig, InvalidValue, ModelConfig
from ..model.loader import load_model, resolve_model_path
from ..model.runner import ModelRunner, device_time
from ..plan import ModelOutput, StepPlan
from .config import check_same_vocabulary
from .draft_model import DraftModelProposer
from .ngram import NgramProposer
from .proposal import Proposal, max_drafts


class SpeculativeExecutor:
    """The model runner with a proposer (ngram.py or draft_model.py) behind it."""

    def __init__(self, runner: ModelRunner, proposer, config: EngineConfig):
        self.runner, self.proposer, self.speculative = runner, proposer, config.speculative_config
        self.kind, self.model_config = runner.kind, runner.model_config
        self.speculates = True

    def describe(self) -> dict:
        return {**self.runner.describe(), "speculative_config": asdict(self.speculative)}

    def execute(self, plan: StepPlan) -> ModelOutput:
        out = self.runner.execute(plan)
        for rid in plan.preempted:  # its blocks, and the draft's K/V in them, are gone
            self.proposer.forget(rid)
        t0 = device_time(self.runner.device.type)
        proposals, k = [], self.speculative.num_speculative_tokens
        for w in plan.work:
            if w.request_id in out.sampled_token_ids:
                r = self.runner.requests[w.request_id]  # its history has the kept tokens
                n = max_drafts(k, r.new.params.max_tokens - r.num_output)
                if n > 0:
                    proposals.append(Proposal(w.request_id, r.token_ids, n, w.block_table))
        out.draft_token_ids = self.proposer.propose(proposals)
        out.draft_time = device_time(self.runner.device.type) - t0
        return out

    def forget(self, request_id: str) -> None:
        self.runner.forget(request_id)
        self.proposer.forget(request_id)


def make_speculative_executor(runner: ModelRunner, config: EngineConfig) -> SpeculativeExecutor:
    """The runner with the proposer `config.speculative_config` names (a draft model's vocabulary
    was checked against the target's by the builder: its token ids are the target's)."""
    speculative = config.speculative_config
    if speculative.method == "ngram":
        return SpeculativeExecutor(runner, NgramProposer(speculative), config)
    draft = load_model(
        speculative.model, device=config.device, dtype=config.dtype, seed=config.seed
    )
    proposer = DraftModelProposer(
        draft, config.num_blocks, config.block_size, config.attention_backend
    )
    return SpeculativeExecutor(runner, proposer, config)


def check_draft_model(name_or_path: str, target: ModelConfig) -> None:
    """A draft model must be a model (a preset, a shipped checkpoint, a directory) with the target's
    vocabulary. Reads its config only, so the builder asks before anything loads."""
    try:
        path = resolve_model_path(name_or_path)
    except InvalidValue as e:
        raise InvalidValue("speculative_config.model", name_or_path, e.allowed) from None
    draft = (
        MODEL_PRESETS[name_or_path] if path is None else ModelConfig.from_json(path / "config.json")
    )
    check_same_vocabulary(name_or_path, draft.vocab_size, target.vocab_size)
