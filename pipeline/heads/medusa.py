"""Medusa heads (FasterDecoding / TensorRT-LLM convention) trained on cached base features.

Convention (the converter and the reference runtime follow it):

* Head i (0-based) reads the base model's last hidden state h_t, taken AFTER the final RMSNorm
  (what ``lm_head`` sees), and predicts token t+2+i: the base model itself predicts t+1 from
  h_t, head 0 the token after that.
* x = h; for each ResBlock: x = x + silu(W x + b); logits_i = lm_head_i(x).
* Label of head i at h_t: the base model's token t+2+i; on teacher-forced text, the base model's own
  distribution of that token (its softmax at t+1+i, :mod:`pipeline.heads.teacher`), Medusa-2's
  self-distillation.
* Every head's lm_head is the base lm_head (SmolLM2 ties it to the embedding), frozen during
  training. Only the ResBlocks are trained and shipped (3 x 332k parameters); the expansion
  step (pipeline/heads/expand.py) writes the full FasterDecoding file with the lm_heads copied
  from the base model.

Why not ModelOpt's ``mtsp.convert(model, [("medusa", ...)])``: its forward runs the 30-layer base
model on every step (seconds per batch on this CPU) and its head lm_heads start random; training
from cached features with the same structure (zero-initialised ResBlock weight, label shift
t+2+i) is ~50x cheaper and gives the same heads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.heads.data import SeqData
from pipeline.heads.teacher import soft_cross_entropy
from pipeline.heads.vocab import loss_lm_head
from pipeline.progress import step_progress

Progress = Callable[[str], None]
IGNORE = -100


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # ModelOpt/FasterDecoding: a head starts as the base lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaResBlocks(nn.Module):
    """``heads[i][l]`` is ResBlock l of head i; state-dict keys ``heads.{i}.{l}.linear.*``."""

    def __init__(self, hidden: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden) for _ in range(num_layers))) for _ in range(num_heads)
        )

    def forward(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Features each head feeds to its lm_head, one [..., H] tensor per head."""
        return [head(hidden) for head in self.heads]

    def fasterdecoding_state(self) -> dict[str, torch.Tensor]:
        """``{h}.{l}.linear.weight|bias`` (FasterDecoding names, without the lm_heads)."""
        return {
            f"{h}.{layer}.linear.{kind}": getattr(block.linear, kind).detach().clone()
            for h, layer, block in self._blocks()
            for kind in ("weight", "bias")
        }

    def load_fasterdecoding_state(self, state: dict[str, torch.Tensor]) -> None:
        for h, layer, block in self._blocks():
            for kind in ("weight", "bias"):
                getattr(block.linear, kind).data.copy_(state[f"{h}.{layer}.linear.{kind}"].float())

    def _blocks(self) -> list[tuple[int, int, nn.Module]]:
        """(head, layer, ResBlock) for every block."""
        heads: list[nn.Sequential] = list(self.heads)  # type: ignore[arg-type]
        return [(h, layer, block) for h, head in enumerate(heads) for layer, block in enumerate(head)]


def medusa_targets(tokens: torch.Tensor, start: int, num_heads: int) -> torch.Tensor:
    """[T, num_heads] labels for one sequence: row t, column i = token t+2+i.

    Positions whose target lies before ``start`` (the prompt) or past the end are IGNORE.
    """
    T = tokens.numel()
    out = torch.full((T, num_heads), IGNORE, dtype=torch.long)
    for i in range(num_heads):
        shift = 2 + i
        if T > shift:
            out[: T - shift, i] = tokens[shift:]
            out[: max(0, start - shift), i] = IGNORE
    return out


def flat_examples(data: SeqData, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, H] float16, labels [N, heads]) over positions with at least one target."""
    feats, labels = [], []
    for s in range(len(data)):
        tokens, hidden, prompt_len = data.seq(s)
        y = medusa_targets(tokens, prompt_len, num_heads)
        keep = (y != IGNORE).any(dim=1)
        feats.append(hidden[keep])
        labels.append(y[keep])
    return torch.cat(feats), torch.cat(labels)


def flat_teacher(data: SeqData, num_heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows of :func:`flat_examples` with the target's distribution of each head's token: ids and probs
    [N, heads, K]; head i at position t predicts token t+2+i, whose distribution the target gives at t+1+i.
    None when the data has no teacher."""
    if data.teacher_ids is None:
        return None
    ids, probs = [], []
    for s in range(len(data)):
        tokens, _, prompt_len = data.seq(s)
        teacher = data.teacher(s)
        assert teacher is not None
        keep = (medusa_targets(tokens, prompt_len, num_heads) != IGNORE).any(dim=1)
        T = tokens.numel()
        at = (torch.arange(T)[:, None] + 1 + torch.arange(num_heads)[None, :]).clamp(max=T - 1)  # [T, heads]
        ids.append(teacher[0][at][keep])
        probs.append(teacher[1][at][keep])
    return torch.cat(ids), torch.cat(probs)


def head_losses(
    blocks: MedusaResBlocks,
    lm_head: torch.Tensor,
    feats: torch.Tensor,
    labels: torch.Tensor,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    table: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Mean cross-entropy per head (0 for a head with no target in the batch).

    ``soft`` (:func:`flat_teacher`): against the target's distribution (``table`` maps its ids to the rows of
    ``lm_head``); None: against ``labels`` (already mapped)."""
    xs = blocks(feats.float())
    out = []
    for i, x in enumerate(xs):
        mask = labels[:, i] != IGNORE
        count = mask.sum().clamp(min=1)
        if soft is None:
            out.append(F.cross_entropy(x @ lm_head.T, labels[:, i], ignore_index=IGNORE, reduction="sum") / count)
        else:
            out.append(soft_cross_entropy(x[mask] @ lm_head.T, soft[0][mask, i], soft[1][mask, i], table) / count)
    return out


@dataclass(frozen=True)
class MedusaTrainConfig:
    num_heads: int = 3
    num_layers: int = 1
    epochs: int = 5  # validation improved up to epoch 4, flat at 5 (the best epoch is the one kept)
    batch_tokens: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.0
    vocab_top_k: int | None = 10  # softmax over data tokens + base top-k (pipeline/heads/vocab.py); None: all
    bf16: bool = True  # bfloat16 autocast for the matmuls (AMX); the weights stay float32
    seed: int = 0


def train_medusa(
    data: SeqData,
    lm_head: torch.Tensor,
    cfg: MedusaTrainConfig,
    say: Progress = print,
    validate: Callable[[MedusaResBlocks], float] | None = None,
    init: MedusaResBlocks | None = None,
) -> tuple[MedusaResBlocks, list[dict]]:
    """Adam on the ResBlocks with cosine decay; returns the blocks and a per-epoch log.

    ``validate`` (optional) scores the model after each epoch on training-side validation data
    (higher is better); the best epoch's weights are returned (:func:`keep_best`).
    """
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    feats, labels = flat_examples(data, cfg.num_heads)
    soft = flat_teacher(data, cfg.num_heads)  # the target's distribution, when the data carries it
    blocks = MedusaResBlocks(lm_head.shape[1], cfg.num_heads, cfg.num_layers)
    if init is not None:  # a warm start (e.g. the base model's heads for a fine-tune)
        blocks.load_state_dict(init.state_dict())
    lm_head, table = loss_lm_head(data, lm_head, cfg.vocab_top_k, cfg.bf16)
    if table is not None:
        labels = torch.where(labels == IGNORE, labels, table[labels.clamp(min=0)])
        say(f"  medusa: softmax over {lm_head.shape[0]} of {table.numel()} tokens, {len(feats)} positions")
    opt = torch.optim.AdamW(blocks.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(feats) / cfg.batch_tokens)
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    log, best = [], None
    with step_progress(f"medusa: {cfg.epochs} epoch(s) of {steps_per_epoch} batches", total) as advance:
        for epoch in range(cfg.epochs):
            start, sums, n = time.monotonic(), torch.zeros(cfg.num_heads), 0
            order = torch.randperm(len(feats), generator=gen)
            for first in range(0, len(order), cfg.batch_tokens):
                idx = order[first : first + cfg.batch_tokens]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                    part = None if soft is None else (soft[0][idx], soft[1][idx])
                    losses = head_losses(blocks, lm_head, feats[idx], labels[idx], part, table)
                opt.zero_grad(set_to_none=True)
                torch.stack(losses).sum().backward()
                opt.step()
                sched.step()
                sums += torch.stack([l.detach() for l in losses])
                n += 1
                advance(1)
            entry = {
                "epoch": epoch + 1,
                "loss_per_head": [round(float(v), 4) for v in sums / n],
                "seconds": round(time.monotonic() - start, 1),
            }
            best = keep_best(blocks, validate, entry, best)
            log.append(entry)
            say(
                f"  medusa epoch {epoch + 1}/{cfg.epochs}: loss {entry['loss_per_head']} ({entry['seconds']} s)"
                + (f", valid {entry['valid_score']}" if "valid_score" in entry else "")
            )
    if best is not None:
        blocks.load_state_dict(best[1])
    return blocks.eval(), log


def keep_best(model: Any, validate: Callable[[Any], float] | None, entry: dict, best: tuple | None) -> tuple | None:
    """Scores ``model`` into ``entry['valid_score']``; returns (score, state) of the best epoch so far."""
    if validate is None:
        return best
    model.eval()
    score = float(validate(model))
    model.train()
    entry["valid_score"] = round(score, 4)
    if best is None or score > best[0]:
        return score, {k: v.detach().clone() for k, v in model.state_dict().items()}
    return best
