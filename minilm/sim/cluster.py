"""Replicas behind a router, on one simulated clock (lesson 11; docs/DESIGN.md, "Fleet").

    cluster = simulated_cluster("llama-3-8b", "h100", replicas=4, router="least_outstanding")
    cluster.add_workload(make_workload("mixed", 1000, rate=40.0, vocab_size=128256))
    run = cluster.run()          # a FleetRun: a timeline per replica and the router's decisions

Each replica is a whole engine (its own scheduler, KV cache and SimulatedClock). The fleet
holds a queue of events in time order (an arrival; with disaggregation, a prompt's KV that
has finished crossing the link) and, at each turn, either handles the earliest event or
steps the replica whose next step starts first, whichever comes first (an event first on a
tie: a request that arrives as a step starts joins it, as on one engine). A request is
routed when it arrives, with the loads the router could see then (`Replica.load_at`): its
outstanding requests count those routed and not finished by then, its KV blocks are those in
use after its last step that had ended by then. One replica behind the router gives the same
timeline as the engine alone (tests/test_fleet.py).
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

from ..config import InvalidValue
from ..core.engine import Engine
from ..metrics import summarize
from ..router import ReplicaLoad, Route, RouterPolicy, make_router, route
from ..timeline import RequestRecord, StepRecord, Timeline
from ..workload import RequestSpec
from .executor import simulated_engine
from .verdict import EarlyVerdict


def next_step_time(engine: Engine) -> float:
    """When the engine's next step starts: now if a request can run, else its next arrival."""
    s = engine.scheduler
    if s.waiting or s.running:
        return engine.clock.now
    return max(engine.clock.now, s.next_arrival()) if s.pending else math.inf


class Replica:
    """One engine, and what a router can know of it at any time since the last routing."""

    def __init__(self, name: str, engine: Engine):
        self.name, self.engine = name, engine
        self.outstanding = 0  # routed, and not finished by the last time the router looked
        self.finishes: list[float] = []  # heap: finish times the router has not seen yet
        self.kv_seen: list[tuple[float, int]] = [(0.0, 0)]  # (time, blocks in use) after steps
        self.num_retired = 0  # of engine.timeline.requests, those the fleet has handled

    def load_at(self, t: float) -> ReplicaLoad:
        """The load as it stood at `t` (calls come in time order)."""
        while self.finishes and self.finishes[0] <= t:
            heapq.heappop(self.finishes)
            self.outstanding -= 1
        while len(self.kv_seen) > 1 and self.kv_seen[1][0] <= t:
            self.kv_seen.pop(0)
        c = self.engine.config
        return ReplicaLoad(self.outstanding, self.kv_seen[0][1], c.num_blocks, c.max_num_seqs)

    def accept(self, spec: RequestSpec, sampling: dict) -> None:
        self.engine.add_workload([spec], **sampling)
        self.outstanding += 1

    def step(self) -> tuple[StepRecord, list[RequestRecord]]:
        """One engine step; the requests it finished."""
        record = self.engine.step()
        self.kv_seen.append((record.t_end, self.engine.kv_manager.num_used_blocks))
        done = self.engine.timeline.requests[self.num_retired :]
        self.num_retired += len(done)
        for r in done:
            heapq.heappush(self.finishes, r.t_finished)
        return record, done

    def prefix_match(self, spec: RequestSpec) -> int:
        """Prompt tokens of `spec` this replica's prefix cache holds now (0 without caching)."""
        kv = self.engine.kv_manager
        blocks = kv.get_computed_blocks(self.engine.make_request(spec))
        return len(blocks) * kv.block_size


@dataclass
class FleetRun:
    """What a fleet did: each replica's own timeline, the router's decision for every request,
    and (disaggregated) every KV transfer. `requests` is each request as its client saw it."""

    timelines: list[Timeline]
    routes: list[Route]
    requests: list[RequestRecord]
    meta: dict = field(default_factory=dict)
    transfers: list = field(default_factory=list)  # disaggregation.KVTransfer

    @property
    def names(self) -> list[str]:
        return [tl.meta["replica"] for tl in self.timelines]

    def timeline(self) -> Timeline:
        """The fleet as one timeline (every replica's steps in time order): for its metrics."""
        steps = sorted((s for tl in self.timelines for s in tl.steps), key=lambda s: s.t_start)
        return Timeline(steps, list(self.requests), dict(self.meta))


def fleet_peak_kv_blocks(run: FleetRun) -> int:
    """The most KV blocks in use at once over the whole fleet (each replica's count holds until
    its next step changes it)."""
    events = sorted(
        (s.t_start, i, s.kv_blocks_used) for i, tl in enumerate(run.timelines) for s in tl.steps
    )
    now, peak = [0] * len(run.timelines), 0
    for _, i, used in events:
        now[i] = used
        peak = max(peak, sum(now))
    return peak


def fleet_summary(
    run: FleetRun, ttft_slo: float | None = None, tpot_slo: float | None = None
) -> dict:
    """`summarize` of the fleet as one deployment: its KV figures are the fleet's (blocks of all
    replicas); counts (requests, steps, tokens, preemptions) are its replicas' sums."""
    m = summarize(run.timeline(), ttft_slo, tpot_slo)
    m["kv_blocks_total"] = sum(tl.steps[0].kv_blocks_total for tl in run.timelines if tl.steps)
    m["peak_kv_blocks"] = fleet_peak_kv_blocks(run)
    return m


def replica_summaries(
    run: FleetRun, ttft_slo: float | None = None, tpot_slo: float | None = None
) -> dict[str, dict]:
    return {tl.meta["replica"]: summarize(tl, ttft_slo, tpot_slo) for tl in run.timelines}


class Fleet(ABC):
    """The event loop shared by replicas behind a router (`Cluster`) and prefill/decode
    pools (disaggregation.py): a heap of timed events and the replicas' next steps."""

    def __init__(self, replicas: list[Replica]):
        self.replicas = replicas
        self.events: list[tuple[float, int, object]] = []  # (time, order, event)
        self.routes: list[Route] = []
        self.ids: set[str] = set()  # every request id queued so far
        self.num_events = 0
        self.where: dict[str, Replica] = {}  # the replica each request was last routed to
        self.watch: EarlyVerdict | None = None  # set: the loop stops once it has a verdict

    def push(self, t: float, event) -> None:
        heapq.heappush(self.events, (t, self.num_events, event))
        self.num_events += 1

    def route_to(
        self,
        pool: list[Replica],
        policy: RouterPolicy,
        spec: RequestSpec,
        t: float,
        sampling: dict,
    ) -> Replica:
        """Route `spec` at time `t` among `pool` and hand it to the chosen replica."""
        decision = route(
            policy,
            spec.id,
            t,
            spec.prompt_ids,
            [r.load_at(t) for r in pool],
            lambda i, _prompt: pool[i].prefix_match(spec),
            [r.name for r in pool],
        )
        self.routes.append(decision)
        chosen = pool[decision.replica]
        chosen.accept(spec, sampling)
        self.where[spec.id] = chosen
        return chosen

    def loop(self) -> None:
        """Handle events and steps in time order until nothing is left (or, with a `watch`,
        until its verdict is known: nothing that happens from then on can change it)."""
        while True:
            t_event = self.events[0][0] if self.events else math.inf
            t_step, replica = min(
                ((next_step_time(r.engine), i) for i, r in enumerate(self.replicas)),
                default=(math.inf, 0),
            )
            if t_event == math.inf and t_step == math.inf:
                return
            if self.watch and self.watch.check(min(t_event, t_step), self.progress):
                return
            if t_event <= t_step:
                t, _, event = heapq.heappop(self.events)
                self.handle(t, event)
            else:
                r = self.replicas[replica]
                _, done = r.step()
                for record in done:
                    self.finished(r, record)

    @abstractmethod
    def handle(self, t: float, event) -> None:
        """Act on one timed event: an arrival to route (`Cluster`), a KV transfer (`Disaggregated`)."""

    @abstractmethod
    def finished(self, replica: Replica, record: RequestRecord) -> None:
        """A replica finished a request: its client's record is done (`served`), or (the
        prefill side of disaggregation) its KV goes on."""

    def served(self, record: RequestRecord) -> None:
        """A request is done, as its client sees it."""
        if self.watch:
            self.watch.served(record)

    @abstractmethod
    def progress(self, rid: str) -> tuple[float | None, int]:
        """A request's first token time (None: not yet) and its tokens so far, as its client
        has them now (what an EarlyVerdict reads)."""

    def check_workload(self, specs: list[RequestSpec], engines: list[Engine], **sampling):
        """Every request checked against each kind of engine before any is queued."""
        kinds: list[Engine] = []
        for e in engines:
            if not any(e.config == k.config for k in kinds):
                kinds.append(e)
        for s in specs:
            for e in kinds:
                e.check_request(e.make_request(s, **sampling))

    def check_ids(self, specs: list[RequestSpec]) -> None:
        """Request ids unique in the workload and new to the fleet; then they are taken."""
        dup = next((i for i, n in Counter(s.id for s in specs).items() if n > 1), None)
        if dup is not None:
            raise InvalidValue(
                "request_id", dup, "appears twice in the workload; ids must be unique"
            )
        used = next((s.id for s in specs if s.id in self.ids), None)
        if used is not None:
            raise InvalidValue("request_id", used, "already in use; request ids must be unique")


class Cluster(Fleet):
    """N engines behind a global router: `add_workload`, then `run` (as one Engine)."""

    def __init__(self, engines: list[Engine], router: str | RouterPolicy = "round_robin"):
        if not engines:
            raise InvalidValue("replicas", 0, "a cluster needs at least one engine")
        super().__init__([Replica(f"replica {i}", e) for i, e in enumerate(engines)])
        self.router = make_router(router)

    def add_workload(self, specs, **sampling) -> None:
        specs = list(specs)
        self.check_ids(specs)
        self.check_workload(specs, [r.engine for r in self.replicas], **sampling)
        self.ids.update(s.id for s in specs)
        for s in specs:
            self.push(s.arrival, (s, sampling))

    def handle(self, t: float, event: tuple[RequestSpec, dict]) -> None:
        spec, sampling = event
        self.route_to(self.replicas, self.router, spec, t, sampling)

    def finished(self, replica: Replica, record: RequestRecord) -> None:
        self.served(record)

    def progress(self, rid: str) -> tuple[float | None, int]:
        if rid not in self.where:
            return None, 0
        req = self.where[rid].engine.requests[rid]
        return req.t_first_token, len(req.token_times)

    def run(self) -> FleetRun:
        self.loop()
        timelines = [tag(r.engine.timeline, r.name) for r in self.replicas]
        meta = timelines[0].meta | {
            "replicas": len(timelines),
            "router": self.router.name,
            "policy": f"{timelines[0].meta['policy']} x{len(timelines)} {self.router.name}",
        }
        requests = [r for tl in timelines for r in tl.requests]
        return FleetRun(timelines, self.routes, requests, meta)


def tag(tl: Timeline, name: str) -> Timeline:
    """The replica's timeline, its meta naming the replica (the timeline itself is kept)."""
    tl.meta = tl.meta | {"replica": name}
    return tl


def simulated_cluster(
    model="llama-3-8b",
    device="h100",
    replicas: int = 2,
    router: str | RouterPolicy = "round_robin",
    **engine_kwargs,
) -> Cluster:
    """`replicas` alike simulated engines (simulated_engine's arguments) behind `router`."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidValue(
            "replicas", replicas, "must be an integer >= 1 (engines behind the router)"
        )
    router = make_router(router)  # a bad name fails before any engine is built
    return Cluster(
        [simulated_engine(model, device, **engine_kwargs) for _ in range(replicas)], router
    )
