"""EAGLE's draft trees while they grow: the children of the frontier, the nodes the drafter expands
next, and the final tree the target verifies.

* :class:`StaticTree` (EAGLE-1, arXiv 2401.15077): the ``eagle_choices`` tree says which candidates
  (top-k ranks) each node keeps; every node that has children in it is expanded.
* :class:`DynamicTree` (EAGLE-2, arXiv 2406.16858): a node's score is its path's cumulative drafter
  log-probability; each level expands the top_k best nodes with top_k children each, then the best
  max_draft_len nodes are kept (scores only fall along a path, so every kept node's ancestors are
  kept too).

Worked example, a static tree ``[[0], [1], [0, 0]]`` (depth 2, top-2 candidates): the root's
candidates (a, b) give nodes 0 = a (rank 0) and 1 = b (rank 1) at depth 1; only node 0 has children
in the tree, so only it is expanded, and its best candidate c becomes node 2 at depth 2. The final
tree is tokens (a, b, c) with parents (-1, -1, 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline import trees
from pipeline.errors import InputError
from pipeline.runtime.model.kv_cache import KVCache
from pipeline.runtime.spec_decode.eagle.drafter import DraftInput
from pipeline.runtime.spec_decode.tree_verify import DraftTree, TreeShape

Candidates = tuple[list[int], list[float]]  # a node's top-k next tokens and their drafter log-probs, best first


@dataclass
class Node:
    token: int
    parent: int  # index into the draft's nodes, -1: the root
    depth: int
    score: float  # cumulative drafter log-probability of the path (EAGLE-2's value)
    shape_index: int = -1  # the node of a static tree


@dataclass
class Draft:
    """One request's tree while it is being drafted."""

    committed: int  # drafter entries from true features (= the root's position n)
    # Nodes whose children come next: (node index, its output f', its candidates).
    frontier: list[tuple[int, torch.Tensor, Candidates]]
    nodes: list[Node] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)  # expanded node -> its drafter-cache slot

    def expansion(self, cache: KVCache, picked: list[int], depth: int) -> DraftInput:
        """Drafter entries of the picked nodes: each sees the committed entries, its ancestors, itself."""
        outputs = {node: f for node, f, _ in self.frontier}  # the parents' predicted features
        visible = torch.zeros(len(picked), cache.length + len(picked), dtype=torch.bool)
        visible[:, : self.committed] = True
        for row, node in enumerate(picked):
            self.slots[node] = cache.length + row
            ancestor = node
            while ancestor >= 0:
                visible[row, self.slots[ancestor]] = True
                ancestor = self.nodes[ancestor].parent
        return DraftInput(
            cache,
            [self.nodes[i].token for i in picked],
            torch.stack([outputs[self.nodes[i].parent] for i in picked]),
            [self.committed + depth - 1] * len(picked),
            visible,
        )

    def tree(self, keep: list[int]) -> DraftTree:
        """The kept nodes (parents before children) as the tree to verify."""
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree(
            tuple(self.nodes[i].token for i in keep),
            tuple(index[self.nodes[i].parent] if self.nodes[i].parent >= 0 else -1 for i in keep),
        )


class TreeRule:
    """How a draft tree grows; :class:`StaticTree` and :class:`DynamicTree` fill in the choices."""

    depth: int  # draft levels
    top_k: int  # candidates each drafter output must supply
    max_draft_len: int  # nodes in the final tree, at most
    max_expanded: int  # drafter entries a step's expansions add, at most

    def grow(self, draft: Draft, depth: int) -> None:
        """Add the children of the frontier nodes (all at depth - 1)."""
        for parent, _, (tokens, log_probs) in draft.frontier:
            score = draft.nodes[parent].score if parent >= 0 else 0.0
            for rank, shape_index in self.children(draft, parent):
                draft.nodes.append(Node(tokens[rank], parent, depth, score + log_probs[rank], shape_index))

    def children(self, draft: Draft, parent: int) -> list[tuple[int, int]]:
        """(candidate rank, static-tree node) of each child ``parent`` gets."""
        raise NotImplementedError

    def to_expand(self, draft: Draft, depth: int) -> list[int]:
        """Nodes at ``depth`` to run through the drafter (their children come next)."""
        raise NotImplementedError

    def final(self, draft: Draft) -> DraftTree:
        return draft.tree(list(range(len(draft.nodes))))


class StaticTree(TreeRule):
    def __init__(
        self, tree: trees.Tree, num_eagle_layers: int, max_non_leaves_per_layer: int | None, max_draft_len: int
    ):
        self.shape = TreeShape.of(tree)
        if self.shape.depth > num_eagle_layers:
            raise InputError(
                f"eagle_choices: tree depth {self.shape.depth} exceeds num_eagle_layers "
                f"{num_eagle_layers} of the engine"
            )
        widest = max(trees.non_leaves_per_level(self.shape.paths))
        most = max_non_leaves_per_layer or widest
        if widest > most:
            raise InputError(
                f"eagle_choices: a level has {widest} non-leaf nodes, more than the engine's "
                f"max_non_leaves_per_layer {most}"
            )
        if len(self.shape) > max_draft_len:
            raise InputError(
                f"eagle_choices: {len(self.shape)} tree nodes exceed the engine's max_draft_len "
                f"{max_draft_len}; use a smaller tree"
            )
        self.depth, self.top_k, self.max_draft_len = self.shape.depth, self.shape.top_k, len(self.shape)
        self._children = self.shape.children()
        self._expandable = {parent for parent in self.shape.parents if parent >= 0}
        self.max_expanded = len(self._expandable)

    def children(self, draft: Draft, parent: int) -> list[tuple[int, int]]:
        shape_parent = draft.nodes[parent].shape_index if parent >= 0 else -1
        return [(self.shape.paths[kid][-1], kid) for kid in self._children.get(shape_parent, [])]

    def to_expand(self, draft: Draft, depth: int) -> list[int]:
        return [i for i, node in enumerate(draft.nodes) if node.depth == depth and node.shape_index in self._expandable]


class DynamicTree(TreeRule):
    def __init__(self, top_k: int | None, num_eagle_layers: int, max_draft_len: int):
        if not top_k or top_k < 1:
            raise InputError(f"reference_eagle_dynamic_tree_max_top_k must be >= 1, got {top_k}")
        self.depth, self.top_k = num_eagle_layers, top_k
        # TensorRT-LLM's rule: top_k + top_k^2 * (num_eagle_layers - 1) nodes, capped by max_draft_len.
        self.max_draft_len = min(top_k + top_k**2 * (num_eagle_layers - 1), max_draft_len)
        self.max_expanded = top_k * (num_eagle_layers - 1)

    def children(self, draft: Draft, parent: int) -> list[tuple[int, int]]:
        return [(rank, -1) for rank in range(self.top_k)]

    def to_expand(self, draft: Draft, depth: int) -> list[int]:
        level = [i for i, node in enumerate(draft.nodes) if node.depth == depth]
        return sorted(level, key=lambda i: -draft.nodes[i].score)[: self.top_k]

    def final(self, draft: Draft) -> DraftTree:
        """Rerank: the best max_draft_len nodes by path score; a node is kept only after its parent
        (scores never rise along a path, ties go to the shallower node)."""
        if len(draft.nodes) <= self.max_draft_len:
            return super().final(draft)
        kept: set[int] = set()
        for i in sorted(range(len(draft.nodes)), key=lambda i: (-draft.nodes[i].score, draft.nodes[i].depth, i)):
            if len(kept) == self.max_draft_len:
                break
            if draft.nodes[i].parent < 0 or draft.nodes[i].parent in kept:
                kept.add(i)
        return draft.tree(sorted(kept))  # creation order is level by level, so parents come first
