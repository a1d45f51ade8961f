"""Load a server from the client's side, as `vllm bench serve` does (lesson 9).

    python -m minilm bench-serve --base-url http://127.0.0.1:8000 --workload docstrings --rate 4 --save result.json
    MINILM_API_KEY=KEY python -m minilm bench-serve ...     # a server started with --api-key (or: --api-key KEY)

Works against any OpenAI-compatible server: this lab's, vLLM, SGLang, TGI. It sends a
workload's requests at a Poisson rate (or all at once, or at a JSON trace's own times),
at most `--max-concurrency` at a time, streams every answer, and times each request from
the stream: TTFT (sent -> first token), ITL (gaps between token chunks), end-to-end.
It prints vLLM's summary table and saves vLLM's result format (bench_result.py), so the
lab's views read a file from either tool.

Workloads (real servers need text):
    docstrings   beginnings of held-out docstrings (the lab's `docstrings` model writes the rest)
    random       random token ids decoded to text, re-encoded to about `--random-input-len`
                 tokens (vLLM's `random` dataset), with `--tokenizer` (the server's, when given)
    FILE.json    a trace: [{"prompt" or "prompt_ids", "max_tokens", "arrival"?}, ...]
    any other lab preset (mixed, uniform, ...)   token-id prompts, sent as token arrays: only for a
                 server with the lab's vocabulary (`--token-id-prompts`)

What the client measures includes the network and the server's HTTP layer; the
server's own timeline (`serve --timeline`) has the engine's side of the same requests,
under the same ids (sent as `X-Request-Id`, as vLLM does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.loader import resolve_model_path
from ..model.tokenizer import load_tokenizer
from ..workload import PRESETS, get_workload, poisson_arrivals
from . import bearer
from .bench_result import RequestOutput, make_result, print_result, save_result


@dataclass
class BenchRequest:
    prompt: str | list[int]
    prompt_len: int  # tokens, by the client's tokenizer (the server's usage replaces it when sent)
    max_tokens: int
    arrival: float = 0.0  # seconds after the benchmark starts


# ---- workloads ---------------------------------------------------------------------------
def client_tokenizer(name: str):
    """A tokenizer by lab model name, checkpoint directory or tokenizer.json path."""
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        from ..model.tokenizer import HFTokenizer

        return HFTokenizer(path)
    return load_tokenizer(resolve_model_path(name))


def random_requests(
    n: int, input_len: int, output_len: int, range_ratio: float, tokenizer, rng: np.random.Generator
) -> list[BenchRequest]:
    """vLLM's `random` dataset: lengths uniform in [len * (1 - ratio), len * (1 + ratio)], random
    token ids decoded to text. Text re-encodes to a slightly different count; it is cut to the target."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio {range_ratio}: must be in [0, 1)")
    special = {tokenizer.bos_token_id, tokenizer.eos_token_id, 0}
    normal = np.array([t for t in range(tokenizer.vocab_size) if t not in special])
    lo_in, hi_in = max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio))
    lo_out, hi_out = (
        max(1, int(output_len * (1 - range_ratio))),
        int(output_len * (1 + range_ratio)),
    )
    requests = []
    for k, m in zip(rng.integers(lo_in, hi_in + 1, n), rng.integers(lo_out, hi_out + 1, n)):
        ids = tokenizer.encode(tokenizer.decode(rng.choice(normal, int(k)).tolist()))[: int(k)]
        text = tokenizer.decode(ids)
        requests.append(BenchRequest(text, len(tokenizer.encode(text)), int(m)))
    return requests


def make_requests(
    workload: str,
    num_prompts: int,
    seed: int = 0,
    rate: float | None = None,
    tokenizer=None,
    max_tokens: int | None = None,
    max_model_len: int = 256,
    token_id_prompts: bool = False,
    random_input_len: int = 32,
    random_output_len: int = 64,
    random_range_ratio: float = 0.0,
) -> list[BenchRequest]:
    """The requests of a workload, with arrival times: Poisson at `rate` requests/s (seeded),
    all at 0 for None, or a JSON trace's own times when it has them and no rate is given."""
    tokenizer = tokenizer or client_tokenizer("docstrings")
    rng = np.random.default_rng(seed)
    if workload == "random":
        requests = random_requests(
            num_prompts, random_input_len, random_output_len, random_range_ratio, tokenizer, rng
        )
        for r, t in zip(requests, poisson_arrivals(rng, rate, num_prompts)):
            r.arrival = float(t)
    else:
        specs = get_workload(
            workload,
            num_requests=num_prompts,
            seed=seed,
            rate=rate,
            max_model_len=max_model_len,
            vocab_size=tokenizer.vocab_size,
        )
        if (
            workload not in PRESETS and rate is not None
        ):  # a trace: new Poisson times instead of its own
            for s, t in zip(specs, poisson_arrivals(rng, rate, len(specs))):
                s.arrival = float(t)
        if any(s.prompt_ids is not None for s in specs) and not token_id_prompts:
            raise ValueError(
                f"workload {workload!r} has token-id prompts, which mean something only to a server "
                f"with the lab's vocabulary: pass --token-id-prompts if it has one, or use "
                f"docstrings, random or a trace of text prompts"
            )
        requests = [
            BenchRequest(
                s.prompt if s.prompt is not None else list(s.prompt_ids),
                len(tokenizer.encode(s.prompt)) if s.prompt is not None else len(s.prompt_ids),
                s.max_tokens,
                s.arrival,
            )
            for s in specs
        ]
    if max_tokens is not None:
        for r in requests:
            r.max_tokens = max_tokens
    return requests


# ---- one request ---------------------------------------------------------------------------
async def send_request(
    client, url: str, payload: dict, request_id: str, prompt_len: int
) -> RequestOutput:
    """POST one streaming request and time its chunks. Any chunk with a choice counts as a token
    (its text may be empty), as vLLM's client counts them; the `usage` chunk gives the totals."""
    out = RequestOutput(request_id=request_id, prompt_len=prompt_len)
    chat = url.endswith("chat/completions")
    text: list[str] = []
    out.start_time = last = time.perf_counter()
    try:
        async with client.stream(
            "POST", url, json=payload, headers={"X-Request-Id": request_id}
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                out.error = f"HTTP {response.status_code}: {body[:500]}"
                return out
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("choices"):
                    now = time.perf_counter()
                    if out.output_tokens == 0:
                        out.ttft = now - out.start_time
                    else:
                        out.itl.append(now - last)
                    last = now
                    choice = data["choices"][0]
                    text.append(
                        (choice["delta"].get("content") if chat else choice.get("text")) or ""
                    )
                    out.output_tokens += 1
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                elif data.get("usage"):
                    out.output_tokens = data["usage"]["completion_tokens"]
                    out.prompt_len = data["usage"].get("prompt_tokens", prompt_len)
        out.success = out.ttft > 0
        out.error = "" if out.success else "the stream ended before any token"
    except (
        Exception
    ) as e:  # a refused connection, a broken stream: the request failed, the run goes on
        out.error = f"{type(e).__name__}: {e}"
    out.generated_text = "".join(text)
    out.latency = last - out.start_time
    return out


# ---- a run ----------------------------------------------------------------------------------
async def server_model(base_url: str, api_key: str | None) -> tuple[str, int | None]:
    """The served model's name and max_model_len (vLLM's /v1/models reports it too)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30, headers=bearer(api_key)) as client:
            response = await client.get(f"{base_url}/v1/models")
        if response.status_code != 401:
            data = response.json()["data"][0]
            return data["id"], data.get("max_model_len")
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"cannot reach an OpenAI-compatible server at {base_url} (GET /v1/models: "
            f"{type(e).__name__}: {e})"
        ) from e
    raise ValueError(
        f"the server at {base_url} asks for an API key that was {'wrong' if api_key else 'not given'} "
        f"(HTTP 401 on GET /v1/models): pass --api-key KEY or set MINILM_API_KEY"
    )


async def benchmark(
    base_url: str,
    requests: list[BenchRequest],
    model: str,
    *,
    max_concurrency: int | None = None,
    endpoint: str = "/v1/completions",
    temperature: float = 0.0,
    ignore_eos: bool = False,
    request_id_prefix: str | None = None,
    settings: dict | None = None,
    progress: bool = False,
    api_key: str | None = None,
) -> dict:
    """Send every request at its arrival time (at most `max_concurrency` in flight), wait for all,
    and return vLLM's result object. `api_key`: sent as `Authorization: Bearer KEY`."""
    import httpx

    prefix = request_id_prefix or f"bench-{uuid.uuid4().hex[:8]}-"
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(requests), desc="requests", unit="req")

    async def one(i: int, r: BenchRequest, client) -> RequestOutput:
        key = "messages" if endpoint.endswith("chat/completions") else "prompt"
        prompt = [{"role": "user", "content": r.prompt}] if key == "messages" else r.prompt
        payload = {
            "model": model,
            key: prompt,
            "max_tokens": r.max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ignore_eos:
            payload["ignore_eos"] = True
        if limit is not None:
            async with limit:
                out = await send_request(
                    client, base_url + endpoint, payload, f"{prefix}{i}", r.prompt_len
                )
        else:
            out = await send_request(
                client, base_url + endpoint, payload, f"{prefix}{i}", r.prompt_len
            )
        if bar is not None:
            bar.update(1)
        return out

    connections = httpx.Limits(
        max_connections=max_concurrency or len(requests) or 1, max_keepalive_connections=None
    )
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(None), limits=connections, headers=bearer(api_key)
    ) as client:
        t0 = time.perf_counter()
        tasks = []
        for i, r in enumerate(requests):
            delay = t0 + r.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, r, client)))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return make_result(
        list(outputs),
        duration,
        {
            "model_id": model,
            "num_prompts": len(requests),
            "max_concurrency": max_concurrency,
            "endpoint_type": "openai-chat" if "chat" in endpoint else "openai",
            **(settings or {}),
        },
    )


async def run(
    base_url: str = "http://127.0.0.1:8000",
    workload: str = "docstrings",
    num_prompts: int = 32,
    rate: float | None = None,
    max_concurrency: int | None = None,
    seed: int = 0,
    model: str | None = None,
    tokenizer: str = "docstrings",
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    endpoint: str = "/v1/completions",
    save: str | None = None,
    quiet: bool = False,
    token_id_prompts: bool = False,
    random_input_len: int = 32,
    random_output_len: int = 64,
    random_range_ratio: float = 0.0,
    progress: bool = False,
    api_key: str | None = None,
) -> dict:
    """The whole benchmark: `await bench_serve.run(url, ...)` in a notebook (the kernel keeps
    running, so a live Gantt updates meanwhile); `python -m minilm bench-serve` from a shell."""
    base_url = base_url.rstrip("/")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate={rate} requests/s: must be > 0 (or None / inf: all at once)")
    if rate == float("inf"):
        rate = None
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency={max_concurrency}: must be >= 1")
    served, max_model_len = await server_model(base_url, api_key)
    requests = make_requests(
        workload,
        num_prompts,
        seed,
        rate,
        client_tokenizer(tokenizer),
        max_tokens,
        max_model_len or 256,
        token_id_prompts,
        random_input_len,
        random_output_len,
        random_range_ratio,
    )
    settings = {
        "label": "minilm bench-serve",
        "base_url": base_url,
        "workload": workload,
        "tokenizer_id": tokenizer,
        "request_rate": rate if rate is not None else "inf",
        "burstiness": 1.0,
        "seed": seed,
        "ignore_eos": ignore_eos,
        "temperature": temperature,
    }
    result = await benchmark(
        base_url,
        requests,
        model or served,
        max_concurrency=max_concurrency,
        endpoint=endpoint,
        temperature=temperature,
        ignore_eos=ignore_eos,
        settings=settings,
        progress=progress,
        api_key=api_key,
    )
    if not quiet:
        print_result(result)
    if save:
        save_result(result, save)
    return result


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument(
        "--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"]
    )
    p.add_argument(
        "--model",
        default=None,
        help="the model's name on the server (default: the first of /v1/models)",
    )
    p.add_argument(
        "--workload",
        "--dataset-name",
        default="docstrings",
        help=f"docstrings, random, a JSON trace, or a lab preset ({', '.join(PRESETS)})",
    )
    p.add_argument("--num-prompts", "--num-requests", type=int, default=32)
    p.add_argument(
        "--rate",
        "--request-rate",
        type=float,
        default=None,
        help="Poisson arrivals, requests/s (default: all at once, vLLM's inf)",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=None, help="at most this many requests in flight"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tokenizer",
        default="docstrings",
        help="to count prompt tokens and build random prompts: a lab model, a checkpoint dir or a "
        "tokenizer.json (use the server's)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="every request's max_tokens (default: the workload's)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask for exactly max_tokens tokens (vLLM's extension)",
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy (vLLM bench's default)"
    )
    p.add_argument("--random-input-len", type=int, default=32)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument(
        "--token-id-prompts",
        action="store_true",
        help="send a lab preset's token-id prompts (only to a server with the lab's vocabulary)",
    )
    p.add_argument(
        "--save",
        "--result-filename",
        default=None,
        help="write the result JSON here (vLLM's --save-result --save-detailed format)",
    )
    p.add_argument("--progress", action="store_true")
    p.add_argument(
        "--api-key",
        default=os.environ.get("MINILM_API_KEY") or None,
        help="for a server started with --api-key: sent as `Authorization: Bearer KEY` (default: "
        "$MINILM_API_KEY; vLLM's bench reads OPENAI_API_KEY)",
    )


def cmd_bench_serve(args) -> None:
    asyncio.run(
        run(
            args.base_url,
            args.workload,
            args.num_prompts,
            args.rate,
            args.max_concurrency,
            args.seed,
            args.model,
            args.tokenizer,
            args.max_tokens,
            args.ignore_eos,
            args.temperature,
            args.endpoint,
            args.save,
            token_id_prompts=args.token_id_prompts,
            random_input_len=args.random_input_len,
            random_output_len=args.random_output_len,
            random_range_ratio=args.random_range_ratio,
            progress=args.progress,
            api_key=args.api_key,
        )
    )
    if args.save:
        print(f"saved {args.save}")
