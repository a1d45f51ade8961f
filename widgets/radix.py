"""A workload's prompts as a radix tree, beside vLLM's block hash table (lesson 8).

SGLang's RadixAttention keeps the KV cache in a **radix tree** (a compressed trie):
every path from the root spells a token prefix some request had, and an edge holds a
whole run of tokens that no prompt branches inside. vLLM keeps a **hash table** of
full blocks, each keyed by (its parent block's key, its own token ids), so a key
names the whole prefix up to the end of its block (minilm/core/prefix_cache.py).

Both answer the same question, "how much of this prompt did an earlier one already
compute?". The tree answers it token by token; the hash table only at block
boundaries. So the table finds the tree's match rounded down to a whole block, and
both leave the last prompt token to compute (the sampler needs its logits):

    tree hit  = min(longest common prefix with an earlier prompt, prompt_len - 1)
    table hit = tree hit rounded down to a multiple of block_size

`radix_figure` draws the tree; `prefix_hits` lists, request by request in arrival
order, what each structure finds. With a cache big enough to evict nothing and every
prompt computed whole when it is admitted (the `continuous` policy), the table's
column is what the engine records as `num_cached_tokens` (tests/test_radix.py).
Only prompts go into the tree: the engine also caches blocks of generated tokens,
which a later prompt matches only if it repeats that output (multi-turn workloads
resend the conversation's own text, not the engine's output).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from minilm.workload import RequestSpec


@dataclass(eq=False)
class RadixNode:
    """A node and the edge into it: `tokens` is the run of token ids on that edge."""

    tokens: tuple[int, ...] = ()
    start: int = 0  # position of tokens[0] in every prompt through here
    children: dict[int, RadixNode] = field(
        default_factory=dict
    )  # first token of the child's edge -> child
    requests: list[str] = field(default_factory=list)  # prompts whose path passes through

    @property
    def end(self) -> int:
        """Prefix length from the root to the end of this node."""
        return self.start + len(self.tokens)

    def split(self, k: int) -> None:
        """Cut the edge after its first `k` tokens: this node keeps them, a new child the rest."""
        rest = RadixNode(self.tokens[k:], self.start + k, self.children, list(self.requests))
        self.tokens, self.children = self.tokens[:k], {rest.tokens[0]: rest}


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def match(root: RadixNode, tokens: Sequence[int]) -> int:
    """How many leading tokens of `tokens` the tree already holds."""
    node, n = root, 0
    while n < len(tokens) and (child := node.children.get(tokens[n])) is not None:
        k = common_length(child.tokens, tokens[n:])
        n += k
        if k < len(child.tokens):
            break
        node = child
    return n


def insert(root: RadixNode, tokens: Sequence[int], request_id: str) -> None:
    """Add a prompt: walk its matching path, split the edge where it leaves it, hang the rest."""
    root.requests.append(request_id)
    node, n = root, 0
    while n < len(tokens):
        child = node.children.get(tokens[n])
        if child is None:
            node.children[tokens[n]] = RadixNode(tuple(tokens[n:]), n, {}, [request_id])
            return
        k = common_length(child.tokens, tokens[n:])
        if k < len(child.tokens):
            child.split(k)  # the prompt ends or branches inside this edge
        child.requests.append(request_id)
        node, n = child, n + k


def build_radix_tree(prompts: Mapping[str, Sequence[int]]) -> RadixNode:
    """The radix tree of prompts (id -> token ids), inserted in the mapping's order."""
    root = RadixNode()
    for rid, tokens in prompts.items():
        insert(root, tokens, rid)
    return root


def walk(root: RadixNode) -> Iterator[tuple[RadixNode, int]]:
    """Every node below the root with its level (1 = a child of the root), depth first."""
    stack = [(c, 1) for c in reversed(list(root.children.values()))]
    while stack:
        node, level = stack.pop()
        yield node, level
        stack.extend((c, level + 1) for c in reversed(list(node.children.values())))


def workload_prompts(
    specs: Iterable[RequestSpec], encode: Callable[[str], list[int]] | None = None
) -> dict[str, list[int]]:
    """Request id -> prompt token ids, in arrival order (ties keep the list's order, as the
    engine's queue does). Text prompts need `encode` (e.g. `engine.tokenizer.encode`)."""
    out = {}
    for s in sorted(specs, key=lambda s: s.arrival):
        if s.prompt_ids is None and encode is None:
            raise ValueError(
                f"request {s.id!r} has a text prompt: pass encode=engine.tokenizer.encode"
            )
        out[s.id] = list(s.prompt_ids) if s.prompt_ids is not None else encode(s.prompt)
    return out


def as_prompts(prompts) -> dict[str, list[int]]:
    if isinstance(prompts, Mapping):
        return {str(k): list(v) for k, v in prompts.items()}
    return workload_prompts(prompts)


def block_key(parent: tuple | None, tokens: Sequence[int]) -> tuple:
    """vLLM's key of a full block: its parent's key (hashed) and its own tokens."""
    return (hash(parent) if parent is not None else None, tuple(tokens))


def prefix_hits(
    prompts: Mapping[str, Sequence[int]] | Iterable[RequestSpec], block_size: int
) -> pd.DataFrame:
    """For each request in arrival order, the prompt tokens an earlier request already
    computed, as a radix tree finds them (`radix_hit`) and as vLLM's block hash table
    finds them (`block_hit`), each seeing every earlier prompt and evicting nothing."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    root, table = RadixNode(), set()
    rows = []
    for rid, tokens in as_prompts(prompts).items():
        n = len(tokens)
        radix = min(match(root, tokens), n - 1)  # the last token is always computed: it samples
        keys, parent = [], None
        for b in range(n // block_size):  # full blocks only
            parent = block_key(parent, tokens[b * block_size : (b + 1) * block_size])
            keys.append(parent)
        hit_blocks = 0
        for key in keys[: (n - 1) // block_size]:  # blocks that leave the last token out
            if key not in table:
                break
            hit_blocks += 1
        rows.append(
            {
                "request": rid,
                "prompt_len": n,
                "radix_hit": radix,
                "block_hit": hit_blocks * block_size,
            }
        )
        insert(root, tokens, rid)
        table.update(keys)
    return pd.DataFrame(rows, columns=["request", "prompt_len", "radix_hit", "block_hit"])


def tree_layout(root: RadixNode) -> dict[RadixNode, tuple[int, float]]:
    """(x, y) of every node: x its level, y the leaves' order (a parent sits in the middle
    of its children), so no two edges cross."""
    pos: dict[RadixNode, tuple[int, float]] = {}
    next_leaf = 0

    def place(node: RadixNode, level: int) -> float:
        nonlocal next_leaf
        if not node.children:
            y = float(next_leaf)
            next_leaf += 1
        else:
            ys = [place(c, level + 1) for c in node.children.values()]
            y = (min(ys) + max(ys)) / 2
        pos[node] = (level, y)
        return y

    place(root, 0)
    return pos


def radix_figure(
    prompts: Mapping[str, Sequence[int]] | Iterable[RequestSpec],
    title: str | None = None,
    decode: Callable[[list[int]], str] | None = None,
    max_hover_tokens: int = 24,
) -> go.Figure:
    """The prompts' radix tree: one marker per node (x: its level in the tree), labelled
    with its edge's token count and how many requests pass through it; hover shows its
    tokens (`decode` turns them into text, for a real tokenizer)."""
    root = build_radix_tree(as_prompts(prompts))
    pos = tree_layout(root)
    nodes = [n for n, _ in walk(root)]
    ex, ey = [], []  # every edge as a line segment; None breaks the line between segments
    for parent in [root, *nodes]:
        for child in parent.children.values():
            ex += [pos[parent][0], pos[child][0], None]
            ey += [pos[parent][1], pos[child][1], None]

    def shown(node: RadixNode) -> str:
        toks = list(node.tokens[:max_hover_tokens])
        more = f" … (+{len(node.tokens) - len(toks)})" if len(node.tokens) > len(toks) else ""
        body = repr(decode(toks)) if decode else " ".join(map(str, toks))
        return f"{body}{more}"

    hover = [
        f"tokens {n.start}–{n.end - 1} ({len(n.tokens)})<br>{len(n.requests)} requests pass through<br>"
        f"{shown(n)}"
        for n in nodes
    ]
    fig = go.Figure(
        [
            go.Scatter(
                x=ex,
                y=ey,
                mode="lines",
                line=dict(color="#999", width=1),
                hoverinfo="skip",
                showlegend=False,
            ),
            go.Scatter(
                x=[pos[root][0]],
                y=[pos[root][1]],
                mode="markers+text",
                text=[f"root · {len(root.requests)} req"],
                textposition="top center",
                marker=dict(size=10, color="black"),
                hoverinfo="skip",
                showlegend=False,
            ),
            go.Scatter(
                x=[pos[n][0] for n in nodes],
                y=[pos[n][1] for n in nodes],
                mode="markers+text",
                text=[f"{len(n.tokens)} tok · {len(n.requests)} req" for n in nodes],
                textposition="top center",
                textfont=dict(size=10),
                hovertext=hover,
                hovertemplate="%{hovertext}<extra></extra>",
                marker=dict(
                    size=[8 + 3 * len(n.requests) ** 0.5 for n in nodes],
                    color=["#d62728" if len(n.requests) > 1 else "#1f77b4" for n in nodes],
                ),
                showlegend=False,
            ),
        ]
    )
    leaves = sum(1 for n in nodes if not n.children)
    fig.update_layout(
        title=title
        or f"radix tree of {len(root.requests)} prompts: {len(nodes)} nodes, "
        f"{leaves} leaves (red: shared by several requests)",
        xaxis=dict(title="level in the tree (root = 0)", dtick=1, zeroline=False),
        yaxis=dict(visible=False, autorange="reversed"),
        plot_bgcolor="white",
        height=min(900, max(300, 120 + 22 * leaves)),
        margin=dict(l=20, r=20, t=50, b=40),
    )
    return fig
