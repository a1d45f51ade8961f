"""Replicas behind a router and prefill/decode disaggregation, simulated (minilm/router.py,
minilm/sim/cluster.py, minilm/sim/disaggregation.py): small workloads, a few seconds in all."""

import json
from collections import Counter

import pytest

from minilm.cli import main
from minilm.config import InvalidValue
from minilm.router import (
    ROUTERS,
    Choice,
    LeastKV,
    LeastOutstanding,
    PrefixAware,
    ReplicaLoad,
    RoundRobin,
    make_router,
    route,
)
from minilm.sim import simulated_engine
from minilm.sim.cluster import Cluster, Replica, fleet_summary, replica_summaries, simulated_cluster
from minilm.sim.disaggregation import (
    get_link,
    simulated_disaggregated,
    transfer_time,
)
from minilm.workload import RequestSpec, make_workload

VOCAB = 128256  # llama-3-8b's
KNOBS = dict(max_num_seqs=8, num_blocks=400)


def workload(name="mixed", n=24, rate=40.0, seed=1):
    return make_workload(name, n, rate=rate, vocab_size=VOCAB, seed=seed, max_model_len=2048)


# ---- the router on states built by hand ---------------------------------------------------
def loads(*pairs):
    return [ReplicaLoad(o, kv, 100, 16) for o, kv in pairs]


def test_each_policy_chooses_what_it_promises():
    state = loads((3, 10), (1, 50), (2, 5))
    assert LeastOutstanding().choose([1], state, None).replica == 1
    assert LeastKV().choose([1], state, None).replica == 2
    rr = RoundRobin()
    assert [rr.choose([1], state, None).replica for _ in range(4)] == [0, 1, 2, 0]
    ties = loads((2, 5), (2, 5))
    assert LeastOutstanding().choose([1], ties, None).replica == 0  # the lowest index on a tie


def test_prefix_aware_prefers_the_cache_within_its_balance():
    cached = {0: 0, 1: 32, 2: 16}  # prompt tokens each replica caches
    match = lambda i, prompt: cached[i]  # noqa: E731
    policy = PrefixAware(balance=2)
    # replica 1 has the longest prefix and 2 more outstanding than the lightest: within the bound
    choice = policy.choose(list(range(40)), loads((0, 0), (2, 0), (1, 0)), match)
    assert choice.replica == 1 and "32 of 40" in choice.reason
    # 3 more than the lightest: over the bound, the lightest gets it
    assert policy.choose([1] * 40, loads((0, 0), (3, 0), (1, 0)), match).replica == 0
    # no replica caches anything: the fewest outstanding
    nothing = PrefixAware().choose([1] * 40, loads((4, 0), (2, 0), (3, 0)), lambda i, p: 0)
    assert nothing.replica == 1 and "no replica caches" in nothing.reason


def test_router_errors_name_the_bad_value():
    with pytest.raises(InvalidValue, match="router='nearest'.*round_robin"):
        make_router("nearest")
    with pytest.raises(InvalidValue, match="balance"):
        PrefixAware(balance=-1)

    class OffTheEnd:
        name = "off_the_end"

        def choose(self, prompt_ids, loads, prefix_match):
            return Choice(len(loads), "one past the last")

    with pytest.raises(InvalidValue, match="off_the_end.*0..1"):
        route(OffTheEnd(), "r0", 0.0, [1], loads((0, 0), (0, 0)))
    assert set(ROUTERS) == {"round_robin", "least_outstanding", "least_kv", "prefix_aware"}


# ---- replicas behind a router ---------------------------------------------------------
def test_one_replica_is_the_engine_alone():
    specs = workload(n=30)
    engine = simulated_engine(policy="chunked", **KNOBS)
    engine.add_workload(specs)
    alone = engine.run()
    cluster = simulated_cluster(replicas=1, policy="chunked", **KNOBS)
    cluster.add_workload(specs)
    fleet = cluster.run().timelines[0]
    assert [(s.t_start, s.t_end, len(s.items)) for s in fleet.steps] == [
        (s.t_start, s.t_end, len(s.items)) for s in alone.steps
    ]
    assert [(r.request_id, r.token_times) for r in fleet.requests] == [
        (r.request_id, r.token_times) for r in alone.requests
    ]


@pytest.mark.parametrize("router", list(ROUTERS))
def test_no_request_is_lost_or_served_twice(router):
    specs = workload("shared-prefix", n=30, rate=80.0)
    cluster = simulated_cluster(
        replicas=3, router=router, policy="chunked", enable_prefix_caching=True, **KNOBS
    )
    cluster.add_workload(specs)
    run = cluster.run()
    served = Counter(r.request_id for tl in run.timelines for r in tl.requests)
    assert served == Counter(s.id for s in specs)  # each exactly once
    where = {r.request_id: tl.meta["replica"] for tl in run.timelines for r in tl.requests}
    assert [r.request_id for r in run.routes] == [
        s.id for s in sorted(specs, key=lambda s: s.arrival)
    ]
    assert all(where[r.request_id] == r.name for r in run.routes)  # served where it was routed
    assert all(
        r.output_len == s.max_tokens
        for r, s in zip(
            sorted(run.requests, key=lambda r: r.request_id), sorted(specs, key=lambda s: s.id)
        )
    )


def test_round_robin_spreads_and_prefix_aware_finds_the_cache():
    specs = workload("shared-prefix", n=40, rate=20.0)
    runs = {}
    for router in ("round_robin", "prefix_aware"):
        cluster = simulated_cluster(
            replicas=2, router=router, policy="chunked", enable_prefix_caching=True, **KNOBS
        )
        cluster.add_workload(specs)
        runs[router] = cluster.run()
    assert [len(tl.requests) for tl in runs["round_robin"].timelines] == [20, 20]
    hits = {k: fleet_summary(r)["prefix_cache_hit_rate"] for k, r in runs.items()}
    assert hits["prefix_aware"] > hits["round_robin"]
    assert any("prompt tokens cached" in r.reason for r in runs["prefix_aware"].routes)


def test_the_router_sees_the_load_as_it_was_at_arrival():
    replica = Replica("r", simulated_engine(policy="chunked", **KNOBS))
    replica.accept(RequestSpec("a", [1] * 100, 4, 0.0), {})
    record, done = replica.step()  # the prompt: blocks held from t_end on
    assert done == [] and replica.load_at(record.t_end / 2) == ReplicaLoad(1, 0, 400, 8)
    assert replica.load_at(record.t_end).kv_blocks_used == 7  # 101 tokens, 16 a block
    while not done:
        record, done = replica.step()
    assert replica.load_at(record.t_start).outstanding == 1  # it finishes at the step's end
    assert replica.load_at(record.t_end) == ReplicaLoad(0, 0, 400, 8)


def test_fleet_metrics_are_the_sums_of_its_replicas():
    cluster = simulated_cluster(replicas=3, router="least_kv", policy="chunked", **KNOBS)
    cluster.add_workload(workload(n=30))
    run = cluster.run()
    fleet, parts = fleet_summary(run), list(replica_summaries(run).values())
    for key in (
        "requests",
        "steps",
        "prompt_tokens",
        "output_tokens",
        "preemptions",
        "kv_blocks_total",
    ):
        assert fleet[key] == sum(p[key] for p in parts), key
    peaks = [p["peak_kv_blocks"] for p in parts]
    assert max(peaks) <= fleet["peak_kv_blocks"] <= sum(peaks)
    assert fleet["wall_s"] >= max(p["wall_s"] for p in parts)


def test_bad_cluster_input_fails_before_anything_runs():
    with pytest.raises(InvalidValue, match="replicas=0"):
        simulated_cluster(replicas=0)
    cluster = Cluster([simulated_engine(**KNOBS) for _ in range(2)])
    bad = [RequestSpec("a", [1, 2], 4, 0.0), RequestSpec("b", [VOCAB], 4, 0.0)]
    with pytest.raises(InvalidValue, match="'b'.*vocabulary"):
        cluster.add_workload(bad)
    with pytest.raises(InvalidValue, match="appears twice"):
        cluster.add_workload([bad[0], bad[0]])
    assert cluster.events == [] and cluster.run().requests == []


# ---- prefill/decode disaggregation --------------------------------------------------------
def disaggregated_run(link="nvlink", n=24, name="long-prompt", **kw):
    fleet = simulated_disaggregated(prefill=2, decode=2, link=link, **(KNOBS | kw))
    specs = workload(name, n=n, rate=60.0)
    fleet.add_workload(specs)
    return specs, fleet.run()


def test_disaggregated_requests_each_prefill_once_and_decode_once():
    specs, run = disaggregated_run()
    pools = {"prefill": Counter(), "decode": Counter()}
    for tl in run.timelines:
        pools[tl.meta["replica"].split()[0]].update(r.request_id for r in tl.requests)
    ids = Counter(s.id for s in specs)
    assert pools["prefill"] == ids and pools["decode"] == ids
    asked = {s.id: s for s in specs}
    for r in run.requests:
        assert r.output_len == asked[r.request_id].max_tokens == len(r.token_times)
        assert r.arrival == asked[r.request_id].arrival


def test_kv_is_never_sent_before_the_prompts_last_chunk():
    specs, run = disaggregated_run(max_num_batched_tokens=256)  # long prompts run in chunks
    last_chunk = {}  # request -> end of the step that computed its prompt's last token
    prompt_len = {s.id: len(s.prompt_ids) for s in specs}
    for tl in run.timelines[:2]:
        for s in tl.steps:
            for it in s.items:
                if it.kind == "prefill" and it.context_len == prompt_len[it.request_id]:
                    last_chunk[it.request_id] = s.t_end
    assert (
        max(
            Counter(
                it.request_id for tl in run.timelines[:2] for s in tl.steps for it in s.items
            ).values()
        )
        > 1
    )
    decoded = {r.request_id: r for tl in run.timelines[2:] for r in tl.requests}
    assert len(run.transfers) == len(specs)
    for x in run.transfers:
        assert last_chunk[x.request_id] <= x.t_ready <= x.t_start < x.t_end
        assert decoded[x.request_id].arrival == x.t_end <= decoded[x.request_id].t_scheduled
    by_source = {}
    for x in sorted(run.transfers, key=lambda x: x.t_start):  # one prompt at a time a link
        assert x.t_start >= by_source.get(x.source, 0.0)
        by_source[x.source] = x.t_end


def test_transfer_time_from_bytes_and_link():
    specs, run = disaggregated_run(link="infiniband")
    x = run.transfers[0]
    # llama-3-8b: 32 layers x K and V x 8 KV heads x 128 x 2 bytes = 131,072 bytes a token
    assert x.num_bytes == x.num_tokens * 131072
    assert x.t_end - x.t_start == pytest.approx(20e-6 + x.num_bytes / 50e9)
    fleet = simulated_disaggregated(prefill=1, decode=1, **KNOBS)
    nvlink = get_link("nvlink", fleet.cost)
    assert nvlink.bandwidth == 450e9  # H100: 900 GB/s both ways
    assert transfer_time(1000, fleet.cost, nvlink, 2) < transfer_time(1000, fleet.cost, nvlink, 1)
    with pytest.raises(InvalidValue, match="link='nvlink'.*one server"):
        simulated_disaggregated(prefill=4, decode=5)
    with pytest.raises(InvalidValue, match="link='pigeon'"):
        simulated_disaggregated(link="pigeon")


def test_a_received_prompt_costs_one_token_on_the_decode_side():
    specs, run = disaggregated_run(n=4)
    decode = run.timelines[2]
    cost = simulated_engine(**KNOBS).executor.cost
    first = decode.steps[0]
    (item,) = [it for it in first.items if it.kind == "prefill"][:1]
    assert first.duration == pytest.approx(
        cost.cost([(1, i.context_len) for i in first.items if i.kind in ("prefill", "decode")]).time
    )
    assert first.duration < cost.cost([(item.num_tokens, item.context_len)]).time


def test_disaggregated_fleet_metrics_add_up():
    specs, run = disaggregated_run(name="mixed")
    fleet, parts = fleet_summary(run), replica_summaries(run)
    assert fleet["requests"] == len(specs)
    assert fleet["output_tokens"] == sum(p["output_tokens"] for p in parts.values())
    prefill = [p for n, p in parts.items() if n.startswith("prefill")]
    assert sum(p["output_tokens"] for p in prefill) == len(specs)  # the first token of each


def test_fleet_figure_has_a_lane_group_per_replica_and_the_transfers():
    from widgets import fleet_figure, routes_frame

    specs, run = disaggregated_run(n=8, link="ethernet")
    fig = fleet_figure(run)
    assert len([k for k in fig.layout if k.startswith("yaxis")]) == 4
    transfers = [t for t in fig.data if t.name == "transfer"]
    assert sum(len(t.x) for t in transfers) == len(specs)
    frame = routes_frame(run)
    assert len(frame) == 2 * len(specs) and frame["why"].str.len().min() > 0


# ---- the command line --------------------------------------------------------------------
def compare(capsys, *flags):
    argv = ["compare", "--simulate", "--model", "llama-3-8b", "--device", "h100", "--json"]
    argv += ["--num-requests", "12", "--rate", "20", "--policies", "chunked", *flags]
    code = main(argv)
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_cli_replicas_and_router(capsys):
    code, (row,) = compare(capsys, "--replicas", "3", "--router", "least_outstanding")
    assert code == 0 and row["policy"] == "chunked x3 least_outstanding"
    assert row["requests"] == 12 == sum(r["requests"] for r in row["replicas"].values())
    code, (row,) = compare(capsys, "--disaggregate", "1:2", "--link", "infiniband")
    assert code == 0 and row["policy"].startswith("chunked 1P2D InfiniBand")
    assert list(row["replicas"]) == ["prefill 0", "decode 0", "decode 1"]


def test_cli_fleet_errors(capsys):
    assert main(["compare", "--replicas", "2", "--num-requests", "2"]) == 2
    assert "--replicas=2: only with --simulate" in capsys.readouterr().err
    for bad in (["--router", "nearest"], ["--disaggregate", "0:2"], ["--disaggregate", "two"]):
        with pytest.raises(SystemExit):
            main(["compare", "--simulate", *bad])


@pytest.mark.parametrize("fleet", ["cluster", "disaggregated"])
def test_a_fleet_runs_the_same_with_the_simulators_fast_path_off(fleet):
    """The fast path (sim/fastforward.py) is the step-by-step simulation, quicker: a fleet's every
    timeline is the same either way. A decode replica prices a received prompt its own way, so
    the shortcuts stand aside there (this caught them pricing it as a whole prompt)."""

    def run(fast: bool):
        specs = workload("long-prompt", n=24, rate=60.0)
        if fleet == "cluster":
            f = simulated_cluster(
                replicas=2, router="least_outstanding", **KNOBS, fast_forward=fast
            )
        else:
            f = simulated_disaggregated(prefill=1, decode=2, **KNOBS, fast_forward=fast)
        f.add_workload(specs)
        return [tl.to_dict() for tl in f.run().timelines]

    assert run(True) == run(False)


@pytest.mark.parametrize("fleet", ["cluster", "disaggregated"])
def test_a_fleet_runs_the_same_on_compact_prompts(fleet):
    """Compact prompts (numpy arrays, what the capacity search makes) are the same requests: a
    fleet's every timeline is the one its list prompts give. (The decode side's prompt once
    came from `prompt + output`, which on an array adds elementwise.)"""

    def run(compact: bool):
        specs = make_workload(
            "long-prompt", 24, rate=60.0, vocab_size=VOCAB, seed=1, max_model_len=2048,
            compact=compact,
        )  # fmt: skip
        if fleet == "cluster":
            f = simulated_cluster(replicas=2, router="prefix_aware", **KNOBS)
        else:
            f = simulated_disaggregated(prefill=1, decode=2, **KNOBS)
        f.add_workload(specs)
        return [tl.to_dict() for tl in f.run().timelines]

    assert run(True) == run(False)
