"""Speculative token trees (Medusa ``medusa_choices`` / EAGLE ``eagle_choices``).

A tree is a list of paths; path ``[0, 2]`` is the node reached by taking the top-1
candidate of the first draft position and the top-3 candidate of the second. Every
prefix of a path must itself be in the tree. The root (the token the target model just
produced) is implicit, so ``len(tree)`` is the number of draft tokens verified per step.
"""

from __future__ import annotations

from collections import Counter

Tree = tuple[tuple[int, ...], ...]

# TensorRT-LLM's default when no choices are given (cpp/include/tensorrt_llm/runtime/
# medusaModule.h, the Medusa paper's ``mc_sim_7b_63``): 63 nodes, depth 4, <= 10 non-leaves
# per level. It is tuned for Vicuna-7B on an A100 and is far too big for a CPU.
MC_SIM_7B_63: Tree = (
    (0,),
    (0, 0),
    (1,),
    (0, 1),
    (2,),
    (0, 0, 0),
    (1, 0),
    (0, 2),
    (3,),
    (0, 3),
    (4,),
    (0, 4),
    (2, 0),
    (0, 5),
    (0, 0, 1),
    (5,),
    (0, 6),
    (6,),
    (0, 7),
    (0, 1, 0),
    (1, 1),
    (7,),
    (0, 8),
    (0, 0, 2),
    (3, 0),
    (0, 9),
    (8,),
    (9,),
    (1, 0, 0),
    (0, 2, 0),
    (1, 2),
    (0, 0, 3),
    (4, 0),
    (2, 1),
    (0, 0, 4),
    (0, 0, 5),
    (0, 0, 0, 0),
    (0, 1, 1),
    (0, 0, 6),
    (0, 3, 0),
    (5, 0),
    (1, 3),
    (0, 0, 7),
    (0, 0, 8),
    (0, 0, 9),
    (6, 0),
    (0, 4, 0),
    (1, 4),
    (7, 0),
    (0, 1, 2),
    (2, 0, 0),
    (3, 1),
    (2, 2),
    (8, 0),
    (0, 5, 0),
    (1, 5),
    (1, 0, 1),
    (0, 2, 1),
    (9, 0),
    (0, 6, 0),
    (0, 0, 0, 1),
    (1, 6),
    (0, 7, 0),
)

# Small trees for CPUs and latency-bound GPUs: a verification pass over ~16 tokens costs
# about 1.3 single-token steps on the 2-core CPU in bf16 (bench/gemm_rows.py), while
# 64 tokens cost 2-3 steps.
CHAIN_3: Tree = ((0,), (0, 0), (0, 0, 0))
CHAIN_4: Tree = ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
CPU_SMALL_15: Tree = (
    (0,),
    (1,),
    (2,),
    (0, 0),
    (0, 1),
    (1, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 1, 0),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 1, 0),
    (0, 1, 0, 0),
    (0, 0, 0, 0, 0),
)
CPU_SMALL_10_DEPTH_3: Tree = (
    (0,),
    (1,),
    (2,),
    (0, 0),
    (0, 1),
    (1, 0),
    (2, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 1, 0),
)

# Fitted to the shipped SmolLM2 heads (heads/) with most_frequent_paths on self-distilled validation
# text the heads never trained on; bench/trees.py reproduces them and scores them on held-out prompts.
# 10 nodes suit float32 CPU engines, 15 bfloat16 ones (a pass over 16 tokens costs ~1.2 single-token
# steps with AMX).
SMOLLM2_MEDUSA_10: Tree = (
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (5,),
    (0, 0),
    (0, 1),
    (0, 2),
    (0, 0, 0),
)
SMOLLM2_MEDUSA_15: Tree = (
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (5,),
    (6,),
    (7,),
    (0, 0),
    (0, 1),
    (0, 2),
    (0, 3),
    (1, 0),
    (0, 0, 0),
    (0, 0, 1),
)
# EAGLE trees stop at depth 3: on a CPU each level costs a drafter pass and an lm_head pass.
SMOLLM2_EAGLE_15: Tree = (
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (0, 0),
    (0, 1),
    (0, 2),
    (0, 3),
    (1, 0),
    (2, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 1, 0),
    (1, 0, 0),
)

TREE_PRESETS: dict[str, Tree] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    "chain_3": CHAIN_3,
    "chain_4": CHAIN_4,
    "cpu_small_15": CPU_SMALL_15,
    "cpu_small_10_depth_3": CPU_SMALL_10_DEPTH_3,
    "smollm2_medusa_10": SMOLLM2_MEDUSA_10,
    "smollm2_medusa_15": SMOLLM2_MEDUSA_15,
    "smollm2_eagle_15": SMOLLM2_EAGLE_15,
}


def resolve_tree(choices: str | list[list[int]] | None) -> Tree:
    """A preset name or an explicit list -> a validated tree. Raises ValueError."""
    if choices is None:
        return MC_SIM_7B_63
    if isinstance(choices, str):
        if choices not in TREE_PRESETS:
            raise ValueError(f"unknown tree preset '{choices}' (known: {', '.join(TREE_PRESETS)})")
        return TREE_PRESETS[choices]
    tree = tuple(tuple(path) for path in choices)
    validate_tree(tree)
    return tree


def tree_name(tree: Tree) -> str:
    """The preset's name (``smollm2_medusa_10``), else ``N-node tree``."""
    return next((name for name, preset in TREE_PRESETS.items() if preset == tree), f"{len(tree)}-node tree")


SIMILAR_SIZE = 0.5  # similar_trees: presets within +-50% of the tree's node count


def similar_trees(tree: Tree, max_depth: int, max_nodes: int) -> list[Tree]:
    """The presets of a similar size to ``tree`` (it first) that fit ``max_depth`` heads and ``max_nodes``."""
    low, high = len(tree) * (1 - SIMILAR_SIZE), len(tree) * (1 + SIMILAR_SIZE)
    others = [
        t
        for t in TREE_PRESETS.values()
        if t != tree and low <= len(t) <= high and tree_depth(t) <= max_depth and len(t) <= max_nodes
    ]
    return [tree, *sorted(others, key=len)]


def tree_or_empty(nodes: list[list[int]]) -> Tree:
    """The tree of recorded ``nodes``, or ``()`` when they do not make a valid tree."""
    try:
        return resolve_tree(nodes)
    except ValueError:
        return ()


def validate_tree(tree: Tree) -> None:
    if not tree:
        raise ValueError("the tree is empty; give at least one path such as [0]")
    seen: set[tuple[int, ...]] = set()
    for path in tree:
        if not path:
            raise ValueError("empty path [] in the tree; the root is implicit")
        if any(index < 0 for index in path):
            raise ValueError(f"path {list(path)} has a negative top-k index")
        if path in seen:
            raise ValueError(f"path {list(path)} appears twice")
        seen.add(path)
    for path in tree:
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"path {list(path)} has no parent {list(path[:-1])} in the tree")


def most_frequent_paths(rank_paths: Counter[tuple[int, ...]], size: int, max_depth: int | None = None) -> Tree:
    """The tree of ``size`` nodes that accepts the most draft tokens on measured data.

    ``rank_paths`` counts, over decoding steps of held-out text, the ranks of the true next
    tokens among the drafter's candidates along the true path: (r_1, ..., r_D) says the true
    token at draft depth d was the drafter's r_d-th candidate (a path stops at the first token
    outside the candidates considered). A tree accepts depth d of a step iff it holds the prefix
    (r_1, ..., r_d), so the tokens a tree accepts are the summed counts of the prefixes it holds;
    a prefix is never rarer than its extensions, hence the best tree of n nodes is simply the n
    most frequent prefixes (ties: shorter, then smaller ranks first), which is prefix-closed.
    The Medusa paper (arXiv 2401.10774, section 3.3.1) grows trees the same way from per-rank
    accuracies assumed independent; counting whole paths needs no independence assumption.
    """
    counts: Counter[tuple[int, ...]] = Counter()
    for path, n in rank_paths.items():
        for depth in range(1, min(len(path), max_depth or len(path)) + 1):
            counts[path[:depth]] += n
    ranked = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:size]
    tree = tuple(sorted(ranked, key=lambda p: (len(p), p)))
    validate_tree(tree)
    return tree


def tree_depth(tree: Tree) -> int:
    return max(len(path) for path in tree)


def non_leaves_per_level(tree: Tree) -> list[int]:
    """Nodes with at least one child, per level; level 0 is the implicit root."""
    parents = {path[:-1] for path in tree}
    per_level = Counter(len(parent) for parent in parents)
    return [per_level.get(level, 0) for level in range(tree_depth(tree))]


def max_top_k(tree: Tree) -> int:
    """Largest top-k index any node asks for, plus one (how many candidates per position)."""
    return max(max(path) for path in tree) + 1


def to_triton_choices(tree: Tree) -> str:
    """The ``{0, 0, 0}, {0, 1}`` form the TensorRT-LLM Triton backend parses."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in tree)


def parse_triton_choices(text: str) -> Tree:
    """Inverse of :func:`to_triton_choices` (used by the reference backend and tests)."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"choices must look like '{{0, 0}}, {{1}}', got {text!r}")
    paths = []
    for chunk in body[1:-1].split("}"):
        chunk = chunk.strip().lstrip(",").strip().lstrip("{").strip()
        if chunk:
            paths.append(tuple(int(item) for item in chunk.split(",")))
    tree = tuple(paths)
    validate_tree(tree)
    return tree
