"""The figures show what the timeline recorded, and the panel's callbacks update them in place."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from helpers import engine as make_engine

from minilm import RequestSpec
from minilm.metrics import DRAFT_KINDS, itls, metrics_text, steps_df, summarize, ttfts
from minilm.timeline import RequestRecord, Timeline
from minilm.trace import save_trace
from widgets.compare import compare_figure, metrics_table, metrics_table_figure
from widgets.gantt import (
    HIGHLIGHT_NAME,
    KIND_LABELS,
    SEGMENT_KINDS,
    gantt_figure,
    request_order,
    set_gantt_step,
)
from widgets.kvmap import PALETTE, kv_cells, kvmap_figure
from widgets.latency import latency_cdfs_figure
from widgets.panel import SIMULATED, ControlPanel
from widgets.report import write_report
from widgets.steps import steps_figure

# prompt, max_tokens, arrival: mixed lengths and two late arrivals, so there is queueing
REQUESTS = [
    (30, 6, 0.0),
    (5, 9, 0.0),
    (17, 3, 0.0),
    (44, 5, 0.0),
    (9, 7, 0.0),
    (12, 4, 0.02),
    (26, 8, 0.03),
]


def small_run(policy: str, **knobs) -> Timeline:
    """A real (micro-model) run of REQUESTS; 3 sequences at a time, so some must wait."""
    knobs = {"max_num_seqs": 3, "max_model_len": 64, **knobs}
    e = make_engine(policy, **knobs)
    e.add_workload(
        [
            RequestSpec(f"r{i}", [(7 * i + j) % 90 + 1 for j in range(p)], m, a)
            for i, (p, m, a) in enumerate(REQUESTS)
        ],
        ignore_eos=True,
    )
    return e.run()


@pytest.fixture(scope="module")
def runs() -> dict[str, Timeline]:
    return {
        "static": small_run("static"),
        "continuous": small_run("continuous"),
        # 8 blocks of 8 slots for up to 3 sequences of up to 49 tokens: chunked must preempt
        "chunked": small_run("chunked", max_num_batched_tokens=16, block_size=8, num_blocks=8),
    }


def bars(fig, name: str, yaxis: str = "y") -> list[tuple[str, float, float, object]]:
    """(request, start ms, length ms, customdata) of every bar of the trace `name`."""
    t = next(t for t in fig.data if t.name == name and (t.yaxis or "y") == yaxis)
    return [
        (y, b, x, c)
        for y, b, x, c in zip(
            t.y, t.base, t.x, t.customdata if t.customdata is not None else [None] * len(t.y)
        )
    ]


def items(tl: Timeline, kind: str):
    return [(s, it) for s in tl.steps for it in s.items if it.kind == kind]


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_prefill_bars_are_the_recorded_prefill_items(runs, policy):
    tl = runs[policy]
    fig = gantt_figure(tl)
    drawn = Counter(
        (y, round(b, 9), round(x, 9))
        for name in ("prefill", "recompute")
        for y, b, x, _ in bars(fig, name)
    )
    recorded = Counter(
        (it.request_id, round(s.t_start * 1e3, 9), round(s.duration * 1e3, 9))
        for s, it in items(tl, "prefill")
    )
    assert drawn == recorded and sum(recorded.values()) == len(items(tl, "prefill"))
    # hover: (request id is y) first and last step, tokens, context length of the chunk, end ms
    for y, b, x, c in bars(fig, "prefill"):
        s = next(s for s in tl.steps if abs(s.t_start * 1e3 - b) < 1e-9)
        it = next(i for i in s.items if i.request_id == y and i.kind == "prefill")
        assert list(c) == pytest.approx(
            [s.step, s.step, it.num_tokens, it.context_len, s.t_end * 1e3]
        )


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_decode_bars_cover_each_contiguous_run_of_decode_steps(runs, policy):
    tl = runs[policy]
    fig = gantt_figure(tl)
    steps_of = {}
    for s, it in items(tl, "decode"):
        steps_of.setdefault(it.request_id, []).append(s.step)
    expected = []  # (request, start ms, end ms, tokens) of each stretch of consecutive steps
    for rid, steps in steps_of.items():
        runs_ = np.split(np.array(steps), np.where(np.diff(steps) != 1)[0] + 1)
        expected += [
            (
                rid,
                round(tl.steps[r[0]].t_start * 1e3, 6),
                round(tl.steps[r[-1]].t_end * 1e3, 6),
                len(r),
            )
            for r in runs_
        ]
    drawn = [(y, round(b, 6), round(b + x, 6), c[2]) for y, b, x, c in bars(fig, "decode")]
    assert sorted(drawn) == sorted(expected)
    assert sum(d[3] for d in drawn) == len(items(tl, "decode"))
    if policy != "chunked":  # nothing preempted: one bar per request
        assert len(drawn) == len(tl.requests)


def test_padding_only_for_static_and_equal_to_recorded_padding(runs):
    for policy, tl in runs.items():
        padding = bars(gantt_figure(tl), "padding")
        recorded = items(tl, "padding")
        assert (len(padding) > 0) == (policy == "static") == (len(recorded) > 0)
        assert sum(c[2] for *_, c in padding) == sum(it.num_tokens for _, it in recorded)


def test_queued_and_preempted_segments(runs):
    for policy, tl in runs.items():
        fig = gantt_figure(tl)
        queued = {y: (b, x) for y, b, x, _ in bars(fig, "queued")}
        waited = {r.request_id: r for r in tl.requests if r.t_scheduled > r.arrival}
        assert set(queued) == set(waited) and waited
        for rid, (b, x) in queued.items():
            assert (b, b + x) == pytest.approx(
                (waited[rid].arrival * 1e3, waited[rid].t_scheduled * 1e3)
            )
        preempted = bars(fig, "preempted")
        assert len(preempted) == sum(r.preemptions for r in tl.requests)
        assert (len(preempted) > 0) == (policy == "chunked")
        assert (len(bars(fig, "recompute")) > 0) == (policy == "chunked")


def test_gantt_axes_numeric_ms_and_request_0_on_top(runs):
    fig = gantt_figure(runs["continuous"])
    assert fig.layout.xaxis.type == "linear" and "ms" in fig.layout.xaxis.title.text
    assert fig.layout.yaxis.autorange == "reversed"
    assert list(fig.layout.yaxis.categoryarray) == [f"r{i}" for i in range(len(REQUESTS))]
    assert all(t.orientation == "h" for t in fig.data)


def test_step_highlight_marks_that_steps_batch(runs):
    tl = runs["continuous"]
    fig = gantt_figure(tl, step=2)
    for k in (2, 5):
        set_gantt_step(fig, tl, k)
        hl = next(t for t in fig.data if t.name == HIGHLIGHT_NAME)
        assert list(hl.y) == [it.request_id for it in tl.steps[k].items]
        assert fig.layout.shapes[0].x0 == pytest.approx(tl.steps[k].t_start * 1e3)
    with pytest.raises(ValueError, match="step=999"):
        set_gantt_step(fig, tl, 999)


@pytest.mark.parametrize("policy", ["static", "chunked"])
def test_kv_map_cells_equal_the_block_tables(runs, policy):
    tl = runs[policy]
    shown, owner, reserved, holders, cached = kv_cells(tl)
    assert holders.max() <= 1 and not cached.any()  # no prefix caching: nothing shared or kept
    order = request_order(tl)
    fig = kvmap_figure(tl)
    z = np.array(fig.data[0].z, dtype=float)
    assert shown == list(range(len(tl.steps)))
    for col, s in enumerate(tl.steps):
        expected = np.full(s.kv_blocks_total, -1)
        for rid, table in s.kv_blocks.items():
            expected[table] = order.index(rid)
        rows = owner.shape[0]  # blocks past the highest id ever used are left out
        assert (expected[rows:] == -1).all() and (owner[:, col] == expected[:rows]).all()
        assert (owner[:, col] < 0).sum() == rows - s.kv_blocks_used  # free blocks
        held = ~reserved[:, col] & (owner[:, col] >= 0)
        assert np.array_equal(z[held, col], owner[held, col] % len(PALETTE) + 0.5)
        assert np.isnan(z[~held, col]).all()
    # static batching reserves the padded length up front; paged chunked never holds an empty block
    assert reserved.any() == (policy == "static")


def test_kv_map_reserved_mode_shows_reserved_but_unused_blocks():
    tl = small_run("continuous", kv_mode="reserved")
    _, owner, reserved, _, _ = kv_cells(tl)
    first = tl.steps[0]
    # each request got blocks for prompt + max_tokens; after its prefill only the prompt's are filled
    expect = sum(
        len(t) - -(-it.context_len // 16)
        for rid, t in first.kv_blocks.items()
        for it in first.items
        if it.request_id == rid
    )
    assert reserved[:, 0].sum() == expect > 0


def test_prefix_caching_views_show_cached_shared_and_kept_blocks():
    """Two long shared prefixes, a tight cache: the Gantt stripes each request's cached
    prompt tokens; the KV map counts each block's holders and marks cached free blocks."""
    e = make_engine(
        "continuous",
        max_num_seqs=3,
        max_model_len=64,
        block_size=4,
        num_blocks=24,
        enable_prefix_caching=True,
    )
    prefixes = [[(3 * j) % 90 + 1 for j in range(20)], [(5 * j) % 90 + 2 for j in range(16)]]
    e.add_workload(
        [
            RequestSpec(f"r{i}", prefixes[i % 2] + [i + 1] * (i % 3 + 1), 4, 0.001 * i)
            for i in range(9)
        ],
        ignore_eos=True,
    )
    tl = e.run()
    cached = bars(gantt_figure(tl), "cached")
    recorded = items(tl, "cached")
    assert len(cached) == len(recorded) > 0
    assert sorted(c[2] for *_, c in cached) == sorted(it.num_tokens for _, it in recorded)
    shown, owner, reserved, holders, kept = kv_cells(tl)
    for col, s in enumerate(tl.steps):
        count = Counter(b for t in s.kv_blocks.values() for b in t)
        assert all(holders[b, col] == n for b, n in count.items())
        assert sorted(np.flatnonzero(kept[:, col])) == sorted(s.kv_cached_free)
    assert holders.max() > 1 and kept.any()
    kvmap_figure(tl)  # draws


def test_steps_figure_stacks_tokens_by_kind_against_the_budget(runs):
    tl = runs["static"]
    fig = steps_figure(tl)
    for kind in ("prefill", "decode", "padding"):
        trace = next(t for t in fig.data if t.name == f"{kind} tokens")
        assert list(trace.y) == [s.tokens(kind) for s in tl.steps]
    budget = next(t for t in fig.data if t.name == "token budget")
    assert len(budget.y) == 0  # static batching has no token budget
    budget = next(t for t in steps_figure(runs["chunked"]).data if t.name == "token budget")
    assert set(budget.y) == {runs["chunked"].meta["max_num_batched_tokens"]} == {16}
    step_time = next(t for t in fig.data if t.name == "step time")
    assert list(step_time.y) == pytest.approx([s.duration * 1e3 for s in tl.steps])
    blocks = next(t for t in fig.data if t.name == "KV blocks used")
    assert list(blocks.y) == [s.kv_blocks_used for s in tl.steps]


# ---- speculative decoding (lesson 10) -----------------------------------------------------------
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}


@pytest.fixture(scope="module")
def spec_run() -> Timeline:
    """The micro model with n-gram drafts over prompts that repeat themselves: some drafts are
    accepted, most rejected (its weights are random); 3 at a time, so r3 waits."""
    e = make_engine("continuous", max_num_seqs=3, max_model_len=128, speculative_config=NGRAM)
    prompts = [
        [5, 6, 7, 8] * 2 + [5, 6],
        list(range(10, 40)),
        [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
        [9] * 20,
    ]
    for i, p in enumerate(prompts):
        e.add_request(f"r{i}", p, max_tokens=24, ignore_eos=True)
    tl = e.run()
    assert 0 < summarize(tl)["spec_acceptance_rate"] < 1  # both kinds, or the tests prove little
    return tl


def test_gantt_draws_each_requests_accepted_and_rejected_drafts(spec_run):
    fig = gantt_figure(spec_run)
    for kind in DRAFT_KINDS:
        trace = next(t for t in fig.data if t.name == KIND_LABELS[kind])
        drawn = Counter()
        for rid, c in zip(trace.y, trace.customdata):
            drawn[rid] += c[2]
        recorded = Counter()
        for s in spec_run.steps:
            for it in s.items:
                recorded[it.request_id] += (
                    it.num_accepted if kind == "accepted" else it.num_draft - it.num_accepted
                )
        assert drawn == +recorded and sum(drawn.values()) > 0
        assert trace.showlegend and f"drafts {kind}" in trace.hovertemplate
    # the two share one stripe's thickness, in proportion to their tokens
    acc, rej = (next(t for t in fig.data if t.name == KIND_LABELS[k]) for k in DRAFT_KINDS)
    both = set(acc.y) & set(rej.y)
    for rid in both:
        a, r = list(acc.y).index(rid), list(rej.y).index(rid)
        assert acc.width[a] + rej.width[r] == pytest.approx(0.45)
        assert acc.width[a] / rej.width[r] == pytest.approx(
            acc.customdata[a][2] / rej.customdata[r][2]
        )
        assert rej.offset[r] == pytest.approx(acc.offset + acc.width[a])
    decode = next(t for t in fig.data if t.name == "decode")
    assert "drafts" in decode.hovertemplate


def test_steps_figure_stacks_drafts_apart_and_splits_the_model_time(spec_run):
    fig = steps_figure(spec_run)
    tokens = {t.name: list(t.y) for t in fig.data if t.name.endswith(" tokens")}
    for s, *counts in zip(spec_run.steps, *tokens.values()):
        assert sum(counts) == s.tokens()  # the composition adds up to what the step computed
    drafts = [sum(i.num_draft for i in s.items) for s in spec_run.steps]
    accepted = [sum(i.num_accepted for i in s.items) for s in spec_run.steps]
    assert tokens["draft accepted tokens"] == accepted
    assert tokens["draft rejected tokens"] == [d - a for d, a in zip(drafts, accepted)]
    assert tokens["decode tokens"] == [
        s.tokens("decode") - d for s, d in zip(spec_run.steps, drafts)
    ]
    verify, draft = (
        next(t for t in fig.data if t.name == f"of which {n}") for n in ("verify", "draft")
    )
    assert list(draft.y) == pytest.approx([s.draft_time * 1e3 for s in spec_run.steps])
    assert list(verify.y) == pytest.approx(
        [(s.model_time - s.draft_time) * 1e3 for s in spec_run.steps]
    )
    assert all(s.draft_time > 0 for s in spec_run.steps)
    df = steps_df(spec_run)
    assert (
        list(df["draft_tokens"]) == drafts
        and list(df["rejected_tokens"] + df["accepted_tokens"]) == drafts
    )


def test_views_of_a_run_that_did_not_speculate_show_no_drafts(runs):
    fig = steps_figure(runs["continuous"])
    assert not any(t.showlegend for t in fig.data if "draft" in t.name)
    gantt = gantt_figure(runs["continuous"])
    assert not any(t.showlegend or len(t.y) for t in gantt.data if t.name in KIND_LABELS.values())


def test_metrics_table_shows_acceptance_only_when_a_run_speculated(runs, spec_run, tmp_path):
    mixed = {"continuous": runs["continuous"], "ngram": spec_run}
    table = metrics_table(mixed)
    summary = summarize(spec_run)
    assert table.loc["ngram", "drafts accepted (%)"] == round(100 * summary["spec_acceptance_rate"])
    assert table.loc["ngram", "tokens per verify"] == round(
        summary["spec_mean_acceptance_length"], 2
    )
    assert pd.isna(table.loc["continuous", "drafts accepted (%)"])
    cells = metrics_table_figure(mixed).data[0].cells.values
    assert list(cells[-2]) == ["-", round(100 * summary["spec_acceptance_rate"])]
    assert "drafts accepted (%)" not in metrics_table({"continuous": runs["continuous"]})
    assert (
        "tokens per verify"
        in metrics_text({n: summarize(tl) for n, tl in mixed.items()}).splitlines()[0]
    )
    report = write_report(mixed, tmp_path / "r.html").read_text()
    assert "tokens per verify</th>" in report and "draft accepted" in report


def test_latency_cdfs_are_the_metrics_values(runs):
    fig = latency_cdfs_figure(runs)
    ttft = [t for t in fig.data if t.xaxis == "x"]
    itl = [t for t in fig.data if t.xaxis == "x2"]
    for trace, tl in zip(ttft, runs.values()):
        assert list(trace.x) == pytest.approx(sorted(v * 1e3 for v in ttfts(tl)))
        assert trace.y[-1] == 1.0
    for trace, tl in zip(itl, runs.values()):
        assert len(trace.x) == len(itls(tl))


def test_compare_stacks_gantts_on_one_time_axis(runs):
    fig = compare_figure(runs)
    assert (
        fig.layout.xaxis.matches == fig.layout.xaxis2.matches == "x3"
    )  # one time axis, at the bottom
    for row, (name, tl) in enumerate(runs.items(), start=1):
        yaxis = "y" if row == 1 else f"y{row}"
        drawn = bars(fig, "prefill", yaxis) + bars(fig, "recompute", yaxis)
        assert len(drawn) == len(items(tl, "prefill"))
        assert (
            f"{max(s.t_end for s in tl.steps) * 1e3:.1f} ms" in fig.layout.annotations[row - 1].text
        )
    legend = [t.name for t in fig.data if t.showlegend is not False]
    # chunked brings recompute, preempted; nothing is cached without prefix caching; "waiting" is a client's view;
    # nothing speculated: no drafts; one engine: no KV transfers
    assert sorted(legend) == sorted(
        set(SEGMENT_KINDS) - {"cached", "waiting", "transfer", *DRAFT_KINDS} | {HIGHLIGHT_NAME}
    )
    table = metrics_table(runs)
    assert list(table.index) == list(runs) and table.loc["static", "requests"] == len(REQUESTS)
    assert "drafts accepted (%)" not in table  # nothing speculated


def test_metrics_table_is_numeric_with_units_in_its_headers(runs):
    """One table for lessons, demo and CLI (minilm/metrics.py): numbers, not strings, so that
    it sorts and plots; latencies in ms, rounded as the CLI prints them."""
    table = metrics_table(runs)
    assert all(pd.api.types.is_numeric_dtype(t) for t in table.dtypes)
    m = summarize(runs["continuous"])
    assert table.loc["continuous", "TTFT p50 (ms)"] == round(m["ttft_p50"] * 1e3, 1)
    assert table.loc["continuous", "time (s)"] == round(m["wall_s"], 2)
    assert table.loc["static", "padding (%)"] == round(
        100 * summarize(runs["static"])["padding_fraction"]
    )
    assert (
        "TTFT p50 (ms)"
        in metrics_text({n: summarize(tl) for n, tl in runs.items()}).splitlines()[0]
    )


def test_save_trace_and_html_report(runs, tmp_path):
    path = save_trace(runs["chunked"], tmp_path / "t.json")
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(e["name"] == "prefill" for e in events) == len(items(runs["chunked"], "prefill"))
    with pytest.raises(ValueError, match="must end in .json"):
        save_trace(runs["chunked"], tmp_path / "t.txt")
    report = write_report(runs, tmp_path / "r.html").read_text()
    assert report.count("Plotly.newPlot") == 2 + len(runs) and "static" in report


def test_report_cli_writes_html_report(tmp_path):
    from widgets.report import main as report_main

    out = tmp_path / "report.html"
    assert (
        report_main(
            [
                "--simulate",
                "--model",
                "llama-3-8b",
                "--device",
                "h100",
                "--num-requests",
                "6",
                "--json",
                "--html",
                str(out),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert (
        "<html" in text and "plotly" in text.lower() and "chunked" in text and "simulated" in text
    )


# ---- the control panel ------------------------------------------------------------------


@pytest.fixture
def panel() -> ControlPanel:
    """A panel on the simulator (fast, reproducible): 10 requests, 3 sequences at a time."""
    return ControlPanel(
        engine_kind=SIMULATED,
        sim_model="llama-3-8b",
        sim_device="h100",
        num_requests=10,
        max_num_seqs=3,
    )


def prefill_bases(fig) -> list[float]:
    return list(next(t for t in fig.data if t.name == "prefill").base)


def test_run_button_updates_figures_in_place(panel):
    gantt, first = panel.gantt, panel.timeline
    assert (
        len(first.requests) == 10
        and panel.progress.value == 10
        and "10 requests" in panel.message.value
    )
    before = prefill_bases(gantt)
    panel.max_num_seqs.value = 6
    panel.policy.value = "chunked"
    panel.run_button.click()
    tl = panel.timeline
    assert panel.gantt is gantt and tl is not first and tl.meta["policy"] == "chunked"
    assert prefill_bases(gantt) != before
    assert sorted(prefill_bases(gantt)) == pytest.approx(
        sorted(s.t_start * 1e3 for s, _ in items(tl, "prefill"))
    )
    assert list(panel.steps.data[0].y) == [s.tokens("prefill") for s in tl.steps]
    assert panel.step_slider.max == len(tl.steps) - 1 == panel.play.max


def test_slider_moves_the_highlight(panel):
    tl = panel.timeline
    for k in (3, 7):
        panel.step_slider.value = k
        hl = next(t for t in panel.gantt.data if t.name == HIGHLIGHT_NAME)
        assert list(hl.y) == [it.request_id for it in tl.steps[k].items]
        assert panel.gantt.layout.shapes[0].x0 == pytest.approx(tl.steps[k].t_start * 1e3)
        assert (
            panel.kv.layout.shapes[0].x0 == k - 0.5 and panel.steps.layout.shapes[0].x0 == k - 0.5
        )


@pytest.mark.parametrize(
    "knob,value,says",
    [
        ("max_num_seqs", -1, "max_num_seqs=-1"),
        ("num_requests", 0, "num_requests=0"),
        ("rate", -2.0, "rate=-2.0"),
        ("max_model_len", 0, "max_model_len=0"),
        ("block_size", 0, "block_size=0"),
    ],
)
def test_bad_value_shows_a_message_and_keeps_the_figures(panel, knob, value, says):
    tl, before = panel.timeline, prefill_bases(panel.gantt)
    kv_before = np.array(panel.kv.data[0].z, dtype=float)
    getattr(panel, knob).value = value
    panel.run_button.click()
    assert says in panel.message.value and "InvalidValue" in panel.message.value
    assert "Traceback" not in panel.message.value
    assert panel.timeline is tl and prefill_bases(panel.gantt) == before
    assert np.array_equal(np.array(panel.kv.data[0].z, dtype=float), kv_before, equal_nan=True)


def test_save_trace_button(panel, tmp_path):
    panel.trace_path.value = str(tmp_path / "run.json")
    panel.save_button.click()
    assert "saved" in panel.message.value and (tmp_path / "run.json").exists()
    panel.trace_path.value = str(tmp_path / "run.txt")
    panel.save_button.click()
    assert "must end in .json" in panel.message.value


def test_unknown_initial_control_is_an_error():
    with pytest.raises(ValueError, match="max_batch"):
        ControlPanel(run_now=False, max_batch=3)
    with pytest.raises(ValueError, match="policy='fifo'"):
        ControlPanel(run_now=False, policy="fifo")


def test_measured_panel_run_of_the_tiny_model():
    """The default engine: the tiny model really runs on this machine (measured time)."""
    p = ControlPanel(num_requests=3, max_num_seqs=2, workload="uniform", max_model_len=300)
    assert p.timeline is not None, p.message.value
    assert p.timeline.meta["clock"] == "measured" and len(p.timeline.requests) == 3
    assert len(prefill_bases(p.gantt)) == len(items(p.timeline, "prefill"))


def test_sweep_figure_has_one_point_per_run():
    from minilm import make_workload
    from minilm.sim import simulated_engine
    from widgets.latency import sweep, sweep_figure

    specs = make_workload("mixed", 12, seed=1, vocab_size=1000, max_model_len=512)

    def run(**knobs) -> Timeline:
        e = simulated_engine("llama-3-8b", "h100", max_model_len=512, **knobs)
        e.add_workload(specs)
        return e.run()

    df = sweep(run, ["continuous", "chunked"], "max_num_seqs", [2, 8])
    fig = sweep_figure(df, "ttft_p99")
    assert [t.name for t in fig.data] == ["continuous", "chunked"]
    for trace in fig.data:
        part = df[df["policy"] == trace.name]
        assert list(trace.x) == list(part["output_tok_per_s"])
        assert list(trace.y) == pytest.approx(list(part["ttft_p99"] * 1e3))
        assert list(trace.text) == ["max_num_seqs=2", "max_num_seqs=8"]
    assert "simulated" in fig.layout.title.text
    with pytest.raises(ValueError, match="latency='ttft'"):
        sweep_figure(df, "ttft")


def test_fill_width_sizes_a_figure_widget_again_when_a_view_appears():
    """A FigureWidget's first draw happens before the page attaches it (Plotly's 700 px default);
    fill_width asks for autosize once a view exists (tests/test_browser.py checks the pixels)."""
    import plotly.graph_objects as go

    from widgets import fill_width

    fig = fill_width(go.FigureWidget())
    assert fig._view_count == 0 and fig.layout.autosize is None
    fig._view_count = 1  # what the frontend reports when it creates a view
    assert fig.layout.autosize is True


def test_gantt_rows_of_a_benchmark_client_read_short():
    """`bench-serve` names requests `bench-<8 hex>-<i>`: the rows read `<i>`, the hover keeps the id."""
    from widgets.gantt import row_labels

    assert row_labels(["bench-3f9c2a1e-0", "bench-3f9c2a1e-1", "bench-3f9c2a1e-17"]) == [
        "0",
        "1",
        "17",
    ]
    assert row_labels(["r0", "r1", "r10"]) == [
        "r0",
        "r1",
        "r10",
    ]  # no shared prefix up to a separator
    assert row_labels(["ada-1", "alan-2"]) == ["ada-1", "alan-2"] and row_labels(["solo"]) == [
        "solo"
    ]
    tl = Timeline(
        requests=[
            RequestRecord(
                request_id=f"bench-3f9c2a1e-{i}",
                arrival=0.1 * i,
                prompt_len=4,
                max_tokens=2,
                t_scheduled=None,
                t_first_token=0.1 * i + 0.05,
                token_times=[0.1 * i + 0.05, 0.1 * i + 0.1],
                t_finished=0.1 * i + 0.1,
                output_len=2,
                finish_reason="length",
                preemptions=0,
            )
            for i in range(3)
        ]
    )
    for fig, axis in ((gantt_figure(tl), "yaxis"), (compare_figure({"client": tl}), "yaxis")):
        assert list(fig.layout[axis].ticktext) == ["0", "1", "2"]
