"""The model's logits equal Hugging Face transformers' on the same random weights."""

import random

import pytest
import torch

from minilm.config import ModelConfig
from minilm.core.kv_cache import KVCacheManager
from minilm.model.attention import get_backend
from minilm.model.llama import LlamaModel
from minilm.model.loader import load_model
from minilm.model.runner import allocate_kv_cache, build_step_inputs
from minilm.plan import SeqWork, StepPlan
from minilm.request import Request, SamplingParams, Status
from training.checkpoint import save_checkpoint

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "llama": ModelConfig(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500.0,
    ),
    "qwen2": ModelConfig(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attention_bias=True,
        tie_word_embeddings=True,
        model_type="qwen2",
    ),
}


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(params=list(CONFIGS))
def pair(request, tmp_path):
    """Our model and the HF model loaded from one HF checkpoint of random weights."""
    ours = LlamaModel(CONFIGS[request.param]).init_random(seed=3, std=0.3)
    with torch.no_grad():  # non-trivial norms and biases, so a mix-up would show
        for name, p in ours.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.2)
    path = save_checkpoint(ours, tmp_path / "ckpt")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    return load_model(path), hf


def run_steps(model, steps, num_blocks=64, block_size=4, seed=0):
    """Feed `steps` (lists of (request, num_tokens)) through the paged cache; logits of each sampled row."""
    cfg = model.config
    kv_manager = KVCacheManager(num_blocks, block_size)
    random.Random(seed).shuffle(kv_manager.pool.free)  # scrambled, non-contiguous block tables
    kv = allocate_kv_cache(cfg, num_blocks, block_size, torch.float32, "cpu")
    attention, write_kv = get_backend("reference")
    out = []
    for work in steps:
        plan = StepPlan(
            [
                SeqWork(
                    r.request_id,
                    r.token_ids(r.num_computed_tokens, n),
                    0,
                    r.num_computed_tokens,
                    kv_manager.allocate_slots(r, n),
                    "prefill",
                    True,
                )
                for r, n in work
            ],
            [],
            0,
            0,
            0,
            0,
        )
        inp = build_step_inputs(plan, block_size, 0)
        with torch.no_grad():
            h = model(inp.input_ids, inp.positions, kv, inp.meta, attention, write_kv)
            out.append(model.logits(h))
        for (r, _), w in zip(work, plan.work):
            r.num_computed_tokens = w.end
    return out


def make_request(rid, ids):
    r = Request(rid, ids, SamplingParams(max_tokens=len(ids)))
    r.status = Status.RUNNING
    return r


def test_full_prompt_logits_match(pair):
    ours, hf = pair
    ids = torch.randint(
        0, ours.config.vocab_size, (23,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    req = make_request("a", ids)
    (logits,) = run_steps(ours, [[(req, len(ids))]])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert rel_err(logits, ref) < 1e-4


def test_token_by_token_decode_matches(pair):
    """Prefill a prefix, then feed one token per step, two sequences interleaved in one batch."""
    ours, hf = pair
    g = torch.Generator().manual_seed(2)
    seqs = {
        rid: torch.randint(0, ours.config.vocab_size, (n,), generator=g).tolist()
        for rid, n in (("a", 19), ("b", 11))
    }
    # the model sees each sequence's full ids; a request's "prompt" holds them all
    reqs = {rid: make_request(rid, ids) for rid, ids in seqs.items()}
    steps = [[(reqs["a"], 7), (reqs["b"], 5)]] + [
        [(reqs["a"], 1), (reqs["b"], 1)] for _ in range(6)
    ]
    logits = run_steps(ours, steps)
    with torch.no_grad():
        ref = {rid: hf(torch.tensor([ids])).logits[0] for rid, ids in seqs.items()}
    for i, lg in enumerate(logits):
        # every row of the flat batch: prefill rows first step, one decode row per sequence after
        if i == 0:
            assert rel_err(lg[:7], ref["a"][:7]) < 1e-4
            assert rel_err(lg[7:12], ref["b"][:5]) < 1e-4
        else:
            assert rel_err(lg[0], ref["a"][6 + i]) < 1e-4
            assert rel_err(lg[1], ref["b"][4 + i]) < 1e-4
