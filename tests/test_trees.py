"""Tree presets and the measured-acceptance tree builder (pipeline/trees.py)."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

from pipeline import trees


def accepted(tree: trees.Tree, rank_paths: Counter) -> int:
    """Draft tokens a tree accepts over the counted steps (the quantity most_frequent_paths maximizes)."""
    nodes = set(tree)
    return sum(
        n * next((d for d in range(len(path), 0, -1) if all(path[:k] in nodes for k in range(1, d + 1))), 0)
        for path, n in rank_paths.items()
    )


RANK_PATHS = Counter({(0, 0, 0): 30, (0, 1, 0): 12, (1, 0): 20, (2,): 9, (0, 0, 2): 7, (1, 1, 1): 5, (3, 0): 4, (): 40})


def test_most_frequent_paths_is_optimal_and_prefix_closed():
    for size in range(1, 9):
        tree = trees.most_frequent_paths(RANK_PATHS, size)
        trees.validate_tree(tree)
        assert len(tree) == size
        # Brute force over every prefix-closed tree of this size built from observed prefixes.
        prefixes = sorted({p[:d] for p in RANK_PATHS for d in range(1, len(p) + 1)})
        best = max(
            accepted(c, RANK_PATHS) for c in combinations(prefixes, size) if all(len(p) == 1 or p[:-1] in c for p in c)
        )
        assert accepted(tree, RANK_PATHS) == best


def test_most_frequent_paths_depth_limit_and_order():
    tree = trees.most_frequent_paths(RANK_PATHS, 4, max_depth=1)
    assert tree == ((0,), (1,), (2,), (3,))
    assert trees.most_frequent_paths(RANK_PATHS, 3) == ((0,), (0, 0), (0, 0, 0))  # counts 49, 37, 30 beat (1,): 25


def test_smollm2_presets_are_the_recorded_fitted_trees():
    """bench/trees.py wrote them; a refit that changes them must update the presets (and the specs)."""
    import json
    from pathlib import Path

    fitted = json.loads((Path(__file__).resolve().parents[1] / "bench" / "trees.json").read_text())["methods"]
    for preset, (method, name) in {
        "smollm2_medusa_10": ("medusa", "fitted_10"),
        "smollm2_medusa_15": ("medusa", "fitted_15"),
        "smollm2_eagle_15": ("eagle", "fitted_15"),
    }.items():
        assert trees.TREE_PRESETS[preset] == tuple(tuple(p) for p in fitted[method]["trees"][name]), preset
