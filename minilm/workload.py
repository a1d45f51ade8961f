"""Workloads: lists of requests with prompt tokens, output lengths and arrival times.

Presets are seeded, so a workload is the same on every machine:

uniform      prompt and output lengths uniform in a range; everything arrives at t=0
mixed        heavy-tailed (log-normal) prompt and output lengths, the shape of ShareGPT
             conversations: most short, a few long
long-prompt  many short requests decoding, then a few prompts of thousands of tokens
             arriving while they do: the chunked-prefill lesson's workload
docstrings   real text for the trained `docstrings` model: each prompt is the beginning
             of a held-out docstring, max_tokens is generous, so the model's EOS (not
             max_tokens) decides each output's length, as in real serving traffic

`rate` (requests/s) turns any preset into an online workload with Poisson arrivals.
A JSON file of `{"id", "prompt_ids" or "prompt", "max_tokens", "arrival"}` objects
replays a user's own trace.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PRESETS = ("uniform", "mixed", "long-prompt", "docstrings")
DOCSTRINGS_HELDOUT = Path(__file__).parent / "checkpoints" / "docstrings" / "heldout.json"
# Generous (most docstrings end well before it), and a few-word prompt (at most 18 tokens
# among the held-out ones) plus this stays within the 256 positions the model was trained on.
DOCSTRINGS_MAX_TOKENS = 224
DOCSTRINGS_PROMPT_ROOM = 32


@dataclass
class RequestSpec:
    id: str
    prompt_ids: list[int] | None
    max_tokens: int
    arrival: float = 0.0
    prompt: str | None = None  # text, encoded by the engine's tokenizer when prompt_ids is None


def lognormal_lengths(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(int)


def num_long_prompts(n: int) -> int:
    """How many of `long-prompt`'s requests are the long ones (the last of the list)."""
    return max(1, n // 16)


def preset_lengths(name: str, n: int, rng: np.random.Generator, max_model_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of a preset."""
    if name == "uniform":
        return rng.integers(16, 129, n), rng.integers(16, 129, n)
    if name == "mixed":
        prompts = lognormal_lengths(rng, n, 64, 0.9, 4, max_model_len // 2)
        outputs = lognormal_lengths(rng, n, 48, 1.0, 2, max_model_len // 4)
        return prompts, outputs
    if name == "long-prompt":
        prompts = rng.integers(16, 65, n)
        outputs = rng.integers(96, 161, n)
        num_long = num_long_prompts(n)
        prompts[-num_long:] = rng.integers(max_model_len // 2, max_model_len * 3 // 4, num_long)
        outputs[-num_long:] = rng.integers(16, 33, num_long)
        return prompts, outputs
    raise ValueError(f"workload preset {name!r}; allowed: {', '.join(PRESETS)} (or a JSON file)")


def poisson_arrivals(rng: np.random.Generator, rate: float | None, n: int) -> np.ndarray:
    """Arrival times of a Poisson process at `rate` requests/s, or all at t=0 for None."""
    return np.cumsum(rng.exponential(1.0 / rate, n)) if rate is not None else np.zeros(n)


def make_workload(name: str = "mixed", num_requests: int = 64, seed: int = 0, vocab_size: int = 256,
                  rate: float | None = None, max_model_len: int = 2048,
                  long_prompt_delay: float = 0.05) -> list[RequestSpec]:
    """A seeded preset. Prompt tokens are random ids below `vocab_size` (random-weight models
    do not care what they read). `long_prompt_delay` spaces the long prompts of `long-prompt`
    (seconds), so they arrive while the short requests decode."""
    if num_requests < 1:
        raise ValueError(f"num_requests={num_requests} must be >= 1")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate={rate} requests/s must be > 0 (or None for all at t=0)")
    rng = np.random.default_rng(seed)
    if name == "docstrings":
        return docstring_workload(num_requests, rng, rate, max_model_len)
    prompts, outputs = preset_lengths(name, num_requests, rng, max_model_len)
    arrivals = poisson_arrivals(rng, rate, num_requests)
    if rate is None and name == "long-prompt":
        num_long = num_long_prompts(num_requests)
        arrivals[-num_long:] = long_prompt_delay * (1 + np.arange(num_long))
    return [RequestSpec(id=f"r{i}", prompt_ids=rng.integers(0, vocab_size, int(p)).tolist(),
                        max_tokens=int(o), arrival=float(a))
            for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals))]


def docstring_prompt(doc: str, max_words: int = 6) -> str:
    """The first words of a docstring's first line (at most half of them, at least one):
    enough to set the topic, leaving the model the rest to write."""
    words = doc.split("\n", 1)[0].split(" ")
    return " ".join(words[:max(1, min(max_words, len(words) // 2))])


def docstring_workload(num_requests: int, rng: np.random.Generator, rate: float | None,
                       max_model_len: int) -> list[RequestSpec]:
    """Prompts from the held-out docstrings the `docstrings` checkpoint ships (never trained on);
    text, so the engine's tokenizer encodes them."""
    if not DOCSTRINGS_HELDOUT.exists():
        raise ValueError(f"workload 'docstrings' needs {DOCSTRINGS_HELDOUT}; "
                         f"train the checkpoint with `python -m minilm.train` (see README)")
    docs = json.loads(DOCSTRINGS_HELDOUT.read_text())
    picks = rng.choice(len(docs), num_requests, replace=num_requests > len(docs))
    max_tokens = min(DOCSTRINGS_MAX_TOKENS, max_model_len - DOCSTRINGS_PROMPT_ROOM)
    arrivals = poisson_arrivals(rng, rate, num_requests)
    return [RequestSpec(id=f"r{i}", prompt_ids=None, prompt=docstring_prompt(docs[k]), max_tokens=max_tokens,
                        arrival=float(a)) for i, (k, a) in enumerate(zip(picks, arrivals))]


def load_workload(path: str | Path) -> list[RequestSpec]:
    """A JSON list of request objects (a user's own trace)."""
    items = json.loads(Path(path).read_text())
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of requests, got {type(items).__name__}")
    specs = []
    for i, it in enumerate(items):
        if "prompt_ids" not in it and "prompt" not in it:
            raise ValueError(f"{path}: request {i} has neither 'prompt_ids' nor 'prompt'")
        if "max_tokens" not in it:
            raise ValueError(f"{path}: request {i} has no 'max_tokens'")
        specs.append(RequestSpec(id=str(it.get("id", f"r{i}")), prompt_ids=it.get("prompt_ids"),
                                 max_tokens=it["max_tokens"], arrival=float(it.get("arrival", 0.0)),
                                 prompt=it.get("prompt")))
    return specs


def get_workload(name_or_path: str, **kwargs) -> list[RequestSpec]:
    """A preset by name, or a JSON file by path."""
    if name_or_path in PRESETS:
        return make_workload(name_or_path, **kwargs)
    if Path(name_or_path).suffix == ".json" or Path(name_or_path).exists():
        return load_workload(name_or_path)
    raise ValueError(f"workload {name_or_path!r}; allowed: {', '.join(PRESETS)} or a path to a JSON file")
