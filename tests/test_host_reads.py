"""A step reads nothing back from its tensors but what sampling needs (issue 34).

On a GPU, reading a device tensor on the host (`.tolist()`, `.item()`, `bool(t)`, a boolean
mask index, ...) waits until every queued kernel has run: the GPU drains while Python waits.
The runner knows each step's layout on the host already (from the plan), so building the
batch and running the model must read nothing back, whatever the number of layers or the
batch; only sampling reads its tokens, and a greedy step's all at once: one read, whatever
the batch (nano-vllm's way; issue 25.5). Here every such read during one engine step is
counted, by the line of minilm that made it. On a CPU the same calls run as on a GPU, so the
count is the same; only their cost differs. (Host-to-device copies, and syncs made inside
PyTorch's C++ such as `nonzero`, are not seen here.)
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from minilm import Engine, EngineConfig
from minilm.config import MODEL_PRESETS
from minilm.model.llama import LlamaModel

PACKAGE = os.path.dirname(os.path.abspath(sys.modules["minilm"].__file__))
SAMPLING = os.path.join(PACKAGE, "model", "sampling.py")
READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def caller_in_minilm() -> tuple[str, int]:
    """(file, line) of the innermost minilm frame below the patched method."""
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.startswith(PACKAGE):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame else ("outside minilm", 0)


def is_mask(index) -> bool:
    return any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool
        for i in (index if isinstance(index, tuple) else (index,))
    )


@contextmanager
def counting_host_reads():
    """Yields a Counter of (file, line) -> reads made inside the block."""
    reads = Counter()

    def counted(method):
        def read(self, *args, **kwargs):
            reads[caller_in_minilm()] += 1
            return method(self, *args, **kwargs)

        return read

    def counted_if_mask(method):
        def index(self, index, *value):
            if is_mask(index):
                reads[caller_in_minilm()] += 1
            return method(self, index, *value)

        return index

    with pytest.MonkeyPatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
        for name in ("__getitem__", "__setitem__"):
            patch.setattr(torch.Tensor, name, counted_if_mask(getattr(torch.Tensor, name)))
        yield reads


def step_reads(engine: Engine) -> tuple[Counter, int, set]:
    """(reads outside sampling by (file, line), reads in sampling, kinds of work) of one step."""
    with counting_host_reads() as reads:
        record = engine.step()
    sampling = sum(n for (file, _), n in reads.items() if file == SAMPLING)
    others = Counter(
        {
            (os.path.relpath(f, os.path.dirname(PACKAGE)), line): n
            for (f, line), n in reads.items()
            if f != SAMPLING
        }
    )
    return others, sampling, {i.kind for i in record.items}


def decode_and_mixed_step(backend: str, num_layers: int, batch: int) -> dict:
    """Host reads of a decode-only step of `batch` sequences, then of one with a whole new prompt too."""
    model = LlamaModel(replace(MODEL_PRESETS["tiny"], num_hidden_layers=num_layers)).init_random(0)
    engine = Engine(
        model, EngineConfig(policy="continuous", attention_backend=backend, max_model_len=64)
    )
    for i in range(batch):
        engine.add_request(f"r{i}", [3 + i] * (5 + 3 * i), max_tokens=8, ignore_eos=True)
    engine.step()  # every prompt's prefill
    decode = step_reads(engine)
    engine.add_request("late", list(range(10, 30)), max_tokens=8, ignore_eos=True)
    mixed = step_reads(engine)
    assert decode[2] == {"decode"} and mixed[2] == {"decode", "prefill"}
    return {"decode": decode[:2], "mixed": mixed[:2]}


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_a_step_reads_back_only_its_sampled_tokens(backend):
    for num_layers in (1, 3):
        for batch in (1, 4):
            for step, (others, sampling) in decode_and_mixed_step(
                backend, num_layers, batch
            ).items():
                where = f"{backend}, {num_layers} layers, batch {batch}, {step} step"
                assert not others, f"{where}: host reads outside sampling at {dict(others)}"
                # one argmax over the batch, one .tolist(): one read for every sequence's token
                assert sampling == 1, f"{where}: {sampling} reads in sampling"
