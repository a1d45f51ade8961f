# %% [markdown]
# # 7c · What came next, and what it is worth
#
# Lesson 7b priced a token and counted GPUs. This lesson steps back: where serving went
# after in-flight batching (the systems from Orca on, and prefill/decode
# disaggregation), and four points source `000` makes about the technique's place in
# the industry that the other lessons do not teach: inference compute overtaking
# training, token economics, "not a moat", and inference at the edge.
#
# Everything here is **simulated** (Llama-3-8B, the cost model of
# `minilm/sim/costmodel.py`) or computed from a stated figure; every price and every
# figure not from the cost model is marked as an assumption or cited.

# %%
import inspect

from minilm import make_workload, summarize
from minilm.core.policies import ContinuousPolicy, schedule_decodes, admit_prompts
from minilm.sim import simulated_engine
from minilm.sim.costmodel import CostModel, DeviceSpec, get_device
from labs.prose import say

h100 = get_device("h100")

# %% [markdown]
# ## 1. How we got here
#
# Source `000` tells the history in one line: Orca defined the problem, vLLM proved that
# KV cache management is the key, TensorRT-LLM made it a product, Sarathi and SGLang
# worked out chunked prefill, and by 2024 it was industry consensus. With what each
# system added, and the lesson that measures it:
#
# | year | system | what it added | lesson |
# |---|---|---|---|
# | before | static batching (BERT-era serving, `generate(batch)`) | fixed-shape batches: padding, and a batch as slow as its longest row | lesson 2 |
# | 2022 | Orca (OSDI) | iteration-level scheduling: the batch decided at every step; selective batching: mixed prefill and decode in one step | lesson 3 |
# | 2023 | vLLM (SOSP) | PagedAttention: the KV cache in blocks, so memory turns into batch size | lesson 4 |
# | 2023 | TensorRT-LLM (NVIDIA) | in-flight batching as a product: packed (unpadded) inputs, paged KV (chunked context followed in 2024) | lessons 3, 5 |
# | 2023 | DeepSpeed-FastGen | Dynamic SplitFuse: prompts split and fused so every forward pass has about the same size | lesson 6 |
# | 2024 | Sarathi-Serve (OSDI) | chunked prefill with stall-free batching: a token budget set by the latency limit | lessons 6, 7b |
# | 2024 | SGLang | RadixAttention: prompt prefixes cached and shared in a radix tree, cache-aware scheduling | lesson 8 |
# | 2024 | DistServe (OSDI) | goodput as the target; prefill and decode on separate GPUs | lessons 7, 7b |
#
# FlashAttention (2022, lesson 5) runs underneath all of them: exact attention computed
# tile by tile, which made long contexts affordable.
#
# > **Source 000, checked.** "Sarathi/SGLang solved the engineering details of chunked
# > prefill" (Sarathi/SGLang 解决了 chunked prefill 的细节工程问题).
# >
# > Half right. Chunked prefill is Sarathi-Serve's and DeepSpeed-FastGen's; SGLang
# > supports it, but what SGLang added is prefix caching in a radix tree and its front-end
# > language (lesson 8). The line also stops before disaggregation, the next section.
#
# > **Source 000, checked.** "Deploy a model with vLLM and compare the throughput with
# > continuous batching on and off (the `--disable-continuous-batching` parameter)."
# >
# > vLLM has no such switch: its scheduler is built on iteration-level scheduling, and its
# > engine arguments have no flag to turn that off. The comparison is lesson 3's, on this
# > engine; lesson 9 serves this engine over an OpenAI-compatible API and measures it with
# > a benchmark client that speaks to vLLM too.

# %% [markdown]
# ## 2. What came next: prefill/decode disaggregation
#
# Chunked prefill keeps prompts and decodes on the same GPU and schedules around their
# interference. **Disaggregation** removes it: one pool of GPUs runs only prefills,
# another only decodes; when a prompt is done, its KV cache is sent from the prefill GPU
# to a decode GPU, which then generates the answer. Each pool can be sized and
# parallelised for its own phase and its own limit: prefill for TTFT, decode for the gaps
# between tokens.
#
# > DistServe (Zhong et al., OSDI 2024): up to 7.4x more requests, or a 12.6x tighter
# > SLO, than colocated systems, with over 90% of requests within their latency limits.
# > vLLM, SGLang and NVIDIA Dynamo now support serving this way.
#
# The price is the transfer. Llama-3-8B's KV cache for one prompt, over the H100's NVLink
# inside a server and over a network link between servers (its speed an assumption, in
# the code), against the prefill that produced it:

# %%
# NBVAL_CHECK_OUTPUT
NETWORK_BYTES_PER_S = 400e9 / 8  # ASSUMED: one 400 Gb/s link (InfiniBand NDR class) between servers
NVLINK_BYTES_PER_S = h100.interconnect_bw / 2  # one direction: the datasheet's figure counts both
llama = CostModel("llama-3-8b", "h100")
for prompt in (1024, 4096, 16384):
    kv = llama.kv_bytes_per_token * prompt
    prefill_ms = llama.cost([(prompt, prompt)]).time * 1e3
    print(f"{prompt:6,d}-token prompt: {kv / 2**20:6,.0f} MiB of KV; prefill {prefill_ms:7.1f} ms; transfer "
          f"{kv / NVLINK_BYTES_PER_S * 1e3:5.1f} ms over NVLink, {kv / NETWORK_BYTES_PER_S * 1e3:6.1f} ms over "
          f"the network (simulated H100; NVLink from the datasheet, the network assumed)")

# %%
# NBVAL_CHECK_OUTPUT
ITL_P99_LIMIT, SECONDS = 0.050, 20  # lesson 7b, section 4: its p99 token-gap limit and seconds of arrivals
BUSY = 120.0  # req/s of `mixed` per H100: lesson 7b, section 3's busiest rate within its loosest TTFT limit


def steady_run(preset, rate, num_requests, max_num_seqs, **knobs):
    """`num_requests` of `preset` arriving at `rate`, in-flight batching without chunks (simulated H100), as
    lesson 7b runs them."""
    specs = make_workload(preset, num_requests=num_requests, seed=0, rate=rate, vocab_size=128256, **knobs)
    engine = simulated_engine("llama-3-8b", "h100", policy="continuous", max_num_seqs=max_num_seqs,
                              record_kv_blocks=False, **knobs)
    engine.add_workload(specs)
    return summarize(engine.run())


long_runs = {rate: steady_run("long-prompt", rate, int(rate * SECONDS), 64, max_model_len=8192)
             for rate in (5.0, 10.0, 15.0)}
stalled = next(r for r, m in long_runs.items() if m["itl_p99"] > ITL_P99_LIMIT)
RUNNING = 64  # lesson 7b's sweep's max_num_seqs
decode_step_ms = llama.cost([(1, 1024)] * RUNNING).time * 1e3
mixed_itl = steady_run("mixed", BUSY, max(300, int(BUSY * SECONDS)), 128)["itl_p99"]
assert max(mixed_itl, decode_step_ms / 1e3) < ITL_P99_LIMIT < long_runs[stalled]["itl_p99"]
say(f"When it wins: when prefills would break the decodes' limit. In-flight batching without chunks breaks a "
    f"{ITL_P99_LIMIT * 1e3:.0f} ms p99 limit at {stalled:g} req/s of long prompts "
    f"({long_runs[stalled]['itl_p99'] * 1e3:.0f} ms, lesson 7b, section 4); a decode-only GPU never runs a prompt, "
    f"and its steps stay near the {decode_step_ms:.1f} ms of a decode step of {RUNNING} sequences. Chunking gets "
    f"most of the way on one GPU; disaggregation also lets each pool be sized for its own phase. When it does not: "
    f"short prompts (`mixed` at {BUSY:g} req/s per H100, without chunks, keeps its p99 token gap at "
    f"{mixed_itl * 1e3:.0f} ms, within the same limit), a deployment too small to split, or a slow link, where the "
    f"KV transfer adds to every request's TTFT.")

# %% [markdown]
# ## 3. Inference overtakes training
#
# > Source `000`: LLM inference cost already exceeds training cost; by public analyses,
# > inference is 60–80% of leading AI companies' compute ("an industry consensus
# > estimate", 推理计算量占比已达 60–80%).
#
# The lab cannot check a company's books, but it can show why the share tips. Training
# costs about $6ND$ FLOPs once ($N$ parameters, $D$ training tokens: a forward and a
# backward pass per token); serving costs about $2N$ FLOPs per token, forever. How much
# data went into training:
#
# > Meta, "Introducing Meta Llama 3" (April 2024): Llama-3 is pretrained on over 15T
# > tokens.
#
# When has serving spent what training did, at the pace lesson 7b's H100 keeps?

# %%
# NBVAL_CHECK_OUTPUT
TRAINING_TOKENS = 15e12  # Meta: "over 15T tokens" for Llama 3 (a lower bound)
FLEET = 1000  # H100s serving the model (ASSUMED)
llama = CostModel("llama-3-8b", "h100")
training_flops = 6 * llama.model.num_params * TRAINING_TOKENS
decode = llama.cost([(1, 1024)] * 128)  # one decode step of 128 sequences at 1,024 tokens of context
flops_per_token = decode.flops / 128  # 2N plus attention, by the cost model's count
queue = make_workload("mixed", num_requests=1000, seed=0, vocab_size=128256)
engine = simulated_engine("llama-3-8b", "h100", policy="continuous", max_num_seqs=128, record_kv_blocks=False)
engine.add_workload(queue)
pace = summarize(engine.run())["output_tok_per_s"]  # output tokens/s per H100 (the tail included)
break_even_tokens = training_flops / flops_per_token
days = break_even_tokens / (pace * FLEET) / 86400
assert 1 < days < 365  # the sentence below: months, not years
say(f"Computed: training Llama-3-8B took about **{training_flops:.1e} FLOPs**; a served token costs "
    f"{flops_per_token / 1e9:.1f} GFLOPs (the cost model's count at 1,024 tokens of context), so serving matches "
    f"training after **{break_even_tokens / 1e12:.0f} trillion** output tokens. At {pace:,.0f} output tokens/s per "
    f"H100 (simulated, in-flight batching, `mixed`), an assumed fleet of {FLEET:,} H100s gets there in "
    f"**{days:.0f} days**; after that every day of serving adds compute that training never will. (Prompt tokens "
    f"cost compute too, so the real date comes sooner.) A model served widely for a year spends most of its "
    f"compute on inference, which is why the share tips, and why a serving engine's efficiency is worth so much.")

# %% [markdown]
# ## 4. Token economics
#
# > Source `000`: APIs bill by the token; every cut in the cost per token turns directly
# > into margin or into a lower price (Token 经济兴起：API 按 token 计费，每 token
# > 成本的降低直接转化为利润空间或价格竞争力), and for a GPU cloud, the same H100 earns
# > more per card with dynamic batching.
#
# Revenue per GPU-hour is the pace times the price: tokens per hour times what a
# million of them sell for. With an assumed API price and lesson 7b's assumed GPU price:

# %%
# NBVAL_CHECK_OUTPUT
USD_PER_MILLION_OUT = 0.20  # ASSUMED price of a million output tokens of an 8B model; edit it
USD_PER_H100_HOUR = 3.00  # ASSUMED, as in lesson 7b
paces = {}
for policy in ("static", "continuous"):
    engine = simulated_engine("llama-3-8b", "h100", policy=policy, max_num_seqs=128, record_kv_blocks=False)
    engine.add_workload(queue)
    paces[policy] = summarize(engine.run())["output_tok_per_s"]
print(f"assumed: ${USD_PER_MILLION_OUT:.2f} per million output tokens, ${USD_PER_H100_HOUR:.2f} per H100-hour")
for policy, tok_s in paces.items():
    revenue = tok_s * 3600 / 1e6 * USD_PER_MILLION_OUT
    print(f"{policy:10s}: {tok_s:7,.0f} tok/s -> ${revenue:5.2f} per H100-hour, margin ${revenue - USD_PER_H100_HOUR:+5.2f}; "
          f"break-even price ${USD_PER_H100_HOUR / (tok_s * 3600 / 1e6):.3f} per million (simulated pace)")

# %%
# NBVAL_CHECK_OUTPUT
revenue = {p: t * 3600 / 1e6 * USD_PER_MILLION_OUT for p, t in paces.items()}
assert revenue["static"] < USD_PER_H100_HOUR < revenue["continuous"]  # the sentence below
say(f"With these assumptions the same H100 earns **${revenue['continuous']:.2f}** an hour with in-flight batching and "
    f"**${revenue['static']:.2f}** with static batching, against a cost of ${USD_PER_H100_HOUR:.2f}: the scheduler "
    f"decides whether this price makes money at all. Read the other way, the price a provider can charge and "
    f"still break even falls {paces['continuous'] / paces['static']:.1f}x. The pace is that of a burst of "
    f"{len(queue):,} requests served to its end (lesson 7b, section 2, lists what such a pace assumes); a real "
    f"service, with quiet hours, earns less.")

# %% [markdown]
# ## 5. Not a moat
#
# > Source `000`: in-flight batching is a general software technique, open-sourced in
# > every mainstream framework; it is nobody's exclusive moat, and its economic effect is
# > indirect: cheaper inference makes a bigger market (非护城河 ... 降低推理成本 → 扩大 AI
# > 推理市场总量).
#
# The lab bears the first half out: the idea fits in a few lines. This engine's
# in-flight policy, the part that differs from static batching, is:

# %%
print(inspect.getsource(ContinuousPolicy.schedule))

# %%
# NBVAL_CHECK_OUTPUT
lines = sum(len(inspect.getsource(f).splitlines()) for f in (ContinuousPolicy.schedule, schedule_decodes, admit_prompts))
say(f"**{lines}** lines of Python, with the two loops it calls: schedule a decode for every running request, then "
    f"admit from the queue while a seat, KV blocks and budget allow. vLLM, SGLang, TensorRT-LLM, Hugging Face's "
    f"TGI and `transformers` (`generate_batch`) all do it, and all are open. What sets deployments apart is "
    f"elsewhere: the cost of the GPUs and how full they are kept (lessons 7 and 7b), kernels tuned to each chip "
    f"(lesson 5), caches and routing that reuse work across requests (lesson 8), capacity planned against an SLO, "
    f"and the model itself.")

# %% [markdown]
# ## 6. Inference at the edge
#
# > Source `000`: stacked, dynamic batching, FP8 and speculative decoding make on-device
# > and edge inference possible too (使端侧/边缘推理也成为可能).
#
# A laptop-class device in the cost model, from its maker's figures:
#
# > Apple, M2 Max (January 2023): up to 400 GB/s of unified memory bandwidth; a GPU of up
# > to 13.6 TFLOPS.
#
# The TFLOPS figure is the FP32 rate, used here for bfloat16 arithmetic too, and the memory
# size is an assumption (both in the code). The device's efficiencies are the cost model's
# untuned defaults, not fitted to any measurement, so read the numbers as a roofline
# estimate. What does batching buy there?

# %%
# NBVAL_CHECK_OUTPUT
laptop = DeviceSpec(name="laptop (M2 Max class, ASSUMED)", flops=13.6e12, mem_bw=400e9, memory=32e9,
                    source="Apple's M2 Max figures; efficiencies untuned")
edge = {}
for label, knobs in (("bf16", {}), ("8-bit weights and KV", dict(quantization="fp8", kv_cache_dtype="fp8"))):
    model = CostModel("llama-3-8b", laptop, **knobs)
    edge[label] = {b: b / model.cost([(1, 1024)] * b).time for b in (1, 4, 16, 64)}
print("Llama-3-8B decode on a laptop-class device, 1,024 tokens of context (simulated, untuned)")
for label, row in edge.items():
    print(f"  {label:21s}: " + ", ".join(f"batch {b}: {t:5.0f} tok/s" for b, t in row.items()))

# %%
# NBVAL_CHECK_OUTPUT
one, shared = edge["8-bit weights and KV"][1], edge["8-bit weights and KV"][16]
assert edge["8-bit weights and KV"][1] > 1.5 * edge["bf16"][1] and shared > 8 * one  # the sentences below
say(f"Simulated: one user on a laptop gets **{edge['bf16'][1]:.0f}** tokens/s from Llama-3-8B in bf16 and "
    f"**{one:.0f}** with 8-bit weights and KV: a decode step reads every weight, and the bytes set the pace. Batching "
    f"would multiply the device's output ({shared:.0f} tokens/s at batch 16), but a laptop has one user, so there is "
    f"rarely a batch to form; what serves one user is what makes one sequence faster: fewer bytes (quantization) "
    f"and speculative decoding, which uses the idle arithmetic of a batch-1 step (lesson 10). Batching pays at the "
    f"edge only where one device serves several streams (agents, a small office server).")

# %% [markdown]
# **What to remember.** Serving went from fixed batches to a batch decided at every step
# (Orca), memory in blocks (vLLM), chunks under a budget (Sarathi-Serve) and separate
# prefill and decode GPUs (DistServe). A widely served model soon spends more compute
# serving than it took to train, so the cost per token is the economics; the scheduling
# that sets it is a few lines every open engine has, and the edge, with one user, needs
# the techniques that speed up one sequence more than batching.
