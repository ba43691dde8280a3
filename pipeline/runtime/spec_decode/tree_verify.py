"""Draft-tree verification shared by the speculative methods (Medusa, EAGLE, Lookahead).

A method proposes a :class:`DraftTree` under the *root*, the last token already chosen but not
yet in the KV cache. One forward pass feeds root + all nodes with a tree attention mask (each
node sees the cache, its ancestors and itself) and depth-based positions, and returns logits
for every fed token. :func:`accept` walks from the root: at each accepted node the target
model's own choice (argmax, or a sample from the request's RNG) is compared with the node's
children; a matching child is accepted, otherwise the walk stops and that choice becomes the
bonus token. :func:`commit` keeps only the accepted path in the KV cache.

Why this is lossless under sampling too: every emitted token is a sample of the target
distribution at its position given the tokens before it (the drafts only decide how many of
those samples one forward pass can check), so the output distribution is exactly the target's;
this is the "sequential sampling" rule, which needs no draft probabilities. For drafts that are
a deterministic function of the context (top-k tree candidates, n-grams) it is also the best a
lossless rule can do: at a node with candidate children C it accepts with probability
sum_{c in C} p(c), and no rule can accept more often, because an accepted child is the emitted
token and the emitted token must be distributed as p. It draws one sample per emitted token from
the request's generator, like plain decoding, so a seeded request gives the same tokens with or
without speculation (up to float round-off between a tree pass and single-token passes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline import trees
from pipeline.runtime.model.engine import Logits, StepInput, StepRows
from pipeline.runtime.model.kv_cache import KVCache

Choose = Callable[[torch.Tensor], int]  # logits row -> the target model's token


@dataclass(frozen=True)
class DraftTree:
    """Nodes in feeding order; ``parents[i]`` is node i's parent node index, -1 for the root.
    A parent must come before its children."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError("every parent must be -1 (the root) or an earlier node")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def depths(self) -> list[int]:
        """1 for children of the root."""
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def mask(self) -> torch.Tensor:
        """Bool [1 + n, 1 + n] over root + nodes: True where row may attend to column."""
        n = len(self)
        allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        allowed[:, 0] = True
        for i, p in enumerate(self.parents):
            allowed[i + 1] = allowed[p + 1] if p >= 0 else allowed[0]
            allowed[i + 1, i + 1] = True
        return allowed


def tree_input(cache: KVCache, root: int, tree: DraftTree) -> StepInput:
    past = cache.length
    positions = [past] + [past + d for d in tree.depths()]
    return StepInput(cache, [root, *tree.tokens], Logits.ALL, positions, tree.mask())


@dataclass(frozen=True)
class TreeShape:
    """A static choices tree (``medusa_choices`` / ``eagle_choices``) in feeding order, parents first.

    Node i is reached by taking the ``paths[i][-1]``-th candidate (top-k rank) of its parent
    ``parents[i]`` (-1: the root); its depth is ``len(paths[i])``.
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]

    @classmethod
    def of(cls, tree: trees.Tree) -> TreeShape:
        trees.validate_tree(tree)
        paths = tuple(sorted(tree, key=len))  # stable sort: a parent (a shorter path) always comes first
        index = {path: i for i, path in enumerate(paths)}
        return cls(paths, tuple(index.get(path[:-1], -1) for path in paths))

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(path) for path in self.paths)

    @property
    def top_k(self) -> int:
        """Candidates needed per draft position (largest rank + 1)."""
        return max(path[-1] for path in self.paths) + 1

    def children(self) -> dict[int, list[int]]:
        """Node index -> its children, in feeding order (-1: the root's)."""
        out: dict[int, list[int]] = {}
        for i, parent in enumerate(self.parents):
            out.setdefault(parent, []).append(i)
        return out


@dataclass(frozen=True)
class Verdict:
    path: list[int]  # accepted node indices, root to leaf
    tokens: list[int]  # the accepted drafts' tokens, then the bonus token

    @property
    def accepted_drafts(self) -> int:
        return len(self.path)

    def rows(self, offset: int = 1) -> list[int]:
        """Fed positions of the root and the accepted nodes: the tokens now committed, whose
        hidden states are the next step's features (Medusa heads, EAGLE drafter)."""
        return [0] + [offset + i for i in self.path]


def accept(tree: DraftTree, logits: torch.Tensor, choose: Choose, offset: int = 1) -> Verdict:
    """``logits`` [fed, vocab]: row 0 the root's, row ``offset + i`` node i's (rows are read in
    place: gathering them would copy megabytes of logits every step)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    node = -1
    while True:
        token = choose(logits[0 if node < 0 else offset + node])
        match = next((c for c in children.get(node, []) if tree.tokens[c] == token), None)
        if match is None:
            return Verdict(path, [tree.tokens[i] for i in path] + [token])
        path.append(match)
        node = match


def commit(cache: KVCache, start: int, verdict: Verdict, offset: int = 1) -> None:
    """Keep root + accepted nodes in the cache; ``start`` is the cache length before the step,
    ``offset`` the fed position of node 0 (the root is at 0)."""
    cache.keep(start, verdict.rows(offset))


@dataclass
class Proposal:
    """One request's drafts for one step, as fed: node i of ``tree`` sits at fed position
    ``offset + i`` (the root at 0; Lookahead puts its window in between)."""

    input: StepInput
    tree: DraftTree
    start: int  # cache length before the step
    offset: int = 1

    @classmethod
    def of_tree(cls, cache: KVCache, root: int, tree: DraftTree) -> Proposal:
        return cls(tree_input(cache, root, tree), tree, cache.length)


def verify(proposal: Proposal, rows: StepRows, cache: KVCache, choose: Choose) -> Verdict:
    """Accept the longest path the target agrees with (see the module docstring) and keep only
    it in the cache."""
    verdict = accept(proposal.tree, rows.logits, choose, proposal.offset)
    commit(cache, proposal.start, verdict, proposal.offset)
    return verdict
