"""The shipped `docstrings` checkpoint writes real text and stops at its EOS (issue 7)."""

import json

import pytest
import torch

from minilm import Engine
from minilm.model.llama import LlamaModel
from minilm.model.loader import CHECKPOINTS_DIR, load_model
from minilm.model.tokenizer import load_tokenizer
from minilm.workload import docstring_prompt, make_workload
from training.dense import dense_logits
from training.train import encode_docs, eval_rows, evaluate, parse_args, token_byte_lengths, train

CKPT = CHECKPOINTS_DIR / "docstrings"
HELDOUT = json.loads((CKPT / "heldout.json").read_text())
PROMPTS = [docstring_prompt(d) for d in HELDOUT[:16]]


def generate(
    policy: str = "continuous", max_tokens: int = 128, **knobs
) -> dict[str, tuple[list[int], str]]:
    engine = Engine("docstrings", policy=policy, max_model_len=256, **knobs)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"p{i}", prompt=prompt, max_tokens=max_tokens)
    tl = engine.run()
    return {r.request_id: (r.output_ids, r.finish_reason) for r in tl.requests}


@pytest.fixture(scope="module")
def greedy():
    return generate()


def test_config_and_tokenizer_agree_on_special_tokens():
    model, tok = load_model("docstrings"), load_tokenizer(CKPT)
    assert (model.config.bos_token_id, model.config.eos_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
    )
    assert model.config.vocab_size == tok.vocab_size
    assert (
        tok.decode(tok.encode("Return the sum of two numbers.\n    x"))
        == "Return the sum of two numbers.\n    x"
    )


def test_dense_training_path_matches_the_paged_engine_path():
    from minilm.model.attention import get_backend
    from minilm.model.llama import AttentionMetadata
    from minilm.model.runner import allocate_kv_cache

    model = load_model("docstrings")
    ids = torch.tensor(load_tokenizer(CKPT).encode(HELDOUT[0])[:40])
    kv = allocate_kv_cache(model.config, 4, 16, torch.float32, "cpu")
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor([0, len(ids)], dtype=torch.int32),
        context_lens=torch.tensor([len(ids)], dtype=torch.int32),
        block_tables=torch.tensor([[2, 0, 3]], dtype=torch.int32),
        slot_mapping=torch.tensor([[2, 0, 3][i // 16] * 16 + i % 16 for i in range(len(ids))]),
    )
    with torch.no_grad():
        paged = model.logits(
            model(ids, torch.arange(len(ids)), kv, meta, *get_backend("reference"))
        )
        dense = dense_logits(model, ids[None])[0]
    torch.testing.assert_close(dense, paged, atol=1e-4, rtol=1e-4)


def test_greedy_generation_is_deterministic_and_stops_at_eos(greedy):
    assert generate() == greedy
    stopped = [rid for rid, (_, reason) in greedy.items() if reason == "stop"]
    assert len(stopped) > len(PROMPTS) / 2, (
        greedy
    )  # most requests end at EOS (12 of 16 when shipped)
    # the EOS is the last token of a stopped request, and its text is words, not bytes of noise
    eos = load_tokenizer(CKPT).eos_token_id
    assert all(greedy[rid][0][-1] == eos for rid in stopped)
    text = " ".join(load_tokenizer(CKPT).decode(ids) for ids, _ in greedy.values())
    assert sum(c.isalpha() or c.isspace() for c in text) > 0.8 * len(text)


def test_heldout_loss_is_far_below_random_weights():
    trained = load_model("docstrings")
    random = LlamaModel(trained.config).init_random(0).eval()
    tok = load_tokenizer(CKPT)._tok
    rows = eval_rows(encode_docs(tok, HELDOUT[:40]), seq_len=128)
    lengths = token_byte_lengths(tok)
    got = evaluate(trained, rows, 128, lengths, "cpu", max_rows=8)
    base = evaluate(random, rows, 128, lengths, "cpu", max_rows=8)
    assert base.loss > 0.9 * torch.log(torch.tensor(float(trained.config.vocab_size))).item()
    assert got.loss < base.loss - 3.0, (got, base)  # nats per token
    assert got.bits_per_byte < 0.6 * base.bits_per_byte


@pytest.mark.parametrize(
    "policy,knobs",
    [
        ("static", dict(max_num_seqs=4)),
        ("chunked", dict(max_num_seqs=8, max_num_batched_tokens=16)),
    ],
)
def test_batching_policies_give_the_same_greedy_text(greedy, policy, knobs):
    assert generate(policy, **knobs) == greedy


def test_docstrings_workload_is_text_and_lengths_come_from_eos():
    specs = make_workload("docstrings", num_requests=12, seed=1, max_model_len=256)
    assert all(s.prompt and s.prompt_ids is None for s in specs)
    assert specs == make_workload("docstrings", num_requests=12, seed=1, max_model_len=256)
    engine = Engine("docstrings", max_model_len=256)
    engine.add_workload(specs[:6])
    lengths = {r.output_len for r in engine.run().requests}
    assert len(lengths) > 2  # outputs end where the model says, not all at max_tokens


def test_smoke_training_writes_a_loadable_checkpoint(tmp_path):
    stats = train(parse_args(["--smoke", "--out", str(tmp_path)]))
    for name in ("config.json", "model.safetensors", "tokenizer.json", "heldout.json", "README.md"):
        assert (tmp_path / name).exists(), name
    model, tok = load_model(tmp_path), load_tokenizer(tmp_path)
    assert model.config.eos_token_id == tok.eos_token_id == 2
    assert stats["heldout_loss"] < torch.log(torch.tensor(float(model.config.vocab_size))).item()
    engine = Engine(str(tmp_path))
    assert (
        engine.config.max_model_len == model.config.max_position_embeddings == 64
    )  # the trained context
    engine.add_request("a", prompt="Return the", max_tokens=4)
    assert len(engine.run().requests[0].output_ids) >= 1


def test_smoke_training_with_tokenizer_reuses_its_ids(tmp_path):
    """A draft model for speculative decoding must read and write its target's token ids."""
    given = CKPT / "tokenizer.json"
    train(parse_args(["--smoke", "--out", str(tmp_path), "--tokenizer", str(given)]))
    assert (
        tmp_path / "tokenizer.json"
    ).read_bytes() == given.read_bytes()  # a copy, not a retrained BPE
    model, tok = load_model(tmp_path), load_tokenizer(tmp_path)
    assert (
        model.config.vocab_size == tok.vocab_size == load_model("docstrings").config.vocab_size
    )  # not --vocab-size
    assert tok.encode(HELDOUT[0]) == load_tokenizer(CKPT).encode(HELDOUT[0])
