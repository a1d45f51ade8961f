"""A benchmark run with failed requests through every view (issue 34): vLLM's result format marks
them (`errors`, `output_lens` 0, whatever tokens came before it broke), the timeline keeps them as
"error" / "incomplete" (minilm/timeline.py), the metrics count them and leave them out of every
latency, and no view, nor the simulator's replay, trips over them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from serving import docstrings_engine, serving, wait_idle

import widgets
from minilm.client.bench_result import (
    RequestOutput,
    make_result,
    print_result,
    replay_specs,
    simulate_result,
)
from minilm.client.bench_serve import BenchRequest, benchmark
from minilm.metrics import itls, metrics_text, summarize, ttfts
from minilm.timeline import ERROR, INCOMPLETE, Timeline
from widgets.states import states_figure

TRACEBACK = (
    'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
    "aiohttp.client_exceptions.ClientPayloadError: Response payload is not completed"
)


def vllm_run() -> dict:
    """What `vllm bench serve --save-result --save-detailed` writes for a run where three of five
    requests failed (vllm/benchmarks/serve.py, lib/endpoint_request_func.py): r2 got an HTTP 500
    (`errors` is the response's reason), r3 streamed two tokens and then its connection broke (the
    traceback; its ttft and itls stay, its generated text and output_len do not), r4 got an error
    status without a reason (`errors` ""). A broken request's slow first token and long gap would
    be the run's p99 if they were counted."""
    return {
        "backend": "vllm",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "duration": 3.0,
        "completed": 2,
        "failed": 3,
        "total_output_tokens": 5,
        "input_lens": [100, 200, 50, 80, 60],
        "output_lens": [3, 2, 0, 0, 0],
        "ttfts": [0.05, 0.08, 0.0, 0.5, 0.0],
        "itls": [[0.02, 0.03], [0.04], [], [0.9], []],
        "start_times": [1000.0, 1000.5, 1001.0, 1001.2, 1001.4],
        "generated_texts": ["a b c", "d e", "", "", ""],
        "errors": ["", "", "Internal Server Error", TRACEBACK, ""],
    }


@pytest.fixture
def tl() -> Timeline:
    return widgets.load_bench_result(vllm_run(), label="vLLM")


def test_the_issue_reproduction_prints_a_table(capsys):
    print(
        widgets.metrics_table(
            {
                "x": widgets.load_bench_result(
                    {
                        "input_lens": [4, 4],
                        "output_lens": [3, 3],
                        "ttfts": [0.1, 0.0],
                        "itls": [[0.01, 0.01], []],
                        "start_times": [0.0, 0.01],
                        "errors": ["", "HTTP 500"],
                    }
                )
            }
        )
    )
    out = capsys.readouterr().out
    assert "requests  failed" in out and "x           2       1" in out


def test_failed_rows_become_error_and_incomplete_requests(tl):
    r = tl.requests
    assert [q.finish_reason for q in r] == ["finished", "finished", ERROR, INCOMPLETE, ERROR]
    assert [q.failed for q in r] == [False, False, True, True, True]
    assert (
        r[2].error == "Internal Server Error" and r[3].error == TRACEBACK and r[4].error
    )  # never ""
    # no token came: nothing but where it was sent
    assert (
        r[2].token_times == []
        and r[2].t_first_token is None
        and r[2].t_finished == r[2].arrival == 1.0
    )
    # it broke after two tokens: they stay on its row, and it ends at the last
    assert r[3].token_times == pytest.approx([1.7, 2.6]) and r[3].t_finished == pytest.approx(2.6)
    assert r[3].output_len == 2 and r[2].output_len == r[4].output_len == 0
    again = Timeline.from_json(tl.to_json())  # a timeline file keeps them
    assert [(q.finish_reason, q.error) for q in again.requests] == [
        (q.finish_reason, q.error) for q in r
    ]


def test_metrics_count_failures_and_leave_them_out_of_every_latency(tl):
    m = summarize(tl)
    assert (m["requests"], m["failed"], m["incomplete"]) == (5, 3, 1)
    assert (
        m["failed"] == vllm_run()["failed"]
        and m["output_tokens"] == vllm_run()["total_output_tokens"]
    )
    assert sorted(ttfts(tl)) == pytest.approx([0.05, 0.08])  # not the broken one's 0.5 s
    assert max(itls(tl)) == pytest.approx(0.04) and m["itl_max"] == pytest.approx(
        0.04
    )  # not its 0.9 s gap
    assert m["ttft_p99"] == pytest.approx(np.percentile([0.05, 0.08], 99))
    assert m["e2e_p99"] == pytest.approx(np.percentile([0.10, 0.12], 99))
    assert m["prompt_tokens"] == 300  # vLLM's total_input_tokens: the completed requests'
    completed_only = Timeline(requests=[q for q in tl.requests if not q.failed], meta=tl.meta)
    for key in (
        "ttft_p50",
        "ttft_p99",
        "itl_p50",
        "itl_p99",
        "tpot_p99",
        "e2e_p50",
        "itl_worst_p99",
    ):
        assert m[key] == pytest.approx(summarize(completed_only)[key]), key
    assert summarize(tl, ttft_slo=10.0)["slo_attainment"] == pytest.approx(
        2 / 5
    )  # a failed one met nothing
    table = widgets.metrics_table({"vLLM": tl})
    assert table.loc["vLLM", "failed"] == 3 and table.loc["vLLM", "of which incomplete"] == 1
    assert table.loc["vLLM", "TTFT p99 (ms)"] == round(m["ttft_p99"] * 1e3, 1)
    assert "failed" in metrics_text({"vLLM": m}).splitlines()[0]
    assert "failed" not in widgets.metrics_table(
        {"ok": completed_only}
    )  # a column only where something failed


def test_the_gantt_marks_each_failure_and_names_its_error(tl):
    fig = widgets.gantt_figure(tl)
    failed = next(t for t in fig.data if t.name == "failed")
    assert list(failed.y) == ["r2", "r4"] and list(failed.x) == pytest.approx(
        [1000.0, 1400.0]
    )  # where they were sent
    assert failed.customdata[0][0] == "Internal Server Error"
    incomplete = next(t for t in fig.data if t.name == "incomplete")
    assert list(incomplete.y) == ["r3"] and list(incomplete.x) == pytest.approx(
        [2600.0]
    )  # its last token
    # a traceback shows as its last line, safe in the hover's HTML
    assert (
        incomplete.customdata[0][0]
        == "aiohttp.client_exceptions.ClientPayloadError: Response payload is not completed"
    )
    ticks = next(t for t in fig.data if t.name == "token")
    assert sorted(ticks.y).count("r3") == 2 and "r2" not in list(
        ticks.y
    )  # the tokens it got are drawn
    waiting = next(t for t in fig.data if t.name == "waiting")
    assert "r2" not in list(waiting.y) and "r3" in list(
        waiting.y
    )  # no bar: how long r2 waited is unknown
    assert "3 of 5 failed" in fig.layout.title.text
    escaped = widgets.load_bench_result(
        {**vllm_run(), "errors": ["", "", "<html>502</html>", TRACEBACK, ""]}
    )
    assert (
        next(t for t in widgets.gantt_figure(escaped).data if t.name == "failed").customdata[0][0]
        == "&lt;html&gt;502&lt;/html&gt;"
    )


def test_every_view_and_the_replay_take_a_run_with_failures(tl, tmp_path):
    sim = simulate_result(tl, "llama-3-8b", "h100", "continuous")
    # replayed: the completed ones, and the broken one up to the tokens it got (its load was real);
    # left out: the two that got no token (whether the server did any work for them is unknown)
    assert [(s.id, s.max_tokens) for s in replay_specs(tl)] == [("r0", 3), ("r1", 2), ("r3", 2)]
    assert (
        sorted(q.request_id for q in sim.requests) == ["r0", "r1", "r3"]
        and sim.meta["replay_left_out"] == 2
    )
    fig = widgets.compare_figure({"vLLM": tl, "simulated": sim, "again": tl})
    assert [t.name for t in fig.data if t.name in ("failed", "incomplete") and t.showlegend] == [
        "failed",
        "incomplete",
    ]
    assert "3 of 5 failed" in fig.layout.annotations[0].text
    cdf = widgets.latency_cdfs_figure({"vLLM": tl, "simulated": sim})
    ttft_line = next(t for t in cdf.data if t.legendgroup == "vLLM" and t.xaxis == "x")
    assert len(ttft_line.x) == 2 and "3 failed" in ttft_line.name
    widgets.steps_figure(tl)
    states_figure(tl)
    widgets.metrics_table_figure({"vLLM": tl, "simulated": sim})
    page = widgets.write_report(
        {"vLLM": tl, "simulated": sim}, tmp_path / "report.html"
    ).read_text()
    assert "of which incomplete" in page


def test_a_run_where_every_request_failed():
    r = vllm_run()
    everything_failed = {
        **r,
        "output_lens": [0] * 5,
        "errors": ["Internal Server Error"] * 5,
        "ttfts": [0.0] * 5,
        "itls": [[]] * 5,
    }
    tl = widgets.load_bench_result(everything_failed)
    m = summarize(tl)
    assert m["failed"] == 5 and np.isnan(m["ttft_p50"]) and m["output_tokens"] == 0
    widgets.gantt_figure(tl)
    widgets.compare_figure({"all failed": tl})
    widgets.latency_cdfs_figure({"all failed": tl})
    widgets.metrics_table({"all failed": tl})
    sim = simulate_result(tl)
    assert sim.requests == [] and sim.meta["replay_left_out"] == 5


def test_bench_serve_writes_a_broken_stream_as_vllm_does(capsys):
    """What send_request leaves after an exception broke the stream after two tokens, and after an
    error status: make_result writes them in vLLM's shape and the loader reads them back."""
    ok = RequestOutput("a", "x y z", True, 0.2, 3, 0.1, [0.05, 0.05], 10, "", 100.0, "length")
    broken = RequestOutput(
        "b", "p q", False, 0.3, 2, 0.1, [0.2], 10, "RemoteProtocolError: peer closed", 100.1
    )
    refused = RequestOutput("c", "", False, 0.0, 0, 0.0, [], 10, "HTTP 503: shutting down", 100.2)
    r = make_result([ok, broken, refused], 1.0, {})
    assert (r["completed"], r["failed"], r["output_lens"], r["total_output_tokens"]) == (
        1,
        2,
        [3, 0, 0],
        3,
    )
    assert r["errors"] == ["", "RemoteProtocolError: peer closed", "HTTP 503: shutting down"]
    assert r["mean_ttft_ms"] == pytest.approx(100.0)  # the broken one's ttft is not in it
    print_result(r)
    assert "Failed requests:" in capsys.readouterr().out
    tl = widgets.load_bench_result(r)
    assert [q.finish_reason for q in tl.requests] == ["length", INCOMPLETE, ERROR]


def test_a_real_server_refusing_a_request_loads_into_the_views(capsys):
    """The lab's own client against the lab's server: a request the server refuses (max_tokens 0:
    HTTP 400) is a failed row in vLLM's shape, and the run draws, counts and replays."""
    requests = [
        BenchRequest("def add(a, b):", 6, 4),
        BenchRequest("def sub(a, b):", 6, 0, 0.01),
        BenchRequest("def mul(a, b):", 6, 4, 0.02),
    ]
    with serving(docstrings_engine(max_num_seqs=4)) as (url, engine, _):
        r = asyncio.run(benchmark(url, requests, "docstrings", ignore_eos=True))
        wait_idle(engine)
    assert (r["completed"], r["failed"]) == (2, 1)
    assert r["errors"][1].startswith("HTTP 400") and "max_tokens" in r["errors"][1]
    assert (r["output_lens"][1], r["ttfts"][1], r["itls"][1]) == (0, 0.0, [])
    tl = widgets.load_bench_result(r)
    assert [q.finish_reason for q in tl.requests] == ["length", ERROR, "length"]
    assert summarize(tl)["failed"] == 1 and len(ttfts(tl)) == 2
    widgets.gantt_figure(tl)
    sim = simulate_result(tl)
    assert len(sim.requests) == 2 and sim.meta["replay_left_out"] == 1
    widgets.compare_figure({"client": tl, "simulated": sim})
    widgets.latency_cdfs_figure({"client": tl})
