"""Training vocabulary: the softmax of the training losses runs over a subset of the vocabulary.

The heads' lm_head is the frozen base lm_head (49152 x 576); on a 2-core CPU the full-vocab
cross-entropy costs ~7x the rest of a training step. The subset is every token in the data plus
the base model's top-k next-token candidates at every position, i.e. the targets and their
plausible competitors; tokens the base model never ranks there hardly compete with a head whose
features stay near the base model's. Evaluation (pipeline/heads/evaluate.py) always uses the full
vocabulary, so the reported accuracies include any effect of the approximation.
"""

from __future__ import annotations

import torch

from pipeline.heads.data import SeqData


@torch.no_grad()
def training_vocab(
    data: SeqData, lm_head: torch.Tensor, top_k: int = 10, chunk: int = 2048, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Sorted token ids: all tokens of ``data`` (and of its teacher) + the base top-``top_k`` at each position
    (scored in ``dtype``)."""
    keep = torch.zeros(lm_head.shape[0], dtype=torch.bool)
    keep[data.tokens] = True
    if data.teacher_ids is not None:  # distillation labels (pipeline/heads/teacher.py) are always rows
        keep[data.teacher_ids.reshape(-1)] = True
    weight = lm_head.to(dtype)
    for first in range(0, data.hidden.shape[0], chunk):
        logits = data.hidden[first : first + chunk].to(dtype) @ weight.T
        keep[logits.topk(top_k, dim=-1).indices.reshape(-1)] = True
    return keep.nonzero().squeeze(1)


def loss_lm_head(
    data: SeqData, lm_head: torch.Tensor, top_k: int | None, bf16: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The frozen lm_head the training losses use, and the full id -> row table (None: every row).

    With ``top_k``, only the rows of :func:`training_vocab`. With ``bf16`` (training under bf16
    autocast) it is cast once here: autocast would cast the frozen matrix again on every call.
    """
    lm_head, table = lm_head.detach().float(), None
    if top_k is not None:
        vocab = training_vocab(data, lm_head, top_k, dtype=torch.bfloat16 if bf16 else torch.float32)
        table = remap(vocab, lm_head.shape[0])
        lm_head = lm_head[vocab]
    return (lm_head.to(torch.bfloat16) if bf16 else lm_head), table


def remap(vocab: torch.Tensor, size: int) -> torch.Tensor:
    """full id -> index in ``vocab`` (-1 for ids outside it)."""
    table = torch.full((size,), -1, dtype=torch.long)
    table[vocab] = torch.arange(vocab.numel())
    return table
