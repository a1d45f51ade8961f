"""The Triton paged-attention kernel on a CUDA GPU: checked, timed, compared; a table and JSON.

    python bench/gpu_attention.py [--out bench/results/gpu_attention.json]
    python bench/gpu_attention.py --smoke   # tiny shapes; on a CPU, Triton's interpreter
    python bench/gpu_attention.py --show bench/results/gpu_attention.json   # print a saved result

What it measures (issue 3), all in bf16 with 32 query heads, 8 KV heads, head_dim 128,
block_size 16 and scrambled block tables:

decode   one token per sequence, batch 1..256 x context 512..32k, through
         `paged_attention` (which picks split-KV for few sequences). Achieved
         bandwidth = bytes the kernel must move (K and V of every context, q, out,
         block tables) / median time, against the bandwidth of a device-to-device
         copy measured here (bytes read + bytes written / time, the same convention).
prefill  one prompt chunk of 512..4096 tokens after 0..16k cached tokens. TFLOP/s =
         causal attention FLOPs (4 * Hq * D per visible query-key pair) / median
         time, against torch's SDPA flash backend on the same K/V gathered into
         contiguous tensors (the kernel reads them through the block table).

Before timing a shape, the kernel's output on it is checked against the pure-torch
reference (`minilm/model/attention/reference.py`). Times are `triton.testing.do_bench`
medians (L2 cleared before each run). Targets on an H200: decode at batch >= 64 and
context >= 4k at >= 80% of the copy bandwidth; prefill at >= 60% of SDPA flash.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install needed

from bench import report  # noqa: E402

FULL = dict(
    dtype=torch.bfloat16,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size=16,
    decode_batches=(1, 4, 16, 64, 128, 256),
    decode_contexts=(512, 2048, 4096, 8192, 16384, 32768),
    prefill_chunks=(512, 1024, 2048, 4096),
    prefill_cached=(0, 4096, 16384),
    tolerance=2e-2,
)
# --smoke: the same code paths at sizes the CPU interpreter runs in seconds (fp16: the
# interpreter's bf16 is wrong). Its times are interpreter wall-clock, not GPU numbers.
SMOKE = dict(
    dtype=torch.float16,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=32,
    block_size=16,
    decode_batches=(1, 2),
    decode_contexts=(64, 600),
    prefill_chunks=(16, 48),
    prefill_cached=(0, 40),
    tolerance=1e-2,
)
TARGET_DECODE = dict(min_batch=64, min_context=4096, fraction_of_copy=0.80)
TARGET_PREFILL = dict(fraction_of_sdpa=0.60)


@dataclass
class Setup:
    dtype: torch.dtype
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    device: torch.device
    timer: str  # "do_bench" (CUDA) or "wall-clock" (interpreter)


def median_ms(fn, setup: Setup) -> float:
    if setup.timer == "do_bench":
        from triton.testing import do_bench

        t = do_bench(fn, quantiles=[0.5])  # a float on some Triton versions, [float] on others
        return float(t[0] if isinstance(t, (list, tuple)) else t)
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(setup: Setup, nbytes: int) -> float:
    """Bytes/s of `dst.copy_(src)` on the device, counting what is read plus what is written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=setup.device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), setup)
    return 2 * nbytes / (ms * 1e-3)


def new_cache(setup: Setup, num_seqs: int, max_context: int, gen: torch.Generator):
    """Random K and V caches for `num_seqs` sequences of up to `max_context` tokens, and a
    shuffled order of their blocks."""
    from minilm.core.kv_cache import cdiv

    num_blocks = num_seqs * cdiv(max_context, setup.block_size)
    shape = (num_blocks, setup.block_size, setup.num_kv_heads, setup.head_dim)
    k = torch.randn(shape, generator=gen, device=setup.device, dtype=setup.dtype)
    v = torch.randn(shape, generator=gen, device=setup.device, dtype=setup.dtype)
    order = torch.randperm(num_blocks, generator=gen, device=setup.device).to(torch.int32)
    return k, v, order


def metadata(q_lens: list[int], ctx_lens: list[int], order: torch.Tensor, block_size: int):
    """Sequence i takes the next blocks of the shuffled `order`: scrambled, never shared."""
    from minilm.core.kv_cache import cdiv
    from minilm.model.llama import AttentionMetadata

    need = [cdiv(c, block_size) for c in ctx_lens]
    width, device = max(need), order.device
    tables = torch.zeros(len(ctx_lens), width, dtype=torch.int32, device=device)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = order[used : used + n]
        used += n
    cu = torch.tensor([0] + q_lens, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    return AttentionMetadata(
        cu,
        torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        tables,
        torch.zeros(0, dtype=torch.int64, device=device),
    )


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def checked(name: str, err: float, tolerance: float) -> float:
    if not err < tolerance:
        raise SystemExit(f"CHECK FAILED on {name}: relative error {err:.2e} >= {tolerance:.0e}")
    return err


def bench_decode(
    setup: Setup, batches, contexts, tolerance: float, copy_bps: float, gen
) -> list[dict]:
    from minilm.model.attention import reference
    from minilm.model.attention import triton_paged as tp

    k_cache, v_cache, order = new_cache(setup, max(batches), max(contexts), gen)
    scale = setup.head_dim**-0.5
    rows = []
    for batch in batches:
        for ctx in contexts:
            meta = metadata([1] * batch, [ctx] * batch, order, setup.block_size)
            q = torch.randn(
                batch,
                setup.num_q_heads,
                setup.head_dim,
                generator=gen,
                device=setup.device,
                dtype=setup.dtype,
            )
            segments = tp.split_kv_segments(q, k_cache, meta)
            out = tp.paged_attention(q, k_cache, v_cache, meta, scale)
            err = checked(
                f"decode b={batch} ctx={ctx}",
                rel_error(out, reference.paged_attention(q, k_cache, v_cache, meta, scale)),
                tolerance,
            )
            ms = median_ms(lambda: tp.paged_attention(q, k_cache, v_cache, meta, scale), setup)
            unified_ms = (
                ms
                if segments == 1
                else median_ms(
                    lambda: tp.attention_unified(q, k_cache, v_cache, meta, scale), setup
                )
            )
            elt = k_cache.element_size()
            nbytes = (
                2 * batch * ctx * setup.num_kv_heads * setup.head_dim * elt  # K and V
                + 2 * q.numel() * elt
                + meta.block_tables.numel() * 4
            )  # q, out, tables
            bw = nbytes / (ms * 1e-3)
            rows.append(
                dict(
                    batch=batch,
                    context=ctx,
                    segments=segments,
                    ms=ms,
                    unified_ms=unified_ms,
                    bytes=nbytes,
                    GBps=bw / 1e9,
                    fraction_of_copy=bw / copy_bps,
                    rel_error=err,
                )
            )
            print(
                f"decode  batch {batch:4d} ctx {ctx:6d}  split {segments:2d}  {ms * 1e3:9.1f} us "
                f"(unified {unified_ms * 1e3:9.1f} us)  {bw / 1e9:7.1f} GB/s  {bw / copy_bps:6.1%} of copy  "
                f"err {err:.1e}",
                flush=True,
            )
    return rows


def sdpa_flash(q, k, v, cached: int):
    """torch SDPA on contiguous [1, H, L, D] tensors, flash backend on CUDA; causal aligned bottom-right."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    mask = (
        dict(is_causal=True)
        if cached == 0
        else dict(attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
    )
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, **mask)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, **mask)


def bench_prefill(setup: Setup, chunks, cached_lens, tolerance: float, gen) -> list[dict]:
    from minilm.model.attention import reference
    from minilm.model.attention import triton_paged as tp

    k_cache, v_cache, order = new_cache(setup, 1, max(chunks) + max(cached_lens), gen)
    scale = setup.head_dim**-0.5
    group = setup.num_q_heads // setup.num_kv_heads
    rows = []
    for cached in cached_lens:
        for n in chunks:
            ctx = cached + n
            meta = metadata([n], [ctx], order, setup.block_size)
            q = torch.randn(
                n,
                setup.num_q_heads,
                setup.head_dim,
                generator=gen,
                device=setup.device,
                dtype=setup.dtype,
            )
            out = tp.paged_attention(q, k_cache, v_cache, meta, scale)
            err = checked(
                f"prefill chunk={n} cached={cached}",
                rel_error(out, reference.paged_attention(q, k_cache, v_cache, meta, scale)),
                tolerance,
            )

            # SDPA's inputs: the same keys and values, gathered contiguous, one per query head.
            def dense(cache):
                kv = reference.gather_kv(cache, meta.block_tables[0], ctx)  # [ctx, Hkv, D]
                return kv.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0).contiguous()

            k, v, qd = dense(k_cache), dense(v_cache), q.transpose(0, 1).unsqueeze(0).contiguous()
            sdpa_out = sdpa_flash(qd, k, v, cached)[0].transpose(0, 1)
            err_sdpa = checked(
                f"SDPA vs kernel, chunk={n} cached={cached}", rel_error(out, sdpa_out), tolerance
            )
            ms = median_ms(lambda: tp.paged_attention(q, k_cache, v_cache, meta, scale), setup)
            sdpa_ms = median_ms(lambda: sdpa_flash(qd, k, v, cached), setup)
            pairs = n * cached + n * (n + 1) // 2  # query-key pairs the causal mask lets through
            flops = 4 * setup.num_q_heads * setup.head_dim * pairs
            tf, tf_sdpa = flops / (ms * 1e-3) / 1e12, flops / (sdpa_ms * 1e-3) / 1e12
            rows.append(
                dict(
                    chunk=n,
                    cached=cached,
                    ms=ms,
                    sdpa_ms=sdpa_ms,
                    flops=flops,
                    TFLOPs=tf,
                    sdpa_TFLOPs=tf_sdpa,
                    fraction_of_sdpa=tf / tf_sdpa,
                    rel_error=err,
                    rel_error_vs_sdpa=err_sdpa,
                )
            )
            print(
                f"prefill chunk {n:5d} cached {cached:6d}  {ms:8.3f} ms  {tf:6.1f} TFLOP/s  "
                f"sdpa{'-flash' if q.is_cuda else ' (cpu)'} {sdpa_ms:8.3f} ms {tf_sdpa:6.1f} TFLOP/s  {tf / tf_sdpa:6.1%}  err {err:.1e}",
                flush=True,
            )
    return rows


def verdicts(decode: list[dict], prefill: list[dict]) -> list[dict]:
    """The targets, on the worst shape each covers (none for what was not measured)."""
    big = [
        r
        for r in decode
        if r["batch"] >= TARGET_DECODE["min_batch"] and r["context"] >= TARGET_DECODE["min_context"]
    ]
    out = []
    if big:
        out.append(
            report.check(
                f"decode, batch >= {TARGET_DECODE['min_batch']} and context >= "
                f"{TARGET_DECODE['min_context']}: worst fraction of copy bandwidth",
                min(r["fraction_of_copy"] for r in big),
                ">=",
                TARGET_DECODE["fraction_of_copy"],
            )
        )
    if prefill:
        out.append(
            report.check(
                "prefill: worst fraction of SDPA-flash TFLOP/s",
                min(r["fraction_of_sdpa"] for r in prefill),
                ">=",
                TARGET_PREFILL["fraction_of_sdpa"],
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        default=None,
        help="JSON results, a .txt table beside it (default: "
        "bench/results/gpu_attention.json; with --smoke none: an interpreter's times are not results)",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tiny shapes; runs on CPU in the Triton interpreter"
    )
    report.add_show_option(ap)
    args = ap.parse_args()
    if args.show:
        return show(report.load(args.show))
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise SystemExit(
            "bench/gpu_attention.py needs a CUDA GPU (none found): it times the compiled Triton "
            "kernel. Use --smoke to run its code paths at tiny sizes in the CPU interpreter."
        )
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first `import triton`
    import triton

    shapes = SMOKE if args.smoke else FULL
    setup = Setup(
        shapes["dtype"],
        shapes["num_q_heads"],
        shapes["num_kv_heads"],
        shapes["head_dim"],
        shapes["block_size"],
        torch.device("cuda" if cuda else "cpu"),
        "do_bench" if cuda else "wall-clock",
    )
    device_name = (
        torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()}), Triton interpreter"
    )
    t0 = time.perf_counter()
    gen = torch.Generator(device=setup.device).manual_seed(0)
    copy_bps = copy_bandwidth(setup, (1 << 30) if cuda and not args.smoke else (64 << 20))
    print(
        "\n".join(
            header(
                dict(
                    device=device_name,
                    torch=torch.__version__,
                    triton=triton.__version__,
                    dtype=str(setup.dtype),
                    num_q_heads=setup.num_q_heads,
                    num_kv_heads=setup.num_kv_heads,
                    head_dim=setup.head_dim,
                    block_size=setup.block_size,
                    timer=setup.timer,
                    copy_GBps=copy_bps / 1e9,
                )
            )
        ),
        flush=True,
    )
    decode = bench_decode(
        setup,
        shapes["decode_batches"],
        shapes["decode_contexts"],
        shapes["tolerance"],
        copy_bps,
        gen,
    )
    if cuda:
        torch.cuda.empty_cache()
    prefill = bench_prefill(
        setup, shapes["prefill_chunks"], shapes["prefill_cached"], shapes["tolerance"], gen
    )
    total_s = time.perf_counter() - t0
    conditions = report.machine() | dict(
        torch=torch.__version__,
        triton=triton.__version__,
        device=device_name,
        smoke=args.smoke,
        timer=setup.timer,
        dtype=str(setup.dtype),
        num_q_heads=setup.num_q_heads,
        num_kv_heads=setup.num_kv_heads,
        head_dim=setup.head_dim,
        block_size=setup.block_size,
        copy_GBps=copy_bps / 1e9,
        targets=dict(decode=TARGET_DECODE, prefill=TARGET_PREFILL),
        total_s=total_s,
    )
    rows = [{"phase": "decode"} | r for r in decode] + [{"phase": "prefill"} | r for r in prefill]
    res = report.result(
        "gpu_attention",
        report.command_line(),
        conditions,
        rows,
        [] if args.smoke else verdicts(decode, prefill),
    )
    table = show_text(res)
    print(table)
    out = args.out or (None if args.smoke else "bench/results/gpu_attention.json")
    if out is not None:
        out = report.write(out, res)
        out.with_suffix(".txt").write_text(table + "\n")
        print(f"wrote {out} and {out.with_suffix('.txt')}")


DECODE = [
    report.Column("batch (seqs)", "batch", "d"),
    report.Column("context (tokens)", "context", "d"),
    report.Column("split (segments)", "segments", "d"),
    report.Column("time (us)", "ms", ".1f", 1e3),
    report.Column("unified (us)", "unified_ms", ".1f", 1e3),
    report.Column("bandwidth (GB/s)", "GBps", ".1f"),
    report.Column("of copy (%)", "fraction_of_copy", ".1%"),
]
PREFILL = [
    report.Column("chunk (tokens)", "chunk", "d"),
    report.Column("cached (tokens)", "cached", "d"),
    report.Column("time (ms)", "ms", ".3f"),
    report.Column("kernel (TFLOP/s)", "TFLOPs", ".1f"),
    report.Column("sdpa (ms)", "sdpa_ms", ".3f"),
    report.Column("sdpa (TFLOP/s)", "sdpa_TFLOPs", ".1f"),
    report.Column("of sdpa (%)", "fraction_of_sdpa", ".1%"),
]


def header(c: dict) -> list[str]:
    lines = [
        f"device {c['device']}; torch {c['torch']}, triton {c['triton']}; "
        f"{c['dtype'].removeprefix('torch.')}, Hq={c['num_q_heads']}, Hkv={c['num_kv_heads']}, "
        f"D={c['head_dim']}, block_size={c['block_size']}; timer: {c['timer']} median",
        f"device-to-device copy: {c['copy_GBps']:.0f} GB/s (read + write)",
    ]
    if c["timer"] != "do_bench":
        lines.append("SMOKE RUN ON CPU: interpreter wall-clock times, not GPU measurements")
    return lines


def show_text(res: dict) -> str:
    """What the script prints after a run and writes beside the JSON (.txt; lesson 5 shows it)."""
    c, rows = res["conditions"], res["rows"]
    lines = header(c) + [
        "",
        "decode (one token per sequence)",
        report.table([r for r in rows if r["phase"] == "decode"], DECODE),
        "",
        "prefill (one chunk after `cached` tokens)",
        report.table([r for r in rows if r["phase"] == "prefill"], PREFILL),
        "",
    ]
    lines.append(
        "checks: none (a smoke run's times are the interpreter's, not a GPU's)"
        if c["smoke"]
        else report.checks_text(res["checks"])
    )
    lines.append(f"total {c['total_s']:.0f} s")
    return "\n".join(lines)


def show(res: dict) -> None:
    print(show_text(res))


if __name__ == "__main__":
    main()
