"""The lab's clients of a server (lesson 9): they speak HTTP to `minilm serve` (or to any
OpenAI-compatible server) and import nothing of the server itself.

bench_serve.py   `python -m minilm bench-serve`: vLLM's `bench serve`, a load generator
bench_result.py  its result files (vLLM's format): make, print, turn into timelines
process.py       `minilm serve` in a child process, for a notebook or a script
"""

from __future__ import annotations


def bearer(key: str | None) -> dict[str, str]:
    """The header a client sends with `key` (none without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}
