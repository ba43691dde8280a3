"""The target's own next-token distribution as the heads' training label (distillation).

On teacher-forced text the text's next token is not what the target would say: a drafter trained to
predict the text learns the text, and a fine-tune's drafter trained that way learns the fine-tuning
data instead of the fine-tune. Greedy speculative decoding accepts a draft token only when it is the
target's own choice, so the label is the target's distribution p = softmax(lm_head(f_t)) at the very
position the head predicts, as in EAGLE's training code (Li et al. 2024: ``target_p =
softmax(head(target_hidden))``, cross-entropy of the drafter against it) and Medusa-2's
self-distillation (Cai et al. 2024: KL divergence to the target's distribution).

Only the top ``TEACHER_TOP_K`` tokens per position are kept (ids and probabilities of the
full-vocabulary softmax, computed once in float32 from the exact features while the data is built):
10 x (8 + 2) bytes per token next to the 1152 bytes of its float16 feature, where the full
distribution would be 49152 x 2 bytes. The loss renormalises them; the mass they hold is reported
(on the SmolLM2 code fine-tune over standard-library source, most of it). K equals the training
vocabulary's per-position top-k (:mod:`pipeline.heads.vocab`), so every teacher token is a row of the
training softmax.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

TEACHER_TOP_K = 10


@torch.no_grad()
def teacher_forced_states(model, sequences: list[list[int]], *, batch: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(index, [T, H] last hidden state after the final norm, in the model's dtype and on its device) per
    sequence, batched by length and right padded."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for first in range(0, len(order), batch):
        chunk = order[first : first + batch]
        width = max(len(sequences[i]) for i in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            mask[row, : len(sequences[i])] = 1
        device = model.device  # the target may sit on a GPU; the features come back to the host
        states = model.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        for row, i in enumerate(chunk):
            yield i, states[row, : len(sequences[i])]


@torch.no_grad()
def teacher_topk(logits: torch.Tensor, k: int = TEACHER_TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int64 [..., k], probs float32 [..., k]): the top-k of softmax(logits), best first."""
    probs, ids = logits.float().softmax(-1).topk(k, dim=-1)
    return ids, probs


@torch.no_grad()
def teacher_forced(
    model, sequences: list[list[int]], *, batch: int, top_k: int = TEACHER_TOP_K
) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """(features float16, teacher (ids, probs float16) per sequence) in one target pass."""
    hidden: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    teachers: list[tuple[torch.Tensor, torch.Tensor]] = [(torch.empty(0), torch.empty(0))] * len(sequences)
    for i, states in teacher_forced_states(model, sequences, batch=batch):
        ids, probs = teacher_topk(model.lm_head(states), top_k)
        hidden[i] = states.to("cpu", torch.float16)
        teachers[i] = (ids.cpu(), probs.to("cpu", torch.float16))
    return hidden, teachers


def soft_cross_entropy(
    logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, table: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum over rows of -sum_k p_k log q(ids_k): q = softmax(logits) [n, V], p = ``probs`` [n, K] renormalised.

    ``table`` maps vocabulary ids to the columns of ``logits`` (a training-vocabulary subset); every
    teacher id must be one of them.
    """
    cols = ids if table is None else table[ids]
    if bool((cols < 0).any()):
        raise ValueError("a teacher token is outside the training vocabulary")
    weights = probs.float() / probs.float().sum(-1, keepdim=True).clamp(min=1e-9)
    log_q = F.log_softmax(logits.float(), dim=-1).gather(-1, cols)
    return -(weights * log_q).sum()
