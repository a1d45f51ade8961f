"""The `speculative_config` knob (vLLM's `--speculative-config`), checked and with defaults filled.
The builder (core/builder.py) turns what the user gave into this before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..config import InvalidValue, check_int

SPECULATIVE_METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """vLLM's `--speculative-config` (lesson 10): who proposes draft tokens and how many a step.
    ngram: prompt lookup in the request's own tokens; draft_model: a small model (`model`)."""

    method: str = "ngram"
    num_speculative_tokens: int = (
        4  # k: drafts proposed for each decode, verified in one target step
    )
    prompt_lookup_min: int | None = (
        None  # ngram: shortest suffix to look up (unset: as the other, else 5)
    )
    prompt_lookup_max: int | None = None  # ngram: longest
    model: str | None = None  # draft_model: a preset, a shipped checkpoint or a directory

    @classmethod
    def of(cls, value: Any) -> SpeculativeConfig | None:
        """From a dict (the JSON a user gives), a SpeculativeConfig or None, checked, defaults filled."""
        if value is None:
            return None
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in fields(cls)})
            if unknown:
                raise InvalidValue(
                    "speculative_config",
                    unknown[0],
                    f"unknown key; allowed: {', '.join(f.name for f in fields(cls))}",
                )
            value = cls(**value)
        if not isinstance(value, cls):
            raise InvalidValue(
                "speculative_config", value, "allowed: a dict, a SpeculativeConfig or None"
            )
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(value, name) is not None:
                check_int(f"speculative_config.{name}", getattr(value, name), 1)
        low = value.prompt_lookup_min or value.prompt_lookup_max or 5  # vLLM's defaults
        value = replace(
            value, prompt_lookup_min=low, prompt_lookup_max=value.prompt_lookup_max or low
        )
        value.validate()
        return value

    def validate(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise InvalidValue(
                "speculative_config.method",
                self.method,
                f"allowed: {', '.join(SPECULATIVE_METHODS)}",
            )
        check_int("speculative_config.num_speculative_tokens", self.num_speculative_tokens, 1)
        if (self.method == "draft_model") != (self.model is not None):
            raise InvalidValue(
                "speculative_config.model",
                self.model,
                "a draft model's name or path with method 'draft_model', and only then",
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise InvalidValue(
                "speculative_config.prompt_lookup_min",
                self.prompt_lookup_min,
                f"must be <= prompt_lookup_max={self.prompt_lookup_max}",
            )

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past the verified tokens that drafting writes: a draft model's K/V of its own
        drafts (before the target has seen them); n-gram lookup writes none."""
        return self.num_speculative_tokens if self.method == "draft_model" else 0


def check_same_vocabulary(draft: str, vocab: int, target_vocab: int) -> None:
    """A draft model's token ids are the target's: it must share the target's tokenizer."""
    if vocab != target_vocab:
        raise InvalidValue(
            "speculative_config.model",
            draft,
            f"has a vocabulary of {vocab} tokens, the "
            f"target {target_vocab}: a draft model must share the target's tokenizer",
        )
