"""Streaming text from streaming tokens.

A byte-level BPE token can end in the middle of a UTF-8 character (an emoji is four
bytes, often split over two tokens), and decoding such a prefix gives U+FFFD, the
replacement character. So a token's text is the growth of the decoded output, held
back while it ends in U+FFFD, and the texts of a request's tokens always join up to
`tokenizer.decode(all of its output ids)`: exactly what the engine's offline
`generate` returns (tests/test_server.py checks this through HTTP).

Decoding the whole output at every token costs O(n^2) over a request; vLLM decodes a
short window instead (`prefix_offset`, `read_offset`). Outputs here are at most a few
hundred tokens, so the window is the last few tokens plus what is still held back.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
WINDOW = 4  # tokens of context decoded before the new ones (BPE merges never look further back)


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # decode from here ...
        self.read_offset = 0  # ... text up to here has been sent

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """The new text these tokens add ('' while a character is incomplete, unless `final`)."""
        self.ids.extend(token_ids)
        decode = self.tokenizer.decode
        sent = decode(self.ids[self.prefix_offset : self.read_offset])
        text = decode(self.ids[self.prefix_offset :])
        if len(text) <= len(sent) or (text.endswith(REPLACEMENT) and not final):
            return ""
        new = text[len(sent) :]
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - WINDOW)
        return new


class StopChecker:
    """Stop strings, which the engine knows nothing of (it sees tokens): the text is searched
    as it grows, and text that could be the start of a stop string is held back until the
    next piece shows whether it is, so no text past a stop string is ever sent, even when
    the string spans two tokens (as vLLM's output processor does)."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.held = ""

    def add(self, text: str, final: bool) -> tuple[str, bool]:
        """(the text that may be sent now, whether a stop string was found: then send nothing more)."""
        text = self.held + text
        found = [text.find(s) for s in self.stops if s in text]
        if found:
            return text[: min(found)], True
        cut = len(text) if final else max(0, len(text) - self.hold)
        self.held = text[cut:]
        return text[:cut], False
