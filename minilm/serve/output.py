"""From the engine's tokens to one OpenAI choice: its text, its stop, its log-probabilities.

The engine hands over token ids (and, when asked, each token's log-probability and the
top few); a `Choice` turns them into what the client reads, one piece at a time:

- text, through the incremental detokenizer (a piece may be '' while a character is
  incomplete), cut at the first stop string (detokenizer.StopChecker);
- the finish reason in OpenAI's words ("abort" for the engine's "aborted");
- logprobs in the shape the endpoint's clients expect: the completions API's
  `tokens / token_logprobs / top_logprobs / text_offset`, or chat's `content` list.

When a stop string ends the text, `stopped` is set: the server then aborts the request
in the engine (reason "stop"), so it frees its KV and computes nothing more.
"""

from __future__ import annotations

from .detokenizer import IncrementalDetokenizer, StopChecker
from .messages import Tokens
from .openai_api import CHAT, FINISH_REASONS, GenerateRequest


class Choice:
    def __init__(self, index: int, req: GenerateRequest, tokenizer):
        self.index, self.req, self.tokenizer = index, req, tokenizer
        self.detok, self.stop = IncrementalDetokenizer(tokenizer), StopChecker(req.stop)
        self.num_tokens, self.text_len = 0, 0
        self.finish_reason: str | None = None
        self.stopped = False

    def feed(self, event: Tokens) -> tuple[str, dict | None]:
        """The new text these tokens add, and their logprobs in the endpoint's shape (or None)."""
        if self.finish_reason is not None:
            return "", None
        text, entries = "", []
        for k, token in enumerate(event.token_ids):
            last = event.finish_reason is not None and k == len(event.token_ids) - 1
            piece, found = self.stop.add(self.detok.add([token], final=last), final=last)
            self.num_tokens += 1
            if event.logprobs is not None:
                entries.append((token, event.logprobs[k], self.text_len + len(text)))
            text += piece
            if found:
                self.stopped, self.finish_reason = True, "stop"
                break
        else:
            if event.finish_reason is not None:
                text += self.stop.add("", final=True)[0] if not event.token_ids else ""
                self.finish_reason = FINISH_REASONS[event.finish_reason]
        self.text_len += len(text)
        return text, (self.logprobs(entries) if event.logprobs is not None else None)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def logprobs(self, entries: list[tuple[int, list, int]]) -> dict:
        if self.req.kind == CHAT:

            def item(token: int, logprob: float) -> dict:
                text = self.token_text(token)
                return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

            return {
                "content": [
                    item(t, lp) | {"top_logprobs": [item(i, v) for i, v in top]}
                    for t, (lp, top), _ in entries
                ]
            }
        return {
            "tokens": [self.token_text(t) for t, _, _ in entries],
            "token_logprobs": [lp for _, (lp, _), _ in entries],
            "top_logprobs": [{self.token_text(i): v for i, v in top} for _, (_, top), _ in entries],
            "text_offset": [offset for _, _, offset in entries],
        }


def merge_logprobs(parts: list[dict | None]) -> dict | None:
    """One choice's logprobs over a whole response, from its pieces' (non-streaming)."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    return {k: [v for p in parts for v in p[k]] for k in parts[0]}
