"""The capacity search (minilm/sim/search.py): the cheapest deployment that meets a load, each
deployment's capacity by bisection (sim/capacity.py), run serially, in local processes or on
Ray with the same answer. Tiny workloads: seconds (Ray's own start is most of its test)."""

import pytest

from minilm.cli import main
from minilm.config import InvalidValue
from minilm.metrics import slo_attainment
from minilm.sim.search import (
    GPU_PRICES,
    Ask,
    Deployment,
    cheapest,
    deployment_space,
    layout_arg,
    measure,
    pareto,
    rank,
    search,
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
    pytest.importorskip("ray")
    space = [Deployment("a100"), Deployment("l4"), Deployment("a100", replicas=1, decode=1)]
    assert search(ASK, space, ray="local") == search(ASK, space, workers=2)


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
