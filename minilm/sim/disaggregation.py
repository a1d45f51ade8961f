"""Prefill/decode disaggregation, simulated (DistServe, Splitwise; lesson 11, docs/FLEET.md).

    fleet = simulated_disaggregated("llama-3-8b", "h100", prefill=1, decode=3, link="nvlink")
    fleet.add_workload(specs)
    run = fleet.run()            # a FleetRun: prefill and decode timelines, every KV transfer

A prefill pool runs each prompt and samples its first token (the request's TTFT); then the
prompt's KV cache crosses the link to a decode replica, and the decode pool generates the rest.
On the prefill side a request is the prompt with max_tokens=1: it finishes, and its blocks are
freed, at the end of the step that computed its prompt's last chunk, and only then does its
transfer start. On the decode side it is the prompt and the first token, arriving when its KV
has arrived: the scheduler admits it when it has the blocks, and the decode clock prices that
admission as the one token it computes (`received_step_time`), not as a prompt.

A transfer takes `latency + bytes / (bandwidth * tp)`: the KV of the prompt (costmodel's
kv_bytes_per_token), sent by the prefill replica's `tp` GPUs in parallel, each over its own
link. A prefill replica sends one prompt at a time (a queue on its link). Simplifications,
said here so they are not mistaken for the model's findings: the prefill side frees the blocks
at once (a real one holds them until the transfer ends); the decode side allocates them on
arrival (a real one reserves them before it pulls); the receiving end is never the bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import InvalidValue
from ..core.engine import Engine
from ..request import token_list
from ..router import RouterPolicy, make_router
from ..timeline import RequestRecord
from ..workload import RequestSpec
from .cluster import Fleet, FleetRun, Replica, tag
from .costmodel import GB, CostModel
from .executor import simulated_engine

GPUS_PER_SERVER = 8  # an HGX/DGX server: NVLink reaches the GPUs of one server only


@dataclass(frozen=True)
class Link:
    """How a prompt's KV reaches the decode side, per GPU and one way."""

    name: str
    bandwidth: float  # bytes/s
    latency: float  # seconds a transfer costs besides its bytes (an ASSUMPTION for every link)
    source: str


# Bandwidths from datasheets; latencies are assumptions (a transfer's setup and its first
# byte: microseconds for NVLink, tens of them for an RDMA network with its software).
NETWORK_LINKS = {
    "infiniband": Link(
        "InfiniBand NDR 400 Gb/s",
        50 * GB,
        20e-6,
        "NVIDIA ConnectX-7 datasheet: 400 Gb/s = 50 GB/s a port; one NIC a GPU as in a DGX H100",
    ),
    "ethernet": Link(
        "Ethernet 100 Gb/s", 12.5 * GB, 50e-6, "100 Gb/s = 12.5 GB/s, one NIC a GPU (assumption)"
    ),
}
LINK_NAMES = ("nvlink", *NETWORK_LINKS)


def get_link(link: str | Link, cost: CostModel) -> Link:
    """A link by name: nvlink (inside one server: the device's interconnect from its spec,
    which datasheets quote for both directions, halved), infiniband or ethernet; or one given."""
    if isinstance(link, Link):
        return link
    if link == "nvlink":
        dev = cost.device
        return Link(
            f"{dev.name} NVLink",
            dev.interconnect_bw / 2,
            5e-6,
            f"{dev.source}: {dev.interconnect_bw / GB:.0f} GB/s both ways, half one way",
        )
    if link not in NETWORK_LINKS:
        raise InvalidValue("link", link, f"allowed: {', '.join(LINK_NAMES)} (or a Link)")
    return NETWORK_LINKS[link]


def transfer_time(num_tokens: int, cost: CostModel, link: Link, tp: int) -> float:
    """Seconds to send `num_tokens` tokens of KV from a replica of `tp` GPUs."""
    return link.latency + num_tokens * cost.kv_bytes_per_token / (link.bandwidth * tp)


@dataclass(frozen=True)
class KVTransfer:
    request_id: str
    source: int  # prefill replica (index into the prefill pool)
    dest: int  # decode replica (index into the decode pool)
    t_ready: float  # the end of the step that computed the prompt's last chunk
    t_start: float  # the link was free (a replica sends one prompt at a time)
    t_end: float  # the KV has arrived: the decode side may admit it
    num_tokens: int
    num_bytes: int


def received_step_time(cost: CostModel, plan) -> float:
    """A decode replica's step: a prompt whose KV came over the link computes only its last token
    (the first output, sampled on the prefill side, is fed in as a decode); a prompt recomputed
    after a preemption here is a prompt again."""
    shape = []
    for w in plan.work:
        if (
            w.kind == "prefill" and w.new is not None
        ):  # first scheduled here: its KV came over the link
            if w.samples:
                shape.append((1, w.end))
        else:
            shape.append((w.num_new_tokens + w.num_padding, w.end))
    return cost.cost(shape).time


def receive_kv(engine: Engine) -> Engine:
    """Make a simulated engine a decode replica: its clock prices a received prompt by
    `received_step_time`, not as a prompt it computes."""
    cost = engine.executor.cost
    engine.clock.step_time = lambda plan: received_step_time(cost, plan)
    return engine


class Disaggregated(Fleet):
    """A prefill pool and a decode pool on one simulated clock, a router in front of each."""

    def __init__(
        self,
        prefill: list[Engine],
        decode: list[Engine],
        link: str | Link = "nvlink",
        router: str | RouterPolicy = "least_outstanding",
        decode_router: str | RouterPolicy = "least_kv",
    ):
        if not prefill or not decode:
            raise InvalidValue(
                "pools",
                (len(prefill), len(decode)),
                "need at least one prefill and one decode engine",
            )
        self.prefill = [Replica(f"prefill {i}", e) for i, e in enumerate(prefill)]
        self.decode = [Replica(f"decode {i}", e) for i, e in enumerate(decode)]
        super().__init__(self.prefill + self.decode)
        self.router, self.decode_router = make_router(router), make_router(decode_router)
        self.cost: CostModel = prefill[0].executor.cost
        self.tp = min(
            e.executor.cost.tp for e in prefill + decode
        )  # parallel links a transfer uses
        self.link = get_link(link, self.cost)
        self.link_free = [0.0] * len(prefill)  # when each prefill replica's link is free again
        self.transfers: list[KVTransfer] = []
        self.asked: dict[str, RequestSpec] = {}  # each request as its client sent it
        self.sampling_of: dict[str, dict] = {}
        self.first: dict[str, tuple[int, RequestRecord]] = {}  # its prefill side's record

    def add_workload(self, specs, **sampling) -> None:
        specs = list(specs)
        self.check_ids(specs)
        first = [prefill_spec(s) for s in specs]
        self.check_workload(first, [r.engine for r in self.prefill], **sampling)
        encode = self.prefill[0].engine.make_request  # a text prompt's ids
        tails = [
            decode_spec(s, token_list(encode(f).prompt_ids) + [0], s.arrival)
            for s, f in zip(specs, first)
            if s.max_tokens > 1
        ]
        self.check_workload(tails, [r.engine for r in self.decode], **sampling)
        self.ids.update(s.id for s in specs)
        for s in specs:
            self.asked[s.id], self.sampling_of[s.id] = s, sampling
            self.push(s.arrival, ("arrive", s))

    def handle(self, t: float, event: tuple) -> None:
        kind, rid = event[0], event[1].id
        if kind == "arrive":
            self.route_to(
                self.prefill, self.router, prefill_spec(event[1]), t, self.sampling_of[rid]
            )
            return
        # "send": the prompt's last chunk has run; its KV waits for the link, crosses it, and
        # arrives at the decode replica the decode router picks now
        source = self.first[rid][0]
        req = self.prefill[source].engine.requests[rid]
        n = req.prompt_len  # the first output token is computed on the decode side
        start = max(t, self.link_free[source])
        end = self.link_free[source] = start + transfer_time(n, self.cost, self.link, self.tp)
        tail = decode_spec(self.asked[rid], token_list(req.prompt_ids) + req.output_ids, end)
        chosen = self.route_to(self.decode, self.decode_router, tail, t, self.sampling_of[rid])
        self.transfers.append(
            KVTransfer(
                rid,
                source,
                self.decode.index(chosen),
                t,
                start,
                end,
                n,
                n * self.cost.kv_bytes_per_token,
            )
        )

    def finished(self, replica: Replica, record: RequestRecord) -> None:
        rid = record.request_id
        if replica not in self.prefill:
            self.served(joined(self.asked[rid], self.first[rid][1], record))
            return
        self.first[rid] = (self.prefill.index(replica), record)
        if self.asked[rid].max_tokens > 1:
            self.push(record.t_finished, ("send", self.asked[rid]))
        else:
            self.served(record)

    def progress(self, rid: str) -> tuple[float | None, int]:
        if rid not in self.first:  # the prefill side finishes a request with its first token
            return None, 0
        decoding = self.where[rid]
        rest = decoding.engine.requests[rid].token_times if decoding in self.decode else []
        return self.first[rid][1].t_first_token, 1 + len(rest)

    def run(self) -> FleetRun:
        self.loop()
        timelines = [tag(r.engine.timeline, r.name) for r in self.replicas]
        decoded = {r.request_id: r for d in self.decode for r in d.engine.timeline.requests}
        requests = [
            joined(self.asked[rid], first, decoded.get(rid))
            for rid, (_, first) in self.first.items()
        ]
        p, d = len(self.prefill), len(self.decode)
        meta = timelines[0].meta | {
            "replicas": p + d,
            "router": self.router.name,
            "policy": f"{timelines[0].meta['policy']} {p}P{d}D {self.link.name}",
            "link": self.link.name,
            "link_bandwidth": self.link.bandwidth,
            "link_latency": self.link.latency,
        }
        return FleetRun(timelines, self.routes, requests, meta, self.transfers)


def prefill_spec(spec: RequestSpec) -> RequestSpec:
    return RequestSpec(spec.id, spec.prompt_ids, 1, spec.arrival, spec.prompt)


def decode_spec(spec: RequestSpec, prompt_and_first: list[int], arrival: float) -> RequestSpec:
    """The decode side's request: the prompt and the first token, the rest of max_tokens."""
    return RequestSpec(spec.id, list(prompt_and_first), spec.max_tokens - 1, arrival)


def joined(asked: RequestSpec, first: RequestRecord, rest: RequestRecord | None) -> RequestRecord:
    """The request as its client saw it: the first token from the prefill side, the rest from
    the decode side."""
    if rest is None:  # max_tokens=1: done on the prefill side
        return first
    return RequestRecord(
        request_id=first.request_id,
        arrival=asked.arrival,
        prompt_len=first.prompt_len,
        max_tokens=asked.max_tokens,
        t_scheduled=first.t_scheduled,
        t_first_token=first.t_first_token,
        token_times=first.token_times + rest.token_times,
        t_finished=rest.t_finished,
        output_len=first.output_len + rest.output_len,
        finish_reason=rest.finish_reason,
        preemptions=first.preemptions + rest.preemptions,
        output_ids=first.output_ids + rest.output_ids,
        num_cached_tokens=first.num_cached_tokens,
    )


def simulated_disaggregated(
    model="llama-3-8b",
    device="h100",
    prefill: int = 1,
    decode: int = 1,
    link: str | Link = "nvlink",
    tp: int = 1,
    decode_tp: int | None = None,
    router: str | RouterPolicy = "least_outstanding",
    decode_router: str | RouterPolicy = "least_kv",
    policy: str = "chunked",
    **engine_kwargs,
) -> Disaggregated:
    """`prefill` engines of `tp` GPUs (running `policy`) and `decode` engines of `decode_tp`
    (continuous batching: a received prompt costs one token, so there is nothing to chunk).
    Over NVLink all the GPUs must fit one server (GPUS_PER_SERVER)."""
    for name, n in (("prefill", prefill), ("decode", decode)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidValue(name, n, "must be an integer >= 1 (replicas in the pool)")
    decode_tp = tp if decode_tp is None else decode_tp
    gpus = prefill * tp + decode * decode_tp
    if link == "nvlink" and gpus > GPUS_PER_SERVER:
        raise InvalidValue(
            "link",
            link,
            f"NVLink joins the GPUs of one server ({GPUS_PER_SERVER}); this needs {gpus}: use infiniband or ethernet",
        )
    if engine_kwargs.get("speculative_config") is not None:
        raise InvalidValue(
            "speculative_config",
            engine_kwargs["speculative_config"],
            "not with disaggregation (yet)",
        )
    prefill_engines = [
        simulated_engine(model, device, policy=policy, tp=tp, **engine_kwargs)
        for _ in range(prefill)
    ]
    # the decode side runs no prompts: the prefill side's chunk budget and cache are not its own
    decode_kwargs = engine_kwargs | {"enable_prefix_caching": False, "max_num_batched_tokens": None}
    decode_engines = [
        receive_kv(
            simulated_engine(model, device, policy="continuous", tp=decode_tp, **decode_kwargs)
        )
        for _ in range(decode)
    ]
    return Disaggregated(prefill_engines, decode_engines, link, router, decode_router)
