"""The OpenAI API's shapes: request bodies in (checked), response chunks out.

Only what `server.py` needs, written out by hand so every rule is visible:

    parse_request(body, kind, ...)   a JSON body -> GenerateRequest, or BadRequest (HTTP 400)
    chat_prompt(messages)            the chat template (the docstrings model is not a chat model)
    completion_chunk / chat_chunk    one SSE event's JSON for a piece of text
    usage(...)                       the token counts OpenAI reports

A bad value is refused before anything reaches the engine, with a message that names
the value and what is allowed, in OpenAI's error JSON:

    {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}

vLLM's extensions that benchmarks send are accepted: `top_k`, `ignore_eos`,
`stop_token_ids`, `repetition_penalty` (1.0 only), `min_tokens` (0 only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

COMPLETIONS, CHAT = "completions", "chat"


class APIError(Exception):
    """An error the client caused (or a full queue): an HTTP status and OpenAI's error JSON."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def BadRequest(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


@dataclass
class GenerateRequest:
    """One checked request, ready for `engine.add_request` (prompt already tokenized)."""

    kind: str                      # COMPLETIONS or CHAT
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields
    stream: bool = False
    include_usage: bool = False    # stream_options.include_usage: a last chunk with the token counts
    user: str | None = None        # OpenAI's `user` field: the lab puts it in the request id (the Gantt's row)


# ---- the chat template ---------------------------------------------------------
CHAT_TEMPLATE_DOC = ("the docstrings model is a completion model that never saw a chat: a conversation becomes "
                     "its messages' contents joined by blank lines, and the reply continues that text")


def chat_prompt(messages: list[dict]) -> str:
    """The lab's chat template. A chat model's template wraps each message in role markers it
    was trained on (`<|im_start|>user ...`); the docstrings model was trained on plain
    docstrings only, so markers would be noise to it. The prompt is the messages' contents
    joined by blank lines (roles dropped), and the model continues the last one."""
    return "\n\n".join(m["content"] for m in messages)


def check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"messages={short(messages)}: must be a non-empty list of "
                         f"{{'role': ..., 'content': ...}} objects", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}]={short(m)}: each message needs a role of "
                             f"'system', 'user' or 'assistant'", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}] (text only)
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                                 f"are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content={short(content)}: must be a string", "messages")
        messages[i] = {"role": m["role"], "content": content}
    return messages


# ---- checking a body ------------------------------------------------------------
def short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def get_number(body: dict, name: str, default, lo: float | None = None, hi: float | None = None,
               integer: bool = False, allowed: str = ""):
    """body[name] as a number within [lo, hi] (None or absent: `default`)."""
    value = body.get(name)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or (lo is not None and value < lo) or \
            (hi is not None and value > hi):
        raise BadRequest(f"{name}={short(value)}: {allowed}", name)
    return value


def refuse_unless(body: dict, name: str, ok, what: str) -> None:
    """Options the lab's engine does not have: refused unless absent or at their neutral value."""
    if name in body and body[name] is not None and not ok(body[name]):
        raise BadRequest(f"{name}={short(body[name])}: not supported by the minilm server ({what})", name)


def parse_request(body: Any, kind: str, *, model_name: str, tokenizer, max_model_len: int) -> GenerateRequest:
    """Check an OpenAI request body and tokenize its prompt; raises APIError (400) naming the bad value."""
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and model != model_name:
        raise BadRequest(f"model={short(model)} does not exist; this server serves {model_name!r} "
                         f"(GET /v1/models)", "model", "model_not_found")
    refuse_unless(body, "n", lambda v: v == 1, "one choice per request: n=1")
    refuse_unless(body, "best_of", lambda v: v == 1, "best_of=1")
    refuse_unless(body, "echo", lambda v: v is False, "echo=false")
    refuse_unless(body, "logprobs", lambda v: v is False or v == 0, "no logprobs")
    refuse_unless(body, "top_logprobs", lambda v: v == 0, "no logprobs")
    refuse_unless(body, "stop", lambda v: v == [], "no stop strings; use stop_token_ids")
    refuse_unless(body, "presence_penalty", lambda v: v == 0, "no penalties")
    refuse_unless(body, "frequency_penalty", lambda v: v == 0, "no penalties")
    refuse_unless(body, "repetition_penalty", lambda v: v == 1, "no penalties: repetition_penalty=1")
    refuse_unless(body, "min_tokens", lambda v: v == 0, "min_tokens=0")
    refuse_unless(body, "tools", lambda v: v == [], "no tools")

    if kind == CHAT:
        prompt_ids = tokenizer.encode(chat_prompt(check_messages(body.get("messages"))))
    else:
        prompt_ids = prompt_tokens(body.get("prompt"), tokenizer)
    if not prompt_ids:
        raise BadRequest("the prompt is empty; it needs at least one token", "messages" if kind == CHAT else "prompt")
    room = max_model_len - len(prompt_ids)
    if room < 1:
        raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; this model's maximum context length is "
                         f"{max_model_len} tokens (the length it was trained on), prompt and output together",
                         "messages" if kind == CHAT else "prompt", "context_length_exceeded")
    # OpenAI's defaults: 16 tokens for completions; for chat, whatever fits the context
    name = "max_completion_tokens" if kind == CHAT and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = get_number(body, name, 16 if kind == COMPLETIONS else room, lo=1, integer=True,
                            allowed="must be an integer >= 1")
    if max_tokens > room:
        raise BadRequest(f"{name}={max_tokens} with a prompt of {len(prompt_ids)} tokens needs "
                         f"{len(prompt_ids) + max_tokens} positions; this model's maximum context length is "
                         f"{max_model_len} (at most {room} new tokens for this prompt)", name,
                         "context_length_exceeded")
    sampling = {
        "temperature": float(get_number(body, "temperature", 1.0, 0, 2, allowed="must be a number in [0, 2] "
                                                                               "(0 is greedy)")),
        "top_p": float(get_number(body, "top_p", 1.0, 0, 1, allowed="must be a number in (0, 1]")),
        "top_k": get_number(body, "top_k", 0, -1, integer=True, allowed="must be an integer >= 0 (0 or -1: off)"),
        "seed": get_number(body, "seed", None, integer=True, allowed="must be an integer"),
        "ignore_eos": body.get("ignore_eos") or False,
        "stop_token_ids": tuple(stop_ids(body.get("stop_token_ids"), tokenizer)),
    }
    if sampling["top_p"] == 0:
        raise BadRequest("top_p=0: must be a number in (0, 1]", "top_p")
    sampling["top_k"] = max(sampling["top_k"], 0)  # vLLM's -1 is the lab's 0: off
    if not isinstance(sampling["ignore_eos"], bool):
        raise BadRequest(f"ignore_eos={short(body['ignore_eos'])}: must be true or false", "ignore_eos")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={short(stream)}: must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise BadRequest(f"stream_options={short(options)}: must be {{'include_usage': true|false}}",
                         "stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest(f"user={short(user)}: must be a string", "user")
    return GenerateRequest(kind, prompt_ids, max_tokens, sampling, stream, options.get("include_usage", False), user)


def prompt_tokens(prompt: Any, tokenizer) -> list[int]:
    """A completions `prompt`: text, or token ids (for a client that shares the lab's vocabulary)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = tokenizer.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
        return list(prompt)
    raise BadRequest(f"prompt={short(prompt)}: must be a string or a list of token ids "
                     f"(one prompt per request)", "prompt")


def stop_ids(value: Any, tokenizer) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and 0 <= t < tokenizer.vocab_size for t in value):
        raise BadRequest(f"stop_token_ids={short(value)}: must be a list of token ids in "
                         f"[0, {tokenizer.vocab_size})", "stop_token_ids")
    return value


# ---- responses ------------------------------------------------------------------
FINISH_REASONS = {"stop": "stop", "length": "length", "aborted": "abort"}  # engine's -> OpenAI's (vLLM's "abort")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_chunk(rid: str, model: str, created: int, text: str, finish_reason: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}


def chat_chunk(rid: str, model: str, created: int, text: str, finish_reason: str | None, first: bool) -> dict:
    # OpenAI sends the role in a chunk of its own before any text; the lab puts it in the
    # first token's chunk, so every chunk is one token (clients time tokens by chunks)
    delta = {"role": "assistant", "content": text} if first else {"content": text}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def usage_chunk(rid: str, model: str, created: int, kind: str, counts: dict) -> dict:
    obj = "chat.completion.chunk" if kind == CHAT else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": counts}


def full_response(rid: str, model: str, created: int, kind: str, text: str, finish_reason: str,
                  counts: dict) -> dict:
    if kind == CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": counts}


def now_s() -> int:
    return int(time.time())
