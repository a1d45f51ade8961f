"""Bad input: a ValueError that names the value, raised before any state changes; the engine carries on."""

import json

import pytest
import torch
from helpers import MICRO, engine, micro_model

from minilm import Engine, EngineConfig
from minilm.config import InvalidValue
from minilm.model.loader import load_model
from minilm.workload import RequestSpec, get_workload
from training.checkpoint import save_checkpoint


@pytest.fixture
def e():
    eng = engine("continuous", max_model_len=64, max_num_seqs=4, block_size=4, num_blocks=12)
    eng.add_request("ok", [1, 2, 3], max_tokens=5, ignore_eos=True)
    return eng


@pytest.mark.parametrize(
    "kwargs,name,match",
    [
        (dict(request_id="x", prompt_ids=[]), "prompt", r"^request 'x': prompt=\[\]: empty"),
        (
            dict(request_id="x", prompt_ids=[1] * 60, max_tokens=10),
            "max_tokens",
            "max_tokens=10: .*max_model_len=64",
        ),
        (
            dict(request_id="x", prompt_ids=[1] * 64, max_tokens=1),
            "prompt",
            "prompt=64: .*max_model_len=64",
        ),
        (
            dict(request_id="x", prompt_ids=[1], max_tokens=0),
            "max_tokens",
            "max_tokens=0: must be an integer >= 1",
        ),
        (
            dict(request_id="x", prompt_ids=[1, MICRO.vocab_size]),
            "prompt",
            f"prompt={MICRO.vocab_size}: a token id outside the vocabulary",
        ),
        (dict(request_id="x", prompt_ids=[1, -1]), "prompt", "prompt=-1: a token id outside"),
        (
            dict(request_id="x", prompt_ids=[1], stop_token_ids=(500,)),
            "stop_token_ids",
            "stop_token_ids=500",
        ),
        (dict(request_id="ok", prompt_ids=[1]), "request_id", "request_id='ok': already in use"),
        (
            dict(request_id="x", prompt_ids=[1] * 40, max_tokens=20),
            "max_tokens",
            "needs 15 KV blocks",
        ),
        (
            dict(request_id="x", prompt_ids=[1], temperature=-1.0),
            "temperature",
            "temperature=-1.0: must be",
        ),
        (dict(request_id="x", prompt_ids=[1], top_p=0.0), "top_p", "top_p=0.0: must be"),
        (dict(request_id="x", prompt_ids=[1], top_k=-2), "top_k", "top_k=-2: must be"),
        (dict(request_id="x", prompt_ids=[1], arrival=-2.0), "arrival", "arrival=-2.0: must be"),
    ],
)
def test_bad_request_is_rejected_and_engine_carries_on(e, kwargs, name, match):
    """One wording everywhere: `request 'id': name=value: what is allowed`, and the name is
    the field's (the HTTP server turns it into OpenAI's `param`)."""
    before = (len(e.requests), list(e.kv_manager.pool.free), len(e.scheduler.pending))
    with pytest.raises(InvalidValue, match=match) as raised:
        e.add_request(**kwargs)
    assert raised.value.name == name
    if name != "request_id":
        assert str(raised.value).startswith(f"request {kwargs['request_id']!r}: ")
    assert before == (len(e.requests), list(e.kv_manager.pool.free), len(e.scheduler.pending))
    tl = e.run()
    assert [r.request_id for r in tl.requests] == ["ok"] and tl.requests[0].output_len == 5


def test_bad_request_in_a_workload_adds_none_of_it(e):
    specs = [RequestSpec("a", [1, 2], 3), RequestSpec("b", [], 3)]
    with pytest.raises(ValueError, match="'b': prompt=\\[\\]: empty"):
        e.add_workload(specs)
    assert "a" not in e.requests
    with pytest.raises(ValueError, match="request_id='a': appears twice"):
        e.add_workload([RequestSpec("a", [1], 2), RequestSpec("a", [2], 2)])


def test_continuous_budget_smaller_than_a_prompt():
    eng = engine("continuous", max_model_len=64, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        eng.add_request("x", [1] * 20, max_tokens=2)
    eng.add_request("y", [1] * 10, max_tokens=2)  # fits: still accepted


@pytest.mark.parametrize(
    "knobs,match",
    [
        (dict(block_size=0), "block_size=0"),
        (dict(num_blocks=0), "num_blocks=0"),
        (dict(max_num_seqs=-1), "max_num_seqs=-1"),
        (dict(policy="chunked", max_num_batched_tokens=0), "max_num_batched_tokens=0"),
        (dict(policy="fifo"), "policy='fifo'"),
        (dict(kv_mode="contiguous"), "kv_mode='contiguous'"),
        (dict(attention_backend="flash"), "attention_backend='flash'"),
        (dict(kv_cache_bytes=10), "kv_cache_bytes=10"),
    ],
)
def test_bad_knobs(knobs, match):
    with pytest.raises(ValueError, match=match):
        Engine(micro_model(), EngineConfig(**knobs))


def test_unknown_names():
    with pytest.raises(ValueError, match="workload='sharegpt': allowed"):
        get_workload("sharegpt")
    with pytest.raises(ValueError, match="model='gpt-5': not a preset"):
        Engine("gpt-5")


def test_bad_checkpoints(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_checkpoint(micro_model(), tmp_path / "ok")
    tensors = load_file(str(path / "model.safetensors"))
    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing 1 tensor.*up_proj"):
        load_model(path)
    bad = dict(tensors)
    bad["model.norm.weight"] = torch.ones(7)
    save_file(bad, str(path / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"model.norm.weight has shape \(7,\), the config needs \(32,\)"
    ):
        load_model(path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"num_attention_heads": 3}))
    with pytest.raises(ValueError, match="num_attention_heads=3"):
        load_model(path)


def test_budget_smaller_than_the_batch_is_rejected():
    """A step must hold a decode token of every running request; with fewer tokens than
    max_num_seqs, the newest requests would wait every step (vLLM rejects it too)."""
    with pytest.raises(ValueError, match="max_num_batched_tokens=4: must be >= max_num_seqs=8"):
        Engine(
            micro_model(), EngineConfig(policy="chunked", max_num_seqs=8, max_num_batched_tokens=4)
        )
    Engine(micro_model(), EngineConfig(policy="chunked", max_num_seqs=8, max_num_batched_tokens=8))


def test_max_model_len_is_capped_by_the_model():
    e = Engine("docstrings")
    assert (
        e.config.max_model_len == e.model_config.max_position_embeddings == 256
    )  # its trained context
    with pytest.raises(
        ValueError, match="max_model_len=257: must be <= the model's max_position_embeddings=256"
    ):
        Engine("docstrings", max_model_len=257)
