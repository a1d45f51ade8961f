"""Speculative decoding (lesson 10): a proposer guesses a request's next k tokens cheaply, and
one step of the target model checks them all at once (model/sampling.py `accept`).

config.py       the speculative_config knob
ngram.py        prompt lookup: the tokens that followed the same words earlier in the request
draft_model.py  a small model with the target's tokenizer and its own paged K/V
executor.py     the target's runner, then the proposer, in one step
"""

from .config import SpeculativeConfig
from .executor import SpeculativeExecutor, make_speculative_executor

__all__ = ["SpeculativeConfig", "SpeculativeExecutor", "make_speculative_executor"]
