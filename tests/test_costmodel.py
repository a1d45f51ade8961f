"""The roofline cost model and the simulator (costmodel.py, simulator.py)."""

import json

import pytest
from helpers import MICRO, micro_model
from hypothesis import given, settings
from hypothesis import strategies as st

from minilm import Engine, EngineConfig, make_workload
from minilm.cli import main
from minilm.config import InvalidValue
from minilm.core.clock import SimulatedClock
from minilm.sim import simulated_engine, vllm_default_budget
from minilm.sim.costmodel import (
    DEVICE_SPECS,
    ENGINE_KINDS,
    MODEL_SPECS,
    CostModel,
    get_device,
    get_model_spec,
    roofline,
    sizes_from_hf_config,
)
from minilm.workload import RequestSpec
from training.checkpoint import hf_config

GPUS = sorted(DEVICE_SPECS)


def run_sim(policy="chunked", n=60, rate=40.0, **knobs):
    e = simulated_engine("llama-3-8b", "h100", policy, max_num_seqs=32, max_model_len=512, **knobs)
    e.add_workload(
        make_workload(
            "mixed", n, seed=3, vocab_size=e.model_config.vocab_size, rate=rate, max_model_len=512
        )
    )
    return e.run()


# ---- determinism and arrivals -------------------------------------------------------
@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_same_inputs_give_the_identical_timeline(policy):
    a, b = run_sim(policy), run_sim(policy)
    assert a.to_json() == b.to_json()
    assert a.meta["clock"] == "simulated" and a.meta["device"] == "H100 SXM"


def test_arrivals_are_honoured_and_lengths_come_from_max_tokens():
    tl = run_sim("continuous", n=40, rate=2.0)
    for r in tl.requests:
        assert r.t_scheduled >= r.arrival and r.t_first_token > r.arrival
        assert r.output_len == r.max_tokens and r.finish_reason == "length"
    # steps run back to back, except when the engine is idle: then the clock jumps to the next arrival
    arrivals = {r.arrival for r in tl.requests}
    jumps = [b.t_start for a, b in zip(tl.steps, tl.steps[1:]) if b.t_start != a.t_end]
    assert jumps and all(t in arrivals and t > 0 for t in jumps)


# ---- the roofline ---------------------------------------------------------------------
shapes = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    shape=shapes,
    device=st.sampled_from(GPUS + ["cpu"]),
    grow=st.sampled_from(["token", "context", "seq"]),
    which=st.integers(0, 39),
)
def test_more_tokens_never_take_less_time(shape, device, grow, which):
    cm = CostModel("llama-3-8b" if device != "cpu" else "tiny", device)
    base = [(q, q + c) for q, c in shape]  # context after the step includes the new tokens
    i = which % len(base)
    q, c = base[i]
    more = list(base)
    if grow == "token":
        more[i] = (q + 1, c + 1)
    elif grow == "context":
        more[i] = (q, c + 1)
    else:
        more.append((1, 1))
    assert cm.cost(more).time >= cm.cost(base).time


def test_decode_is_memory_bound_and_long_prefill_compute_bound_on_h100():
    cm = CostModel("llama-3-8b", "h100")
    assert cm.cost([(1, 1024)]).bound == "memory"
    assert cm.cost([(8192, 8192)]).bound == "compute"
    # the crossover: the prompt length where a prefill turns compute-bound. A prefill of N
    # tokens does ~2 FLOPs per weight per token over b bytes per weight, N * 2 / b FLOP/byte,
    # so it should cross near N = ridge * b / 2 (H100 with the fitted efficiencies: 227 FLOP/byte).
    n_cross = next(n for n in range(1, 4096) if cm.cost([(n, n)]).bound == "compute")
    expected = cm.device.ridge_point * cm.dtype_bytes / 2
    assert expected == pytest.approx(226.6, abs=0.1)
    assert n_cross == pytest.approx(expected, rel=0.15)  # the model crosses at n = 244
    # batching decodes raises intensity the same way: 64 decodes are still memory-bound
    assert cm.cost([(1, 512)] * 64).bound == "memory"


def test_llama2_7b_fp16_decode_at_batch_1_on_a100_is_near_weights_over_bandwidth():
    cm = CostModel("llama-2-7b", "a100", dtype="float16")
    ideal = get_model_spec("llama-2-7b").num_params * 2 / DEVICE_SPECS["a100"].mem_bw  # 6.61 ms
    t = cm.cost([(1, 128)]).time  # 11.5 ms: 82.7% of peak bandwidth, plus vLLM's 3.6 ms a step
    assert ideal == pytest.approx(6.61e-3, rel=0.01)
    assert (
        1.0 < t / ideal < 2.0
    )  # published: LMDeploy 10 ms, gpt-fast 9.5 ms (bench/data/gpu_measurements.json)
    assert t == pytest.approx(11.5e-3, rel=0.01)
    # a C++ runtime pays about what vLLM does a step (fitted on TensorRT-LLM and NeMo)
    assert CostModel("llama-2-7b", "a100", dtype="float16", engine="cpp").cost(
        [(1, 128)]
    ).time == pytest.approx(11.4e-3, rel=0.01)


def test_roofline_corner_all_reduce_latency_and_engine_kinds():
    # the corner: max at p = inf, the sum at p = 1; equal halves cost 2^(1/p) of one
    assert roofline(3.0, 1.0, float("inf")) == 3.0 and roofline(3.0, 1.0, 1.0) == pytest.approx(4.0)
    p = DEVICE_SPECS["a100"].roofline_p
    assert roofline(1.0, 1.0, p) == pytest.approx(2 ** (1 / p)) and roofline(0.0, 0.0, p) == 0.0
    # every all-reduce pays its latency: two per layer, however few the bytes
    two = CostModel("llama-3-70b", "h100", tp=2).cost([(1, 100)])
    assert two.comm_s > 2 * 80 * DEVICE_SPECS["h100"].allreduce_latency > 0
    # the engine kind sets the overhead; a built-in GPU pays the lab engine's (vLLM's)
    step = {
        k: CostModel("llama-3-8b", "a100", engine=k).cost([(1, 100)]).overhead_s
        for k in ENGINE_KINDS
    }
    assert (
        CostModel("llama-3-8b", "a100").cost([(1, 100)]).overhead_s
        == step["vllm"]
        == ENGINE_KINDS["vllm"].step_overhead
    )
    assert step["eager"] > step["vllm"] > step["compiled"]
    with pytest.raises(ValueError, match="allowed: vllm"):
        CostModel("llama-3-8b", "a100", engine="sglang")


def test_items_and_plans_give_the_same_time():
    tl = run_sim("static", n=40)
    cm = CostModel("llama-3-8b", "h100")
    for s in tl.steps[:200]:
        assert cm.items_time(s.items) == pytest.approx(s.duration, rel=1e-12)


# ---- KV capacity, specs ------------------------------------------------------------------
def test_kv_capacity_from_memory_left_after_weights():
    cm = CostModel("llama-3-8b", "h100")
    weights = MODEL_SPECS["llama-3-8b"].num_params * 2  # 16.06 GB of bf16
    per_block = 2 * 32 * 16 * 8 * 128 * 2  # K and V, 32 layers, 16 tokens, 8 KV heads of 128: 2 MiB
    assert cm.kv_num_blocks(16, 0.9) == int(80e9 * 0.9 - weights) // per_block == 26674
    assert cm.kv_num_blocks(16, 0.5) < cm.kv_num_blocks(16, 0.9)
    with pytest.raises(ValueError, match="do not fit"):
        CostModel("llama-3-70b", "h100").kv_num_blocks()
    assert CostModel("llama-3-70b", "h100", tp=4).kv_num_blocks() > 0
    e = simulated_engine("llama-3-8b", "h100", "continuous")
    assert e.kv_manager.num_blocks == 26674


def test_tensor_parallel_splits_the_work_and_adds_all_reduces():
    one, four = CostModel("llama-3-70b", "h100", tp=2), CostModel("llama-3-70b", "h100", tp=4)
    shape = [(1, 1000)] * 32
    assert four.cost(shape).memory_s == pytest.approx(one.cost(shape).memory_s / 2)
    assert four.cost(shape).comm_s > one.cost(shape).comm_s > 0


def test_model_specs_and_hf_configs():
    assert (
        get_model_spec("llama-3-8b").num_params == 8_030_261_248
    )  # HF's count for Meta-Llama-3-8B
    llama31 = {
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    }
    assert sizes_from_hf_config(llama31).num_params == get_model_spec("llama-3-8b").num_params
    with pytest.raises(ValueError, match="hidden_size"):
        sizes_from_hf_config({"vocab_size": 10})
    with pytest.raises(ValueError, match="gelu"):
        sizes_from_hf_config({**llama31, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="allowed: h100"):
        get_device("tpu-v9")
    with pytest.raises(ValueError, match="not a preset"):
        get_model_spec("no-such-model")
    with pytest.raises(ValueError, match="tp=0"):
        CostModel("tiny", "h100", tp=0)


def test_a_config_json_path_works(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(hf_config(MODEL_SPECS["qwen2.5-7b"])))
    assert get_model_spec(tmp_path).num_params == get_model_spec("qwen2.5-7b").num_params
    assert get_model_spec(p).attention_bias


# ---- quantization (vLLM's quantization and kv_cache_dtype) -----------------------------------
def test_fp8_halves_the_linear_weights_and_the_kv_cache():
    bf16, fp8 = (
        CostModel("llama-3-8b", "h100"),
        CostModel("llama-3-8b", "h100", quantization="fp8", kv_cache_dtype="fp8"),
    )
    linear = fp8.linear_params  # q, k, v, o and the MLP: 6.98 G of Llama-3-8B's 8.03 G parameters
    assert linear == pytest.approx(6.98e9, rel=1e-3)
    assert (
        bf16.weight_bytes - fp8.weight_bytes == linear
    )  # 2 bytes -> 1; the LM head and norms stay bf16
    assert bf16.weight_memory - fp8.weight_memory == linear
    assert (
        fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 131072
    )  # 2 x 32 layers x 8 heads x 128 x 2 B
    int8 = CostModel("llama-3-8b", "h100", quantization="int8")
    assert (
        int8.weight_bytes == fp8.weight_bytes and int8.kv_bytes_per_token == bf16.kv_bytes_per_token
    )
    # fp8 KV holds twice the tokens in the memory the (smaller) weights leave
    assert (
        fp8.kv_num_blocks()
        == 2 * int8.kv_num_blocks()
        == 2 * int(72e9 - int8.weight_memory) // (16 * 131072)
    )
    e = simulated_engine(
        "llama-3-8b", "h100", "continuous", quantization="fp8", kv_cache_dtype="fp8"
    )
    assert e.kv_manager.num_blocks == fp8.kv_num_blocks() == 60004  # bf16: 26674
    assert (e.timeline.meta["quantization"], e.timeline.meta["kv_cache_dtype"]) == ("fp8", "fp8")
    halved = simulated_engine("llama-3-8b", "h100", kv_cache_dtype="fp8", kv_cache_bytes=2**30)
    assert halved.kv_manager.num_blocks == 2**30 // (16 * 65536) == 1024


def test_a_memory_bound_decode_gains_the_bytes_ratio():
    """Batch 1 on an H100: the step is memory-bound, so 8-bit weights cut its roofline time by
    the bytes read (15.01 GB of weights -> 8.03 GB, plus 0.13 GB of KV for a 1k-token context:
    1.85x). vLLM's 3.6 ms a step does not shrink: the whole step gains 1.36x; a compiled
    engine (no scheduler) gains the bytes ratio."""
    shape = [(1, 1024)]
    for engine, whole in ((None, 1.36), ("compiled", 1.85)):
        base, fp8 = (
            CostModel("llama-3-8b", "h100", engine=engine, quantization=q).cost(shape)
            for q in (None, "fp8")
        )
        bytes_ratio = base.bytes / fp8.bytes
        assert bytes_ratio == pytest.approx(1.85, abs=0.01)
        assert base.bound == fp8.bound == "memory"
        assert base.roofline_s / fp8.roofline_s == pytest.approx(bytes_ratio, rel=0.02)
        assert base.time / fp8.time == pytest.approx(whole, abs=0.01)


def test_fp8_computes_faster_only_where_the_device_has_fp8_tensor_cores():
    prefill = [(4096, 4096)]  # compute-bound on both
    linear_share = (
        2
        * 4096
        * CostModel("llama-3-8b").linear_params
        / CostModel("llama-3-8b").cost(prefill).flops
    )
    assert linear_share == pytest.approx(
        0.929, abs=0.001
    )  # the rest: attention and the LM head, in bf16
    h100 = DEVICE_SPECS["h100"]
    for device, gain in (
        ("h100", 1 / (1 - linear_share + linear_share * h100.flops / h100.fp8_flops)),
        ("a100", 1.0),
    ):
        bf16, int8, fp8 = (
            CostModel("llama-3-8b", device, quantization=q).cost(prefill)
            for q in (None, "int8", "fp8")
        )
        assert (
            bf16.bound == "compute" and bf16.flops == int8.flops == fp8.flops
        )  # the same arithmetic
        assert int8.compute_s == bf16.compute_s  # int8 weights are dequantized: bf16 matmuls
        # H100: the linear layers at twice the rate (1.87x in all); A100: no FP8 arithmetic at all
        assert bf16.compute_s / fp8.compute_s == pytest.approx(gain, rel=1e-9)
    assert DEVICE_SPECS["a100"].fp8_flops == 0 and get_device("cpu").fp8_flops == 0
    for d in (
        "h100",
        "h200",
        "l40s",
        "l4",
        "rtx4090",
    ):  # Ada and Hopper: FP8 at twice the 16-bit rate (datasheets)
        assert DEVICE_SPECS[d].fp8_flops == pytest.approx(2 * DEVICE_SPECS[d].flops, rel=0.025)


def test_int8_on_an_a100_against_torchaos_published_speedup():
    """torchao's Llama-2-7B on one A100 (batch 1, 200 tokens, torch.compile): bf16 107.38 tok/s,
    int8 weight-only 170.83, 1.59x (github.com/pytorch/ao, commit 1df9caef,
    torchao/_models/llama/benchmark_results.txt). The cost model, with the fitted 16-bit
    bandwidth efficiency for both, predicts 1.95x: real int8 kernels read their bytes at a
    lower share of the bandwidth (1131 GB/s against bf16's 1419 in the same file)."""

    def tok_s(q):
        cm = CostModel("llama-2-7b", "a100", engine="compiled", quantization=q)
        return 200 / (
            cm.cost([(5, 5)]).time + sum(cm.cost([(1, 5 + i)]).time for i in range(1, 200))
        )

    published = 170.83 / 107.38
    assert tok_s("int8") / tok_s(None) == pytest.approx(1.95, abs=0.01)
    assert 1.0 < tok_s("int8") / tok_s(None) / published < 1.25


def test_bad_quantization_values_are_refused():
    for kwargs, match in (
        (dict(quantization="int4"), "quantization='int4': allowed: None, int8, fp8"),
        (dict(kv_cache_dtype="fp16"), "kv_cache_dtype='fp16': allowed: auto, fp8"),
    ):
        with pytest.raises(InvalidValue, match=match):
            CostModel("llama-3-8b", "h100", **kwargs)
        with pytest.raises(InvalidValue, match=match):
            simulated_engine("llama-3-8b", "h100", **kwargs)
    assert (
        main(
            [
                "run",
                "--simulate",
                "--model",
                "llama-3-8b",
                "--device",
                "h100",
                "--quantization",
                "int4",
            ]
        )
        == 2
    )


# ---- real and simulated executors decide the same -----------------------------------------
@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_real_and_simulated_executor_make_the_same_scheduling_decisions(policy):
    """The same per-step durations (the cost model's, for the micro model on an H100) drive
    both engines; the real model computes, the simulator does not. With a small KV cache
    the run includes preemptions, and with Poisson arrivals the admissions depend on time."""
    knobs = dict(
        max_num_seqs=4, num_blocks=12, block_size=4, max_model_len=64, max_num_batched_tokens=64
    )
    specs = make_workload(
        "uniform", 10, seed=5, vocab_size=MICRO.vocab_size, rate=2000.0, max_model_len=64
    )
    specs = [RequestSpec(s.id, s.prompt_ids[:12], min(s.max_tokens, 10), s.arrival) for s in specs]
    cost = CostModel(MICRO, "h100")
    real = Engine(
        micro_model(), EngineConfig(policy=policy, **knobs), clock=SimulatedClock(cost.step_time)
    )
    sim = simulated_engine(MICRO, "h100", policy, **knobs)
    for e in (real, sim):
        e.add_workload(specs, ignore_eos=True)
    a, b = real.run(), sim.run()
    assert [(s.items, s.t_start, s.t_end, s.kv_blocks) for s in a.steps] == [
        (s.items, s.t_start, s.t_end, s.kv_blocks) for s in b.steps
    ]
    strip = [{**r.__dict__, "output_ids": None} for r in a.requests]
    assert strip == [{**r.__dict__, "output_ids": None} for r in b.requests]
    if policy == "continuous":
        assert sum(s.num_preempted for s in a.steps) > 0


# ---- the seed's example ----------------------------------------------------------------------
def long_prompt_while_decoding(policy: str, budget: int) -> dict:
    """60 requests decoding (128-token prompts, 200 new tokens each) on Llama-3-8B / H100;
    one 8192-token prompt arrives at t = 0.5 s, when all of them decode. Returns the decoders' worst inter-token gap.
    (Llama 3.1: Llama 3's sizes, trained to more than 8192 positions, so the prompt and its output fit.)"""
    e = simulated_engine(
        "llama-3.1-8b",
        "h100",
        policy,
        max_num_seqs=64,
        max_model_len=8192 + 64,
        max_num_batched_tokens=budget,
    )
    specs = [RequestSpec(f"d{i}", [7] * 128, 200) for i in range(60)]
    specs.append(RequestSpec("long", [7] * 8192, 16, arrival=0.5))
    e.add_workload(specs)
    tl = e.run()
    decoders = [r for r in tl.requests if r.request_id != "long"]
    gaps = [b - a for r in decoders for a, b in zip(r.token_times, r.token_times[1:])]
    long = next(r for r in tl.requests if r.request_id == "long")
    return {
        "max_itl": max(gaps),
        "median_itl": sorted(gaps)[len(gaps) // 2],
        "long_ttft": long.t_first_token - long.arrival,
    }


def test_seed_example_long_prompt_stalls_decodes_unless_chunked():
    """What the model predicts (simulated, Llama-3-8B bf16 on one H100 SXM, the lab's engine):
    - a decode step of the 60 requests takes 9.6 ms (memory-bound: 15 GB of weights + KV,
      plus vLLM's 3.6 ms a step);
    - without chunking (continuous: the whole prompt joins one step) that step takes
      198 ms (compute-bound; attention is 13% of its FLOPs): every decode stalls 198 ms
      (worst inter-token gap 0.198 s against a median of 9.6 ms); the prompt's first
      token comes 0.206 s after it arrives;
    - with a 512-token budget the prompt is split over 19 steps of 10.6 to 19.2 ms
      (60 decodes + 452 prompt tokens, attention growing with the context): the worst
      decode gap is 19.2 ms, and the prompt's first token comes 0.336 s after it arrives.
    """
    whole = long_prompt_while_decoding("continuous", 8192 + 64)
    chunked = long_prompt_while_decoding("chunked", 512)
    assert whole["median_itl"] == pytest.approx(9.6e-3, rel=0.02)
    assert whole["max_itl"] == pytest.approx(0.198, rel=0.02)
    assert whole["long_ttft"] == pytest.approx(0.206, rel=0.02)
    assert chunked["max_itl"] == pytest.approx(0.0192, rel=0.02)
    assert chunked["long_ttft"] == pytest.approx(0.336, rel=0.02)
    assert chunked["max_itl"] < whole["max_itl"] / 10


# ---- command line -------------------------------------------------------------------------
def test_cli_compare_simulate(capsys):
    assert (
        main(
            [
                "compare",
                "--simulate",
                "--model",
                "llama-3-8b",
                "--device",
                "h100",
                "--workload",
                "mixed",
                "--num-requests",
                "40",
                "--json",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in rows] == ["static", "continuous", "chunked"]
    assert all(r["clock"] == "simulated" for r in rows)
    assert rows[0]["padding_fraction"] > 0 == rows[1]["padding_fraction"]
    assert (
        main(["compare", "--simulate", "--model", "llama-3-70b", "--device", "h100", "--json"]) == 2
    )


def test_bad_knobs_raise_value_error():
    with pytest.raises(ValueError, match="block_size"):
        simulated_engine("llama-3-8b", "h100", "chunked", block_size=0)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        simulated_engine("llama-3-8b", "h100", "chunked", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="policy"):
        simulated_engine("llama-3-8b", "h100", "fastest")


def test_vllm_default_budget_follows_its_memory_and_a100_rule():
    # vllm/engine/arg_utils.py: >= 70 GiB and not an A100 -> 8,192 online / 16,384 offline
    assert (vllm_default_budget("h100"), vllm_default_budget("h100", online=False)) == (8192, 16384)
    assert vllm_default_budget("h200") == 8192
    assert (vllm_default_budget("a100"), vllm_default_budget("a100", online=False)) == (2048, 8192)
    assert vllm_default_budget("l4") == 2048
