"""Speculative decoding's gain against batch size, simulated (lesson 10, bench/spec_decode.py).

At batch 1 a decode step reads every weight to compute one token per sequence: the GPU's
arithmetic idles, and verifying k drafts in the same step costs little more. As the batch grows
the step turns compute-bound and every draft token costs what a real one does: the drafts the
target rejects, and the draft model's own steps, become a loss. The batch size where the gain
ends depends on alpha and k.
"""

from __future__ import annotations

from ..metrics import summarize
from ..workload import RequestSpec
from .executor import simulated_engine


def spec_speedup_table(
    model: str = "llama-3-8b",
    device: str = "h100",
    draft: str | None = "llama-3.2-1b",
    k: int = 4,
    acceptance=0.7,
    batch_sizes=(1, 8, 32, 64, 128, 256),
    prompt_len: int = 128,
    max_tokens: int = 256,
    **knobs,
) -> list[dict]:
    """A row per batch size B: B requests of `prompt_len` tokens arriving together, each producing
    `max_tokens`, with `max_num_seqs` = B, run with speculation off and on (a `draft` model from
    costmodel.MODEL_SPECS, or n-gram lookup when None). Output tok/s over the whole run, median TPOT,
    speedup = tok/s on / off. Simulated times. `knobs` go to both engines (the policy: the engine's
    default, continuous; under chunked prefill's small budget, drafts also take prompt chunks' room)."""
    spec = ({"method": "draft_model", "model": draft} if draft else {"method": "ngram"}) | {
        "num_speculative_tokens": k
    }
    rows = []
    for batch in batch_sizes:
        runs = {}
        for name, extra in (
            ("off", {}),
            ("on", {"speculative_config": spec, "acceptance": acceptance}),
        ):
            engine = simulated_engine(
                model, device, max_num_seqs=batch, record_kv_blocks=False, **extra, **knobs
            )
            engine.add_workload(
                [RequestSpec(f"r{i}", [7] * prompt_len, max_tokens) for i in range(batch)],
                ignore_eos=True,
            )
            runs[name] = summarize(engine.run())
        off, on = runs["off"], runs["on"]
        rows.append(
            {
                "batch_size": batch,
                "tok_per_s_off": off["output_tok_per_s"],
                "tok_per_s_on": on["output_tok_per_s"],
                "speedup": on["output_tok_per_s"] / off["output_tok_per_s"],
                "tpot_ms_off": 1e3 * off["tpot_p50"],
                "tpot_ms_on": 1e3 * on["tpot_p50"],
                "mean_acceptance_length": on["spec_mean_acceptance_length"],
            }
        )
    return rows
