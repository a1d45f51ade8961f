"""Everything that needs a CUDA GPU, in one command: checked, timed, one table and one JSON.

    python bench/gpu_check.py                   # on a CUDA GPU: at most 8 minutes by its own budget
    python bench/gpu_check.py --dry-run         # every part on this CPU: interpreter, tiny shapes (< 3 min)
    python bench/gpu_check.py --show bench/results/gpu_check.json   # print a saved result

A GPU is lent to this project rarely and briefly, so this script is prepared and proven
on the CPU (`--dry-run` is part of the test suite: tests/test_gpu_check.py). Its parts
run in order; each is guarded (a failure is recorded as the part's error and the next
part runs) and has a wall-clock budget: loops stop early when it runs out, and the part
says so. The budgets add up to at most 8 minutes, so a second try fits in a 15-minute lease.

1 environment   torch / Triton / CUDA versions, the device, its memory; the lab imports
                and runs an engine on the device
2 kernel        the Triton kernel against the reference attention on fresh random inputs:
                fp16 and bf16, GQA groups 1-8, decode / prefill / mixed batches and a chunk
                after cached tokens, scrambled block tables, NaN-poisoned outputs, query
                blocks ending on tile boundaries, split-KV; then Llama-3-8B-sized shapes
3 speed         bench/gpu_attention.py's measurements on a smaller grid: decode bandwidth
                against a device-to-device copy, prefill TFLOP/s against SDPA's flash backend
4 engine        a model of Qwen2-0.5B's shape with random bf16 weights (nothing can be
                downloaded), every policy on `mixed` and `long-prompt`: output tok/s, TTFT,
                ITL; greedy tokens across policies (a difference only where the top two
                logits nearly tie); against transformers' continuous batching and static
                `generate` on the same weights and requests
5 cost model    part 4's measured step times against what minilm/sim/costmodel.py predicts
                for the same steps on this device, and the engine's own time per step
                (scheduling and updating requests: a step's time outside the model call)
6 trace         a timeline and a Perfetto trace of one run, saved beside the JSON

The dry run runs the same code on this CPU: the kernel in Triton's interpreter (fp16 and
fp32; its bf16 is wrong), the `tiny` model in fp32 with the sdpa backend (an engine run in
the interpreter would take minutes), small workloads, and the `cpu` cost-model spec.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(ROOT),
    str(ROOT / "bench"),
    str(ROOT / "tests"),
]  # the lab; gpu_attention.py and
# vs_transformers.py beside this file; tests/helpers.py's batch builder

from bench import report  # noqa: E402

TOTAL_BUDGET_S = 480  # 8 minutes
BUDGETS_S = {
    "environment": 20,
    "kernel": 110,
    "speed": 90,
    "engine": 200,
    "cost model": 20,
    "trace": 20,
}
# Qwen2-0.5B's shape (its config.json): GQA group 7, head_dim 64, q/k/v bias, tied embeddings
QWEN2_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    attention_bias=True,
    tie_word_embeddings=True,
    model_type="qwen2",
    bos_token_id=None,
    eos_token_id=151643,
)
NEAR_TIE = {
    torch.bfloat16: 0.125,
    torch.float16: 0.02,
    torch.float32: 1e-3,
}  # top-2 logit gap, in logits


@dataclass
class Plan:
    """What this run does: the GPU's sizes, or the dry run's."""

    device: torch.device
    dry: bool
    kernel_dtypes: tuple
    groups: tuple  # GQA groups the kernel is checked at
    head_dim: int
    engine_dtype: str
    engine_backend: str
    engine_model: object  # a ModelConfig
    requests: dict  # workload -> number of requests
    max_model_len: int
    max_num_seqs: int
    cost_device: str

    @staticmethod
    def make(dry: bool) -> Plan:
        from minilm.config import MODEL_PRESETS, ModelConfig

        if dry:
            return Plan(
                torch.device("cpu"),
                True,
                (torch.float16, torch.float32),
                (1, 3, 8),
                32,
                "float32",
                "sdpa",
                MODEL_PRESETS["tiny"],
                {"mixed": 8, "long-prompt": 8},
                256,
                8,
                "cpu",
            )
        return Plan(
            torch.device("cuda"),
            False,
            (torch.bfloat16, torch.float16),
            tuple(range(1, 9)),
            128,
            "bfloat16",
            "triton",
            ModelConfig(**QWEN2_05B),
            {"mixed": 64, "long-prompt": 32},
            2048,
            32,
            "h200",
        )


class OutOfTime(Exception):
    pass


class Part:
    """A part's rows, checks and notes, and its clock (`tick` raises OutOfTime past the budget)."""

    def __init__(self, name: str, budget_s: float):
        self.name, self.budget_s, self.t0 = name, budget_s, time.monotonic()
        self.rows, self.checks, self.notes = [], [], []
        self.status, self.seconds = "not run", 0.0

    def tick(self) -> None:
        if time.monotonic() - self.t0 > self.budget_s:
            raise OutOfTime(f"out of its {self.budget_s:.0f} s budget")

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)


# ---- 1. environment -------------------------------------------------------------------------
def environment(part: Part, plan: Plan) -> None:
    from minilm import Engine

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError as e:
        env["triton"] = f"missing ({e})"
    if plan.device.type == "cuda":
        props = torch.cuda.get_device_properties(plan.device)
        free, total = torch.cuda.mem_get_info(plan.device)
        env |= {
            "device": props.name,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_GiB": total / 2**30,
            "free_GiB": free / 2**30,
        }
    else:
        env |= {"device": "cpu (dry run)"}
    part.notes.append(
        " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in env.items())
    )
    engine = Engine(
        "tiny",
        device=str(plan.device),
        max_num_seqs=4,
        max_model_len=128,
        attention_backend=plan.engine_backend,
    )
    for i in range(4):
        engine.add_request(f"e{i}", list(range(1, 10 + 7 * i)), max_tokens=8, ignore_eos=True)
    tl = engine.run()
    part.rows.append(env | {"engine_requests": len(tl.requests), "engine_steps": len(tl.steps)})
    part.checks.append(
        report.check(
            f"an engine runs on {plan.device.type} (requests finished)", len(tl.requests), "==", 4
        )
    )


# ---- 2. kernel correctness --------------------------------------------------------------------
def kernel_cases(dry: bool) -> list[tuple[str, list[int], list[int]]]:
    """(name, new tokens per sequence, context per sequence): the shapes the CPU tests use."""
    cases = [
        ("decode", [1, 1, 1, 1], [1, 17, 64, 130]),
        ("prefill", [1, 20, 37], [1, 20, 37]),
        ("mixed", [1, 9, 1, 33, 1], [40, 9, 200, 33, 7]),
        ("chunk after cache", [16, 1, 25], [80, 33, 25]),
        ("tile boundaries", [64, 32, 1], [128, 64, 64]),
    ]
    if not dry:
        cases += [
            ("decode, long", [1] * 16, [4096 + 37 * i for i in range(16)]),
            ("prefill 1k after 3k", [1024], [4096]),
        ]
    return cases


def kernel(part: Part, plan: Plan) -> None:
    from helpers import paged_attention_batch

    from minilm.model.attention import reference
    from minilm.model.attention import triton_paged as tp

    tolerance = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
    worst: dict = {}
    for dtype in plan.kernel_dtypes:
        for group in plan.groups:
            for name, q_lens, ctx_lens in kernel_cases(plan.dry):
                part.tick()
                q, k, v, meta = paged_attention_batch(
                    q_lens, ctx_lens, group, plan.head_dim, dtype, seed=group
                )
                q, k, v = (t.to(plan.device) for t in (q, k, v))
                meta = type(meta)(
                    *(
                        t.to(plan.device)
                        for t in (
                            meta.cu_seqlens_q,
                            meta.context_lens,
                            meta.block_tables,
                            meta.slot_mapping,
                        )
                    )
                )
                out = torch.full_like(
                    q, float("nan")
                )  # poisoned: an element never written stays NaN
                tp.paged_attention(q, k, v, meta, q.shape[-1] ** -0.5, out=out)
                ref = reference.paged_attention(q, k, v, meta, q.shape[-1] ** -0.5)
                err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                key = (str(dtype).removeprefix("torch."), name)
                worst[key] = max(worst.get(key, 0.0), err if not math.isnan(err) else math.inf)
                if not err < tolerance[dtype]:
                    part.notes.append(
                        f"FAILED {key[0]} {name} group {group}: relative error {err:.2e}"
                    )
    split = split_kv_case(plan)
    for (dtype, name), err in sorted(worst.items()):
        part.rows.append(
            {
                "dtype": dtype,
                "case": name,
                "groups": " ".join(map(str, plan.groups)),
                "max_rel_error": err,
                "tolerance": tolerance[getattr(torch, dtype)],
            }
        )
    part.rows += split
    bad = [r for r in part.rows if not r["max_rel_error"] < r["tolerance"]]
    part.checks.append(
        report.check(
            "kernel cases within tolerance of the reference (count)",
            len(part.rows) - len(bad),
            "==",
            len(part.rows),
        )
    )


def split_kv_case(plan: Plan) -> list[dict]:
    """A decode step of few sequences with long contexts: the split-KV path and its merge."""
    from helpers import paged_attention_batch

    from minilm.model.attention import reference
    from minilm.model.attention import triton_paged as tp

    rows = []
    for dtype in plan.kernel_dtypes:
        q, k, v, meta = paged_attention_batch([1, 1], [700, 1900], 4, plan.head_dim, dtype, seed=9)
        q, k, v = (t.to(plan.device) for t in (q, k, v))
        meta = type(meta)(
            *(
                t.to(plan.device)
                for t in (
                    meta.cu_seqlens_q,
                    meta.context_lens,
                    meta.block_tables,
                    meta.slot_mapping,
                )
            )
        )
        segments = tp.split_kv_segments(q, k, meta)
        out = torch.full_like(q, float("nan"))
        tp.paged_attention(q, k, v, meta, q.shape[-1] ** -0.5, out=out)
        ref = reference.paged_attention(q, k, v, meta, q.shape[-1] ** -0.5)
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        rows.append(
            {
                "dtype": str(dtype).removeprefix("torch."),
                "case": f"split-KV ({segments} segments)",
                "groups": "4",
                "max_rel_error": err if not math.isnan(err) else math.inf,
                "tolerance": {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}[
                    dtype
                ],
            }
        )
    return rows


# ---- 3. kernel speed ----------------------------------------------------------------------------
def speed(part: Part, plan: Plan) -> None:
    import gpu_attention as ga

    shapes = ga.SMOKE if plan.dry else ga.FULL
    setup = ga.Setup(
        shapes["dtype"],
        shapes["num_q_heads"],
        shapes["num_kv_heads"],
        shapes["head_dim"],
        shapes["block_size"],
        plan.device,
        "wall-clock" if plan.dry else "do_bench",
    )
    gen = torch.Generator(device=plan.device).manual_seed(0)
    copy_bps = ga.copy_bandwidth(setup, (64 << 20) if plan.dry else (1 << 30))
    part.notes.append(
        f"device-to-device copy {copy_bps / 1e9:.0f} GB/s (read + write); {setup.timer} medians"
    )
    batches, contexts = ((1, 2), (64, 600)) if plan.dry else ((1, 16, 64, 256), (2048, 8192, 32768))
    decode = ga.bench_decode(setup, batches, contexts, shapes["tolerance"], copy_bps, gen)
    part.tick()
    chunks, cached = ((16, 48), (0, 40)) if plan.dry else ((512, 2048), (0, 8192))
    prefill = ga.bench_prefill(setup, chunks, cached, shapes["tolerance"], gen)
    part.rows += [{"phase": "decode"} | r for r in decode] + [
        {"phase": "prefill"} | r for r in prefill
    ]
    if not plan.dry:  # an interpreter's times are no measurement of the kernel
        part.checks += ga.verdicts(decode, prefill)


# ---- 4. the engine end to end ---------------------------------------------------------------------
def random_model(plan: Plan):
    """The engine's model with seeded random weights, made on the device (a 0.5 B model's
    init on the CPU would take longer than the check)."""
    from minilm.model.llama import LlamaModel
    from minilm.model.loader import resolve_dtype

    if plan.dry:
        return LlamaModel(plan.engine_model).init_random(0)
    with torch.device(plan.device):
        model = LlamaModel(plan.engine_model)
    gen = torch.Generator(device=plan.device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.to(resolve_dtype(plan.engine_dtype)).eval()


def engine_runs(part: Part, plan: Plan, model) -> dict:
    """Every policy on both workloads; returns {(workload, policy): (engine, summary)}."""
    from minilm import Engine, EngineConfig, make_workload, summarize
    from minilm.workload import recommended_knobs

    runs = {}
    for workload, n in plan.requests.items():
        specs = make_workload(
            workload,
            n,
            seed=0,
            vocab_size=plan.engine_model.vocab_size,
            max_model_len=plan.max_model_len,
        )
        for policy in ("static", "continuous", "chunked"):
            part.tick()
            knobs = {"max_num_seqs": plan.max_num_seqs} | recommended_knobs(workload, n, policy)
            engine = Engine(
                model,
                EngineConfig(
                    policy=policy,
                    device=str(plan.device),
                    dtype=plan.engine_dtype,
                    attention_backend=plan.engine_backend,
                    max_model_len=plan.max_model_len,
                    record_kv_blocks=False,
                    **knobs,
                ),
            )
            engine.add_workload(specs, ignore_eos=True)
            summary = summarize(engine.run())
            runs[workload, policy] = engine, summary
            part.rows.append({"system": f"minilm {policy}", "workload": workload} | summary)
    return runs


def greedy_agreement(part: Part, plan: Plan, runs: dict, model) -> None:
    """Greedy tokens of every policy against continuous; a difference must sit on a near-tie."""
    from training.dense import dense_logits

    near = NEAR_TIE[model.lm_head.weight.dtype]
    same = differ = ties = 0
    for (workload, _), (engine, _) in runs.items():
        base = runs[workload, "continuous"][0]
        for rid, req in engine.requests.items():
            a, b = base.requests[rid].output_ids, req.output_ids
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if pos is None:
                same += 1
                continue
            differ += 1
            with torch.no_grad():
                ids = torch.tensor([req.prompt_ids + a[:pos]], device=plan.device)
                top = torch.topk(dense_logits(model, ids)[0, -1], 2).values
            ties += float(top[0] - top[1]) < near
    part.notes.append(
        f"greedy tokens against continuous: {same} requests identical, {differ} differ "
        f"({ties} of them where the top two logits are within {near})"
    )
    part.checks.append(
        report.check(
            "policies' greedy differences not at a near-tie (count)", differ - ties, "==", 0
        )
    )


def transformers_runs(part: Part, plan: Plan, runs: dict, model) -> None:
    """transformers' continuous batching and static `generate` on the same weights (through an HF
    checkpoint, as tests/test_model_hf.py loads them) and the same `mixed` requests."""
    import tempfile

    try:
        import transformers
        import vs_transformers as vt

        from training.checkpoint import save_checkpoint
    except ImportError as e:  # the GPU image may have another transformers
        part.notes.append(f"transformers comparison skipped: {e}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(model, tmp, dtype=plan.engine_dtype)
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, dtype=getattr(torch, plan.engine_dtype)
        )
    hf = hf.to(plan.device).eval()
    engine = runs["mixed", "continuous"][0]
    workload = [
        vt.RequestSpec(r.request_id, r.prompt_ids, r.params.max_tokens)
        for r in engine.requests.values()
    ]
    args = argparse.Namespace(max_num_seqs=plan.max_num_seqs, max_batch_tokens=plan.max_model_len)
    ours = runs["mixed", "continuous"][1]["output_tok_per_s"]
    for name, fn in (
        ("transformers continuous", vt.run_hf_continuous),
        ("transformers static", vt.run_hf_static),
    ):
        part.tick()
        try:
            run = fn(hf, workload, args)
        except Exception as e:  # noqa: BLE001 (an API that moved between versions: say so, go on)
            part.notes.append(f"{name} failed: {type(e).__name__}: {e}")
            continue
        tokens = sum(len(v) for v in run.outputs.values())
        same = sum(run.outputs.get(r.request_id) == r.output_ids for r in engine.requests.values())
        part.rows.append(
            {
                "system": name,
                "workload": "mixed",
                "output_tok_per_s": tokens / run.wall_s,
                "wall_s": run.wall_s,
                "identical_requests": same,
            }
            | dict.fromkeys(("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "steps"))
        )  # it times none
        target = (">=", 3.0) if name == "transformers continuous" and not plan.dry else (None, None)
        part.checks.append(
            report.check(
                f"minilm continuous / {name}, output tok/s (x)",
                ours / (tokens / run.wall_s),
                *target,
            )
        )
        part.notes.append(
            f"{name}: {same} of {len(workload)} requests' greedy tokens identical to minilm's"
        )


def engine(part: Part, plan: Plan) -> dict:
    model = random_model(plan)
    runs = engine_runs(part, plan, model)
    greedy_agreement(part, plan, runs, model)
    transformers_runs(part, plan, runs, model)
    return runs


# ---- 5. the cost model against the device ------------------------------------------------------------
def cost_model(part: Part, plan: Plan, runs: dict) -> None:
    from minilm.sim.costmodel import CostModel

    cost = CostModel(plan.engine_model, plan.cost_device, dtype=plan.engine_dtype)
    for (workload, policy), (engine, _) in runs.items():
        steps = engine.timeline.steps
        errors = [
            abs(cost.items_time(s.items) - s.duration) / s.duration for s in steps if s.duration > 0
        ]
        overhead = [s.duration - s.model_time for s in steps]
        part.rows.append(
            {
                "workload": workload,
                "policy": policy,
                "steps": len(steps),
                "median_abs_error": statistics.median(errors),
                "p90_abs_error": statistics.quantiles(errors, n=10)[-1]
                if len(errors) > 1
                else errors[0],
                "measured_step_ms": 1e3 * statistics.median(s.duration for s in steps),
                "predicted_step_ms": 1e3
                * statistics.median(cost.items_time(s.items) for s in steps),
                "engine_overhead_ms": 1e3 * statistics.median(overhead),
            }
        )
    part.checks.append(
        report.check(
            "cost model, median |error| over all runs' steps (share)",
            statistics.median(r["median_abs_error"] for r in part.rows),
        )
    )


# ---- 6. a timeline and a trace for the lessons -------------------------------------------------------
def trace(part: Part, plan: Plan, runs: dict, out_dir: Path) -> None:
    from minilm.trace import save_trace

    engine, _ = runs["long-prompt", "chunked"]
    stem = "gpu_check_dry" if plan.dry else "gpu_check"
    timeline = engine.timeline.to_json(out_dir / f"{stem}_timeline.json")
    path = save_trace(engine.timeline, out_dir / f"{stem}_trace.json")
    part.rows.append(
        {"file": str(path), "timeline_bytes": len(timeline), "trace_bytes": path.stat().st_size}
    )


# ---- the run ------------------------------------------------------------------------------------------
def run_part(name: str, fn, deadline: float, parts: list[Part]) -> object:
    part = Part(name, min(BUDGETS_S[name], max(0.0, deadline - time.monotonic())))
    parts.append(part)
    print(f"== {name} (budget {part.budget_s:.0f} s)", flush=True)
    result = None
    try:
        result = fn(part)
        part.status = "ok"
    except OutOfTime as e:
        part.status = f"partial: {e}"
    except BaseException as e:  # noqa: BLE001 (SystemExit from a failed check too: record it, run the next part)
        if isinstance(e, KeyboardInterrupt):
            raise
        part.status = f"error: {type(e).__name__}: {e}"
        part.notes.append(traceback.format_exc(limit=6)[-2000:])
    part.seconds = time.monotonic() - part.t0
    print(f"   {part.status} in {part.seconds:.1f} s", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="every part on this CPU: Triton's interpreter, tiny sizes",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="the JSON (a .txt table and the trace files beside it); default "
        "bench/results/gpu_check.json, or a temporary folder's with --dry-run",
    )
    report.add_show_option(ap)
    args = ap.parse_args(argv)
    if args.show:
        show(report.load(args.show))
        return 0
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --dry-run to check the script on this CPU")
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first `import triton`
    out = Path(
        args.out
        or (
            "bench/results/gpu_check.json"
            if not args.dry_run
            else Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_check_dry" / "gpu_check.json"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    plan = Plan.make(args.dry_run)
    t0 = time.monotonic()
    deadline = t0 + TOTAL_BUDGET_S
    parts: list[Part] = []
    run_part("environment", lambda p: environment(p, plan), deadline, parts)
    run_part("kernel", lambda p: kernel(p, plan), deadline, parts)
    run_part("speed", lambda p: speed(p, plan), deadline, parts)
    runs = run_part("engine", lambda p: engine(p, plan), deadline, parts) or {}
    if runs:
        run_part("cost model", lambda p: cost_model(p, plan, runs), deadline, parts)
        run_part("trace", lambda p: trace(p, plan, runs, out.parent), deadline, parts)
    conditions = report.machine() | {
        "dry_run": plan.dry,
        "device": parts[0].rows[0].get("device") if parts[0].rows else str(plan.device),
        "total_s": time.monotonic() - t0,
        "budget_s": TOTAL_BUDGET_S,
        "parts": [
            {
                "part": p.name,
                "status": p.status,
                "seconds": p.seconds,
                "budget_s": p.budget_s,
                "notes": p.notes,
            }
            for p in parts
        ],
    }
    rows = [{"part": p.name} | r for p in parts for r in p.rows]
    checks = [c for p in parts for c in p.checks]
    checks += [
        report.check(f"part {p.name} completed", p.status == "ok", "==", True) for p in parts
    ]
    res = report.result("gpu_check", report.command_line(), conditions, rows, checks)
    report.write(out, res)
    text = show_text(res)
    out.with_suffix(".txt").write_text(text + "\n")
    print(text)
    print(f"JSON: {out}")
    return 0


# ---- printing -------------------------------------------------------------------------------------
TABLES = {
    "environment": [
        report.Column("device", "device"),
        report.Column("torch", "torch"),
        report.Column("triton", "triton"),
        report.Column("cuda", "cuda"),
        report.Column("engine steps (count)", "engine_steps", "d"),
    ],
    "kernel": [
        report.Column("dtype", "dtype"),
        report.Column("case", "case"),
        report.Column("GQA groups", "groups"),
        report.Column("max rel. error (share)", "max_rel_error", ".1e"),
        report.Column("tolerance (share)", "tolerance", ".0e"),
    ],
    "engine": [
        report.Column("system", "system"),
        report.Column("workload", "workload"),
        report.Column("out (tok/s)", "output_tok_per_s", ".0f"),
        report.Column("TTFT p50 (ms)", "ttft_p50", ".1f", 1e3),
        report.Column("TTFT p99 (ms)", "ttft_p99", ".1f", 1e3),
        report.Column("ITL p50 (ms)", "itl_p50", ".2f", 1e3),
        report.Column("ITL p99 (ms)", "itl_p99", ".2f", 1e3),
        report.Column("steps (count)", "steps", "d"),
    ],
    "cost model": [
        report.Column("workload", "workload"),
        report.Column("policy", "policy"),
        report.Column("steps (count)", "steps", "d"),
        report.Column("measured step p50 (ms)", "measured_step_ms", ".2f"),
        report.Column("predicted step p50 (ms)", "predicted_step_ms", ".2f"),
        report.Column("|error| p50 (%)", "median_abs_error", ".0%"),
        report.Column("|error| p90 (%)", "p90_abs_error", ".0%"),
        report.Column("scheduling + update p50 (ms)", "engine_overhead_ms", ".2f"),
    ],
    "trace": [
        report.Column("file", "file"),
        report.Column("timeline (bytes)", "timeline_bytes", "d"),
        report.Column("trace (bytes)", "trace_bytes", "d"),
    ],
}


def show_text(res: dict) -> str:
    c = res["conditions"]
    kind = (
        "DRY RUN ON A CPU: interpreter and tiny-model times, not GPU measurements"
        if c["dry_run"]
        else c["device"]
    )
    lines = [
        report.joined(
            f"gpu_check: {kind}",
            f"{c['total_s']:.0f} s of a {c['budget_s']} s budget",
            report.about(c),
        )
    ]
    for p in c["parts"]:
        lines += ["", f"{p['part']}: {p['status']} ({p['seconds']:.1f} s of {p['budget_s']:.0f} s)"]
        lines += [f"  {n}" for n in p["notes"] if not n.startswith("Traceback")]
        rows = [r for r in res["rows"] if r["part"] == p["part"]]
        if p["part"] == "speed":  # bench/gpu_attention.py's two tables
            import gpu_attention as ga

            lines += [
                report.table([r for r in rows if r["phase"] == phase], columns)
                for phase, columns in (("decode", ga.DECODE), ("prefill", ga.PREFILL))
                if any(r["phase"] == phase for r in rows)
            ]
        elif rows:
            lines.append(report.table(rows, TABLES[p["part"]]))
    return "\n".join(lines + ["", report.checks_text(res["checks"])])


def show(res: dict) -> None:
    print(show_text(res))


if __name__ == "__main__":
    sys.exit(main())
