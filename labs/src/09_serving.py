# %% [markdown]
# # 9 · Serving: the engine behind an HTTP API, measured from the client
#
# Until now the engine ran *offline*: a whole workload handed over at once, its clock
# jumping over idle time. Real engines (vLLM, SGLang, TGI) run behind an
# OpenAI-compatible HTTP API, and their users see them only from the outside: how long
# until the first token, how fast the rest arrives. This lesson puts the lab's engine
# behind such an API and measures it the way `vllm bench serve` does.
#
# What changes when an engine serves (`minilm/serve/server.py`, `minilm/serve/engine_core.py`):
#
# - **two processes.** As in vLLM V1, the engine core (scheduler, KV cache, model) runs in
#   a process of its own and does nothing but steps; the server's process parses HTTP,
#   tokenizes, detokenizes and streams. They exchange small messages over a local socket
#   (ZeroMQ). The engine code is the same as offline. Section 7 measures why it is split.
# - **the wall clock.** Idle time is real; a request arrives when its HTTP request does.
# - **the client sees more.** Its time to first token includes the network, parsing,
#   tokenizing and the hand-over to the engine process, on top of the engine's queueing
#   and prefill.
#
# The servers run in processes of their own, as in production, stopped at the end by their pids.

# %%
import asyncio
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

import widgets
from minilm import Timeline, summarize
from minilm.metrics import itls
from minilm.client.bench_result import engine_view, load_result, simulate_result
from minilm.client.process import ServerProcess
from labs.prose import say

RUNS = Path(tempfile.mkdtemp(prefix="lesson09-"))  # result files and timelines of this lesson's runs
# two servers, one per policy, started together (each waits for its model to load), and for
# section 7 a third whose engine runs in a thread of the server's own process; one CPU thread
# each (`cpu_threads=1`): the servers and their clients share this machine's cores, and threads
# of one server would wait on the others'
servers = {policy: ServerProcess(policy=policy, max_num_seqs=8, cpu_threads=1, timeline=RUNS / f"serve_{policy}.json",
                                 timeout=None)
           for policy in ("continuous", "static")}
servers["thread"] = ServerProcess(policy="continuous", max_num_seqs=8, cpu_threads=1, engine_core="thread", timeout=None)
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
# ## 2. What this machine can serve, then a load it keeps up with
#
# `python -m minilm bench-serve` sends a workload to any OpenAI-compatible server, streams
# every answer and times each token as it arrives. Its first question is what a server
# *can* do, its capacity: every request sent at once (`--rate inf`, which is also
# `vllm bench serve`'s default). `bench_serve.run` is the same client, called from the
# kernel; here it asks each of the three servers:

# %%
# NBVAL_IGNORE_OUTPUT
from minilm.client import bench_serve

NUM_PROMPTS, MAX_TOKENS = 16, 64  # requests, at most this many tokens each (docstring prompts, seeded)
POLICIES = ("continuous", "static")
capacity = {}
for name in ("continuous", "thread", "static"):  # "thread" is for section 7; static last, as the load is set from it
    s = servers[name]
    capacity[name] = await bench_serve.run(s.url, "docstrings", NUM_PROMPTS, rate=float("inf"), max_tokens=MAX_TOKENS,
                                          seed=0, save=str(RUNS / f"client_{name}_inf.json"), quiet=True)
print(f"{'server':11} {'req/s':>6} {'out tok/s':>10}")
for name, r in capacity.items():
    print(f"{name:11} {r['request_throughput']:6.2f} {r['output_throughput']:10.1f}")

# %% [markdown]
# A fixed rate would mean something else on every machine: a rate a fast laptop serves
# with time to spare overloads a slow one. So the load is set from what this machine just
# measured: Poisson arrivals at three quarters of static batching's capacity, a load that
# keeps a static server busy but that it can keep up with, on any machine.
#
# The client runs in its own process (`asyncio.create_subprocess_exec`), so the kernel
# stays free and the live Gantt below grows while the requests come in: each row is a
# request, grey while it waits, blue for its prompt, green while it decodes.

# %%
# NBVAL_IGNORE_OUTPUT
LOAD_FRACTION = 0.75  # of static batching's capacity, in requests/s
RATE = round(LOAD_FRACTION * capacity["static"]["request_throughput"], 2)
LOAD = ["--workload", "docstrings", "--num-prompts", str(NUM_PROMPTS), "--max-tokens", str(MAX_TOKENS), "--seed", "0"]
print(f"the load: {RATE} requests/s")


async def bench_serve_at_rate(url: str, save: Path) -> str:
    """`python -m minilm bench-serve ... --rate RATE` in its own process; returns its printed table."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "minilm", "bench-serve", "--base-url", url,
                                                *LOAD, "--rate", str(RATE), "--save", str(save),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode()


live = widgets.live_gantt(server.url, interval=0.5)
live

# %%
# NBVAL_IGNORE_OUTPUT
print(await bench_serve_at_rate(server.url, RUNS / "client_continuous.json"))
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
print(await bench_serve_at_rate(servers["static"].url, RUNS / "client_static.json"))

# %% [markdown]
# One run of each is a small sample, and on a shared machine a burst of other work can
# fall on one run and not on the other. So the wait is measured over more pairs of runs
# at the same rate, with other prompts and send times (other seeds), the two policies
# taking turns so that whatever else the machine does falls on both alike, and every
# request's time to first token pooled:

# %%
# NBVAL_IGNORE_OUTPUT
REPEATS = 4  # pairs of runs beyond the two above


def ttfts_of(result: dict) -> list[float]:
    return [t for t, error in zip(result["ttfts"], result["errors"]) if not error]  # seconds, completed requests


waits = {policy: ttfts_of(load_result(RUNS / f"client_{policy}.json")) for policy in POLICIES}
pair_gains = []  # each pair's static / continuous median TTFT: the spread a single pair would show
for seed in range(1, REPEATS + 1):
    pair = {policy: await bench_serve.run(servers[policy].url, "docstrings", NUM_PROMPTS, rate=RATE,
                                          max_tokens=MAX_TOKENS, seed=seed, quiet=True) for policy in POLICIES}
    pair_gains.append(pair["static"]["median_ttft_ms"] / pair["continuous"]["median_ttft_ms"])
    for policy in POLICIES:
        waits[policy] += ttfts_of(pair[policy])
for s in servers.values():
    s.stop()  # Ctrl-C by pid: each writes its --timeline
print(f"{'policy':11} {'requests':>8} {'TTFT p50 (ms)':>14} {'TTFT p90 (ms)':>14}")
for policy in POLICIES:
    print(f"{policy:11} {len(waits[policy]):8} {np.median(waits[policy]) * 1e3:14.1f} "
          f"{np.percentile(waits[policy], 90) * 1e3:14.1f}")
print("static / continuous median TTFT, pair by pair:", " ".join(f"{g:.1f}x" for g in pair_gains))

# %% [markdown]
# Both loads side by side. At a rate a server keeps up with, tokens per second say
# little: it finishes what arrives, so the number measures the arrival rate and how fast
# the last requests drain (lesson 6). What a policy changes there is how long a user
# waits, at the median and in the tail.

# %%
# NBVAL_IGNORE_OUTPUT
AT_RATE, AT_ONCE = "at the rate", "all at once"  # the rate is measured: no number in a checked label
results = {(load, policy): load_result(RUNS / f"client_{policy}{suffix}.json")
           for load, suffix in ((AT_RATE, ""), (AT_ONCE, "_inf")) for policy in POLICIES}
print(f"{'load':12} {'policy':11} {'out tok/s':>10} {'TTFT p50 (ms)':>14} {'TTFT p90 (ms)':>14} {'TPOT p50 (ms)':>14}")
for (load, policy), r in results.items():
    print(f"{load:12} {policy:11} {r['output_throughput']:10.1f} {r['median_ttft_ms']:14.1f} {r['p90_ttft_ms']:14.1f} "
          f"{r['median_tpot_ms']:14.1f}")

# %%
# NBVAL_IGNORE_OUTPUT
at_rate = {policy: results[AT_RATE, policy] for policy in POLICIES}
at_once = {policy: results[AT_ONCE, policy] for policy in POLICIES}
sent_over = max(at_rate["continuous"]["start_times"]) - min(at_rate["continuous"]["start_times"])  # seconds
lengths = np.array(at_once["continuous"]["output_lens"])
capacity_gain = at_once["continuous"]["output_throughput"] / at_once["static"]["output_throughput"]
wait_gain = {"median": np.median(waits["static"]) / np.median(waits["continuous"]),
             "p90": np.percentile(waits["static"], 90) / np.percentile(waits["continuous"], 90)}
# the claims below: all at once beats the rate's load; at a load set from this machine's own capacity (so a
# faster or a slower CPU sees the same queueing), the wait is several times shorter at the median and in the tail
assert at_once["continuous"]["output_throughput"] > at_rate["continuous"]["output_throughput"], (
    at_once["continuous"]["output_throughput"], at_rate["continuous"]["output_throughput"])
CLAIMED = 3  # "several times shorter": the least gain the verdict below states, at the median and the p90
assert wait_gain["median"] > CLAIMED and wait_gain["p90"] > CLAIMED, wait_gain
say(f"All at once, continuous batching gives **{capacity_gain:.1f}x** the output tokens/s of static batching on "
    f"this machine: its capacity, the kind of number the sources' ranges in lesson 3 are about (and, as lesson 3 "
    f"shows, it grows with how uneven the output lengths are; here their coefficient of variation is "
    f"{lengths.std() / lengths.mean():.2f}). At {RATE:g} requests/s the {NUM_PROMPTS} requests were sent over "
    f"{sent_over:.1f} s, and the {at_rate['continuous']['output_throughput']:.0f} and "
    f"{at_rate['static']['output_throughput']:.0f} tok/s are that load and its drain. There the gain is in the "
    f"wait: over the {len(waits['continuous'])} requests of {REPEATS + 1} pairs of runs the median TTFT is "
    f"**{wait_gain['median']:.1f}x** shorter with continuous batching "
    f"({np.median(waits['continuous']) * 1e3:.0f} ms against {np.median(waits['static']) * 1e3:.0f} ms), and the "
    f"p90 **{wait_gain['p90']:.1f}x** ({np.percentile(waits['continuous'], 90) * 1e3:.0f} against "
    f"{np.percentile(waits['static'], 90) * 1e3:.0f} ms), because static batching makes a new request wait for a "
    f"whole batch to end. Pair by pair the median's gain ranged from {min(pair_gains):.1f}x to "
    f"{max(pair_gains):.1f}x; the verdict (more than {CLAIMED}x at both) holds because the load was set from "
    f"this machine's own capacity.")

# %% [markdown]
# Same prompts, greedy decoding: both servers must have written the same texts, under
# both loads, and every request must have come back.

# %%
# NBVAL_CHECK_OUTPUT
for (load, policy), r in results.items():
    print(f"{load:12} {policy:10}: {r['completed']} of {r['num_prompts']} requests completed, {r['failed']} failed")
print("same texts under both policies:",
      all(results[load, "continuous"]["generated_texts"] == results[load, "static"]["generated_texts"]
          for load in (AT_RATE, AT_ONCE)))

# %% [markdown]
# ## 4. The client's view in the lab's charts
#
# `widgets.load_bench_result` turns a result file into a timeline the client saw: a row
# per request, waiting (lilac) from when it was sent until its first token, then
# decoding with a tick per token. The two policies at the fixed rate, on one time axis:

# %%
client = {policy: widgets.load_bench_result(RUNS / f"client_{policy}.json", label=policy) for policy in POLICIES}
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
          for policy in POLICIES}
widgets.compare_figure({"client side (continuous)": client["continuous"],
                        "engine side (continuous)": engine["continuous"]})

# %% [markdown]
# And the engine side of the two policies under the same load: static batching's padded
# batches and the queue in front of them, against a batch refilled at every step.

# %%
widgets.compare_figure({"engine side (static)": engine["static"], "engine side (continuous)": engine["continuous"]})

# %%
# NBVAL_IGNORE_OUTPUT
for policy in POLICIES:
    served = {r.request_id: r for r in engine[policy].requests}
    added = [(c.t_first_token - c.arrival) - (served[c.request_id].t_first_token - served[c.request_id].arrival)
             for c in client[policy].requests]
    print(f"{policy:10}: the HTTP layer added {np.median(added) * 1e3:.1f} ms to the median TTFT "
          f"(engine TTFT p50 {summarize(engine[policy])['ttft_p50'] * 1e3:.1f} ms)")

# %% [markdown]
# ## 6. What would a GPU have done with these requests?
#
# The simulator replays the same requests (prompt and output lengths, send times) on a
# simulated Llama-3-8B on an H100 (`minilm/sim/costmodel.py`): the engine's side of the same
# traffic on hardware this laptop does not have. With a vLLM result file, this is a
# what-if for your own deployment. Both loads, both policies:

# %%
# NBVAL_IGNORE_OUTPUT
all_at_once = widgets.load_bench_result(RUNS / "client_continuous_inf.json")
simulated, sim_once = {}, {}
for policy in POLICIES:
    simulated[f"{policy} on a simulated H100"] = simulate_result(client["continuous"], "llama-3-8b", "h100", policy,
                                                                 max_num_seqs=8)
    sim_once[policy] = summarize(simulate_result(all_at_once, "llama-3-8b", "h100", policy, max_num_seqs=8))
print(f"{'':34} {'at ' + f'{RATE:g} req/s':>32} {AT_ONCE:>14}")
print(f"{'':34} {'out tok/s':>10} {'TTFT p50':>10} {'TPOT p50':>10} {'out tok/s':>14}")
for policy in POLICIES:
    r, o = at_rate[policy], at_once[policy]
    print(f"{policy + ', this CPU (measured)':34} {r['output_throughput']:10.0f} {r['median_ttft_ms']:7.1f} ms "
          f"{r['median_tpot_ms']:7.1f} ms {o['output_throughput']:14.0f}")
for policy in POLICIES:
    m = summarize(simulated[f"{policy} on a simulated H100"])
    print(f"{policy + ', H100 (simulated)':34} {m['output_tok_per_s']:10.0f} {m['ttft_p50'] * 1e3:7.1f} ms "
          f"{m['tpot_p50'] * 1e3:7.1f} ms {sim_once[policy]['output_tok_per_s']:14.0f}")
widgets.compare_figure(simulated)

# %%
# NBVAL_IGNORE_OUTPUT
sim = summarize(simulated["continuous on a simulated H100"])
cap = sim["output_tokens"] / sent_over  # an engine that answered every request the moment it was sent
assert sim["output_tok_per_s"] <= cap and at_rate["continuous"]["output_throughput"] <= cap  # a run lasts >= its sends
say(f"At {RATE:g} requests/s the load caps the throughput, on any hardware: these requests ask for {sim['output_tokens']} "
    f"output tokens and were sent over {sent_over:.1f} s, so even an engine that answered instantly could not "
    f"average more than {cap:.0f} tok/s over the run. The simulated H100's {sim['output_tok_per_s']:.0f} tok/s, "
    f"like this CPU's {at_rate['continuous']['output_throughput']:.0f}, is that load and its drain. Compare "
    f"hardware at a rate by its latencies (TTFT, TPOT, in the table), and by throughput only all at once: "
    f"{sim_once['continuous']['output_tok_per_s']:.0f} output tok/s with continuous batching on the simulated "
    f"H100, {sim_once['continuous']['output_tok_per_s'] / sim_once['static']['output_tok_per_s']:.1f}x static "
    f"batching's.")

# %% [markdown]
# ## 7. Why the engine has a process of its own
#
# Python runs one thread at a time (the GIL). With the engine in a thread of the server's
# process, every step waits while the HTTP layer parses a request, detokenizes a token or
# writes an SSE chunk, and those chunks wait while a step runs; on a busy server that is
# thousands of small interruptions a second. vLLM V1 moved its engine core into a process
# of its own for this reason: the two sides then run at the same time, on two cores, and
# pay instead for a message between processes (a few microseconds with ZeroMQ and
# msgspec) for each batch of tokens. Here is the third server, the same engine and policy
# in a thread, under the same all-at-once load as section 3:

# %%
# NBVAL_IGNORE_OUTPUT
designs = {"engine process (default)": at_once["continuous"],
           "engine thread": load_result(RUNS / "client_thread_inf.json")}
print(f"{'design':26} {'out tok/s':>10} {'TTFT p50 (ms)':>14} {'ITL p50 (ms)':>13} {'ITL p99 (ms)':>13}")
for name, r in designs.items():
    print(f"{name:26} {r['output_throughput']:10.1f} {r['median_ttft_ms']:14.1f} {r['median_itl_ms']:13.1f} "
          f"{r['p99_itl_ms']:13.1f}")
process_gain = designs["engine process (default)"]["output_throughput"] / designs["engine thread"]["output_throughput"]

# %%
# NBVAL_IGNORE_OUTPUT
say(f"Measured here: the engine process serves **{process_gain:.2f}x** the output tokens per second of the "
    f"engine thread " + ("(a gain: both sides now run at once)" if process_gain > 1.05 else
                         "(no clear gain this time: the machine had no idle core for the second process, or the "
                         "steps were long enough that the HTTP layer rarely got in their way)") +
    ". On two cores with other work running the number moves from run to run; `bench/serve_overhead.py` "
    "measures both designs against the offline engine on a quiet machine (README, Benchmarks).")

# %% [markdown]
# ## 8. The same server under guidellm
#
# Engineers who run vLLM or SGLang measure them with `vllm bench serve` and, more and more,
# with guidellm, the vLLM project's own benchmark tool. Its JSON report loads into the same
# views: `widgets.load_bench_result` reads the format from the file
# (`minilm/client/guidellm_result.py`). A fresh server, one load for both clients: fixed
# prompt and output lengths, the same concurrency, the chat API. guidellm gets the
# checkpoint's own tokenizer, so it downloads nothing.

# %%
# NBVAL_IGNORE_OUTPUT
import os

from minilm.client.guidellm_result import guidellm_command
from minilm.model.loader import resolve_model_path

C, N, PROMPT, OUTPUT = 8, 32, 32, 32  # concurrency, requests, prompt and output tokens each
with ServerProcess(policy="continuous", max_num_seqs=C, cpu_threads=1) as fresh:  # one thread, as above
    ours = await bench_serve.run(fresh.url, "random", N, max_concurrency=C, ignore_eos=True, quiet=True,
                                 endpoint="/v1/chat/completions", random_input_len=PROMPT, random_output_len=OUTPUT)
    theirs = guidellm_command(fresh.url, RUNS / "guidellm.json", concurrency=C, num_requests=N, prompt_tokens=PROMPT,
                              output_tokens=OUTPUT, tokenizer=resolve_model_path("docstrings"))
    proc = await asyncio.create_subprocess_exec(*theirs, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
two_tools = {"minilm bench-serve": widgets.load_bench_result(ours),
             "guidellm": widgets.load_bench_result(RUNS / "guidellm.json")}
measured = {tool: summarize(tl) for tool, tl in two_tools.items()}
print(f"{'client':19} {'requests':>8} {'out tok/s':>10} {'TTFT p50 (ms)':>14} {'ITL mean (ms)':>14} {'ITL p99 (ms)':>13}")
for tool, m in measured.items():
    mean_itl = np.mean(itls(two_tools[tool]))
    print(f"{tool:19} {m['requests'] - m['failed']:8} {m['output_tok_per_s']:10.1f} {m['ttft_p50'] * 1e3:14.1f} "
          f"{mean_itl * 1e3:14.1f} {m['itl_p99'] * 1e3:13.1f}")
widgets.latency_cdfs_figure(two_tools)

# %%
# NBVAL_IGNORE_OUTPUT
ours_tl = two_tools["minilm bench-serve"]
mean_gaps = [(r.token_times[-1] - r.token_times[0]) / (r.output_len - 1) for r in ours_tl.requests]
as_guidellm_p99 = np.percentile(np.repeat(mean_gaps, OUTPUT - 1), 99)  # guidellm's ITL, on bench-serve's own run
pooled_p99 = measured["minilm bench-serve"]["itl_p99"]
hidden = ("a stall between two tokens, the thing lesson 7's ITL tail is about, averages away"
          if as_guidellm_p99 < pooled_p99 else "this run had no stall for the average to hide")
sentence = (
    f"The two clients define TTFT alike, from sending a request to its first token: its p50 is "
    f"{measured['minilm bench-serve']['ttft_p50'] * 1e3:.0f} ms for bench-serve and "
    f"{measured['guidellm']['ttft_p50'] * 1e3:.0f} ms for guidellm here, one run each on a shared machine "
    f"(`bench/guidellm_vs_bench_serve.py` compares them over repeats). Their ITL is not the same number: "
    f"bench-serve, like vLLM and these lessons, keeps every gap between two tokens, while guidellm records "
    f"only a request's first and last token and reports its mean gap (the views space its tokens evenly). "
    f"On bench-serve's own run the p99 of the gaps is {pooled_p99 * 1e3:.0f} ms and the p99 of the "
    f"requests' mean gaps, guidellm's definition, {as_guidellm_p99 * 1e3:.0f} ms: {hidden}. For a real "
    f"deployment reach for guidellm (or `vllm bench serve`): the vLLM project maintains it, it sweeps "
    f"concurrencies and rates in one run, and its report loads here. The lab's bench-serve is for seeing "
    f"inside: it times every token and sends its ids as `X-Request-Id`, so its requests line up with the "
    f"engine's timeline (section 5).")
say(sentence)

# %% [markdown]
# **What to remember.** A server adds a layer between the engine and its users, and only
# the client sees all of it; measure from there (`bench-serve`, or `vllm bench serve`)
# and compare with the engine's own timeline to see where the time goes. Ask two
# questions with two loads: all requests at once (`--rate inf`) for what a server can do,
# a rate for what its users feel. At a rate the server keeps up with, tokens per second
# are the load, and continuous batching's gain shows in TTFT: static batching makes a
# new request wait for a whole batch to end.
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
#
# **Exercise 9** (`exercises/09_serving.ipynb`): stop strings on a token stream, holding
# back only the text that could begin one (the server's checker holds a fixed window), and
# vLLM's `include_stop_str_in_output`.
