"""Offline accuracy and greedy acceptance estimates of trained heads on held-out sequences.

Greedy speculative decoding accepts a draft path only while every token equals the base
model's greedy token, and the held-out data IS the base model's greedy output; so for each
decoding step ("anchor" t: the base has just produced token t+1 from h_t) we need, per draft
depth d, the rank of the true token t+1+d among the head's candidates *conditioned on the true
path so far*:

* Medusa: head d-1's logits at h_t (heads do not depend on the path).
* EAGLE: draft step d of :meth:`EagleDrafter.unrolled` with the true tokens; with tree attention a
  node sees only its ancestors, so on the accepted path this is exactly what tree drafting
  computes (verified against explicit drafting in tests/heads).

A tree path (r_1, ..., r_d) is accepted when it is in the tree and r_k is the true token's rank
at depth k; the step yields 1 + (longest accepted depth) tokens and the next anchor is the last
accepted position. Mean tokens per step = answer tokens / steps. On teacher-forced text the true
token is the target's own greedy choice after the text's prefix (its teacher's top-1), not the text's.
An estimate: the reference backend's numbers (numerics, batching) come later.
"""

from __future__ import annotations

import torch

from pipeline.heads.data import KINDS, SeqData
from pipeline.heads.eagle import EagleDrafter
from pipeline.heads.medusa import MedusaResBlocks
from pipeline.trees import Tree

MISS = 1 << 30


def true_ranks(logits: torch.Tensor, targets: torch.Tensor, cap: int) -> torch.Tensor:
    """Rank (0 = top-1) of each target in its logits row, MISS when >= cap."""
    true = logits.gather(-1, targets.unsqueeze(-1))
    rank = (logits > true).sum(-1)
    return torch.where(rank < cap, rank, torch.full_like(rank, MISS))


def accepted_depth(ranks: list[int], tree: set[tuple[int, ...]]) -> int:
    depth = 0
    while depth < len(ranks) and tuple(ranks[: depth + 1]) in tree:
        depth += 1
    return depth


def simulate(ranks: torch.Tensor, start: int, tree: Tree) -> tuple[int, int]:
    """(answer tokens, steps) for one sequence. ranks [T, D]: row t = anchor t, column d-1 = depth d."""
    T = ranks.shape[0]
    paths = set(tree)
    depth_max = max(len(p) for p in tree)
    t, steps = start - 1, 0
    table = ranks.tolist()
    while t + 1 <= T - 1:
        room = (T - 1) - (t + 1)
        d = accepted_depth(table[t][: min(depth_max, room)], paths)
        steps += 1
        t += 1 + d
    return T - start, steps


def _shifted_targets(next_labels: torch.Tensor, depth: int) -> torch.Tensor:
    """[T, depth]: column d-1 = the target's token t+1+d, i.e. its next token after position t+d
    (:meth:`SeqData.next_labels`; clamped, callers mask past the end)."""
    T = next_labels.numel()
    idx = (torch.arange(T)[:, None] + torch.arange(1, depth + 1)[None, :]).clamp(max=T - 1)
    return next_labels[idx]


def _next(tokens: torch.Tensor) -> torch.Tensor:
    return torch.cat([tokens[1:], tokens[-1:]])


@torch.no_grad()
def medusa_ranks(
    blocks: MedusaResBlocks,
    lm_head: torch.Tensor,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    cap: int,
    next_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ranks of the target's tokens (``next_labels``; None: the data's own next tokens) per anchor and head."""
    targets = _shifted_targets(_next(tokens) if next_labels is None else next_labels, blocks.num_heads)
    cols = [true_ranks(x @ lm_head.T, targets[:, i], cap) for i, x in enumerate(blocks(hidden.float()))]
    return torch.stack(cols, 1)


@torch.no_grad()
def eagle_ranks(
    drafter: EagleDrafter,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    depth: int,
    cap: int,
    next_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ranks of the target's tokens (``next_labels``; None: the data's own next tokens) per anchor and depth."""
    T = tokens.numel()
    preds = drafter.unrolled(embed, tokens[None], hidden.float()[None], torch.ones(1, T, dtype=torch.bool), depth)
    targets = _shifted_targets(_next(tokens) if next_labels is None else next_labels, depth)
    return torch.stack([true_ranks(p[0] @ lm_head.T, targets[:, i], cap) for i, p in enumerate(preds)], 1)


def summarize(rank_fn, data: SeqData, trees: dict[str, Tree], depth: int) -> dict:
    """Per kind: top-1 / top-3 accuracy per depth over answer targets, and tokens/step per tree."""
    report = {}
    for kind in KINDS:
        part = data.select(kind)
        if len(part) == 0:
            continue
        hits1, hits3, counts = torch.zeros(depth), torch.zeros(depth), torch.zeros(depth)
        produced, steps = {name: 0 for name in trees}, {name: 0 for name in trees}
        for s in range(len(part)):
            tokens, hidden, start = part.seq(s)
            ranks = rank_fn(tokens, hidden, part.next_labels(s))
            T = tokens.numel()
            for d in range(1, depth + 1):
                rows = torch.arange(T)
                valid = (rows + 1 + d <= T - 1) & (rows + 1 + d >= start)
                counts[d - 1] += valid.sum()
                hits1[d - 1] += (ranks[valid, d - 1] == 0).sum()
                hits3[d - 1] += (ranks[valid, d - 1] < 3).sum()
            for name, tree in trees.items():
                a, b = simulate(ranks, start, tree)
                produced[name] += a
                steps[name] += b
        report[kind] = {
            "sequences": len(part),
            "answer_tokens": int(sum(produced.values()) // max(1, len(trees))),
            "top1_per_depth": [round(float(h / max(c, 1)), 4) for h, c in zip(hits1, counts)],
            "top3_per_depth": [round(float(h / max(c, 1)), 4) for h, c in zip(hits3, counts)],
            "tokens_per_step": {name: round(produced[name] / max(1, steps[name]), 3) for name in trees},
        }
    return report


def evaluate_medusa(blocks: MedusaResBlocks, lm_head: torch.Tensor, data: SeqData, trees: dict[str, Tree]) -> dict:
    lm_head = lm_head.float()
    return summarize(
        lambda tk, hd, nx: medusa_ranks(blocks, lm_head, tk, hd, cap=16, next_labels=nx), data, trees, blocks.num_heads
    )


def evaluate_eagle(
    drafter: EagleDrafter,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    data: SeqData,
    trees: dict[str, Tree],
    depth: int = 4,
) -> dict:
    embed, lm_head = embed.float(), lm_head.float()
    return summarize(
        lambda tk, hd, nx: eagle_ranks(drafter, embed, lm_head, tk, hd, depth, cap=16, next_labels=nx),
        data,
        trees,
        depth,
    )
