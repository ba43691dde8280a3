"""The offline acceptance simulation."""

from __future__ import annotations

import torch

from pipeline.heads.evaluate import MISS, accepted_depth, simulate, true_ranks
from pipeline.trees import CHAIN_4, CPU_SMALL_10_DEPTH_3


def test_true_ranks():
    logits = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.2, 0.1]])
    assert true_ranks(logits, torch.tensor([2, 2]), cap=3).tolist() == [1, 2]
    assert true_ranks(logits, torch.tensor([2, 2]), cap=2).tolist() == [1, MISS]


def test_accepted_depth_follows_tree_paths():
    tree = set(CPU_SMALL_10_DEPTH_3)
    assert accepted_depth([0, 0, 0], tree) == 3
    assert accepted_depth([2, 0, 0], tree) == 2  # (2, 0) exists, (2, 0, 0) does not
    assert accepted_depth([1, 1, 0], tree) == 1
    assert accepted_depth([3, 0, 0], tree) == 0


def test_simulate_counts_steps():
    T, start = 20, 5  # 15 answer tokens
    perfect = torch.zeros(T, 4, dtype=torch.long)
    produced, steps = simulate(perfect, start, CHAIN_4)
    assert produced == 15 and steps == 3  # 5 + 5 + 5
    miss = torch.full((T, 4), MISS)
    assert simulate(miss, start, CHAIN_4) == (15, 15)
