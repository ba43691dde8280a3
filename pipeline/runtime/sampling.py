"""Next-token choice from logits: greedy, or temperature / top-k / top-p with a per-request RNG.

Each request has its own ``torch.Generator`` (seeded from its ``seed``), so a request's tokens
do not depend on who shares its batch.
"""

from __future__ import annotations

import torch

from pipeline.runtime.request import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(params.seed & 0xFFFF_FFFF_FFFF_FFFF)  # Triton sends seed as UINT64
    return generator


def sample_one(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from a [vocab] float32 logits row."""
    if params.greedy:
        return int(torch.argmax(logits))
    top_k, top_p = params.regularized()
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if top_k > 0:
        probs, ids = torch.topk(probs, min(top_k, probs.numel()))  # sorted, descending
    else:
        probs, ids = torch.sort(probs, descending=True)
    if top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (always the first token).
        before = torch.cumsum(probs, dim=-1) - probs
        probs = torch.where(before < top_p * probs.sum(), probs, torch.zeros_like(probs))
    choice = torch.multinomial(probs, 1, generator=generator)
    return int(ids[choice])
