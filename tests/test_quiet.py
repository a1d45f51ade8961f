"""minilm/quiet.py: the libraries' known start-up warnings are dropped, and nothing else is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from minilm.quiet import not_known

ROOT = Path(__file__).resolve().parents[1]


def record(logger: str, message: str) -> logging.LogRecord:
    return logging.LogRecord(logger, logging.WARNING, __file__, 0, message, None, None)


def test_only_the_known_lines_are_dropped():
    so = "Failed to load /venv/torchao/_C_mxfp8.so: Could not load this library"
    enum = "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by ..."
    assert not not_known(record("torchao", so))
    assert not not_known(record("torch.utils._pytree", enum))
    assert not_known(record("torchao", "Skipping import of cpp extensions"))  # another warning
    assert not_known(record("minilm", so))  # the same words from another logger
    assert not_known(record("torchao", "Failed to load weights.bin"))  # not an extension


def test_a_bench_that_imports_transformers_starts_quietly():
    # `from transformers import LlamaForCausalLM` imports torchao, which on a CPU torch logs
    # its CUDA extensions that cannot load: --help must print the usage and nothing on stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "bench/vs_transformers.py", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.startswith("usage:")
    assert result.stderr == ""
