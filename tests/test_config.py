"""One config path: EngineConfig.resolve fills every default and checks every knob, for the
engine and the simulator alike, and the command line's engine flags are EngineConfig's fields."""

import argparse
from dataclasses import fields

import psutil
import pytest
import torch

from minilm import Engine, EngineConfig
from minilm.cli import build_parser, engine_config
from minilm.config import MODEL_PRESETS, InvalidValue, default_cpu_threads
from minilm.core.builder import resolve
from minilm.core.kv_cache import cdiv
from minilm.core.policies import make_policy
from minilm.sim.executor import simulated_engine

TINY = MODEL_PRESETS["tiny"]


def resolved(**knobs) -> EngineConfig:
    config, _ = resolve("tiny", EngineConfig(**knobs))
    return config


def test_resolve_fills_each_default():
    c = resolved()
    assert c.max_model_len == TINY.max_position_embeddings == 2048
    assert c.attention_backend == "sdpa"  # on a CPU
    assert c.max_num_batched_tokens == max(2048, 16)  # the continuous policy's budget
    assert c.num_blocks == 16 * (2048 // 16)  # max_num_seqs sequences of max_model_len
    assert c.cpu_threads == default_cpu_threads() == 1  # tests/conftest.py: OMP_NUM_THREADS=1
    assert resolved(policy="chunked").max_num_batched_tokens == 256
    assert resolved(policy="static").max_num_batched_tokens is None  # it has no budget
    assert resolved(policy="static", max_num_batched_tokens=64).max_num_batched_tokens is None
    assert resolved(max_model_len=100, block_size=10).num_blocks == 16 * 10
    assert resolved(device="cuda").attention_backend == "triton"  # resolving loads nothing
    given = dict(max_model_len=512, attention_backend="reference", num_blocks=7, cpu_threads=2)
    assert {k: getattr(resolved(**given), k) for k in given} == given


def test_cpu_threads_default_is_pytorchs(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_cpu_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_cpu_threads() == psutil.cpu_count(logical=False)
    n = torch.get_num_threads()
    try:  # the engine sets torch's thread count from the resolved knob
        assert Engine("tiny").config.cpu_threads == psutil.cpu_count(logical=False)
        assert torch.get_num_threads() == psutil.cpu_count(logical=False)
        Engine("tiny", cpu_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize(
    "knobs,match",
    [
        (dict(max_num_seqs=0), r"max_num_seqs=0: must be an integer >= 1"),
        (dict(max_num_seqs=True), r"max_num_seqs=True: must be an integer >= 1"),
        (dict(cpu_threads=0), r"cpu_threads=0: must be an integer >= 1"),
        (dict(max_model_len=2.5), r"max_model_len=2.5: must be an integer >= 1"),
        (dict(long_prefill_token_threshold=-1), r"long_prefill_token_threshold=-1: .* >= 0"),
        (dict(kv_mode="contiguous"), r"kv_mode='contiguous': allowed: paged, reserved"),
        (dict(scheduling_policy="lifo"), r"scheduling_policy='lifo': allowed: fcfs, lpm"),
        (dict(attention_backend="flash"), r"attention_backend='flash': allowed: None, reference"),
        (dict(quantization="int4"), r"quantization='int4': allowed: None, int8, fp8"),
        (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization=1.5: must be in \(0, 1\]"),
        (dict(max_model_len=4096), r"max_model_len=4096: must be <= .*=2048"),
        (dict(max_num_seqs=32, max_num_batched_tokens=16), r"max_num_batched_tokens=16: .*=32"),
        (dict(policy="fifo"), r"policy='fifo': allowed: static, continuous, chunked"),
        (dict(speculative_config={"method": "eagle"}), r"speculative_config.method='eagle'"),
        (dict(speculative_config={"method": "draft_model", "model": "gpt-5"}), r"model='gpt-5'"),
    ],
)
def test_each_bad_knob_is_named_before_anything_is_built(knobs, match):
    config = EngineConfig(**knobs)
    with pytest.raises(InvalidValue, match=match):
        resolve("tiny", config)
    assert config == EngineConfig(**knobs)  # resolving changes nothing it was given
    with pytest.raises(InvalidValue, match=match):
        Engine("tiny", config)


def test_resolve_is_the_simulators_path_too():
    """The simulator sizes the KV cache by its device's memory, through the same resolve."""
    engine = simulated_engine("llama-3-8b", "h100", max_num_seqs=8)
    executor = engine.executor
    c = engine.config
    assert c.num_blocks == executor.kv_num_blocks(c) > 8 * cdiv(c.max_model_len, 16)
    expected = EngineConfig(max_num_seqs=8, dtype=c.dtype).resolve(
        executor.model_config, make_policy("continuous"), executor.kv_num_blocks
    )
    assert c == expected
    for knobs, match in [
        (dict(block_size=0), "block_size=0"),
        (dict(gpu_memory_utilization=0), "gpu_memory_utilization=0"),
        (dict(max_model_len=10**7), "max_model_len=10000000"),
    ]:
        with pytest.raises(InvalidValue, match=match):
            simulated_engine("llama-3-8b", "h100", **knobs)


def engine_flags(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


@pytest.mark.parametrize("command", ["run", "compare", "serve"])
def test_engine_flags_are_the_fields(command):
    flags = engine_flags(command)
    names = [f.name for f in fields(EngineConfig)]
    swept = {"policy", "enable_prefix_caching"} if command == "compare" else set()  # --policies
    assert {n for n in names if n in flags} == set(names) - swept
    for f in fields(EngineConfig):
        if f.name in flags:
            action = flags[f.name]
            assert action.option_strings[0] == "--" + f.name.replace("_", "-")
            assert action.help.startswith(f.metadata["help"])  # the help is the field's


@pytest.mark.parametrize("command", ["run", "serve"])
def test_no_default_is_declared_twice(command):
    """No flags: the knobs are EngineConfig's own defaults (serve's one exception: prefix caching
    on, as vLLM V1 serves)."""
    args = build_parser().parse_args([command])
    own = {"enable_prefix_caching": True} if command == "serve" else {}
    flags = engine_flags(command)
    defaults = {f.name: flags[f.name].default for f in fields(EngineConfig)}
    assert {k: v for k, v in defaults.items() if v is not None} == own  # left out: None
    assert engine_config(args) == EngineConfig(**own)
    args = build_parser().parse_args(
        [command, "--max-num-seqs", "3", "--no-record-kv-blocks", "--speculative-config", "{}"]
    )
    assert engine_config(args) == EngineConfig(
        **own, max_num_seqs=3, record_kv_blocks=False, speculative_config={}
    )


def test_a_workload_preset_fills_only_what_the_command_line_leaves_out():
    parse = build_parser().parse_args
    preset = {"max_num_seqs": 64, "max_num_batched_tokens": 128}
    assert engine_config(parse(["run"]), preset) == EngineConfig(**preset)
    given = engine_config(parse(["run", "--max-num-seqs", "4"]), preset)
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (4, 128)
