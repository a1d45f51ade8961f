"""A roofline cost model: how long one engine step takes for a model on a device.

The simulator (executor.py) runs the real scheduler and asks this model for each
step's duration, so a laptop can show a Llama-3-8B serving run on an H100.

One step computes `q_i` new tokens for each sequence i of its batch, and sequence i's
context after the step is `c_i` (cached tokens + its new ones). With
T = sum q_i tokens, B sequences, L layers, hidden d, Hq query heads and Hkv KV heads
of size D, MLP width I, vocabulary V, and b bytes per number:

    linear FLOPs    = 2 * T * P_lin + 2 * (B + drafts) * d * V
                      P_lin = L * (d*(Hq + 2*Hkv)*D + Hq*D*d + 3*d*I)  (q,k,v,o + SwiGLU)
                      (the lm_head runs once per sequence: only the last token's logits,
                      and once per draft token a step verifies, lesson 10)
    attention FLOPs = 4 * L * Hq * D * sum_i (q_i*c_i - q_i*(q_i - 1)/2)
                      (QK^T and PV, causal: new token j sees c_i - q_i + j + 1 keys)
    bytes           = W + KV_read + KV_write
                      W        = weights read once per step: every parameter except the
                                 input embedding table (a lookup reads only T of its rows)
                      KV_read  = 2 * L * Hkv * D * b * sum_i c_i
                      KV_write = 2 * L * Hkv * D * b * T
    compute  = FLOPs / (peak * eff_c)          memory = bytes / (bandwidth * eff_m)
    time     = (compute^p + memory^p)^(1/p) + all-reduces + overhead

Seed-level approximations, and where this model differs from them:

    prefill FLOPs ~ 2 * N * params   The linear part here excludes the embedding table
                  (no FLOPs) and counts the lm_head once per sequence, not per token;
                  attention adds 4*L*Hq*D*N^2/2, which the approximation leaves out and
                  which grows with N (Llama-3-8B, N = 8192: about +15%).
    decode bytes  ~ weights + KV     The same, except that the input embedding table is
                  not read (Llama-3-8B: 1.05 GB of its 16 GB of bf16 weights).

Activations are not counted as memory traffic (they are small next to the weights at
the batch sizes of a serving engine and stay in cache when they are not).

`p` says how much the two overlap. p = inf is the textbook roofline, max(compute,
memory): loading the weights hides the arithmetic completely. Real kernels do not: a
128-token prefill of Llama-2-7B on an A100, where the two are about equal, takes 16 ms
(TensorRT-LLM) to 22 ms (LMDeploy) against 10 ms for a decode step (LMDeploy): 1.6x to
2.2x, not 1x (bench/data/gpu_measurements.json). A finite p rounds the
corner: equal halves cost 2^(1/p) times one of them, and a step far from the ridge
costs what its larger term costs, as before.

A step is compute-bound when its arithmetic intensity (FLOPs / byte) exceeds the
device's ridge point, peak / bandwidth (H100 SXM: 989e12 / 3.35e12 = 295 FLOP/byte).
A decode step at batch 1 does ~2 FLOPs per 2-byte weight, 1 FLOP/byte: far below the
ridge, memory-bound. A prefill of N tokens does ~N FLOP/byte, so it becomes
compute-bound near N = ridge * b / 2 tokens (on an H100 with the fitted efficiencies,
227 FLOP/byte: the model crosses at N = 244).

`overhead` is what a step costs besides the roofline: scheduling, launching kernels,
sampling. It depends on the engine more than on the GPU, so it belongs to a kind of
engine (ENGINE_KINDS): a C++ runtime (TensorRT-LLM), a Python scheduler around CUDA
graphs (vLLM), a compiled loop (gpt-fast), eager PyTorch. The built-in GPUs charge the
lab's engine's, vLLM's; `CostModel(..., engine="cpp")` charges another kind's. On this
machine's CPU the engine is this lab's Python over per-sequence attention calls, so the
calibrated `cpu` spec has a cost per step, per layer and per sequence and layer
(bench/calibrate_cpu.py fits all of them from measured steps).

Tensor parallelism (`tp` GPUs): FLOPs, weights and KV are split evenly, and every layer
adds two all-reduces of the step's activations (T * d * b bytes) over the interconnect:
each costs a fixed latency (launch and synchronization, what a decode step's few
kilobytes mostly pay) plus its bytes, 2 * (tp - 1) / tp of which cross each link (ring):

    all-reduces = 2 * L * (allreduce_latency + 2 * (tp - 1) / tp * T * d * b / link)

Quantization (vLLM's `quantization` and `kv_cache_dtype`; lesson 10). The linear layers'
weights (q, k, v, o and the MLP: P_lin above) take one byte each instead of b; the LM head,
the embedding and the norms keep theirs, as vLLM's fp8 and the lab's engine
(model/quantization.py) leave them. With `kv_cache_dtype="fp8"` K and V take one byte each.

    int8   weight-only: W shrinks, the linear FLOPs run at the 16-bit rate (the weights
           are dequantized to bf16 inside the matmul)
    fp8    weights and activations in FP8 (W8A8): the linear FLOPs run at the device's
           FP8 tensor-core rate (`fp8_flops`, twice the bf16 rate on Ada and Hopper); a
           device without FP8 arithmetic (A100, CPU) runs it as weight-only, as vLLM does

So a memory-bound decode gains up to the bytes ratio either way, and only fp8 on an FP8
device makes compute-bound prefill faster. The fitted efficiencies are the 16-bit ones:
no quantized measurement went into the fit (bench/calibrate_gpu.py), and real 8-bit
kernels reach less of the bandwidth (torchao's int8 weight-only Llama-2-7B decode on an
A100: 1.59x bf16's tokens/s, where the bytes alone would give 1.9x; tests/test_costmodel.py).

The efficiencies, p, the all-reduce latency and the engines' overheads are fitted to
published measurements of A100 and H100 GPUs by bench/calibrate_gpu.py (see the
constants below); the datasheet rates are not.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..config import MODEL_PRESETS, QUANTIZATIONS, SUPPORTED_MODEL_TYPES, InvalidValue, ModelConfig
from ..model.loader import resolve_dtype

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator, as data. Rates are vendor datasheet peaks; efficiencies say how
    much of them a real engine reaches. The built-in GPUs' efficiencies, roofline_p,
    allreduce_latency and step_overhead are fitted to published measurements by
    bench/calibrate_gpu.py; the defaults here are untuned guesses for a custom device."""

    name: str
    flops: float  # dense bf16/fp16 tensor-core FLOP/s (no 2:4 sparsity)
    mem_bw: float  # memory bandwidth, bytes/s
    memory: float  # device memory, bytes
    step_overhead: float = 1e-3  # seconds per step: launches, scheduling, sampling (the engine's)
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    layer_overhead: float = 0.0  # seconds per layer per step (CPU, eager PyTorch: Python per layer)
    seq_overhead: float = 0.0  # seconds per sequence per layer (CPU: per-sequence attention)
    interconnect_bw: float = 0.0  # bytes/s per GPU to its peers (tensor parallelism)
    dtype: str = "bfloat16"  # what the device serves in unless told otherwise
    source: str = ""
    roofline_p: float = (
        math.inf
    )  # compute and memory time combine as (c^p + m^p)^(1/p); inf: max(c, m)
    allreduce_latency: float = (
        0.0  # seconds each all-reduce costs besides its bytes (tensor parallelism)
    )
    fp8_flops: float = 0.0  # dense FP8 tensor-core FLOP/s; 0: no FP8 arithmetic (A100, CPUs)

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which a step is compute-bound (with the efficiencies)."""
        return self.flops * self.compute_efficiency / (self.mem_bw * self.memory_efficiency)


# ---- fitted to published measurements (bench/calibrate_gpu.py) ---------------------------
# calibrate_gpu.py reproduces published measurements of Llama-family models on A100 and H100
# (bench/data/gpu_measurements.json, each with its citation) with this model, fits the values
# below on the fit sources (gpt-fast, TensorRT-LLM's docs, NeMo, Qwen's speed benchmark) and
# reports the error on the held-out ones (LMDeploy, torchao): bench/results/calibrate_gpu.json
# and bench/README.md's "Simulator against published GPU measurements". Rounded to 3 digits.
# One compute efficiency for both: no H100 point is compute-bound enough to fit its own.
ROOFLINE_P = 1.54  # every GPU: how compute and memory time combine, (c^p + m^p)^(1/p)
A100_FIT = {"compute_efficiency": 0.693, "memory_efficiency": 0.827, "allreduce_latency": 3.57e-05}
H100_FIT = {"compute_efficiency": 0.693, "memory_efficiency": 0.903, "allreduce_latency": 1.78e-05}


@dataclass(frozen=True)
class EngineKind:
    """What a kind of engine costs per step besides the roofline (lesson 1): a Python
    scheduler, a C++ runtime and eager PyTorch differ by milliseconds a step."""

    name: str
    step_overhead: float  # seconds per step: scheduling, launches, sampling
    layer_overhead: float = (
        0.0  # seconds per layer per step: kernels launched one by one from Python
    )
    examples: str = ""


# Fitted by bench/calibrate_gpu.py with the constants above: what each kind pays a step on
# top of its kernels. The fit is free to put eager PyTorch's cost per layer; with one eager
# model in the fit sources it chose a cost per step.
ENGINE_KINDS: dict[str, EngineKind] = {
    "vllm": EngineKind(
        "vllm", 0.00363, examples="vLLM 0.6: Python scheduler, CUDA graphs (fit: Qwen's vLLM rows)"
    ),
    "cpp": EngineKind(
        "cpp",
        0.00354,
        examples="TensorRT-LLM, LMDeploy TurboMind: C++ runtimes (fit: TensorRT-LLM, NeMo)",
    ),
    "compiled": EngineKind(
        "compiled",
        0.0,
        examples="gpt-fast: torch.compile, a CUDA graph a step, no scheduler "
        "(fit: gpt-fast; its cost hides in the all-reduce latency)",
    ),
    "eager": EngineKind(
        "eager",
        0.0185,
        0.0,
        examples="Hugging Face transformers, PyTorch without compile (fit: Qwen's "
        "transformers rows)",
    ),
}
LAB_ENGINE = "vllm"  # the built-in GPUs' overhead: the lab's engine is a vLLM-like Python engine


def gpu(
    name: str,
    flops: float,
    mem_bw: float,
    memory: float,
    interconnect_bw: float,
    source: str,
    fit: dict,
    fp8_flops: float = 0.0,
) -> DeviceSpec:
    """A GPU from its datasheet and a fitted set of efficiencies, with the lab engine's overhead."""
    return DeviceSpec(
        name,
        flops,
        mem_bw,
        memory,
        step_overhead=ENGINE_KINDS[LAB_ENGINE].step_overhead,
        interconnect_bw=interconnect_bw,
        source=source,
        roofline_p=ROOFLINE_P,
        fp8_flops=fp8_flops,
        **fit,
    )


# Vendor datasheet values. NVIDIA quotes tensor FLOP/s "with sparsity"; the dense
# rate used here is half of that. GB here are 10^9 bytes, as on the datasheets. FP8 tensor
# cores came with Ada and Hopper; the A100 (Ampere) has none: vLLM runs fp8 there as
# weight-only (FP8 Marlin kernels; docs.vllm.ai, "FP8 W8A8").
DEVICE_SPECS: dict[str, DeviceSpec] = {
    # H100 SXM5 datasheet: BF16 tensor 1,979 TFLOPS with sparsity (989 dense), FP8 tensor
    # 3,958 with sparsity (1,979 dense), HBM3 3.35 TB/s, 80 GB, NVLink 900 GB/s.
    "h100": gpu(
        "H100 SXM",
        989e12,
        3.35 * TB,
        80 * GB,
        900 * GB,
        "NVIDIA H100 datasheet (SXM5)",
        H100_FIT,
        fp8_flops=1979e12,
    ),
    # H200 SXM datasheet: same compute as H100 SXM (FP8 3,958 with sparsity, 1,979 dense),
    # HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s.
    # No published 16-bit H200 measurement was found: the H100's fit (same chip, faster memory).
    "h200": gpu(
        "H200 SXM",
        989e12,
        4.8 * TB,
        141 * GB,
        900 * GB,
        "NVIDIA H200 datasheet (SXM)",
        H100_FIT,
        fp8_flops=1979e12,
    ),
    # A100 80GB SXM datasheet: BF16 tensor 312 TFLOPS dense (624 with sparsity), no FP8,
    # HBM2e 2,039 GB/s, NVLink 600 GB/s.
    "a100": gpu(
        "A100 80GB SXM",
        312e12,
        2039 * GB,
        80 * GB,
        600 * GB,
        "NVIDIA A100 datasheet (80GB SXM)",
        A100_FIT,
    ),
    # The three below were not measured: they take the A100's fit (Ampere; Ada is its successor).
    # L40S datasheet: BF16 tensor 362.05 TFLOPS dense (733 with sparsity), FP8 733 dense
    # (1,466 with sparsity), GDDR6 864 GB/s, 48 GB, PCIe Gen4 x16 64 GB/s (no NVLink).
    "l40s": gpu(
        "L40S",
        362.05e12,
        864 * GB,
        48 * GB,
        32 * GB,
        "NVIDIA L40S datasheet",
        A100_FIT,
        fp8_flops=733e12,
    ),
    # L4 datasheet: BF16 tensor 242 TFLOPS with sparsity (121 dense), FP8 485 with sparsity
    # (242.5 dense), GDDR6 300 GB/s, 24 GB.
    "l4": gpu(
        "L4",
        121e12,
        300 * GB,
        24 * GB,
        32 * GB,
        "NVIDIA L4 datasheet",
        A100_FIT,
        fp8_flops=242.5e12,
    ),
    # RTX 4090, Ada architecture whitepaper: FP16/BF16 tensor with FP32 accumulate
    # 165.2 TFLOPS dense (what PyTorch's bf16 matmuls use), FP8 with FP32 accumulate 330.3
    # dense (660.6 with sparsity), GDDR6X 1,008 GB/s, 24 GB.
    "rtx4090": gpu(
        "RTX 4090",
        165.2e12,
        1008 * GB,
        24 * GB,
        32 * GB,
        "NVIDIA Ada Lovelace architecture whitepaper",
        A100_FIT,
        fp8_flops=330.3e12,
    ),
}
KV_CACHE_DTYPES = ("auto", "fp8")  # vLLM's --kv-cache-dtype: auto is the weights' dtype

CPU_SPEC_FILE = Path(__file__).parent / "cpu_device.json"
DEVICE_NAMES = (*DEVICE_SPECS, "cpu")


def get_device(name: str | DeviceSpec) -> DeviceSpec:
    """A device spec by name (h100, h200, a100, l40s, l4, rtx4090, cpu), or one given."""
    if isinstance(name, DeviceSpec):
        return name
    key = str(name).lower()
    if key == "cpu":
        return load_cpu_spec()
    if key not in DEVICE_SPECS:
        raise InvalidValue("device", name, f"allowed: {', '.join(DEVICE_NAMES)} (or a DeviceSpec)")
    return DEVICE_SPECS[key]


def get_engine_kind(name: str | EngineKind) -> EngineKind:
    """An engine kind by name (vllm, cpp, compiled, eager), or one given."""
    if isinstance(name, EngineKind):
        return name
    if name not in ENGINE_KINDS:
        raise InvalidValue("engine", name, f"allowed: {', '.join(ENGINE_KINDS)} (or an EngineKind)")
    return ENGINE_KINDS[name]


def load_cpu_spec(path: str | Path = CPU_SPEC_FILE) -> DeviceSpec:
    """This machine's CPU, as fitted by bench/calibrate_cpu.py."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no calibrated cpu spec at {path}; run `python bench/calibrate_cpu.py`")
    data = json.loads(path.read_text())
    return DeviceSpec(**data["spec"])


def save_cpu_spec(spec: DeviceSpec, extra: dict, path: str | Path = CPU_SPEC_FILE) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"spec": asdict(spec), **extra}, indent=2) + "\n")
    return path


# ---- model specs ----------------------------------------------------------------
# Sizes from each model's Hugging Face config.json.
LLAMA_3_8B = ModelConfig(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    bos_token_id=128000,
    eos_token_id=128001,
    torch_dtype="bfloat16",
)
LLAMA_3_70B = replace(
    LLAMA_3_8B,
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
)
MODEL_SPECS: dict[str, ModelConfig] = {
    **MODEL_PRESETS,
    "llama-2-7b": ModelConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float16",
    ),
    "llama-3-8b": LLAMA_3_8B,
    # Llama 3.1: Llama 3's sizes, trained to 128k positions (its RoPE scaling changes no cost)
    "llama-3.1-8b": replace(LLAMA_3_8B, max_position_embeddings=131072),
    "llama-3-70b": LLAMA_3_70B,
    # Llama 2 70B: 80 layers, grouped-query attention (8 KV heads), the Llama 2 vocabulary
    "llama-2-70b": ModelConfig(
        vocab_size=32000,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float16",
    ),
    "llama-3.1-70b": replace(LLAMA_3_70B, max_position_embeddings=131072),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        attention_bias=True,
        bos_token_id=151643,
        eos_token_id=151643,
        model_type="qwen2",
        torch_dtype="bfloat16",
    ),
    "qwen2.5-72b": ModelConfig(
        vocab_size=152064,
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        attention_bias=True,
        bos_token_id=151643,
        eos_token_id=151645,
        model_type="qwen2",
        torch_dtype="bfloat16",
    ),
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json): Llama 3's tokenizer, so a draft for Llama 3's 8B and 70B
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128001,
        torch_dtype="bfloat16",
    ),
    "mistral-7b": ModelConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        bos_token_id=1,
        eos_token_id=2,
        model_type="mistral",
        torch_dtype="bfloat16",
    ),
}

SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "bos_token_id",
    "eos_token_id",
    "torch_dtype",
)


def sizes_from_hf_config(d: dict) -> ModelConfig:
    """The sizes of any Llama-shaped HF `config.json` (SwiGLU MLP, grouped-query attention).

    Unlike `ModelConfig.from_hf_dict`, fields the cost does not depend on (rope_scaling,
    sliding windows, ...) are ignored, so Llama-3.1 or Qwen3 configs work too; a model_type
    the real model does not implement is counted as "llama".
    """
    missing = [k for k in SIZE_FIELDS[:5] if k not in d]
    if missing:
        raise ValueError(
            f"config.json lacks {', '.join(missing)}; the cost model needs the model's sizes"
        )
    if d.get("hidden_act", "silu") != "silu":
        raise InvalidValue(
            "hidden_act", d["hidden_act"], "the cost model counts a SwiGLU (silu) MLP"
        )
    kw = {k: d[k] for k in SIZE_FIELDS if d.get(k) is not None}
    kw.setdefault("num_key_value_heads", d["num_attention_heads"])
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = kw["eos_token_id"][0]
    model_type = d.get("model_type", "llama")
    kw["model_type"] = model_type if model_type in SUPPORTED_MODEL_TYPES else "llama"
    if model_type == "qwen2":
        kw.setdefault("attention_bias", True)
    return ModelConfig(**kw)


def get_model_spec(name_or_path: str | ModelConfig) -> ModelConfig:
    """A model spec: a preset name (tiny, small, llama-3-8b, ...), a config.json, or a
    checkpoint directory holding one."""
    if isinstance(name_or_path, ModelConfig):
        return name_or_path
    if str(name_or_path).lower() in MODEL_SPECS:
        return MODEL_SPECS[str(name_or_path).lower()]
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InvalidValue(
            "model",
            str(name_or_path),
            f"not a preset ({', '.join(MODEL_SPECS)}), a config.json or a directory with one",
        )
    return sizes_from_hf_config(json.loads(p.read_text()))


# ---- the cost of one step ----------------------------------------------------------
@dataclass
class StepCost:
    """What one step does and how long the model says it takes (seconds)."""

    num_seqs: int
    num_tokens: int
    linear_flops: float
    attention_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    roofline_p: float = math.inf

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def roofline_s(self) -> float:
        """Compute and memory time together: max(compute, memory) when they overlap fully."""
        return roofline(self.compute_s, self.memory_s, self.roofline_p)

    @property
    def time(self) -> float:
        return self.roofline_s + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline(compute_s: float, memory_s: float, p: float) -> float:
    """(compute^p + memory^p)^(1/p): the max for p = inf, their sum for p = 1."""
    if math.isinf(p):
        return max(compute_s, memory_s)
    hi = max(compute_s, memory_s)
    return 0.0 if hi == 0 else hi * ((compute_s / hi) ** p + (memory_s / hi) ** p) ** (1 / p)


def plan_shape(plan) -> list[tuple[int, int]]:
    """(new tokens, context after the step) of each sequence of a `StepPlan`; padding
    tokens count as real ones: they cost what a real token costs."""
    return [(w.num_new_tokens + w.num_padding, w.end) for w in plan.work]


def items_shape(items: Iterable) -> list[tuple[int, int]]:
    """The same from a timeline step's `StepItem`s (a padding item joins its request's row; a
    verifying decode's context ends at its last draft, rejected or not: all were computed)."""
    rows: dict[str, list[int]] = {}
    for it in items:
        if (
            it.kind == "cached"
        ):  # found in the prefix cache: no compute (its K/V are read as context)
            continue
        row = rows.setdefault(it.request_id, [0, 0])
        row[0] += it.num_tokens
        row[1] = max(row[1], it.context_len + it.num_draft - it.num_accepted)
    return [(q, c) for q, c in rows.values()]


class CostModel:
    """Step times of `model` on `device` (names or specs), `tp` devices in tensor parallel.
    `engine` (vllm, cpp, compiled, eager) replaces the device's per-step overheads with that
    kind of engine's; by default a built-in GPU pays the lab's engine's (vllm).
    `quantization` (None, int8, fp8) stores the linear layers' weights in one byte each, and
    `kv_cache_dtype="fp8"` the KV cache (vLLM's knobs; the module docstring says what each costs)."""

    def __init__(
        self,
        model: str | ModelConfig = "llama-3-8b",
        device: str | DeviceSpec = "h100",
        dtype: str | None = None,
        tp: int = 1,
        engine: str | EngineKind | None = None,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
    ):
        self.model = get_model_spec(model)
        self.name = model if isinstance(model, str) else "custom"
        self.device = get_device(device)
        self.engine = None if engine is None else get_engine_kind(engine)
        self.dtype = dtype or self.device.dtype
        if not isinstance(tp, int) or tp < 1:
            raise InvalidValue("tp", tp, "must be a positive integer (GPUs in tensor parallel)")
        if tp > 1 and self.device.interconnect_bw <= 0:
            raise InvalidValue(
                "tp", tp, f"device {self.device.name} has no interconnect bandwidth in its spec"
            )
        for name, value, allowed in (
            ("quantization", quantization, QUANTIZATIONS),
            ("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES),
        ):
            if value not in allowed:
                raise InvalidValue(name, value, f"allowed: {', '.join(map(str, allowed))}")
        m, self.tp, self.quantization, self.kv_cache_dtype = (
            self.model,
            tp,
            quantization,
            kv_cache_dtype,
        )
        self.dtype_bytes = resolve_dtype(self.dtype).itemsize
        d, hq, hkv, D = m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim
        self.linear_params = m.num_hidden_layers * (
            d * (hq + 2 * hkv) * D + hq * D * d + 3 * d * m.intermediate_size
        )
        self.lm_head_params = d * m.vocab_size
        embed_read = 0 if m.tie_word_embeddings else m.vocab_size * d  # the input table: a lookup
        # a quantized linear weight is one byte (its per-row scales, d_out floats a matrix, are left out)
        linear_bytes = self.dtype_bytes if quantization is None else 1
        self.weight_memory = (
            self.linear_params * linear_bytes
            + (m.num_params - self.linear_params) * self.dtype_bytes
        )
        self.weight_bytes = self.weight_memory - embed_read * self.dtype_bytes
        self.kv_bytes_per_token = m.kv_bytes_per_token(
            1 if kv_cache_dtype == "fp8" else self.dtype_bytes
        )
        self.attn_flops_per_pair = 4 * m.num_hidden_layers * hq * D  # per (query, key) pair
        dev = self.device
        self.flop_rate = dev.flops * dev.compute_efficiency * tp
        # fp8 (vLLM's W8A8) multiplies on FP8 tensor cores where the device has them; int8 weights,
        # and fp8 ones without FP8 arithmetic, are dequantized and multiplied at the 16-bit rate
        fp8 = quantization == "fp8" and dev.fp8_flops > 0
        self.linear_speedup = dev.fp8_flops / dev.flops if fp8 else 1
        self.byte_rate = dev.mem_bw * dev.memory_efficiency * tp
        step, layer = (
            (dev.step_overhead, dev.layer_overhead)
            if self.engine is None
            else (self.engine.step_overhead, self.engine.layer_overhead)
        )
        self.layer_s = step + layer * m.num_hidden_layers
        self.seq_s = dev.seq_overhead * m.num_hidden_layers
        # two all-reduces of [T, d] activations per layer, ring algorithm: a fixed latency
        # each, plus 2 * (tp - 1) / tp of the data over each GPU's link
        self.allreduces = 0 if tp == 1 else 2 * m.num_hidden_layers
        self.comm_fixed_s = self.allreduces * dev.allreduce_latency
        self.comm_s_per_token = (
            0.0
            if tp == 1
            else self.allreduces * 2 * (tp - 1) / tp * d * self.dtype_bytes / dev.interconnect_bw
        )

    def describe(self) -> dict:
        return {
            "device": self.device.name,
            "dtype": self.dtype,
            "tp": self.tp,
            "engine": "the device's own" if self.engine is None else self.engine.name,
            "params": self.model.num_params,
            "weight_bytes": self.weight_bytes,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
        }

    def cost(self, shape: list[tuple[int, int]], num_drafts: int = 0) -> StepCost:
        """The cost of a step from (new tokens, context after the step) per sequence; `num_drafts`
        of its tokens are drafts it verifies, each with logits of its own (lesson 10)."""
        B = len(shape)
        num_tokens = sum(q for q, _ in shape)
        context = sum(c for _, c in shape)
        pairs = (
            context if num_tokens == B else sum(q * c - q * (q - 1) // 2 for q, c in shape)
        )  # all decodes: 1 * c
        return self.cost_of_sums(B, num_tokens, context, pairs, num_drafts)

    def cost_of_sums(
        self, B: int, num_tokens: int, context: int, pairs: int, num_drafts: int = 0
    ) -> StepCost:
        """`cost` from the shape's sums: B sequences, their new tokens, their contexts and
        (query, key) pairs; a decode-only step of B sequences is (B, B, context, context)."""
        linear = 2.0 * (num_tokens * self.linear_params + (B + num_drafts) * self.lm_head_params)
        at_16bit_rate = 2.0 * (
            num_tokens * self.linear_params / self.linear_speedup
            + (B + num_drafts) * self.lm_head_params
        )
        attention = float(self.attn_flops_per_pair * pairs)
        kv_read = float(self.kv_bytes_per_token * context)
        kv_write = float(self.kv_bytes_per_token * num_tokens)
        return StepCost(
            B,
            num_tokens,
            linear,
            attention,
            float(self.weight_bytes),
            kv_read,
            kv_write,
            compute_s=(at_16bit_rate + attention) / self.flop_rate,
            memory_s=(self.weight_bytes + kv_read + kv_write) / self.byte_rate,
            comm_s=self.comm_fixed_s + self.comm_s_per_token * num_tokens,
            overhead_s=self.layer_s + self.seq_s * B,
            roofline_p=self.device.roofline_p,
        )

    def step_time(self, plan) -> float:
        """Seconds for a `StepPlan` (the SimulatedClock's callback)."""
        return self.cost(plan_shape(plan), sum(len(w.draft_token_ids) for w in plan.work)).time

    def items_time(self, items: Iterable) -> float:
        """Seconds for a recorded step's items (what a timeline step would take here), without a
        draft model's own work (`StepRecord.draft_time`)."""
        items = list(items)
        return self.cost(items_shape(items), sum(it.num_draft for it in items)).time

    # ---- KV capacity ---------------------------------------------------------------
    def kv_cache_bytes(self, gpu_memory_utilization: float = 0.9) -> int:
        """Bytes left for the KV cache on all `tp` devices after the weights (vLLM's rule,
        without its activation-memory profiling run)."""
        if not 0 < gpu_memory_utilization <= 1:
            raise InvalidValue(
                "gpu_memory_utilization", gpu_memory_utilization, "must be in (0, 1]"
            )
        total = self.device.memory * gpu_memory_utilization * self.tp
        weights = self.weight_memory
        if weights >= total:
            raise ValueError(
                f"{weights / GB:.1f} GB of {self.quantization or self.dtype} weights do not fit in "
                f"{gpu_memory_utilization:.0%} of {self.tp} x {self.device.memory / GB:.0f} GB ({self.device.name}); raise tp or use a bigger device"
            )
        return int(total - weights)

    def kv_num_blocks(self, block_size: int = 16, gpu_memory_utilization: float = 0.9) -> int:
        return self.kv_cache_bytes(gpu_memory_utilization) // (block_size * self.kv_bytes_per_token)
