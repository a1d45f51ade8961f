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
shared-prefix  a few long system prompts, each in front of many short user turns
multi-turn   conversations whose every turn resends the whole history (its earlier
             turns and replies, the conversation's own text as in ShareGPT-style
             benchmarks, not what the engine answered), a think time between turns
docstrings-shared-prefix, docstrings-multi-turn   the same two in text for the
             `docstrings` model, within its 256 trained positions (lesson 8)

`rate` (requests/s) turns any preset into an online workload with Poisson arrivals.
A JSON file of `{"id", "prompt_ids" or "prompt", "max_tokens", "arrival"}` objects
replays a user's own trace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import InvalidValue
from .gcpause import gc_paused
from .request import TokenIds

PRESETS = (
    "uniform",
    "mixed",
    "long-prompt",
    "docstrings",
    "shared-prefix",
    "multi-turn",
    "docstrings-shared-prefix",
    "docstrings-multi-turn",
)
LENGTH_PRESETS = ("uniform", "mixed", "long-prompt")  # prompts of random ids, by length alone
DOCSTRINGS_HELDOUT = Path(__file__).parent / "checkpoints" / "docstrings" / "heldout.json"
# Generous (most docstrings end well before it), and a few-word prompt (at most 18 tokens
# among the held-out ones) plus this stays within the 256 positions the model was trained on.
DOCSTRINGS_MAX_TOKENS = 224
DOCSTRINGS_PROMPT_ROOM = 32


@dataclass
class RequestSpec:
    id: str
    prompt_ids: TokenIds | None  # a list, or a compact numpy array (make_workload's compact)
    max_tokens: int
    arrival: float = 0.0
    prompt: str | None = None  # text, encoded by the engine's tokenizer when prompt_ids is None


def lognormal_lengths(
    rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int
) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(int)


def num_long_prompts(n: int) -> int:
    """How many of `long-prompt`'s requests are the long ones (the last of the list)."""
    return max(1, n // 16)


def preset_lengths(
    name: str, n: int, rng: np.random.Generator, max_model_len: int
) -> tuple[np.ndarray, np.ndarray]:
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
    raise InvalidValue("workload", name, f"allowed: {', '.join(PRESETS)} (or a JSON file)")


def recommended_knobs(preset: str, num_requests: int, policy: str) -> dict:
    """Engine knobs a preset is meant to be run with (the CLI uses them unless told otherwise).

    `long-prompt` shows a stall only if its short requests decode together when the long
    prompts arrive: every request gets a batch slot; and a chunk budget near a decode
    step's size keeps a chunk step short on a CPU (lesson 6 sweeps it)."""
    if preset != "long-prompt":
        return {}
    return {
        "max_num_seqs": num_requests,
        **({"max_num_batched_tokens": max(128, num_requests)} if policy == "chunked" else {}),
    }


def poisson_arrivals(rng: np.random.Generator, rate: float | None, n: int) -> np.ndarray:
    """Arrival times of a Poisson process at `rate` requests/s, or all at t=0 for None."""
    return np.cumsum(rng.exponential(1.0 / rate, n)) if rate is not None else np.zeros(n)


@gc_paused()  # thousands of token lists, none in a cycle (gcpause.py)
def make_workload(
    name: str = "mixed",
    num_requests: int = 64,
    seed: int = 0,
    vocab_size: int = 256,
    rate: float | None = None,
    max_model_len: int = 2048,
    long_prompt_delay: float = 0.05,
    compact: bool = False,
) -> list[RequestSpec]:
    """A seeded preset. Prompt tokens are random ids below `vocab_size` (random-weight models
    do not care what they read). `long_prompt_delay` spaces the long prompts of `long-prompt`
    (seconds), so they arrive while the short requests decode. `compact` makes each prompt a
    numpy int32 array, the same ids in a tenth of the memory (uniform, mixed, long-prompt:
    the presets whose prompts are not built by joining lists)."""
    if num_requests < 1:
        raise InvalidValue("num_requests", num_requests, "must be >= 1")
    if compact and name not in LENGTH_PRESETS:
        allowed = f"compact prompts are made by {', '.join(LENGTH_PRESETS)} only"
        raise InvalidValue("compact", compact, allowed)
    if rate is not None and rate <= 0:
        raise InvalidValue("rate", rate, "must be > 0 requests/s (or None for all at t=0)")
    rng = np.random.default_rng(seed)
    if name == "docstrings":
        return docstring_workload(num_requests, rng, rate, max_model_len)
    if name in ("shared-prefix", "multi-turn"):

        def text(n):  # random token ids: a random-weight model does not care what it reads
            return rng.integers(0, vocab_size, n).tolist()

        if name == "shared-prefix":
            prefixes = [
                text(int(n)) for n in rng.integers(max_model_len // 8, max_model_len // 4, 4)
            ]
            turns = [text(int(n)) for n in rng.integers(8, 33, num_requests)]
            return shared_prefix_workload(
                prefixes, turns, rng.integers(16, 65, num_requests).tolist(), rng, rate
            )
        conversations = [
            [
                (text(int(u)), text(int(r)))
                for u, r in zip(rng.integers(16, 49, 4), rng.integers(16, 65, 4))
            ]
            for _ in range(-(-num_requests // 4))
        ]
        return multi_turn_workload(conversations, num_requests, None, rng, rate)
    if name.startswith("docstrings-"):
        return docstring_prefix_workload(name, num_requests, rng, rate)
    prompts, outputs = preset_lengths(name, num_requests, rng, max_model_len)
    arrivals = poisson_arrivals(rng, rate, num_requests)
    if rate is None and name == "long-prompt":
        num_long = num_long_prompts(num_requests)
        arrivals[-num_long:] = long_prompt_delay * (1 + np.arange(num_long))
    # one draw for all prompts: the ids a draw each gives (numpy's stream), 10x faster
    ids = rng.integers(0, vocab_size, int(prompts.sum()))
    ids = ids.astype(np.int32) if compact else ids.tolist()
    ends = np.cumsum(prompts).tolist()
    return [
        RequestSpec(id=f"r{i}", prompt_ids=ids[end - p : end], max_tokens=o, arrival=a)
        for i, (p, end, o, a) in enumerate(
            zip(prompts.tolist(), ends, outputs.tolist(), arrivals.tolist())
        )
    ]


def docstring_prompt(doc: str, max_words: int = 6) -> str:
    """The first words of a docstring's first line (at most half of them, at least one):
    enough to set the topic, leaving the model the rest to write."""
    words = doc.split("\n", 1)[0].split(" ")
    return " ".join(words[: max(1, min(max_words, len(words) // 2))])


def docstring_workload(
    num_requests: int, rng: np.random.Generator, rate: float | None, max_model_len: int
) -> list[RequestSpec]:
    """Prompts from the held-out docstrings the `docstrings` checkpoint ships (never trained on);
    text, so the engine's tokenizer encodes them."""
    if not DOCSTRINGS_HELDOUT.exists():
        raise ValueError(
            f"workload 'docstrings' needs {DOCSTRINGS_HELDOUT}; "
            f"train the checkpoint with `python -m training.train` (see docs/MODELS.md)"
        )
    docs = json.loads(DOCSTRINGS_HELDOUT.read_text())
    picks = rng.choice(len(docs), num_requests, replace=num_requests > len(docs))
    max_tokens = min(DOCSTRINGS_MAX_TOKENS, max_model_len - DOCSTRINGS_PROMPT_ROOM)
    arrivals = poisson_arrivals(rng, rate, num_requests)
    return [
        RequestSpec(
            id=f"r{i}",
            prompt_ids=None,
            prompt=docstring_prompt(docs[k]),
            max_tokens=max_tokens,
            arrival=float(a),
        )
        for i, (k, a) in enumerate(zip(picks, arrivals))
    ]


def spec(rid: str, prompt: list[int] | str, max_tokens: int, arrival: float) -> RequestSpec:
    """A request from token ids or from text (which the engine's tokenizer encodes)."""
    if isinstance(prompt, str):
        return RequestSpec(rid, None, int(max_tokens), float(arrival), prompt=prompt)
    return RequestSpec(rid, prompt, int(max_tokens), float(arrival))


def shared_prefix_workload(
    prefixes: list, turns: list, max_tokens: list[int], rng: np.random.Generator, rate: float | None
) -> list[RequestSpec]:
    """Each user turn behind one of a few shared system prompts (picked at random)."""
    picks = rng.integers(0, len(prefixes), len(turns))
    arrivals = poisson_arrivals(rng, rate, len(turns))
    return [
        spec(f"r{i}", prefixes[k] + turn, m, a)
        for i, (k, turn, m, a) in enumerate(zip(picks, turns, max_tokens, arrivals))
    ]


def system_prompt_workload(
    num_system_prompts: int,
    rate: float | None = None,
    n: int = 200,
    seed: int = 0,
    vocab_size: int = 128256,
    hot: int = 0,
) -> list[RequestSpec]:
    """n requests, each one of `num_system_prompts` random system prompts (1,024-2,047
    tokens) plus a user turn (8-32 tokens), asking for 16-64 output tokens (lessons 8, 8b, 11;
    `vocab_size` defaults to Llama-3's). `hot` > 0 makes the first system prompt `hot + 1`
    times as popular as each other one (lesson 11: one prompt that a cache-only router
    would pile onto one replica)."""
    if isinstance(hot, bool) or not isinstance(hot, int) or hot < 0:
        raise InvalidValue("hot", hot, "must be an integer >= 0 (extra copies of the first prompt)")
    rng = np.random.default_rng(seed)

    def text(k):
        return rng.integers(0, vocab_size, k).tolist()

    systems = [text(int(k)) for k in rng.integers(1024, 2048, num_system_prompts)]
    turns = [text(int(k)) for k in rng.integers(8, 33, n)]
    picks = [systems[0]] * hot + systems  # picked from uniformly
    return shared_prefix_workload(picks, turns, rng.integers(16, 65, n).tolist(), rng, rate)


def skewed_workload(
    n: int,
    rate: float | None,
    period: int = 4,
    seed: int = 0,
    vocab_size: int = 128256,
) -> list[RequestSpec]:
    """Poisson arrivals of 200-399-token prompts; every `period`-th request asks for 400-599
    output tokens, the others for 16-47 (lesson 11: lengths in step with a round-robin
    router's turn, its worst case)."""
    for name, value in (("n", n), ("period", period)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidValue(name, value, "must be an integer >= 1")
    if rate is not None and rate <= 0:
        raise InvalidValue("rate", rate, "must be > 0 requests/s (or None for all at t=0)")
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(rng, rate, n)
    specs = []
    for i, t in enumerate(arrivals):
        prompt = rng.integers(0, vocab_size, int(rng.integers(200, 400))).tolist()
        out = int(rng.integers(400, 600)) if i % period == 0 else int(rng.integers(16, 48))
        specs.append(RequestSpec(f"r{i}", prompt, out, float(t)))
    return specs


def multi_turn_workload(
    conversations: list[list[tuple]],
    num_requests: int,
    max_tokens: int | None,
    rng: np.random.Generator,
    rate: float | None,
    think_time: float = 1.0,
) -> list[RequestSpec]:
    """Every turn's prompt is the conversation so far (turns and replies) plus a new turn.
    Conversations start at `rate / turns` a second (all at t=0 for None), and a turn
    follows the previous one after an exponential think time (mean `think_time` seconds).
    A turn's `max_tokens` is its reply's length, or `max_tokens` for text."""
    turns = len(conversations[0])
    starts = poisson_arrivals(rng, rate / turns if rate else None, len(conversations))
    specs = []
    for c, (conversation, t) in enumerate(zip(conversations, starts)):
        history = conversation[0][0][:0]  # empty, of the conversation's type (ids or text)
        for k, (user, reply) in enumerate(conversation):
            specs.append(spec(f"c{c}-t{k}", history + user, max_tokens or len(reply), t))
            history += user + reply
            t += rng.exponential(think_time)
    return sorted(specs, key=lambda r: r.arrival)[:num_requests]


def docstring_prefix_workload(
    name: str, num_requests: int, rng: np.random.Generator, rate: float | None
) -> list[RequestSpec]:
    """The shared-prefix and multi-turn shapes in text for the `docstrings` model: system
    prompts are held-out docstrings, turns their beginnings, replies their first lines;
    every request fits the model's 256 positions (tests/test_workloads.py checks)."""
    docs = json.loads(DOCSTRINGS_HELDOUT.read_text())
    pick = lambda n: [docs[k] for k in rng.choice(len(docs), n, replace=n > len(docs))]  # noqa: E731
    if name == "docstrings-shared-prefix":
        prefixes = [d[:360].rsplit(" ", 1)[0] + "\n\n" for d in pick(3)]
        return shared_prefix_workload(
            prefixes,
            [docstring_prompt(d) for d in pick(num_requests)],
            [64] * num_requests,
            rng,
            rate,
        )
    conversations = [
        [
            (docstring_prompt(d), d.split("\n", 1)[0][len(docstring_prompt(d)) : 160] + "\n\n")
            for d in pick(3)
        ]
        for _ in range(-(-num_requests // 3))
    ]
    return multi_turn_workload(conversations, num_requests, 48, rng, rate)


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
        specs.append(
            RequestSpec(
                id=str(it.get("id", f"r{i}")),
                prompt_ids=it.get("prompt_ids"),
                max_tokens=it["max_tokens"],
                arrival=float(it.get("arrival", 0.0)),
                prompt=it.get("prompt"),
            )
        )
    return specs


def get_workload(name_or_path: str, **kwargs) -> list[RequestSpec]:
    """A preset by name, or a JSON file by path."""
    if name_or_path in PRESETS:
        return make_workload(name_or_path, **kwargs)
    if Path(name_or_path).suffix == ".json" or Path(name_or_path).exists():
        return load_workload(name_or_path)
    raise InvalidValue(
        "workload", name_or_path, f"allowed: {', '.join(PRESETS)} or a path to a JSON file"
    )
