"""The global router: which replica serves a request (docs/DESIGN.md, "Fleet"; lesson 11).

It sees plain values, what a router in front of real engines can know: each replica's load as
it was when the request arrived (`ReplicaLoad`: requests routed to it and not finished, KV
blocks in use, its seats) and `prefix_match(replica, prompt_ids)`, how many of the prompt's
first tokens that replica's prefix cache holds. The simulator (sim/cluster.py) calls `route` with the
loads it reconstructs for the arrival time; the server over several engine cores
(`serve --data-parallel-size N`, serve/engine_client.py) calls it with the loads the cores
report with their outputs, and `RoutedPrefixes` as its prefix match: it cannot read a core's
cache, only remember what it sent there.

round_robin        each replica in turn
least_outstanding  the fewest outstanding requests (Vidur's LOR global scheduler)
least_kv           the fewest KV blocks in use (then the fewest outstanding)
prefix_aware       the longest cached prefix, unless that replica has more than `balance`
                   outstanding requests above the least loaded one, which then gets it
                   (SGLang router's cache-aware policy, llm-d's prefix scorer)

A policy of your own is a class with a `name` and `choose(prompt_ids, loads, prefix_match)`
that returns a `Choice`: the replica and a sentence saying why (exercise 11).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .config import InvalidValue, check_int


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router sees of one replica at one moment."""

    outstanding: int  # requests routed to it that have not finished
    kv_blocks_used: int  # as of its last step that ended by then
    kv_blocks_total: int
    max_num_seqs: int  # its seats: requests routed beyond them wait for one (lesson 11)


@dataclass(frozen=True)
class Choice:
    replica: int  # index into the loads
    reason: str  # why this one, for the timeline: "3 outstanding, the fewest"


PrefixMatch = Callable[[int, Sequence[int]], int]  # (replica, prompt ids) -> cached prompt tokens


def no_prefix_match(replica: int, prompt_ids: Sequence[int]) -> int:
    return 0  # replicas without a prefix cache


class RoutedPrefixes:
    """A router's guess at one engine's prefix cache, from the prompts it routed there (SGLang's
    router keeps such an approximate tree per worker): each full block of a prompt is named by
    a hash chained through its parent's, as the engine's own cache names it
    (core/prefix_cache.py), and the `capacity` most recently routed names are kept. A guess: the
    engine evicts on its own and never says so."""

    def __init__(self, block_size: int, capacity: int = 4096):
        check_int("block_size", block_size, 1, "must be an integer >= 1 (tokens per block)")
        check_int("capacity", capacity, 1, "must be an integer >= 1 (block names kept)")
        self.block_size, self.capacity = block_size, capacity
        self.names: OrderedDict[int, None] = OrderedDict()

    def chain(self, prompt_ids: Sequence[int]) -> list[int]:
        """The names of the prompt's full blocks, first to last."""
        names, parent, b = [], 0, self.block_size
        for start in range(0, len(prompt_ids) - b + 1, b):
            parent = hash((parent, tuple(prompt_ids[start : start + b])))
            names.append(parent)
        return names

    def add(self, prompt_ids: Sequence[int]) -> None:
        for name in self.chain(prompt_ids):
            self.names[name] = None
            self.names.move_to_end(name)
        while len(self.names) > self.capacity:
            self.names.popitem(last=False)

    def match(self, prompt_ids: Sequence[int]) -> int:
        """Prompt tokens in the longest run of leading blocks routed here before."""
        n = 0
        for name in self.chain(prompt_ids):
            if name not in self.names:
                break
            n += 1
        return n * self.block_size


class RouterPolicy(Protocol):
    name: str

    def choose(
        self, prompt_ids: Sequence[int], loads: Sequence[ReplicaLoad], prefix_match: PrefixMatch
    ) -> Choice: ...


def fewest(loads: Sequence[ReplicaLoad], key: Callable[[ReplicaLoad], tuple]) -> int:
    """The index with the smallest key; the lowest index among equals."""
    return min(range(len(loads)), key=lambda i: (key(loads[i]), i))


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self.turn = 0

    def choose(self, prompt_ids, loads, prefix_match) -> Choice:
        i = self.turn % len(loads)
        self.turn += 1
        return Choice(i, f"its turn ({self.turn - 1} routed before)")


class LeastOutstanding:
    name = "least_outstanding"

    def choose(self, prompt_ids, loads, prefix_match) -> Choice:
        i = fewest(loads, lambda r: (r.outstanding,))
        return Choice(i, f"{loads[i].outstanding} outstanding, the fewest")


class LeastKV:
    name = "least_kv"

    def choose(self, prompt_ids, loads, prefix_match) -> Choice:
        i = fewest(loads, lambda r: (r.kv_blocks_used, r.outstanding))
        return Choice(i, f"{loads[i].kv_blocks_used} KV blocks in use, the fewest")


class PrefixAware:
    """The replica with the longest cached prefix of the prompt (the least loaded among equals),
    unless it has more than `balance` outstanding requests above the least loaded replica:
    cache hits are worth a little imbalance, not a queue."""

    name = "prefix_aware"

    def __init__(self, balance: int = 8) -> None:
        check_int("balance", balance, 0, "must be an integer >= 0 (outstanding requests)")
        self.balance = balance

    def choose(self, prompt_ids, loads, prefix_match) -> Choice:
        matches = [prefix_match(i, prompt_ids) for i in range(len(loads))]
        lightest = fewest(loads, lambda r: (r.outstanding,))
        best = min(range(len(loads)), key=lambda i: (-matches[i], loads[i].outstanding, i))
        if matches[best] == 0:
            return Choice(lightest, "no replica caches a prefix: the fewest outstanding")
        excess = loads[best].outstanding - loads[lightest].outstanding
        if excess > self.balance:
            return Choice(
                lightest,
                f"replica {best} caches {matches[best]} tokens but has {excess} outstanding "
                f"more than this one (> balance {self.balance}): the fewest outstanding",
            )
        return Choice(best, f"{matches[best]} of {len(prompt_ids)} prompt tokens cached, the most")


ROUTERS: dict[str, type] = {p.name: p for p in (RoundRobin, LeastOutstanding, LeastKV, PrefixAware)}


def make_router(router: str | RouterPolicy) -> RouterPolicy:
    """A router policy by name (a fresh one: round_robin keeps its turn), or one given."""
    if isinstance(router, str):
        if router not in ROUTERS:
            raise InvalidValue("router", router, f"allowed: {', '.join(ROUTERS)} (or a policy)")
        return ROUTERS[router]()
    if not callable(getattr(router, "choose", None)):
        raise InvalidValue(
            "router", router, "a policy needs a choose(prompt_ids, loads, prefix_match)"
        )
    return router


@dataclass(frozen=True)
class Route:
    """The router's decision for one request, as the timeline keeps it."""

    request_id: str
    t: float  # when it was routed: its arrival (or, to a decode pool, its prompt's end)
    replica: int
    reason: str
    outstanding: tuple[int, ...]  # every replica's, as the router saw them
    kv_blocks_used: tuple[int, ...]
    name: str = ""  # the chosen replica's, where the caller names them ("decode 1")


def route(
    policy: RouterPolicy,
    request_id: str,
    t: float,
    prompt_ids: Sequence[int],
    loads: Sequence[ReplicaLoad],
    prefix_match: PrefixMatch = no_prefix_match,
    names: Sequence[str] | None = None,
) -> Route:
    """Ask `policy` where the request goes; a choice outside the replicas is an error."""
    choice = policy.choose(prompt_ids, loads, prefix_match)
    if not isinstance(choice, Choice) or not (
        isinstance(choice.replica, int) and 0 <= choice.replica < len(loads)
    ):
        raise InvalidValue(
            "router",
            getattr(policy, "name", policy),
            f"chose {choice!r}; a Choice of a replica in 0..{len(loads) - 1} is allowed",
            request_id,
        )
    return Route(
        request_id,
        t,
        choice.replica,
        choice.reason,
        tuple(r.outstanding for r in loads),
        tuple(r.kv_blocks_used for r in loads),
        names[choice.replica] if names else str(choice.replica),
    )
