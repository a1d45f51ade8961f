# %% [markdown]
# # 9 · Serving: the engine behind an HTTP API, measured from the client
#
# Until now the engine ran *offline*: a whole workload handed over at once, its clock
# jumping over idle time. Real engines (vLLM, SGLang, TGI) run behind an
# OpenAI-compatible HTTP API, and their users see them only from the outside: how long
# until the first token, how fast the rest arrives. This lesson puts the lab's engine
# behind such an API and measures it the way `vllm bench serve` does.
#
# What changes when an engine serves (`minilm/server.py`, `minilm/engine_thread.py`):
#
# - **one engine thread.** The engine loop runs in one background thread; HTTP handlers
#   only hand requests over and stream tokens back. The engine code is the same as
#   offline.
# - **the wall clock.** Idle time is real; a request arrives when its HTTP request does.
# - **the client sees more.** Its time to first token includes the network, parsing,
#   tokenizing and the hand-over to the engine thread, on top of the engine's queueing
#   and prefill.
#
# The servers run in processes of their own, as in production, stopped at the end by their pids.

# %%
import asyncio
import sys
import tempfile
from pathlib import Path

import httpx

import widgets
from minilm import Timeline, summarize
from minilm.bench_result import engine_view, load_result, simulate_result
from minilm.serve_process import ServerProcess

RUNS = Path(tempfile.mkdtemp(prefix="lesson09-"))  # result files and timelines of this lesson's runs
# two servers, one per policy, started together (each waits for its model to load)
servers = {policy: ServerProcess(policy=policy, max_num_seqs=8, timeline=RUNS / f"serve_{policy}.json", timeout=None)
           for policy in ("continuous", "static")}
for s in servers.values():
    s.wait_ready()
server = servers["continuous"]
model = httpx.get(f"{server.url}/v1/models").json()["data"][0]

# %%
# NBVAL_CHECK_OUTPUT
print(f"serving {model['id']!r} with policy {model['policy']!r}, max_model_len {model['max_model_len']}")

# %% [markdown]
# ## 1. One request, as the wire carries it
#
# `POST /v1/completions` with `"stream": true` answers with Server-Sent Events: one
# `data: {json}` line per token, a last chunk with the token counts (`usage`) when
# asked, and `data: [DONE]`. Any OpenAI client (the `openai` package, `curl`, vLLM's
# benchmark) reads it.

# %%
# NBVAL_IGNORE_OUTPUT
body = {"model": model["id"], "prompt": "Return the number of", "max_tokens": 6, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}}
with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as response:
    for line in response.iter_lines():
        if line:
            print(line)

# %% [markdown]
# ## 2. Load it, and watch
#
# `python -m minilm bench-serve` sends a workload to any OpenAI-compatible server at a
# Poisson rate, streams every answer and times each token as it arrives. It runs here in
# its own process (`asyncio.create_subprocess_exec`), so the kernel stays free and the
# live Gantt below grows while the requests come in: each row is a request, grey while
# it waits, blue for its prompt, green while it decodes.

# %%
# 24 docstring prompts at 32 requests/s (Poisson, seeded: the same send times for every run), at most 64 tokens each
LOAD = ["--workload", "docstrings", "--num-prompts", "24", "--rate", "32", "--max-tokens", "64", "--seed", "0"]


async def bench_serve(url: str, save: Path) -> str:
    """`python -m minilm bench-serve ...` in its own process; returns its printed table."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "minilm", "bench-serve", "--base-url", url,
                                                *LOAD, "--save", str(save), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode()


live = widgets.live_gantt(server.url, interval=0.5)
live

# %%
# NBVAL_IGNORE_OUTPUT
print(await bench_serve(server.url, RUNS / "client_continuous.json"))
await live.refresh()
live.stop()

# %% [markdown]
# That is vLLM's summary table: client-side throughput, TTFT (time to first token), TPOT
# (time per output token after the first), ITL (the gaps between tokens) and end-to-end
# latency. The file it saved has the same fields as `vllm bench serve --save-result
# --save-detailed`, so everything below works on a file from a real vLLM deployment too.
#
# ## 3. The on/off experiment, from the client's side
#
# The same client load against the second server, where in-flight batching is off:
# `--policy static` forms a batch, pads it, and admits nobody until its longest row ends.
# (Its Gantt is in section 5.)

# %%
# NBVAL_IGNORE_OUTPUT
print(await bench_serve(servers["static"].url, RUNS / "client_static.json"))
for s in servers.values():
    s.stop()  # Ctrl-C by pid: each writes its --timeline

# %%
# NBVAL_IGNORE_OUTPUT
results = {policy: load_result(RUNS / f"client_{policy}.json") for policy in ("continuous", "static")}
print(f"{'policy':12} {'out tok/s':>10} {'TTFT p50 (ms)':>14} {'TTFT p99 (ms)':>14} {'ITL p50 (ms)':>13}")
for policy, r in results.items():
    print(f"{policy:12} {r['output_throughput']:10.1f} {r['median_ttft_ms']:14.1f} {r['p99_ttft_ms']:14.1f} "
          f"{r['median_itl_ms']:13.1f}")
gain = results["continuous"]["output_throughput"] / results["static"]["output_throughput"]
print(f"\nmeasured from the client on this machine: continuous batching gives {gain:.1f}x the output tokens/s "
      f"and a {results['static']['median_ttft_ms'] / results['continuous']['median_ttft_ms']:.1f}x shorter "
      f"median TTFT")

# %% [markdown]
# Same prompts, greedy decoding: both servers must have written the same texts, and
# every request must have come back.

# %%
# NBVAL_CHECK_OUTPUT
for policy, r in results.items():
    print(f"{policy:10}: {r['completed']} of {r['num_prompts']} requests completed, {r['failed']} failed")
print("same texts under both policies:", results["continuous"]["generated_texts"] == results["static"]["generated_texts"])

# %% [markdown]
# ## 4. The client's view in the lab's charts
#
# `widgets.load_bench_result` turns a result file into a timeline the client saw: a row
# per request, waiting (lilac) from when it was sent until its first token, then
# decoding with a tick per token. The two policies on one time axis:

# %%
client = {policy: widgets.load_bench_result(RUNS / f"client_{policy}.json", label=policy) for policy in results}
widgets.compare_figure(client)

# %%
widgets.latency_cdfs_figure(client)

# %% [markdown]
# ## 5. Client side and engine side of the same requests
#
# Each server wrote its own timeline when it stopped (`--timeline`), and the client sent
# its request ids as `X-Request-Id`, so the two views line up request by request
# (`engine_view` cuts the server's timeline to the client's requests, on the client's
# time axis). The engine side shows what the client cannot: the queue, the prompt's step,
# the batch each token came from. The client's TTFT minus the engine's (arrival to first
# token, on the server's clock) is what the HTTP layer and the network added.

# %%
engine = {policy: engine_view(Timeline.from_json(RUNS / f"serve_{policy}.json"), client[policy])
          for policy in results}
widgets.compare_figure({"client side (continuous)": client["continuous"],
                        "engine side (continuous)": engine["continuous"]})

# %% [markdown]
# And the engine side of the two policies under the same load: static batching's padded
# batches and the queue in front of them, against a batch refilled at every step.

# %%
widgets.compare_figure({"engine side (static)": engine["static"], "engine side (continuous)": engine["continuous"]})

# %%
# NBVAL_IGNORE_OUTPUT
import numpy as np

for policy in results:
    served = {r.request_id: r for r in engine[policy].requests}
    added = [(c.t_first_token - c.arrival) - (served[c.request_id].t_first_token - served[c.request_id].arrival)
             for c in client[policy].requests]
    print(f"{policy:10}: the HTTP layer added {np.median(added) * 1e3:.1f} ms to the median TTFT "
          f"(engine TTFT p50 {summarize(engine[policy])['ttft_p50'] * 1e3:.1f} ms)")

# %% [markdown]
# ## 6. What would a GPU have done with these requests?
#
# The simulator replays the same requests (prompt and output lengths, send times) on a
# simulated Llama-3-8B on an H100 (`minilm/costmodel.py`): the engine's side of the same
# traffic on hardware this laptop does not have. With a vLLM result file, this is a
# what-if for your own deployment.

# %%
# NBVAL_IGNORE_OUTPUT
simulated = {f"{policy} on a simulated H100": simulate_result(client["continuous"], "llama-3-8b", "h100", policy,
                                                              max_num_seqs=8)
             for policy in ("static", "continuous")}
for name, tl in simulated.items():
    m = summarize(tl)
    print(f"{name:34}: {m['output_tok_per_s']:7.0f} output tok/s, TTFT p50 {m['ttft_p50'] * 1e3:6.1f} ms "
          f"(simulated)")
widgets.compare_figure(simulated)

# %% [markdown]
# **What to remember.** A server adds a layer between the engine and its users, and only
# the client sees all of it; measure from there (`bench-serve`, or `vllm bench serve`)
# and compare with the engine's own timeline to see where the time goes. Continuous
# batching's gain shows from the outside too, most of all in TTFT: static batching makes
# a new request wait for a whole batch to end.
#
# The same on a real deployment:
#
# ```bash
# vllm serve meta-llama/Llama-3.1-8B-Instruct                          # or: python -m minilm serve
# vllm bench serve --model meta-llama/Llama-3.1-8B-Instruct --dataset-name random \
#     --request-rate 4 --save-result --save-detailed --result-filename vllm.json
# ```
#
# then `widgets.load_bench_result("vllm.json")` draws it here, and
# `simulate_result(...)` replays it for another model or GPU.
