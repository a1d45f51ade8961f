"""The OpenAI API's shapes: request bodies in (checked), response chunks out.

Only what `server.py` needs, written out by hand so every rule is visible:

    parse_request(body, kind, ...)   a JSON body -> GenerateRequest, or BadRequest (HTTP 400)
    engine_error(e, request)         the engine's own InvalidValue -> a 400 with OpenAI's `param`
    chat_prompt(messages)            the chat template (the docstrings model is not a chat model)
    chunk / full_response            one SSE event's JSON / a whole response, for n choices
    usage(...)                       the token counts OpenAI reports

What is OpenAI's is checked here: the body's shape and types, OpenAI's ranges
(temperature up to 2, 4 stop strings, 20 top logprobs), the model's name, options the
server cannot honour (any option outside `OPTIONS`, or one of them at a value the
engine lacks: a 400 naming it). What is the engine's (an empty prompt, token ids outside
the vocabulary, a context too long, max_tokens, min_tokens, top_p) the engine checks when
the request reaches it, before anything changes, and `engine_error` names the body's
field it came from. Either way the client gets OpenAI's error JSON, naming the value and
what is allowed:

    {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}

Supported: `n` (parallel sampling: n engine requests whose shared prompt the prefix cache
computes once), `stop` strings (output.py), `logprobs` / `top_logprobs`, `seed`,
`max_completion_tokens`, and vLLM's extensions `top_k`, `ignore_eos`, `min_tokens`,
`stop_token_ids` (`repetition_penalty` 1.0 and `min_p` 0 only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import InvalidValue

COMPLETIONS, CHAT = "completions", "chat"


class APIError(Exception):
    """An error the client caused (or a full queue): an HTTP status and OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )

    def to_json(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def BadRequest(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


@dataclass
class GenerateRequest:
    """One checked request, ready for `engine.add_request` (prompt already tokenized)."""

    kind: str  # COMPLETIONS or CHAT
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts
    user: str | None = (
        None  # OpenAI's `user` field: the lab puts it in the request id (the Gantt's row)
    )
    max_tokens_param: str = "max_tokens"  # the body's name for it (chat: max_completion_tokens too)
    n: int = 1  # choices: n engine requests with one prompt, whose KV the prefix cache shares
    stop: list[str] = field(
        default_factory=list
    )  # stop strings (the engine sees tokens: output.py cuts the text)

    def child(self, i: int) -> GenerateRequest:
        """Choice i of n: its own seed (seed + i), so that seeded choices differ and repeat."""
        seed = self.sampling.get("seed")
        return replace(
            self, sampling=self.sampling | ({"seed": seed + i} if seed is not None and i else {})
        )

    def param(self, engine_name: str) -> str | None:
        """The body's field for one of the engine's names (what a 400 calls `param`)."""
        if engine_name == "prompt":
            return "messages" if self.kind == CHAT else "prompt"
        if engine_name == "max_tokens":
            return self.max_tokens_param
        return None if engine_name == "request_id" else engine_name


def engine_error(e: InvalidValue, req: GenerateRequest) -> APIError:
    """The engine refused the request (nothing changed): a 400 naming the body's field."""
    return APIError(400, str(e), req.param(e.name), e.code)


# ---- the chat template ---------------------------------------------------------
CHAT_TEMPLATE_DOC = (
    "the docstrings model is a completion model that never saw a chat: a conversation becomes "
    "its messages' contents joined by blank lines, and the reply continues that text"
)


def chat_prompt(messages: list[dict]) -> str:
    """The lab's chat template. A chat model's template wraps each message in role markers it
    was trained on (`<|im_start|>user ...`); the docstrings model was trained on plain
    docstrings only, so markers would be noise to it. The prompt is the messages' contents
    joined by blank lines (roles dropped), and the model continues the last one."""
    return "\n\n".join(m["content"] for m in messages)


def check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest(
            f"messages={short(messages)}: must be a non-empty list of "
            f"{{'role': ..., 'content': ...}} objects",
            "messages",
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(
                f"messages[{i}]={short(m)}: each message needs a role of "
                f"'system', 'user' or 'assistant'",
                "messages",
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}] (text only)
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            ):
                raise BadRequest(
                    f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                    f"are supported",
                    "messages",
                )
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(
                f"messages[{i}].content={short(content)}: must be a string", "messages"
            )
        messages[i] = {"role": m["role"], "content": content}
    return messages


# ---- checking a body ------------------------------------------------------------
def short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def get_number(
    body: dict,
    name: str,
    default,
    lo: float | None = None,
    hi: float | None = None,
    integer: bool = False,
    allowed: str = "",
):
    """body[name] as a number within [lo, hi] (None or absent: `default`)."""
    value = body.get(name)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or (lo is not None and value < lo)
        or (hi is not None and value > hi)
    ):
        raise BadRequest(f"{name}={short(value)}: {allowed}", name)
    return value


def refuse_unless(body: dict, name: str, ok, what: str) -> None:
    """Options the lab's engine does not have: refused unless absent or at their neutral value."""
    if name in body and body[name] is not None and not ok(body[name]):
        raise BadRequest(
            f"{name}={short(body[name])}: not supported by the minilm server ({what})", name
        )


# Every option each endpoint takes. An option outside these gets a 400 naming it: a client
# must learn that this server cannot honour it, not be silently ignored.
COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    # vLLM's extensions that benchmarks and harnesses send
    "top_k",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "repetition_penalty",
    "min_p",
}
OPTIONS = {
    COMPLETIONS: COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"},
    CHAT: COMMON
    | {
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "response_format",
        "parallel_tool_calls",
    },
}
MAX_LOGPROBS = 20  # top log-probabilities a token may ask for (OpenAI's chat limit; vLLM's default)


def parse_request(
    body: Any,
    kind: str,
    *,
    model_name: str,
    tokenizer,
    max_model_len: int,
    max_prompt_bytes: int | None = None,
) -> GenerateRequest:
    """Check an OpenAI request body and tokenize its prompt; raises APIError (400) naming the bad value.
    The engine checks the rest when the request reaches it (`engine_error`). A prompt of more than
    `max_prompt_bytes` bytes could never fit the context: it is refused before it is tokenized."""
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - OPTIONS[kind])
    if unknown:
        raise BadRequest(
            f"unsupported parameter(s) {', '.join(unknown)}: the minilm server takes "
            f"{', '.join(sorted(OPTIONS[kind]))}",
            unknown[0],
            "unsupported_parameter",
        )
    model = body.get("model")
    if model is not None and model != model_name:
        raise BadRequest(
            f"model={short(model)} does not exist; this server serves {model_name!r} "
            f"(GET /v1/models)",
            "model",
            "model_not_found",
        )
    for name, neutral, what in (
        ("echo", (False,), "echo=false"),
        ("suffix", ("",), "no suffix"),
        ("presence_penalty", (0,), "no penalties"),
        ("frequency_penalty", (0,), "no penalties"),
        ("repetition_penalty", (1,), "no penalties: repetition_penalty=1"),
        ("logit_bias", ({},), "no logit_bias"),
        ("min_p", (0,), "min_p=0"),
        ("tools", ([],), "no tools"),
        ("tool_choice", ("none",), "no tools"),
        ("parallel_tool_calls", (False,), "no tools"),
        ("response_format", ({"type": "text"},), "response_format text"),
    ):
        refuse_unless(body, name, neutral.__contains__, what)
    n = get_number(body, "n", 1, 1, 16, integer=True, allowed="must be an integer in [1, 16]")
    refuse_unless(body, "best_of", lambda v: v == n, f"best_of=n ({n})")

    prompt_ids = prompt_tokens(body, kind, tokenizer, max_model_len, max_prompt_bytes)
    # OpenAI's defaults: 16 tokens for completions; for chat, whatever fits the context
    name = (
        "max_completion_tokens"
        if kind == CHAT and body.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    max_tokens = get_number(
        body,
        name,
        16 if kind == COMPLETIONS else max(1, max_model_len - len(prompt_ids)),
        integer=True,
        allowed="must be an integer",
    )
    sampling = {
        "temperature": float(
            get_number(
                body, "temperature", 1.0, 0, 2, allowed="must be a number in [0, 2] (0 is greedy)"
            )
        ),
        "top_p": float(get_number(body, "top_p", 1.0, allowed="must be a number in (0, 1]")),
        "top_k": max(
            0,
            get_number(body, "top_k", 0, integer=True, allowed="must be an integer (0 or -1: off)"),
        ),
        "seed": get_number(body, "seed", None, integer=True, allowed="must be an integer"),
        "ignore_eos": get_bool(body, "ignore_eos"),
        "stop_token_ids": tuple(get_int_list(body, "stop_token_ids")),
        "min_tokens": get_number(body, "min_tokens", 0, integer=True, allowed="must be an integer"),
        "logprobs": logprobs_asked(body, kind),
    }
    stream = get_bool(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise BadRequest(
            f"stream_options={short(options)}: must be {{'include_usage': true|false}}",
            "stream_options",
        )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest(f"user={short(user)}: must be a string", "user")
    return GenerateRequest(
        kind,
        prompt_ids,
        max_tokens,
        sampling,
        stream,
        options.get("include_usage", False),
        user,
        name,
        n,
        stop_strings(body.get("stop")),
    )


def logprobs_asked(body: dict, kind: str) -> int | None:
    """How many top log-probabilities each token comes with, or None for no logprobs at all:
    completions' `logprobs` is that number; chat's is a switch, its number `top_logprobs`."""
    allowed = f"must be an integer in [0, {MAX_LOGPROBS}]"
    if kind == COMPLETIONS:
        return get_number(body, "logprobs", None, 0, MAX_LOGPROBS, integer=True, allowed=allowed)
    top = get_number(body, "top_logprobs", None, 0, MAX_LOGPROBS, integer=True, allowed=allowed)
    if not get_bool(body, "logprobs"):
        if top:
            raise BadRequest(f"top_logprobs={top}: needs logprobs=true", "top_logprobs")
        return None
    return top or 0


def stop_strings(value: Any) -> list[str]:
    """OpenAI's `stop`: a string or up to 4 of them (empty strings would stop at once: refused)."""
    stops = [value] if isinstance(value, str) else value or []
    if (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(isinstance(x, str) and x for x in stops)
    ):
        raise BadRequest(
            f"stop={short(value)}: must be a non-empty string or a list of up to 4", "stop"
        )
    return stops


def get_bool(body: dict, name: str) -> bool:
    value = body.get(name) or False
    if not isinstance(value, bool):
        raise BadRequest(f"{name}={short(value)}: must be true or false", name)
    return value


def get_int_list(body: dict, name: str) -> list[int]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise BadRequest(f"{name}={short(value)}: must be a list of token ids", name)
    return value


def prompt_tokens(
    body: dict, kind: str, tokenizer, max_model_len: int, max_prompt_bytes: int | None
) -> list[int]:
    """The prompt's token ids: chat messages through the chat template, a completions `prompt` as
    text or as token ids (for a client that shares the lab's vocabulary). A prompt that could
    never fit the context is refused before tokenizing (no request may make the others wait)."""
    if kind == CHAT:
        text, param = chat_prompt(check_messages(body.get("messages"))), "messages"
    else:
        text, param = body.get("prompt"), "prompt"
        if isinstance(text, list) and len(text) == 1 and isinstance(text[0], (str, list)):
            text = text[0]  # a batch of one
    if isinstance(text, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in text):
        if len(text) >= max_model_len:
            raise too_long(f"{len(text)} tokens", param, max_model_len)
        return list(text)  # the engine checks that they are in its vocabulary
    if not isinstance(text, str):
        raise BadRequest(
            f"prompt={short(text)}: must be a string or a list of token ids (one prompt per request)",
            param,
        )
    if max_prompt_bytes is not None and len(text.encode()) > max_prompt_bytes:
        raise too_long(
            f"{len(text.encode()):,} bytes, more than the context holds", param, max_model_len
        )
    return tokenizer.encode(text)


def too_long(what: str, param: str, max_model_len: int) -> APIError:
    return BadRequest(
        f"the prompt has {what}; this model's maximum context length is {max_model_len} tokens",
        param,
        "context_length_exceeded",
    )


# ---- responses ------------------------------------------------------------------
FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "aborted": "abort",
}  # engine's -> OpenAI's (vLLM's "abort")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk(
    rid: str,
    model: str,
    created: int,
    kind: str,
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: dict | None,
    first: bool,
) -> dict:
    """One SSE event's JSON: a piece of choice `index`'s text."""
    if kind == CHAT:
        # OpenAI sends the role in a chunk of its own before any text; the lab puts it in the
        # first token's chunk, so every chunk is one token (clients time tokens by chunks)
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_chunk(rid: str, model: str, created: int, kind: str, counts: dict) -> dict:
    obj = "chat.completion.chunk" if kind == CHAT else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": counts,
    }


def full_response(
    rid: str,
    model: str,
    created: int,
    kind: str,
    choices: list[tuple[str, str, dict | None]],
    counts: dict,
) -> dict:
    """A whole (non-streaming) response: `choices` are (text, finish reason, logprobs) in index order."""
    if kind == CHAT:
        items = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": reason,
            }
            for i, (text, reason, logprobs) in enumerate(choices)
        ]
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": items,
            "usage": counts,
        }
    items = [
        {"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}
        for i, (text, reason, logprobs) in enumerate(choices)
    ]
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": items,
        "usage": counts,
    }


def now_s() -> int:
    return int(time.time())
