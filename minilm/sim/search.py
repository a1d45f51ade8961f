"""Capacity search: the cheapest deployment that serves a load within its SLOs (docs/FLEET.md).

    space = deployment_space(devices=("h100", "a100"), tps=(1, 2), layouts=("1", "2", "1:1"))
    ask = Ask("llama-3-8b", "mixed", load=20.0, ttft_slo=0.5, tpot_slo=0.02)
    caps = search(ask, space)            # local processes, all cores (ray=... for Ray)
    rows = rank(ask, caps)               # cheapest that meets the load first, $/h and $/M tokens

As Vidur-Search does (Agrawal et al., MLSys 2024), it finds each deployment's capacity by
bisection on the request rate, not on a fixed grid of rates (`bisect_rate`, capacity.py). A
deployment meets the load when its capacity is at least the load; the cheapest of those
wins. Three shortcuts make it cheaper (`Ask(early_stop=False, from_estimate=False,
skip_bound=False)` is the plain bisection): a run stops once its verdict is certain
(verdict.py: the same verdict as the whole run); a deployment whose fastest decode step is
over the TPOT limit is not run (`tpot_bound`: no rate could hold); and the bisection starts
from the cost model's steady-state estimate (`peak_rate`) or a sibling's capacity, not from
a quarter of the load (the same boundary, within the same tolerance). The tests check all
three. Deployments that simulate alike (`Deployment.simulated_as`) are run once.
A family of deployments (the same GPUs in the same layout) is one task; the tasks run in
local processes (concurrent.futures) or on Ray (`ray="local"` or a cluster's address), and
every run is simulated, so any of them gives the same answer, bit for bit. GPU prices are
ASSUMPTIONS (GPU_PRICES); pass your own.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..config import InvalidValue
from ..core.policies import POLICIES
from ..metrics import slo_attainment
from ..router import ROUTERS
from ..workload import LENGTH_PRESETS, PRESETS, make_workload
from .capacity import bisect_rate
from .cluster import Fleet, simulated_cluster
from .costmodel import DEVICE_SPECS
from .disaggregation import LINK_NAMES, Disaggregated, simulated_disaggregated
from .executor import vllm_default_budget
from .verdict import EarlyVerdict

# $/GPU-hour, ASSUMED: round figures of the order of on-demand cloud prices for one GPU of an
# 8-GPU server in 2025, not any one provider's quote (prices vary 2x between providers and
# fall every year); lesson 7b assumes the same. They rank deployments; pass your own
# (`prices=`, `--price h100=2.5`).
GPU_PRICES: dict[str, float] = {
    "h200": 3.80,
    "h100": 3.00,
    "a100": 1.80,
    "l40s": 1.00,
    "l4": 0.80,
    "rtx4090": 0.40,
}


@dataclass(frozen=True)
class Deployment:
    """GPUs and knobs of one deployment: `replicas` alike engines of `tp` GPUs behind
    `router`, or (decode > 0) `replicas` prefill engines and `decode` decode engines."""

    device: str = "h100"
    tp: int = 1
    replicas: int = 1  # colocated replicas, or the prefill pool's when decode > 0
    decode: int = 0  # 0: colocated; else the decode pool of a disaggregated deployment
    policy: str = "chunked"  # colocated replicas' and the prefill pool's
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None  # the token budget; None: vLLM's default (chunked)
    router: str = "least_outstanding"
    link: str = "nvlink"  # with decode > 0

    def __post_init__(self) -> None:
        checks = (
            ("device", self.device, DEVICE_SPECS),
            ("policy", self.policy, POLICIES),
            ("router", self.router, ROUTERS),
            ("link", self.link, LINK_NAMES),
        )
        for name, value, allowed in checks:
            if value not in allowed:
                raise InvalidValue(name, value, f"allowed: {', '.join(allowed)}")
        for name, low in (("tp", 1), ("replicas", 1), ("decode", 0), ("max_num_seqs", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidValue(name, value, f"must be an integer >= {low}")

    @property
    def simulated_as(self) -> Deployment:
        """The deployment whose simulation this one's is: one prefill replica has nothing to
        route among, so its router does not matter (one colocated replica's neither, but
        deployment_space gives those one router already)."""
        return replace(self, router="least_outstanding") if self.replicas == 1 else self

    @property
    def gpus(self) -> int:
        return (self.replicas + self.decode) * self.tp

    @property
    def label(self) -> str:
        layout = f"{self.replicas}P{self.decode}D" if self.decode else f"{self.replicas}x"
        budget = f" budget {self.max_num_batched_tokens}" if self.max_num_batched_tokens else ""
        link = f" {self.link}" if self.decode else ""
        return (
            f"{layout} {self.device} TP{self.tp} {self.policy} seqs {self.max_num_seqs}"
            f"{budget} {self.router}{link}"
        )

    def price_per_hour(self, prices: dict[str, float]) -> float:
        if self.device not in prices:
            raise InvalidValue("device", self.device, f"no price: priced are {', '.join(prices)}")
        return self.gpus * prices[self.device]

    def build(self, model: str, max_model_len: int) -> Fleet:
        """The simulated fleet (raises ValueError where the model does not fit)."""
        knobs = dict(
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )
        if self.decode:
            return simulated_disaggregated(
                model,
                self.device,
                self.replicas,
                self.decode,
                self.link,
                self.tp,
                router=self.router,
                policy=self.policy,
                **knobs,
            )
        return simulated_cluster(
            model, self.device, self.replicas, self.router, policy=self.policy, tp=self.tp, **knobs
        )


def layout_arg(text: str) -> tuple[int, int]:
    """ "4": four colocated replicas; "1:3": one prefill and three decode replicas."""
    try:
        parts = [int(x) for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) < 1:
        raise InvalidValue("layout", text, 'a number of replicas ("4") or P:D ("1:3"), each >= 1')
    return (parts[0], parts[1] if len(parts) == 2 else 0)


def deployment_space(
    devices: Sequence[str] = ("h100",),
    tps: Sequence[int] = (1,),
    layouts: Sequence[str] = ("1",),
    policies: Sequence[str] = ("chunked",),
    max_num_seqs: Sequence[int] = (128,),
    budgets: Sequence[int | None] = (None,),
    routers: Sequence[str] = ("least_outstanding",),
    link: str = "nvlink",
) -> list[Deployment]:
    """Every combination, once: a token budget only with chunked prefill (None: vLLM's default
    for the device), a router only where there is more than one replica to route to."""
    out: dict[Deployment, None] = {}
    for device, tp, layout, policy, seqs, budget, router in itertools.product(
        devices, tps, layouts, policies, max_num_seqs, budgets, routers
    ):
        replicas, decode = layout_arg(layout)
        if policy == "chunked":
            budget = budget or vllm_default_budget(device)
            if budget < seqs:
                raise InvalidValue(
                    "budget", budget, f"must be >= max_num_seqs={seqs}: a step has room for each"
                )
        else:
            budget = None
        if replicas + decode == 1:
            router = routers[0]
        d = Deployment(device, tp, replicas, decode, policy, seqs, budget, router, link)
        out[d] = None
    return list(out)


@dataclass(frozen=True)
class Ask:
    """What the search is asked: serve `load` requests/s of `workload` on `model` with at least
    `target` of the requests within both SLO limits. Each simulated run holds `num_requests`."""

    model: str
    workload: str
    load: float  # requests/s
    ttft_slo: float | None  # seconds
    tpot_slo: float | None  # seconds
    num_requests: int = 1000
    target: float = 0.9
    seed: int = 0
    max_model_len: int = 4096
    rel_tol: float = 0.05  # bisection stops when the bounds are this close
    low: float | None = None  # the lowest rate tried (None: load / 4); below it: capacity 0
    ceiling: float = 8.0  # the search stops at this many times the load: enough is enough
    # the three shortcuts (off: Vidur-Search's plain bisection, every run to its end)
    early_stop: bool = True  # stop a run once its verdict is certain (verdict.py): exact
    from_estimate: bool = True  # bisection from the cost model's estimate, not from `low`
    skip_bound: bool = True  # no run where the cost model proves no rate holds: exact

    def __post_init__(self) -> None:
        if self.workload not in PRESETS:
            raise InvalidValue("workload", self.workload, f"allowed: {', '.join(PRESETS)}")
        if not self.load > 0:
            raise InvalidValue("load", self.load, "must be > 0 requests/s")
        if isinstance(self.num_requests, bool) or self.num_requests < 1:
            raise InvalidValue("num_requests", self.num_requests, "must be an integer >= 1")
        if not 0 < self.target <= 1:
            raise InvalidValue("target", self.target, "must be a share in (0, 1]")
        if not (self.rel_tol > 0 and self.ceiling > 0):
            raise InvalidValue("rel_tol, ceiling", (self.rel_tol, self.ceiling), "must be > 0")

    def specs(self, rate: float, vocab_size: int):
        """The workload at `rate`, compact where the preset can be (docs/SIMULATOR.md)."""
        return make_workload(
            self.workload,
            self.num_requests,
            seed=self.seed,
            rate=rate,
            vocab_size=vocab_size,
            max_model_len=self.max_model_len,
            compact=self.workload in LENGTH_PRESETS,
        )


@dataclass(frozen=True)
class Capacity:
    """A deployment's capacity under the ask's SLOs: its DistServe goodput (req/s)."""

    deployment: Deployment
    goodput: float  # 0.0: not even the first rate tried held the SLOs
    tried: tuple[tuple[float, float], ...]  # (rate, SLO attainment), in the order tried
    output_tokens_per_request: float  # mean over the workload (what a token price counts)
    all_served: bool  # every run finished each of its requests exactly once
    error: str = ""  # why it could not be built (the weights do not fit): then no capacity
    capped: bool = False  # it held at the ceiling: the capacity is at least `goodput`
    bound: str = ""  # decided without a run: why no rate can hold (then goodput 0.0)
    same_as: str = ""  # not run: it simulates as this deployment does, whose answer it has
    estimate: float = 0.0  # the cost model's guess (req/s) the bisection started from
    simulated: int = 0  # requests that had arrived when each run stopped, over its runs
    wall_s: float = field(default=0.0, compare=False)  # the host's seconds: not part of the answer


def measure(ask: Ask, deployment: Deployment, guess: float | None = None) -> Capacity:
    """One deployment's capacity, by bisection on the rate; with `ask.from_estimate`, from
    `guess` (req/s), else from the cost model's estimate (`peak_rate`)."""
    start = time.perf_counter()
    try:
        fleet = deployment.build(ask.model, ask.max_model_len)
    except ValueError as e:  # does not fit, too many GPUs for one NVLink server
        return Capacity(deployment, 0.0, (), 0.0, True, str(e), wall_s=time.perf_counter() - start)
    vocab = fleet.replicas[0].engine.model_config.vocab_size
    specs = ask.specs(ask.load, vocab)  # lengths do not depend on the rate; arrivals do
    tokens = sum(s.max_tokens for s in specs) / len(specs)
    bound = tpot_bound(fleet, specs, ask) if ask.skip_bound else ""
    if bound:
        return Capacity(
            deployment, 0.0, (), tokens, True, bound=bound, wall_s=time.perf_counter() - start
        )
    runs: list[Run] = []

    def attainment_at(rate: float) -> float:
        runs.append(run_once(ask, deployment, rate))
        return runs[-1].attainment

    low = ask.low if ask.low is not None else ask.load / 4
    high = ask.ceiling * ask.load
    if not ask.from_estimate:
        guess = None
    elif guess is None:
        guess = peak_rate(fleet, specs, ask.tpot_slo)
    g = bisect_rate(attainment_at, ask.target, low, ask.rel_tol, high=high, guess=guess)
    return Capacity(
        deployment, g.rate, tuple(g.tried.items()), tokens, all(r.served for r in runs),
        capped=g.rate >= high, estimate=guess or 0.0, simulated=sum(r.simulated for r in runs),
        wall_s=time.perf_counter() - start,
    )  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One simulated run of a deployment at a rate, as the search sees it."""

    attainment: float  # SLO attainment; stopped early: the bound that decided it (verdict.py)
    simulated: int  # requests that had arrived when it stopped (all of them: it ran to its end)
    stopped: bool  # it stopped early, its verdict known
    steps: int  # engine steps, over the fleet's replicas
    served: bool  # every request finished once; stopped early: none twice, none not asked


def run_once(ask: Ask, deployment: Deployment, rate: float) -> Run:
    fleet = deployment.build(ask.model, ask.max_model_len)
    specs = ask.specs(rate, fleet.replicas[0].engine.model_config.vocab_size)
    fleet.add_workload(specs)
    if ask.early_stop:
        fleet.watch = EarlyVerdict(specs, ask.ttft_slo, ask.tpot_slo, ask.target)
    run = fleet.run()
    ids = [r.request_id for r in run.requests]
    steps = sum(len(tl.steps) for tl in run.timelines)
    if fleet.watch is not None and fleet.watch.stopped:
        served = len(set(ids)) == len(ids) and set(ids) <= {s.id for s in specs}
        return Run(fleet.watch.attainment, fleet.watch.arrived, True, steps, served)
    served = sorted(ids) == sorted(s.id for s in specs)
    attainment = slo_attainment(run.timeline(), ask.ttft_slo, ask.tpot_slo)
    return Run(attainment, len(specs), False, steps, served)


def decode_step_s(engine, batch: int, context: int) -> float:
    """The cost model's seconds for a decode-only step of `batch` sequences at `context` tokens."""
    n = batch * context
    return engine.executor.cost.cost_of_sums(batch, batch, n, n).time


def tpot_bound(fleet: Fleet, specs: list, ask: Ask) -> str:
    """Why no rate can hold the SLOs (empty: some may): every token after a request's first
    comes from a decode step of its own, and no decode step is shorter than one of a single
    sequence at one token of context; when that is over the TPOT limit, only requests of one
    output token can meet it. (The cost model only grows with batch and context; the test
    checks it against every step of a run.)"""
    if ask.tpot_slo is None:
        return ""
    decoders = fleet.decode if isinstance(fleet, Disaggregated) else fleet.replicas
    floor = min(decode_step_s(r.engine, 1, 1) for r in decoders)
    single = sum(s.max_tokens == 1 for s in specs)
    # a margin of a part in 10^9 over the clock's float sums of step times
    if floor <= ask.tpot_slo * (1 + 1e-9) or single / len(specs) >= ask.target:
        return ""
    return (
        f"no decode step is shorter than {floor * 1000:.1f} ms > TPOT limit "
        f"{ask.tpot_slo * 1000:.0f} ms; {single / len(specs):.0%} of requests have one token"
    )


def peak_rate(fleet: Fleet, specs: list, tpot_slo: float | None) -> float:
    """The cost model's estimate of the fleet's capacity (req/s) for the workload's mean
    request, in a steady state: each step decodes `seats` requests and takes in the prompts
    that arrived during it, each priced at what adding it to the step costs (`m`); a step
    lasts t = t_decode / (1 - rate * m), a request needs `out` steps, so rate = seats /
    (out * t_decode + seats * m). Seats: max_num_seqs or what the KV cache holds, fewer while
    t is over the TPOT limit. A guess to start the bisection from, not a bound: queueing and
    the spread of lengths make the true capacity lower or higher."""
    prompt = int(sum(len(s.prompt_ids) for s in specs) / len(specs))
    out = max(sum(s.max_tokens for s in specs) / len(specs) - 1, 1.0)  # after the first
    context = int(prompt + out / 2)

    def rate(engine, with_prompts: bool) -> float:
        c, cost = engine.config, engine.executor.cost
        seats = max(1, min(c.max_num_seqs, c.num_blocks * c.block_size // (context + prompt)))
        while True:
            n = seats * context
            t_decode = decode_step_s(engine, seats, context)
            m = 0.0
            if with_prompts:  # one more sequence of `prompt` new tokens in the step
                pairs = n + prompt * (prompt + 1) // 2
                m = cost.cost_of_sums(seats + 1, seats + prompt, n + prompt, pairs).time - t_decode
            r = seats / (out * t_decode + seats * m)
            if seats == 1 or not tpot_slo or t_decode / (1 - r * m) <= tpot_slo:
                return r
            seats = seats * 3 // 4

    def prefill_rate(engine) -> float:  # a prefill replica: steps of budget-many prompt tokens
        batch = max(1, (engine.config.max_num_batched_tokens or 2048) // prompt)
        return batch / engine.executor.cost.cost([(prompt, prompt)] * batch).time

    if isinstance(fleet, Disaggregated):
        p = sum(prefill_rate(r.engine) for r in fleet.prefill)
        return min(p, sum(rate(r.engine, False) for r in fleet.decode))
    return sum(rate(r.engine, True) for r in fleet.replicas)


def measure_family(task: tuple[Ask, list[Deployment]]) -> list[Capacity]:
    """Deployments of the same GPUs in the same layout, a knob apart, one after another (a
    task of its own: it pickles): each bisection starts from the capacity found just before,
    which a sibling's tends to be near, and takes fewer runs than from the cost model's."""
    ask, family = task
    caps: list[Capacity] = []
    for d in family:
        found = [c.goodput for c in caps if c.goodput > 0]
        caps.append(measure(ask, d, found[-1] if found else None))
    return caps


def search(
    ask: Ask, deployments: Sequence[Deployment], workers: int | None = None, ray: str | None = None
) -> list[Capacity]:
    """Every deployment's capacity, in the order given. `workers=1`: one after another here;
    else local processes (`workers`, default all cores); `ray="local"` starts a local Ray
    instance, `ray="ADDRESS"` joins a running cluster (`pip install minilm-lab[ray]`)."""
    if not deployments:
        raise InvalidValue("deployments", deployments, "the space is empty")
    # deployments that simulate alike are measured once (Deployment.simulated_as); a task is
    # a family: the same GPUs in the same layout (measure_family)
    families: dict[tuple, list[Deployment]] = {}
    for d in dict.fromkeys(d.simulated_as for d in deployments):
        families.setdefault((d.device, d.tp, d.replicas, d.decode), []).append(d)
    tasks = [(ask, f) for f in families.values()]
    workers = workers or os.cpu_count() or 1
    if ray is not None:
        done = on_ray(measure_family, tasks, ray)
    elif workers == 1:
        done = [measure_family(t) for t in tasks]
    else:
        with ProcessPoolExecutor(min(workers, len(tasks))) as pool:
            done = list(pool.map(measure_family, tasks))
    by = {c.deployment: c for caps in done for c in caps}
    return [
        by[d]
        if d == d.simulated_as
        else replace(by[d.simulated_as], deployment=d, same_as=d.simulated_as.label, wall_s=0.0)
        for d in deployments
    ]


def on_ray(fn: Callable, items: list, address: str) -> list:
    """`fn` over `items` as Ray tasks, results in order. The workers import this checkout's
    minilm, shipped to them (`py_modules`), not whatever copy their machine has."""
    try:
        import ray
    except ImportError as e:
        raise InvalidValue(
            "ray", address, "Ray is not installed: pip install 'minilm-lab[ray]'"
        ) from e
    started = not ray.is_initialized()
    if started:
        here = Path(__file__).resolve().parents[1]
        ray.init(
            address=None if address == "local" else address,
            runtime_env={"py_modules": [str(here)], "excludes": ["checkpoints/"]},
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,  # Ray's start-up lines are not the search's output
        )
    try:
        task = ray.remote(num_cpus=1)(fn)
        return ray.get([task.remote(x) for x in items])
    finally:
        if started:
            ray.shutdown()


# ---- the ranked table -----------------------------------------------------------------
def rank(ask: Ask, caps: Sequence[Capacity], prices: dict[str, float] | None = None) -> list[dict]:
    """One row a deployment: those that meet the load first, cheapest first (then the most
    capacity), then those that do not, most capacity first; unbuildable ones last."""
    prices = GPU_PRICES if prices is None else prices
    rows = []
    for c in caps:
        d, per_hour = c.deployment, c.deployment.price_per_hour(prices)
        meets = not c.error and c.goodput >= ask.load
        rows.append(
            {
                "deployment": d.label,
                **asdict(d),
                "gpus": d.gpus,
                "usd_per_hour": per_hour,
                "goodput_req_per_s": None if c.error else c.goodput,
                "capped": c.capped,  # the capacity is at least this (the search's ceiling)
                "meets": meets,
                "headroom": c.goodput / ask.load if not c.error else None,
                # a million output tokens' cost when it serves the load / runs full (capped:
                # at the ceiling, so at most that)
                "usd_per_mtok_at_load": per_hour / tokens_per_hour(ask.load, c) if meets else None,
                "usd_per_mtok_at_capacity": (
                    per_hour / tokens_per_hour(c.goodput, c) if c.goodput > 0 else None
                ),
                "runs": len(c.tried),
                "simulated_requests": c.simulated,
                "estimate_req_per_s": c.estimate,
                "bound": c.bound,
                "same_as": c.same_as,
                "lowest_rate": min((rate for rate, _ in c.tried), default=None),
                "all_served": c.all_served,
                "error": c.error,
                "wall_s": c.wall_s,
            }
        )
    rows.sort(
        key=lambda r: (
            bool(r["error"]),
            not r["meets"],
            r["usd_per_hour"] if r["meets"] else 0.0,
            -(r["goodput_req_per_s"] or 0.0),
        )
    )
    for i, r in enumerate(rows):
        r["rank"] = i + 1
    return rows


def tokens_per_hour(rate: float, c: Capacity) -> float:
    return rate * c.output_tokens_per_request * 3600 / 1e6  # millions of output tokens


def cheapest(rows: list[dict]) -> dict | None:
    """The cheapest deployment that meets the load (None: none does)."""
    return rows[0] if rows and rows[0]["meets"] else None


def pareto(rows: list[dict]) -> list[dict]:
    """The rows no other beats on both cost and capacity (cheapest first): what a budget buys."""
    built = [r for r in rows if not r["error"]]
    front, best = [], -1.0
    for r in sorted(built, key=lambda r: (r["usd_per_hour"], -r["goodput_req_per_s"])):
        if r["goodput_req_per_s"] > best:
            front.append(r)
            best = r["goodput_req_per_s"]
    return front


def table_text(rows: list[dict], limit: int | None = None) -> str:
    header = (
        "rank",
        "deployment",
        "GPUs",
        "$/h",
        "capacity (req/s)",
        "meets",
        "$/M out tok at load",
        "$/M out tok at capacity",
        "runs",
    )
    lines = [header]
    for r in rows[:limit]:
        lines.append(
            (
                str(r["rank"]),
                r["deployment"],
                str(r["gpus"]),
                f"{r['usd_per_hour']:.2f}",
                capacity_text(r),
                "yes" if r["meets"] else "no",
                money(r["usd_per_mtok_at_load"]),
                money(r["usd_per_mtok_at_capacity"]),
                str(r["runs"]),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            v.ljust(w) if i == 1 else v.rjust(w) for i, (v, w) in enumerate(zip(line, widths))
        )
        for line in lines
    )


def capacity_text(row: dict) -> str:
    if row["error"]:
        return "not built"  # the row's error says why (the weights do not fit, ...)
    if row["bound"]:
        return "0 (bound)"  # the cost model shows no rate can hold: the row's bound says why
    if row["goodput_req_per_s"] == 0:
        return f"< {row['lowest_rate']:.1f}"  # not even the lowest rate tried held
    return (">= " if row["capped"] else "") + f"{row['goodput_req_per_s']:.1f}"


def money(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


# ---- `python -m minilm capacity` --------------------------------------------------------
def csv(kind: Callable = str) -> Callable[[str], list]:
    return lambda text: [kind(x) for x in text.split(",") if x]


def price_arg(text: str) -> tuple[str, float]:
    kind, _, usd = text.partition("=")
    try:
        price = float(usd)
    except ValueError:
        price = -1.0
    if kind not in DEVICE_SPECS or not price >= 0:
        raise argparse.ArgumentTypeError(
            f"KIND=USD_PER_GPU_HOUR (e.g. h100=2.5; kinds: {', '.join(DEVICE_SPECS)}), not {text!r}"
        )
    return kind, price


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--workload", default="mixed", choices=list(PRESETS))
    p.add_argument("--load", type=float, required=True, help="requests/s to serve")
    p.add_argument("--ttft-slo", type=float, default=0.5, help="seconds")
    p.add_argument("--tpot-slo", type=float, default=0.02, help="seconds")
    p.add_argument("--target", type=float, default=0.9, help="share within both limits")
    p.add_argument("--num-requests", type=int, default=1000, help="requests in each run")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--rel-tol", type=float, default=0.05)
    p.add_argument("--devices", type=csv(), default=["h100", "a100"])
    p.add_argument("--tp", type=csv(int), default=[1, 2])
    p.add_argument(
        "--layouts", type=csv(), default=["1", "2", "4", "1:1"], help='"N" replicas or "P:D"'
    )
    p.add_argument("--policies", type=csv(), default=["continuous", "chunked"])
    p.add_argument("--max-num-seqs", type=csv(int), default=[128])
    p.add_argument("--budgets", type=csv(int), default=[None], help="chunked token budgets")
    p.add_argument("--routers", type=csv(), default=["least_outstanding"])
    p.add_argument("--link", default="nvlink", choices=list(LINK_NAMES))
    p.add_argument("--price", type=price_arg, action="append", default=[], help="KIND=USD/h")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: cores)")
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run on Ray: a local instance, or the cluster at ADDRESS",
    )
    p.add_argument("--top", type=int, default=None, help="print this many rows")


def cmd_capacity(args) -> list[dict]:
    ask = Ask(
        args.model, args.workload, args.load, args.ttft_slo, args.tpot_slo, args.num_requests,
        args.target, max_model_len=args.max_model_len, rel_tol=args.rel_tol,
    )  # fmt: skip
    space = deployment_space(
        args.devices, args.tp, args.layouts, args.policies, args.max_num_seqs, args.budgets,
        args.routers, args.link,
    )  # fmt: skip
    prices = GPU_PRICES | dict(args.price)
    for d in space:
        d.price_per_hour(prices)  # an unpriced device fails before anything runs
    start = time.perf_counter()
    caps = search(ask, space, args.workers, args.ray)
    rows = rank(ask, caps, prices)
    print(
        f"SIMULATED capacity of {len(space)} deployments of {ask.model} on {ask.workload}, "
        f"{ask.num_requests} requests a run: >= {ask.target:.0%} of requests within TTFT "
        f"{ask.ttft_slo} s and TPOT {ask.tpot_slo} s; load {ask.load} req/s"
    )
    print("prices ($/GPU-hour, ASSUMED): " + ", ".join(f"{k} {v:.2f}" for k, v in prices.items()))
    print(table_text(rows, args.top))
    best = cheapest(rows)
    print(
        f"cheapest that meets {ask.load} req/s: {best['deployment']} at ${best['usd_per_hour']:.2f}/h"
        if best
        else f"no deployment in the space meets {ask.load} req/s"
    )
    print(f"search wall time: {time.perf_counter() - start:.1f} s")
    return rows
