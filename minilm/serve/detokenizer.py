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
        self.read_offset = 0    # ... text up to here has been sent

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """The new text these tokens add ('' while a character is incomplete, unless `final`)."""
        self.ids.extend(token_ids)
        decode = self.tokenizer.decode
        sent = decode(self.ids[self.prefix_offset:self.read_offset])
        text = decode(self.ids[self.prefix_offset:])
        if len(text) <= len(sent) or (text.endswith(REPLACEMENT) and not final):
            return ""
        new = text[len(sent):]
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - WINDOW)
        return new
