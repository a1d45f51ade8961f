# %% [markdown]
# # Lecture demo: static vs in-flight vs chunked, live
#
# Run the first cell: it runs one workload under the three policies and shows first the
# metrics table (one row per policy; watch **`out tok/s`**: the same requests, served at
# what rate), then the three runs on one time axis, with a time slider that highlights
# the step each engine is running at that moment, and the control panel (knobs, Run,
# step-through with play/pause, KV block map). The cells below it are talking points, one
# figure each.

# %% [with setup]
import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import Markdown, display

import widgets
from minilm import make_workload, run_workload
from widgets.compare import set_compare_step
from widgets.panel import ControlPanel

specs = make_workload("mixed", num_requests=16, seed=0, max_model_len=512)
knobs = dict(max_num_seqs=6, max_model_len=512, sampling={"ignore_eos": True})
timelines = {"static": run_workload(specs, policy="static", **knobs),
             "continuous": run_workload(specs, policy="continuous", **knobs),
             "chunked (budget 64)": run_workload(specs, policy="chunked", max_num_batched_tokens=64, **knobs)}


def step_at(tl, t):
    """The step an engine is running at time t (seconds)."""
    return max((s.step for s in tl.steps if s.t_start <= t), default=0)


comparison = widgets.fill_width(go.FigureWidget(widgets.compare_figure(timelines)))
end_ms = max(max(s.t_end for s in tl.steps) for tl in timelines.values()) * 1e3
clock = W.FloatSlider(0.0, min=0.0, max=end_ms, step=end_ms / 200, description="time (ms)",
                      readout_format=".0f", layout=W.Layout(width="70%"))
clock.observe(lambda change: set_compare_step(
    comparison, timelines, {name: step_at(tl, change["new"] / 1e3) for name, tl in timelines.items()}), names="value")
panel = ControlPanel(policy="chunked", max_num_batched_tokens=64, num_requests=16, max_num_seqs=6)
display(Markdown("**Watch `out tok/s`**: the same requests under three policies, measured on this machine; "
                 "then `TTFT p99 (ms)`, the wait of the unluckiest request."),
        widgets.metrics_table(timelines), W.VBox([clock, comparison]), panel)

# %% [markdown]
# ## Talking points
#
# **1. Prefill vs decode** (lesson 1). The first steps of every run are long: prompts.
# Then short decode steps. Per step, tokens by kind and the step's duration:

# %%
widgets.steps_figure(timelines["continuous"])

# %% [markdown]
# **2. Static batching wastes** (lesson 2): padding and early-finished rows (grey) until
# the slowest row ends; new requests wait for the whole batch.

# %%
widgets.gantt_figure(timelines["static"])

# %% [markdown]
# **3. The KV cache, paged** (lesson 4): blocks taken as sequences grow, returned the step
# a request ends.

# %%
widgets.kvmap_figure(timelines["continuous"])

# %% [markdown]
# **4. Latency** (lessons 6–7): TTFT and inter-token latency, per policy.

# %%
widgets.latency_cdfs_figure(timelines)

# %% [markdown]
# **5. The same on a GPU** (simulated, Llama-3-8B on an H100), with long prompts
# arriving among short requests (lesson 6): the same picture every time, on any laptop.
# Edit the model and device names to show another. In the table, watch **`ITL max (ms)`**:
# the longest pause in anyone's stream, a long prompt's stall, which chunking removes.

# %%
from minilm.sim import simulated_engine

def simulate(policy, **kw):
    engine = simulated_engine("llama-3-8b", "h100", policy=policy, max_num_seqs=32, max_model_len=8192, **kw)
    engine.add_workload(make_workload("long-prompt", num_requests=64, seed=0, rate=30.0, max_model_len=8192,
                                      vocab_size=128256))
    return engine.run()

simulated = {"static": simulate("static"), "continuous": simulate("continuous"),
             "chunked (budget 512)": simulate("chunked", max_num_batched_tokens=512)}
widgets.metrics_table(simulated)

# %%
widgets.compare_figure(simulated)

# %% [markdown]
# ## Part 2: the audience's requests, live
#
# Start the lab's server from here (its own process, `minilm/serve/server.py`), on every
# network interface so that the room can reach it. Everyone opens the printed address,
# enters the printed key once, types the beginning of a docstring and a name, and presses
# Send: the model writes the rest, streamed token by token, and their request appears as a
# row below, under the name they typed (or an anonymous `req-N`). Set `port=8000` for an
# address that is easy to read out.
#
# A room shares this server, so it keeps each listener's text to them: the chart's feed
# (`GET /timeline`) carries names, lengths and times, never tokens; the key (`--api-key`,
# a fresh one each time) keeps out whoever is on the network but not in the room; and
# `--max-inflight-per-client` lets no one address take the whole batch (past it, the server answers "Too Many Requests").

# %%
from minilm.serve.auth import room_key
from minilm.client.process import ServerProcess

# one CPU thread (`cpu_threads=1`): the server shares the lecturer's laptop with the notebook
lecture_server = ServerProcess(policy="continuous", host="0.0.0.0", max_num_seqs=8, api_key=room_key(),
                               max_inflight_per_client=2, cpu_threads=1)
print(f"audience: open {lecture_server.public_url}  key: {lecture_server.api_key}")
room = widgets.live_gantt(lecture_server.url, interval=0.5)
room

# %% [markdown]
# No audience (or a quiet one)? Requests like the page's, sent from here: a few named
# users, one after another a fixed gap apart, each asking the model to finish the same
# docstring beginning with sampling on, so each gets a text of their own. Like the page,
# each sends the key and names its row (`X-Request-Id`: the name and a random suffix).
# Unlike the page, they do not stream: each answer comes back whole, while the chart
# shows its tokens arriving. They all come from this one machine, so the per-client limit
# holds some back: a refused visitor (Too Many Requests) waits a moment and asks again, as the OpenAI
# SDK does. `await` keeps the kernel, and so the chart, running meanwhile.

# %%
# NBVAL_IGNORE_OUTPUT
import asyncio
import itertools
import secrets

import httpx

names = ["ada", "alan", "grace", "edsger", "barbara", "donald"]
PROMPT, MAX_TOKENS, TEMPERATURE = "Return the number of", 32, 0.8
GAP_S, RETRY_S = 0.3, 0.2  # seconds between two visitors' requests; before a refused one asks again


async def visitor(client, name, delay):
    await asyncio.sleep(delay)
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": TEMPERATURE}
    headers = {**lecture_server.headers, "X-Request-Id": f"{name}-{secrets.token_hex(3)}"}
    for refused in itertools.count():
        r = await client.post(f"{lecture_server.url}/v1/completions", json=body, headers=headers)
        if r.status_code != 429:  # 429: this machine has its share in flight (--max-inflight-per-client)
            return r.raise_for_status().json()["choices"][0]["text"], refused
        await asyncio.sleep(RETRY_S)


print(f"{len(names)} visitors, one every {GAP_S} s, each a POST /v1/completions (not streamed) for up to "
      f"{MAX_TOKENS} tokens at temperature {TEMPERATURE}:")
async with httpx.AsyncClient(timeout=60) as client:
    answers = await asyncio.gather(*(visitor(client, n, GAP_S * i) for i, n in enumerate(names)))
for name, (text, refused) in zip(names, answers):
    print(f"{name:8} {PROMPT}{text!r}" + (f"  (refused {refused}x: the per-client limit)" if refused else ""))
await room.refresh()

# %% [markdown]
# When the lecture is over: stop the chart and the server (Ctrl-C by its pid: requests in
# flight get a moment to finish).

# %%
room.stop()
lecture_server.stop()

# %% [markdown]
# ## Part 3: several engines
#
# Lesson 11's fleets, for real on this laptop: two servers, each with two engine-core
# processes. The first puts two alike cores behind one API process (`serve
# --data-parallel-size 2`): its router picks a core for each request, and its live Gantt
# shows a lane group per core. The second is a disaggregated pair (`serve
# --kv-transfer-config`): a prefill core sends each request's KV to a decode core; its live
# Gantt follows the decode core, where each request's transfer arrives before it decodes.
# One CPU thread per core, on this machine only (`127.0.0.1`).

# %%
two_cores = ServerProcess(policy="continuous", data_parallel_size=2, max_num_seqs=8, cpu_threads=1, timeout=None)
disaggregated = ServerProcess(policy="continuous", kv_transfer_config='{"kv_connector": "ZmqConnector"}',
                              max_num_seqs=8, cpu_threads=1, timeout=None)
for server in (two_cores, disaggregated):  # started together, each waits for its models to load
    server.wait_ready()
fleet_views = {"two engine cores": widgets.live_gantt(two_cores.url, interval=0.5),
               "a prefill and a decode core": widgets.live_gantt(disaggregated.url, interval=0.5)}
for name, view in fleet_views.items():
    display(Markdown(f"**{name}**"), view)

# %% [markdown]
# Send the same burst to both (`bench-serve`'s client, all at once, greedy); run it again
# for another burst. Under the first chart, each request's lane group is the core the
# router chose.

# %%
# NBVAL_IGNORE_OUTPUT
from minilm.client import bench_serve

BURST, BURST_TOKENS = 16, 16  # requests, all at once; tokens each
results = await asyncio.gather(*(bench_serve.run(s.url, "docstrings", BURST, rate=float("inf"),
                                                 max_tokens=BURST_TOKENS, ignore_eos=True, quiet=True)
                                 for s in (two_cores, disaggregated)))
for (name, view), r in zip(fleet_views.items(), results):
    await view.refresh()
    lanes = " + ".join(str(len(feed.finished)) for feed in view.feeds)
    print(f"{name:28} {r['completed']}/{BURST} completed ({lanes} finished in the chart's lane groups), "
          f"{r['output_throughput']:.0f} output tok/s (measured)")

# %% [markdown]
# Done: stop the charts and both servers.

# %%
for view in fleet_views.values():
    view.stop()
two_cores.stop()
disaggregated.stop()
