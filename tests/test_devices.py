"""The engine on other devices than this machine's CPU: Apple's GPU (MPS) and CUDA. Each test
runs where the device exists and is skipped, with the reason, where it does not (this project's
CI machines have neither; bench/gpu_check.py runs the CUDA checks on a GPU)."""

from __future__ import annotations

import pytest
import torch

from minilm import Engine, make_workload
from minilm.core.clock import MeasuredClock

DEVICES = [
    pytest.param(
        "mps",
        marks=pytest.mark.skipif(
            not torch.backends.mps.is_available(), reason="no Apple GPU (MPS) on this machine"
        ),
    ),
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="no CUDA GPU on this machine"
        ),
    ),
]


def greedy(device: str, backend: str) -> dict[str, list[int]]:
    engine = Engine(
        "tiny",
        max_num_seqs=4,
        max_num_batched_tokens=64,
        policy="chunked",
        device=device,
        attention_backend=backend,
    )
    specs = make_workload(
        "mixed",
        num_requests=8,
        seed=3,
        vocab_size=engine.model_config.vocab_size,
        max_model_len=256,
    )
    engine.add_workload(specs, ignore_eos=True)
    return {r.request_id: r.output_ids for r in engine.run().requests}


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_tokens_on_a_gpu_equal_the_cpus(device):
    """The sdpa backend (the CPU default, and the one a GPU without Triton uses) on the GPU:
    the same greedy tokens as on the CPU, mixed prefill chunks and decodes included."""
    assert greedy(device, "sdpa") == greedy("cpu", "sdpa")


def test_clock_waits_for_the_device_it_times():
    """A GPU runs ahead of Python; the clock synchronises the device it was made for."""
    assert MeasuredClock("cpu").device == "cpu" and MeasuredClock("cuda:0").device == "cuda"
    assert MeasuredClock("mps").device == "mps"
