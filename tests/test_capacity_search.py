"""The capacity search (minilm/sim/search.py): the cheapest deployment that meets a load, each
deployment's capacity by bisection (sim/capacity.py), run serially, in local processes or on
Ray with the same answer. Tiny workloads: seconds (Ray's own start is most of its test)."""

from dataclasses import replace

import pytest

from minilm.cli import main
from minilm.config import InvalidValue
from minilm.metrics import slo_attainment
from minilm.sim.search import (
    GPU_PRICES,
    Ask,
    Deployment,
    capacity_text,
    cheapest,
    decode_step_s,
    deployment_space,
    layout_arg,
    measure,
    pareto,
    peak_rate,
    rank,
    run_once,
    search,
    tpot_bound,
)
from widgets import capacity_figure

ASK = Ask("llama-3-8b", "mixed", load=20.0, ttft_slo=0.5, tpot_slo=0.02, num_requests=30)


def test_the_cheapest_of_a_tiny_space_is_found():
    # L4 cannot decode Llama-3-8B within 20 ms a token (16 GB of weights over 300 GB/s is
    # ~53 ms a step); one A100 can, and costs less than one H100 or two A100s
    space = [
        Deployment("h100"),
        Deployment("l4"),
        Deployment("a100", replicas=2),
        Deployment("a100"),
        Deployment("l4", replicas=4),
    ]
    caps = search(ASK, space, workers=1)
    by_device = {(c.deployment.device, c.deployment.replicas): c.goodput for c in caps}
    assert by_device[("l4", 1)] == by_device[("l4", 4)] == 0.0
    assert by_device[("a100", 1)] >= ASK.load
    rows = rank(ASK, caps)
    assert cheapest(rows)["deployment"] == Deployment("a100").label
    # the brute-force answer from the same capacities: the cheapest with capacity >= the load
    meeting = [c for c in caps if c.goodput >= ASK.load]
    best = min(meeting, key=lambda c: c.deployment.price_per_hour(GPU_PRICES))
    assert cheapest(rows)["deployment"] == best.deployment.label
    # meeting ones first, cheapest first; each one's cost is its GPUs at the assumed price
    flags = [r["meets"] for r in rows]
    assert flags == sorted(flags, reverse=True)
    prices = [r["usd_per_hour"] for r in rows if r["meets"]]
    assert prices == sorted(prices)
    assert all(r["usd_per_hour"] == r["gpus"] * GPU_PRICES[r["device"]] for r in rows)
    assert all(c.all_served for c in caps)
    # 30 requests on an H100 hold at any rate (one batch): doubling stops at the ceiling
    h100 = caps[0]
    assert h100.capped and h100.goodput == ASK.ceiling * ASK.load
    assert max(rate for rate, _ in h100.tried) == ASK.ceiling * ASK.load


def test_a_cheaper_price_changes_the_winner():
    space = [Deployment("h100"), Deployment("a100")]
    caps = search(ASK, space, workers=1)
    assert cheapest(rank(ASK, caps, GPU_PRICES | {"h100": 1.0}))["device"] == "h100"


def test_bisection_matches_a_brute_force_scan_of_the_rate():
    # 100 requests: enough that a run at the boundary queues (30 fit one batch at any rate)
    ask = Ask("llama-3-8b", "mixed", 20.0, 0.5, 0.02, num_requests=100, rel_tol=0.05)
    dep = Deployment("a100")
    cap = measure(ask, dep)
    assert 0 < cap.goodput < ask.ceiling * ask.load and not cap.capped

    def attainment(rate):
        fleet = dep.build(ask.model, ask.max_model_len)
        fleet.add_workload(ask.specs(rate, fleet.replicas[0].engine.model_config.vocab_size))
        return slo_attainment(fleet.run().timeline(), ask.ttft_slo, ask.tpot_slo)

    rates = [30.0 * 1.05**k for k in range(29)]  # 30 to ~117 req/s, 5% apart
    held = [attainment(r) >= ask.target for r in rates]
    assert held[0] and not held[-1] and held == sorted(held, reverse=True)  # one boundary
    first_fail = rates[held.index(False)]
    last_held = rates[held.index(False) - 1]
    # bisection answers a rate that held, below the first failing one, within its tolerance
    assert dict(cap.tried)[cap.goodput] >= ask.target
    assert cap.goodput < first_fail
    assert cap.goodput >= last_held / (1 + ask.rel_tol) ** 2


def test_local_processes_equal_serial():
    space = deployment_space(("a100", "l4"), (1,), ("1", "2", "1:1"), ("chunked",))
    serial = search(ASK, space, workers=1)
    assert search(ASK, space, workers=2) == serial


def test_ray_equals_local():
    ray = pytest.importorskip("ray")
    space = [Deployment("a100"), Deployment("l4"), Deployment("a100", replicas=1, decode=1)]
    try:
        on_ray = search(ASK, space, ray="local")
    except Exception as e:  # Ray gives its node 30 s to start (ray/_private/node.py, fixed)
        if "timed out during startup" not in str(e):  # a loaded 2-core machine can take longer
            raise
        ray.shutdown()
        on_ray = search(ASK, space, ray="local")  # one more start: the result is what is tested
    assert on_ray == search(ASK, space, workers=2)


def test_a_deployment_that_does_not_fit_is_reported_not_run():
    cap = measure(Ask("llama-3-70b", "mixed", 1.0, 0.5, 0.05, num_requests=10), Deployment("l4"))
    assert cap.error.startswith("141.1 GB of bfloat16 weights do not fit") and cap.tried == ()
    row = rank(ASK, [cap])[0]
    assert row["meets"] is False and row["goodput_req_per_s"] is None


def test_the_space_is_every_combination_once():
    space = deployment_space(
        ("h100",), (1, 2), ("1", "2", "1:1"), ("continuous", "chunked"), (64,), (2048, 4096)
    )
    # continuous has no token budget: 2 tp x 3 layouts x (1 + 2 budgets)
    assert len(space) == len(set(space)) == 18
    assert {d.max_num_batched_tokens for d in space if d.policy == "continuous"} == {None}
    assert deployment_space(("h100",))[0].max_num_batched_tokens == 8192  # vLLM's default there
    assert Deployment("h100", tp=2, replicas=1, decode=3).gpus == 8


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(device="tpu"), "device"),
        (dict(router="random"), "router"),
        (dict(policy="fcfs"), "policy"),
        (dict(tp=0), "tp"),
        (dict(decode=-1), "decode"),
    ],
)
def test_bad_deployments_are_refused(kwargs, name):
    with pytest.raises(InvalidValue, match=name):
        Deployment(**kwargs)


def test_bad_input_is_refused():
    for text in ("0", "1:0", "a:b", "1:2:3"):
        with pytest.raises(InvalidValue, match="layout"):
            layout_arg(text)
    with pytest.raises(InvalidValue, match="load"):
        Ask("llama-3-8b", "mixed", 0.0, 0.5, 0.02)
    with pytest.raises(InvalidValue, match="workload"):
        Ask("llama-3-8b", "nope", 1.0, 0.5, 0.02)
    with pytest.raises(InvalidValue, match="deployments"):
        search(ASK, [])


def test_cli_prints_the_ranked_table(capsys):
    argv = "capacity --load 20 --num-requests 20 --devices a100,l4 --tp 1 --layouts 1"
    assert main((argv + " --policies chunked --workers 1 --price l4=0.5").split()) == 0
    out = capsys.readouterr().out
    assert "prices ($/GPU-hour, ASSUMED): h200 3.80, h100 3.00, a100 1.80" in out
    assert "l4 0.50" in out
    assert "cheapest that meets 20.0 req/s: 1x a100 TP1 chunked" in out


def test_the_pareto_front_and_its_figure():
    space = deployment_space(("h100", "a100", "l4"), (1,), ("1", "2"), ("chunked",))
    rows = rank(ASK, search(ASK, space, workers=1))
    front = pareto(rows)
    # no row is at most as dear and holds more; the front rises with the cost
    for f in front:
        assert not any(
            r["usd_per_hour"] <= f["usd_per_hour"]
            and r["goodput_req_per_s"] > f["goodput_req_per_s"]
            for r in rows
        )
    assert [f["goodput_req_per_s"] for f in front] == sorted(f["goodput_req_per_s"] for f in front)
    assert front[0]["device"] == "l4"  # the cheapest is on it, whatever it holds
    fig = capacity_figure(rows, ASK.load)
    points = sum(len(t.x) for t in fig.data if t.mode == "markers")
    assert points == len(rows)
    assert list(fig.data[-1].x) == [f["usd_per_hour"] for f in front]


def test_bad_asks_and_prices_are_refused(capsys):
    with pytest.raises(InvalidValue, match="target"):
        Ask("llama-3-8b", "mixed", 1.0, 0.5, 0.02, target=1.5)
    with pytest.raises(InvalidValue, match="budget"):
        deployment_space(max_num_seqs=(256,), budgets=(128,))
    for bad in ("tpu=1.0", "h100=cheap", "h100=-1"):
        with pytest.raises(SystemExit):
            main(["capacity", "--load", "1", "--price", bad])
        assert "KIND=USD_PER_GPU_HOUR" in capsys.readouterr().err
    assert main("capacity --load 1 --layouts 0:1".split()) == 2  # layout_arg's InvalidValue
    assert "layout" in capsys.readouterr().err


# ---- the shortcuts: early verdicts, the cost model's start, the TPOT bound, alike deployments
OFF = dict(early_stop=False, from_estimate=False, skip_bound=False)
PLAIN = replace(ASK, **OFF)


@pytest.mark.parametrize("slos", [(0.5, 0.02), (0.2, None), (None, 0.015)])
def test_early_verdicts_equal_full_run_verdicts(slos):
    ask = replace(ASK, num_requests=120, ttft_slo=slos[0], tpot_slo=slos[1])
    full_ask = replace(ask, early_stop=False)
    stopped = 0
    for dep in (Deployment("a100"), Deployment("a100", replicas=2), Deployment("a100", decode=1)):
        for rate in (20.0, 45.0, 70.0, 100.0, 160.0):
            early, full = run_once(ask, dep, rate), run_once(full_ask, dep, rate)
            assert (early.attainment >= ask.target) == (full.attainment >= ask.target)
            assert early.served and full.served and not full.stopped
            if early.stopped:  # its bound is on the right side of the full run's attainment
                stopped += 1
                assert early.steps < full.steps and early.simulated <= full.simulated
                if early.attainment >= ask.target:
                    assert early.attainment <= full.attainment
                else:
                    assert early.attainment >= full.attainment
            else:
                assert early == full
    assert stopped >= 5  # the early stop does happen: > 10% missed, or 90% met, before the end


def test_the_tpot_bound_rules_out_only_what_cannot_hold():
    l4 = Deployment("l4")
    cap = measure(ASK, l4)
    assert cap.goodput == 0.0 and cap.tried == () and "TPOT limit 20 ms" in cap.bound
    assert measure(PLAIN, l4).goodput == 0.0  # the plain search finds the same by running it
    assert rank(ASK, [cap])[0]["bound"] == cap.bound and capacity_text(rank(ASK, [cap])[0]) == (
        "0 (bound)"
    )
    # the floor is a floor: no decode step of a run is shorter (L4 and A100, one and two GPUs)
    for dep in (l4, Deployment("a100", tp=2)):
        fleet = dep.build(ASK.model, ASK.max_model_len)
        floor = decode_step_s(fleet.replicas[0].engine, 1, 1)
        fleet.add_workload(ASK.specs(5.0, fleet.replicas[0].engine.model_config.vocab_size))
        steps = fleet.run().timeline().steps
        assert min(s.t_end - s.t_start for s in steps) >= floor * (1 - 1e-9)
    assert tpot_bound(fleet, ASK.specs(5.0, 128256), ASK) == ""  # an A100 can decode in time


def test_bisection_from_any_guess_lands_within_the_tolerance():
    # the brute-force boundary of test_bisection_matches_a_brute_force_scan_of_the_rate
    ask = Ask("llama-3-8b", "mixed", 20.0, 0.5, 0.02, num_requests=100, rel_tol=0.05)
    dep = Deployment("a100")
    fleet = dep.build(ask.model, ask.max_model_len)
    estimate = peak_rate(fleet, ask.specs(ask.load, 128256), ask.tpot_slo)
    plain = measure(replace(ask, from_estimate=False), dep)
    for guess in (None, 6.0, 60.0, 150.0):
        cap = measure(ask, dep, guess)
        assert cap.estimate == (estimate if guess is None else guess)
        assert dict(cap.tried)[cap.goodput] >= ask.target and not cap.capped
        bad = min(r for r, a in cap.tried if a < ask.target and r > cap.goodput)
        assert bad - cap.goodput <= ask.rel_tol * cap.goodput  # the same tolerance
        # and the plain bisection's answer is within that tolerance of it, either way
        assert abs(cap.goodput - plain.goodput) <= 2 * ask.rel_tol * max(cap.goodput, plain.goodput)
    assert len(measure(ask, dep, plain.goodput).tried) <= 3  # a guess on the mark: few runs


def test_deployments_that_simulate_alike_are_run_once():
    lor = Deployment("a100", replicas=1, decode=1, router="least_outstanding")
    rr = replace(lor, router="round_robin")
    assert rr.simulated_as == lor and Deployment("a100", replicas=2).simulated_as.replicas == 2
    # one prefill replica: the router has nothing to choose; the runs are the same, bit for bit
    runs = [one.build(ASK.model, ASK.max_model_len) for one in (lor, rr)]
    for fleet in runs:
        fleet.add_workload(ASK.specs(60.0, 128256))
    a, b = (f.run() for f in runs)
    assert a.requests == b.requests and a.transfers == b.transfers
    caps = search(ASK, [lor, rr], workers=1)
    assert caps[1].same_as == lor.label and caps[1].deployment == rr and caps[1].wall_s == 0.0
    assert replace(caps[1], deployment=lor, same_as="") == replace(caps[0], wall_s=0.0)


def test_the_shortcuts_keep_the_answer_with_fewer_requests():
    ask = replace(ASK, num_requests=100)
    space = [Deployment("a100"), Deployment("l4"), Deployment("a100", replicas=2)]
    space += [Deployment("h100", policy="continuous"), Deployment("a100", decode=1)]
    fast, plain = search(ask, space, workers=1), search(replace(ask, **OFF), space, workers=1)
    assert cheapest(rank(ask, fast))["deployment"] == cheapest(rank(ask, plain))["deployment"]
    for f, p in zip(fast, plain):
        assert f.goodput >= ask.load if p.goodput >= ask.load else f.goodput < ask.load
        assert abs(f.goodput - p.goodput) <= 2 * ask.rel_tol * max(f.goodput, p.goodput)
    # 100 requests a run: 74% of the plain search's requests (at 10,000: bench/capacity_search.py)
    assert sum(len(c.tried) for c in fast) < sum(len(c.tried) for c in plain)
    assert sum(c.simulated for c in fast) < 0.8 * sum(c.simulated for c in plain)
