"""Configuration: the model's shape (HF `config.json` fields), the engine's knobs (vLLM's
names, so what a learner tunes here carries over), and the one way a bad value is said.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
ATTENTION_BACKENDS = ("reference", "sdpa", "triton")  # minilm/model/attention/
KV_MODES = ("paged", "reserved")
SCHEDULING_POLICIES = ("fcfs", "lpm")  # vLLM's word: the waiting queue's order
QUANTIZATIONS = (
    None,
    "int8",
    "fp8",
)  # None: the weights as loaded; 8-bit weights (model/quantization.py)


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
        self.name, self.value, self.allowed, self.request_id, self.code = (
            name,
            value,
            allowed,
            request_id,
            code,
        )
        where = f"request {request_id!r}: " if request_id is not None else ""
        text = repr(value)
        super().__init__(
            f"{where}{name}={text if len(text) <= 60 else text[:60] + '...'}: {allowed}"
        )


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
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            check_int(name, getattr(self, name), 1)
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidValue(
                "num_attention_heads",
                self.num_attention_heads,
                f"must be a multiple of num_key_value_heads={self.num_key_value_heads}",
            )
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise InvalidValue(
                "model_type", self.model_type, f"allowed: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )

    @property
    def num_params(self) -> int:
        """Parameters, counting a tied embedding once."""
        d, q, kv = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
        )
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
            raise InvalidValue(
                "rope_scaling", d["rope_scaling"], "not supported by the minilm model"
            )
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


@dataclass
class EngineConfig:
    """The engine's knobs, as the user gives them; `None` is "the default", which the
    builder resolves against the model and policy into `engine.config`."""

    policy: Any = (
        "continuous"  # the batching policy: a name (static, continuous, chunked) or a Policy object
    )
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None  # None: the policy's default (core/policies.py)
    long_prefill_token_threshold: int = (
        0  # chunked: at most this many prompt tokens per request a step (0: no cap)
    )
    block_size: int = 16
    num_blocks: int | None = (
        None  # None: from kv_cache_bytes, the device's memory, or max_num_seqs full sequences
    )
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float = (
        0.9  # simulated GPUs: the share of memory for weights + KV (vLLM's knob)
    )
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    kv_mode: str = "paged"  # "reserved": allocate prompt + max_tokens up front (pre-paging)
    enable_prefix_caching: bool = (
        False  # share cached prompt-prefix blocks (lesson 8; vLLM V1 turns it on)
    )
    scheduling_policy: str = (
        "fcfs"  # order of the waiting queue: "fcfs", or "lpm" (SGLang's longest prefix match)
    )
    attention_backend: str | None = None  # None: "triton" on CUDA, "sdpa" on CPU (core/builder.py)
    device: str = "cpu"
    dtype: str = "float32"
    quantization: str | None = (
        None  # vLLM's knob: QUANTIZATIONS, through torchao (model/quantization.py)
    )
    seed: int = 0
    cpu_threads: int = (
        1  # torch intra-op threads on CPU: the tiny model's ops are too small to share (README)
    )
    record_kv_blocks: bool = True  # keep each step's block tables (the KV map widget draws them)
    speculative_config: Any = (
        None  # vLLM's keys as a dict, or a spec.SpeculativeConfig (lesson 10); None: off
    )

    def validate(self) -> None:
        """Each knob on its own; checks against the model and policy happen in core/builder.py."""
        for name in ("max_num_seqs", "block_size", "cpu_threads"):
            check_int(name, getattr(self, name), 1)
        check_int(
            "long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            0,
            "must be an integer >= 0 (0: no cap)",
        )
        for name in ("num_blocks", "kv_cache_bytes", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) is not None:
                check_int(
                    name,
                    getattr(self, name),
                    1,
                    "must be a positive integer (or None for the default)",
                )
        for name, allowed in (
            ("scheduling_policy", SCHEDULING_POLICIES),
            ("kv_mode", KV_MODES),
            ("quantization", QUANTIZATIONS),
        ):
            if getattr(self, name) not in allowed:
                raise InvalidValue(
                    name, getattr(self, name), f"allowed: {', '.join(map(str, allowed))}"
                )
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise InvalidValue(
                "attention_backend",
                self.attention_backend,
                f"allowed: {', '.join(ATTENTION_BACKENDS)}",
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidValue(
                "gpu_memory_utilization", self.gpu_memory_utilization, "must be in (0, 1]"
            )
        budget = self.max_num_batched_tokens
        if budget is not None and budget < self.max_num_seqs:
            # vLLM's rule too: with fewer tokens a step than running requests, some decodes
            # would wait every step, the same ones each time.
            raise InvalidValue(
                "max_num_batched_tokens",
                budget,
                f"must be >= max_num_seqs={self.max_num_seqs}: a "
                f"step must have room for one decode token of every running request",
            )
