"""bench-serve -> a vLLM-format result file -> the lab's views, and vLLM's own files (issue 13)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from serving import docstrings_engine, serving, wait_idle

import widgets
from minilm import summarize
from minilm.cli import main as cli_main
from minilm.client.bench_result import engine_view, replay_specs, simulate_result
from minilm.client.bench_serve import client_tokenizer, make_requests, run

VLLM_SUMMARY = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)
VLLM_LISTS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "start_times",
    "generated_texts",
    "errors",
)


def test_bench_serve_result_file_round_trips_into_the_views(tmp_path, capsys):
    path = tmp_path / "result.json"
    with serving(docstrings_engine(max_num_seqs=8)) as (url, engine, _):
        assert (
            cli_main(
                [
                    "bench-serve",
                    "--base-url",
                    url,
                    "--num-prompts",
                    "12",
                    "--rate",
                    "40",
                    "--max-tokens",
                    "24",
                    "--save",
                    str(path),
                ]
            )
            == 0
        )
        wait_idle(engine)
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out and "Output token throughput (tok/s):" in out
    r = json.loads(path.read_text())
    assert set(VLLM_SUMMARY) | set(VLLM_LISTS) <= set(r)
    assert r["completed"] == 12 and r["failed"] == 0 and not any(r["errors"])
    assert r["total_output_tokens"] == sum(r["output_lens"])
    assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration"])
    assert all(len(gaps) == n - 1 for gaps, n in zip(r["itls"], r["output_lens"]))
    # the client saw exactly what the engine did, under the same request ids
    server = {q.request_id: q for q in engine.timeline.requests}
    for rid, n, text, prompt_len, ttft in zip(
        r["request_ids"], r["output_lens"], r["generated_texts"], r["input_lens"], r["ttfts"]
    ):
        q = server[rid]
        assert (q.output_len, q.prompt_len) == (n, prompt_len)
        assert text == engine.tokenizer.decode(q.output_ids)
        assert ttft >= q.t_first_token - q.arrival  # the client's TTFT includes the HTTP layer's
    tl = widgets.load_bench_result(path)
    assert [q.output_len for q in tl.requests] == r["output_lens"] and not tl.steps
    fig = widgets.gantt_figure(tl)
    ticks = next(t for t in fig.data if t.name == "token")
    assert len(ticks.x) == sum(r["output_lens"])
    waiting = next(t for t in fig.data if t.name == "waiting")
    assert np.allclose(sorted(waiting.x), sorted(np.array(r["ttfts"]) * 1e3))
    side = engine_view(
        engine.timeline, tl
    )  # the server's view of the same requests, on the client's axis
    assert sorted(q.request_id for q in side.requests) == sorted(r["request_ids"]) and side.steps
    first = min(tl.requests, key=lambda q: q.arrival).request_id
    assert next(q.arrival for q in side.requests if q.request_id == first) == pytest.approx(0.0)
    assert {i.request_id for s in side.steps for i in s.items} <= set(r["request_ids"])
    widgets.compare_figure({"client": tl, "engine": side})
    sim = simulate_result(tl, "llama-3-8b", "h100", "continuous")
    assert sorted(q.output_len for q in sim.requests) == sorted(r["output_lens"])
    widgets.compare_figure({"client (measured)": tl, "simulated H100": sim})
    widgets.latency_cdfs_figure({"client": tl})
    m = summarize(tl)
    assert m["output_tok_per_s"] > 0 and m["ttft_p50"] == pytest.approx(
        np.percentile(r["ttfts"], 50)
    )


def vllm_file(with_start_times: bool = True) -> dict:
    """What `vllm bench serve --save-result --save-detailed` writes, by hand (no vLLM needed)."""
    r = {
        "date": "20250101-120000",
        "backend": "vllm",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": 3,
        "request_rate": 2.0,
        "duration": 3.0,
        "completed": 2,
        "failed": 1,
        "total_input_tokens": 300,
        "total_output_tokens": 5,
        "request_throughput": 0.67,
        "output_throughput": 1.67,
        "total_token_throughput": 101.7,
        "input_lens": [100, 200, 50],
        "output_lens": [3, 2, 0],
        "ttfts": [0.05, 0.08, 0.0],
        "itls": [[0.02, 0.03], [0.04], []],
        "generated_texts": ["a b c", "d e", ""],
        "errors": ["", "", "Traceback: connection reset"],
    }
    if with_start_times:
        r["start_times"] = [1000.0, 1000.5, 1001.0]
    return r


def test_vllm_result_files_load_into_the_views(tmp_path):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(vllm_file()))
    tl = widgets.load_bench_result(path, label="vLLM")
    assert [q.arrival for q in tl.requests] == [0.0, 0.5, 1.0]
    assert tl.requests[0].token_times == pytest.approx([0.05, 0.07, 0.10])
    assert tl.requests[1].t_first_token == pytest.approx(0.58)
    assert tl.requests[2].finish_reason == "error" and tl.requests[2].token_times == []
    assert tl.meta["policy"] == "vLLM" and tl.meta["has_start_times"]
    widgets.gantt_figure(tl)
    widgets.compare_figure({"vLLM": tl, "again": tl})
    assert [s.max_tokens for s in replay_specs(tl)] == [3, 2]  # the failed request is not replayed
    old = widgets.load_bench_result(vllm_file(with_start_times=False))
    assert [q.arrival for q in old.requests] == [0, 0, 0] and not old.meta["has_start_times"]
    summary_only = {k: v for k, v in vllm_file().items() if k not in ("ttfts", "itls")}
    with pytest.raises(ValueError, match="--save-detailed"):
        widgets.load_bench_result(summary_only)
    with pytest.raises(ValueError, match="one entry per request"):
        widgets.load_bench_result({**vllm_file(), "ttfts": [0.1]})


def test_workloads_text_lengths_and_token_id_refusal():
    tok = client_tokenizer("docstrings")
    reqs = make_requests(
        "random", 20, seed=1, rate=10.0, tokenizer=tok, random_input_len=40, random_output_len=8
    )
    assert all(
        30 <= r.prompt_len <= 40 and r.max_tokens == 8 and isinstance(r.prompt, str) for r in reqs
    )
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    docs = make_requests("docstrings", 5, tokenizer=tok)
    assert all(isinstance(r.prompt, str) and r.arrival == 0 for r in docs)
    with pytest.raises(ValueError, match="--token-id-prompts"):
        make_requests("mixed", 4, tokenizer=tok)
    assert all(
        isinstance(r.prompt, list)
        for r in make_requests("mixed", 4, tokenizer=tok, token_id_prompts=True)
    )


def test_max_concurrency_bounds_what_the_engine_runs_and_chat_works():
    with serving(docstrings_engine(max_num_seqs=8)) as (url, engine, _):
        r = asyncio.run(
            run(
                url,
                "docstrings",
                num_prompts=6,
                max_concurrency=2,
                max_tokens=6,
                ignore_eos=True,
                endpoint="/v1/chat/completions",
                quiet=True,
            )
        )
        wait_idle(engine)
    assert (
        r["completed"] == 6 and r["output_lens"] == [6] * 6 and r["endpoint_type"] == "openai-chat"
    )
    assert max(s.num_running + s.num_waiting for s in engine.timeline.steps) <= 2
