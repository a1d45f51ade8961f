"""Configuration: the model's shape (HF `config.json` fields), the engine's knobs (vLLM's
names, so what a learner tunes here carries over), and the one way a bad value is said.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import psutil

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
ATTENTION_BACKENDS = ("reference", "sdpa", "triton")  # minilm/model/attention/
RECORD_MODES = ("full", "aggregate")  # minilm/record.py
KV_MODES = ("paged", "reserved")
SCHEDULING_POLICIES = ("fcfs", "lpm")  # vLLM's word: the waiting queue's order
QUANTIZATIONS = (
    None,
    "int8",
    "fp8",
)  # None: the weights as loaded; else 8-bit (model/quantization.py)


class InvalidValue(ValueError):
    """`name=value: what is allowed`, after the request it belongs to if any; raised before
    any state changes. The HTTP server answers it with a 400 whose `param` is `name`."""

    def __init__(
        self,
        name: str,
        value: Any,
        allowed: str,
        request_id: str | None = None,
        code: str | None = None,
    ):
        self.name, self.value, self.allowed = name, value, allowed
        self.request_id, self.code = request_id, code
        where = f"request {request_id!r}: " if request_id is not None else ""
        text = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
        super().__init__(f"{where}{name}={text}: {allowed}")


def check_int(
    name: str, value: Any, low: int, allowed: str = "", request_id: str | None = None
) -> None:
    """`value` must be an int (not a bool) >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidValue(name, value, allowed or f"must be an integer >= {low}", request_id)


@dataclass
class ModelConfig:
    """The fields of a Llama/Qwen2/Mistral `config.json` that the model needs."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False  # Qwen2 puts a bias on q/k/v
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 256
    eos_token_id: int | None = 257
    model_type: str = "llama"
    torch_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        sizes = "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads"
        for name in (*sizes.split(), "num_key_value_heads", "head_dim"):
            check_int(name, getattr(self, name), 1)
        if self.num_attention_heads % self.num_key_value_heads:
            allowed = f"must be a multiple of num_key_value_heads={self.num_key_value_heads}"
            raise InvalidValue("num_attention_heads", self.num_attention_heads, allowed)
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            allowed = f"allowed: {', '.join(SUPPORTED_MODEL_TYPES)}"
            raise InvalidValue("model_type", self.model_type, allowed)

    @property
    def num_params(self) -> int:
        """Parameters, counting a tied embedding once."""
        d, q = self.hidden_size, self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.attention_bias else 0)
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embed + d

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token in every layer: what the KV cache stores per token."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        if d.get("hidden_act", "silu") != "silu":
            raise InvalidValue("hidden_act", d["hidden_act"], "only 'silu' (SwiGLU) is supported")
        if d.get("rope_scaling"):
            raise InvalidValue("rope_scaling", d["rope_scaling"], "not supported by minilm's model")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if d.get("model_type") == "qwen2" and "attention_bias" not in d:
            kwargs["attention_bias"] = True  # Qwen2 always has q/k/v bias
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads(Path(path).read_text()))


# Named configs with random weights. `tiny` is the default: small enough that a
# 2-core laptop runs hundreds of engine steps a second, big enough that a long
# prefill costs visibly more than a decode step (lesson 1).
MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(max_position_embeddings=2048),
    "small": ModelConfig(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    ),
}


def knob(default: Any, help: str, choices: tuple = (), low: int | None = None) -> Any:
    """An EngineConfig field: its default, its help (cli.py makes a flag of each) and what
    `resolve` allows: one of `choices`, or an int >= `low` (None too if that's the default)."""
    return field(default=default, metadata={"help": help, "choices": choices, "low": low})


def default_cpu_threads() -> int:
    """PyTorch's own default, as HF transformers keeps it: $OMP_NUM_THREADS, else physical cores."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else psutil.cpu_count(logical=False) or 1


@dataclass
class EngineConfig:
    """The engine's knobs, as the user gives them; `None` is "the default", which `resolve`
    fills in against the model and the policy into `engine.config`."""

    policy: Any = knob("continuous", "static, continuous, chunked (core/policies.py) or a Policy")
    max_num_seqs: int = knob(16, "requests running at once", low=1)
    max_num_batched_tokens: int | None = knob(None, "tokens a step (default: the policy's)", low=1)
    long_prefill_token_threshold: int = knob(
        0, "chunked: at most this many prompt tokens of a request a step (0: no cap)", low=0
    )
    block_size: int = knob(16, "tokens a KV block", low=1)
    num_blocks: int | None = knob(
        None, "default: what kv_cache_bytes or the device holds, else max_num_seqs sequences", low=1
    )
    kv_cache_bytes: int | None = knob(None, "the KV cache's size, to count num_blocks by", low=1)
    gpu_memory_utilization: float = knob(0.9, "simulated: the share of memory for weights + KV")
    max_model_len: int | None = knob(None, "default: the model's max_position_embeddings", low=1)
    kv_mode: str = knob("paged", "reserved: prompt + max_tokens allocated up front", KV_MODES)
    enable_prefix_caching: bool = knob(False, "share cached prompt prefixes (lesson 8)")
    scheduling_policy: str = knob(
        "fcfs", "waiting queue's order: first come, or longest cached prefix", SCHEDULING_POLICIES
    )
    attention_backend: str | None = knob(
        None, "default: triton on CUDA, sdpa on CPU", (None, *ATTENTION_BACKENDS)
    )
    device: str = knob("cpu", "torch device; simulated: h100, a100, l4, cpu, ...")
    dtype: str = knob("float32", "of the weights and KV (simulated: the device's)")
    quantization: str | None = knob(None, "8-bit linear weights (torchao)", QUANTIZATIONS)
    seed: int = knob(0, "of random weights and sampling")
    cpu_threads: int | None = knob(None, "torch threads on CPU (default: PyTorch's)", low=1)
    record_kv_blocks: bool = knob(True, "keep each step's block tables (for the KV map)")
    record: str = knob("full", "aggregate: totals, no token times (a million)", RECORD_MODES)
    speculative_config: Any = knob(None, 'vLLM\'s keys, e.g. {"method": "ngram"} (lesson 10)')

    def resolve(self, model: ModelConfig, policy: Any, kv_num_blocks: Callable) -> EngineConfig:
        """Each default filled in against the model, the policy (its token budget) and the
        executor (`kv_num_blocks(config)`), each knob checked: the one place that does."""
        for f in fields(self):
            value, allowed, low = getattr(self, f.name), f.metadata["choices"], f.metadata["low"]
            if allowed and value not in allowed:
                raise InvalidValue(f.name, value, f"allowed: {', '.join(map(str, allowed))}")
            if low is not None and (value is not None or f.default is not None):
                check_int(f.name, value, low)
        if not 0 < self.gpu_memory_utilization <= 1:
            allowed = "must be in (0, 1]"
            raise InvalidValue("gpu_memory_utilization", self.gpu_memory_utilization, allowed)
        limit = model.max_position_embeddings
        if (self.max_model_len or 0) > limit:
            allowed = f"must be <= the model's max_position_embeddings={limit}"
            raise InvalidValue("max_model_len", self.max_model_len, allowed)
        # the Triton kernel on a GPU; on a CPU PyTorch's fused SDPA over gathered KV
        # (model/attention/sdpa.py: about twice the readable reference's speed, same results)
        backend = self.attention_backend or ("triton" if str(self.device)[:4] == "cuda" else "sdpa")
        c = replace(self, max_model_len=self.max_model_len or limit, attention_backend=backend)
        c.cpu_threads = c.cpu_threads or default_cpu_threads()
        budget = policy.default_token_budget(c)  # None: the policy has no budget
        c.max_num_batched_tokens = budget and (c.max_num_batched_tokens or budget)
        if (c.max_num_batched_tokens or c.max_num_seqs) < c.max_num_seqs:
            # vLLM's rule too: else some decodes would wait every step, the same ones each time
            allowed = f"must be >= max_num_seqs={c.max_num_seqs} (a decode token of each)"
            raise InvalidValue("max_num_batched_tokens", c.max_num_batched_tokens, allowed)
        c.num_blocks = c.num_blocks or kv_num_blocks(c)
        return c
