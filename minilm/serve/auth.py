"""`serve --api-key KEY`: the API asks for `Authorization: Bearer KEY` (vLLM's flag; lesson 9).

    python -m minilm serve --host 0.0.0.0 --api-key KEY     # or MINILM_API_KEY=KEY: not seen by `ps`
    curl -H "Authorization: Bearer KEY" http://HOST:8000/v1/models

Every route answers 401 without the key, in OpenAI's error JSON, except the public ones
below: a route added later is guarded unless it is named here (fail closed, as vLLM's
middleware is). Public: the page at / (it asks its visitor for the key), /health (probes),
/metrics (counts, open in vLLM too) and /timeline, the live Gantt on the projector: it
carries lengths and times only, never text (public.py `public_view`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import InvalidValue
from .openai_api import APIError

PUBLIC_PATHS = frozenset({"/", "/health", "/metrics", "/timeline"})
KEY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: read off a slide without doubt


def check_api_key(key: str) -> None:
    """A key a browser and curl can send: printable ASCII, no spaces (it travels in a header)."""
    if not key or not all(33 <= ord(c) < 127 for c in key):
        raise InvalidValue(
            "--api-key (or MINILM_API_KEY)",
            key,
            "must be printable ASCII without spaces (it "
            "travels in an HTTP header); leave it out for a server without a key",
        )


def room_key(length: int = 6) -> str:
    """A short random key for a lecture's slide (31**6, about 9e8 keys: a lecture hour is too short to guess one)."""
    return "".join(secrets.choice(KEY_ALPHABET) for _ in range(length))


def key_matches(authorization: str | None, key: str) -> bool:
    """`Authorization: Bearer KEY` with this key. Both sides are hashed to the same length, then
    compared in constant time: how long a wrong guess takes says nothing of the key."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(sha256(given.strip()), sha256(key))


def sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def unauthorized(authorization: str | None) -> JSONResponse:
    message = (
        "this server asks for an API key: send the header `Authorization: Bearer KEY`"
        if authorization is None
        else "incorrect API key provided"
    )
    error = APIError(401, message, code="invalid_api_key")
    return JSONResponse(error.to_json(), status_code=401, headers={"WWW-Authenticate": "Bearer"})


class APIKeyMiddleware:
    """Checks the key before any route runs. A plain ASGI app around the server's (not
    Starlette's BaseHTTPMiddleware), so streams and disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, key: str):
        check_api_key(key)
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            authorization = Headers(scope=scope).get("authorization")
            if not key_matches(authorization, self.key):
                await unauthorized(authorization)(scope, receive, send)
                return
        await self.app(scope, receive, send)
