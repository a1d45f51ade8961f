"""guidellm's reports in the lab's views (issue 32): a real guidellm run against the lab's server,
checked against what the server recorded, and a recorded sweep with failed requests.

tests/data/guidellm_sweep_with_failures.json is a real guidellm 0.8.1 report of `minilm serve
--model docstrings` (max_model_len 256), less its benchmarks' `metrics` summaries (the loader
reads the requests):

    guidellm run --backend kind=openai_http,target=URL --profile kind=concurrent,streams=2
        --override profile.streams 2,4 --constraint kind=max_duration,seconds=3
        --data kind=synthetic_text,prompt_tokens=200,prompt_tokens_stdev=60,prompt_tokens_min=100,
              prompt_tokens_max=300,output_tokens=48 --seed kind=static,value=1
        --tokenizer kind=hf_auto,model=minilm/checkpoints/docstrings --output kind=json,path=FILE

Prompts that left no room for 48 tokens in 256 got HTTP 400 (guidellm's `errored`), and the requests still running
when the 3 s were up were cancelled (its `incomplete`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from serving import docstrings_engine, serving, wait_idle

import widgets
from minilm import summarize
from minilm.client.bench_result import load_result, result_to_timeline, simulate_result
from minilm.client.guidellm_result import guidellm_command, strategy_name
from minilm.metrics import itls, ttfts
from minilm.model.loader import resolve_model_path
from minilm.timeline import ERROR, INCOMPLETE

SWEEP = Path(__file__).parent / "data" / "guidellm_sweep_with_failures.json"


def requests_of(benchmark: dict, status: str) -> list[dict]:
    return benchmark["requests"][status] or []


def test_a_guidellm_run_against_the_server_is_what_the_server_recorded(tmp_path):
    report_path = tmp_path / "benchmarks.json"
    n, prompt_tokens, output_tokens = 8, 16, 12
    with serving(docstrings_engine(max_num_seqs=8)) as (url, engine, _):
        command = guidellm_command(
            url,
            report_path,
            concurrency=4,
            num_requests=n,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            tokenizer=resolve_model_path("docstrings"),
        )
        done = subprocess.run(
            command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, timeout=300
        )
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        wait_idle(engine)
    report = json.loads(report_path.read_text())
    tl = widgets.load_bench_result(report_path)  # the format is read from the file
    assert tl.meta["benchmark"] == "concurrent@4" and not tl.steps
    assert len(tl.requests) == n and not any(r.failed for r in tl.requests)
    # the server answered each request under its own id, which guidellm kept as response_id
    server_id = {
        q["request_id"]: q["response_id"].removeprefix("chatcmpl-")
        for q in requests_of(report["benchmarks"][0], "successful")
    }
    served = {r.request_id: r for r in engine.timeline.requests}
    assert sorted(server_id.values()) == sorted(served)
    for r in tl.requests:
        s = served[server_id[r.request_id]]
        assert (
            (r.output_len, r.prompt_len)
            == (s.output_len, s.prompt_len)
            == (output_tokens, s.prompt_len)
        )
        assert len(r.token_times) == r.output_len and r.t_finished == r.token_times[-1]
        # the client's TTFT holds the server's, from arrival to first token, and the HTTP layer's
        assert r.t_first_token - r.arrival >= s.t_first_token - s.arrival - 1e-6
    # first tokens in the order the server wrote them (where they came more than a step or two apart)
    for a in tl.requests:
        for b in tl.requests:
            sa, sb = served[server_id[a.request_id]], served[server_id[b.request_id]]
            if sb.t_first_token - sa.t_first_token > 0.05:
                assert b.t_first_token > a.t_first_token, (a.request_id, b.request_id)
    widgets.gantt_figure(tl)
    widgets.latency_cdfs_figure({"guidellm": tl})
    sim = simulate_result(tl, "llama-3-8b", "h100", "continuous")
    assert sorted(q.output_len for q in sim.requests) == [output_tokens] * n


def test_a_sweep_picks_its_benchmark_by_index_or_strategy_name():
    report = json.loads(SWEEP.read_text())
    names = [strategy_name(b) for b in report["benchmarks"]]
    assert names == ["concurrent@2", "concurrent@4"]
    with pytest.raises(ValueError, match=r"2 benchmarks \(0: concurrent@2, 1: concurrent@4\)"):
        result_to_timeline(SWEEP)
    for bad in (2, -1, "concurrent@8"):
        with pytest.raises(ValueError, match=r"benchmark=.*the report has 0: concurrent@2"):
            result_to_timeline(SWEEP, benchmark=bad)
    by_name = widgets.load_bench_result(SWEEP, benchmark="concurrent@4")
    by_index = widgets.load_bench_result(report, benchmark=1)
    assert (
        by_name.requests == by_index.requests and by_name.meta["policy"] == "guidellm concurrent@4"
    )
    b = report["benchmarks"][1]
    assert len(by_name.requests) == sum(
        len(requests_of(b, s)) for s in b["requests"] if s != "total"
    )
    with pytest.raises(ValueError, match="guidellm report, not vLLM's result format"):
        load_result(SWEEP)
    with pytest.raises(ValueError, match="a vLLM result file holds one run"):
        result_to_timeline(
            {"input_lens": [], "output_lens": [], "ttfts": [], "itls": []}, benchmark=0
        )


@pytest.mark.parametrize("benchmark", [0, 1])
def test_failed_requests_of_a_guidellm_report_are_marked_and_left_out_of_the_latencies(benchmark):
    guidellm = pytest.importorskip("guidellm.schemas")
    report = json.loads(SWEEP.read_text())
    b = report["benchmarks"][benchmark]
    for status in ("successful", "errored", "incomplete"):  # the fixture is guidellm's own format
        for q in requests_of(b, status):
            guidellm.GenerativeRequestStats.model_validate(q)
    errored, incomplete = requests_of(b, "errored"), requests_of(b, "incomplete")
    successful = requests_of(b, "successful")
    assert errored and incomplete and successful
    tl = result_to_timeline(report, benchmark=benchmark)
    by_id = {r.request_id: r for r in tl.requests}
    for q in errored:  # refused with HTTP 400: prompt and max_tokens over the server's 256
        r = by_id[q["request_id"]]
        assert r.finish_reason == ERROR and r.output_len == 0 and not r.token_times
        assert (
            "400" in r.error and r.prompt_len + 48 > 256
        )  # (guidellm keeps no request_args for them)
    for q in incomplete:  # cancelled when the benchmark's time was up, after some tokens
        r = by_id[q["request_id"]]
        assert r.finish_reason == INCOMPLETE and "cancelled" in r.error
        assert r.output_len == len(r.token_times) == q["info"]["timings"]["token_iterations"] > 0
    m = summarize(tl)
    assert (m["failed"], m["incomplete"]) == (len(errored) + len(incomplete), len(incomplete))
    # the latencies are guidellm's own: its TTFT per request, its ITL (a request's mean gap, by token)
    assert sorted(np.array(ttfts(tl)) * 1e3) == pytest.approx(
        sorted(q["time_to_first_token_ms"] for q in successful)
    )
    weights = [q["output_tokens"] - 1 for q in successful]
    mean_itl = np.average([q["inter_token_latency_ms"] for q in successful], weights=weights)
    assert np.mean(itls(tl)) * 1e3 == pytest.approx(mean_itl)
    fig = widgets.gantt_figure(tl)
    assert len(next(t for t in fig.data if t.name == "token").x) == sum(
        r.output_len for r in tl.requests
    )
    sim = simulate_result(tl, "llama-3-8b", "h100", "continuous")
    assert sim.meta["replay_left_out"] == len(errored)
