"""Next-token choice from logits: greedy, or temperature / top-k / top-p with a per-request RNG.

Each request has its own ``torch.Generator`` (seeded from its ``seed``), so a request's tokens
do not depend on who shares its batch.

:func:`adjust_logits` applies what TensorRT-LLM applies to the logits before that choice:
embedding bias, repetition / presence / frequency penalties over the tokens so far (prompt and
output, TensorRT-LLM's default), ``min_tokens`` (end_id banned before it; the default 1 bans
nothing), and bad words (a word's last token banned where the tokens so far end with the rest of it).
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


def adjust_logits(
    logits: torch.Tensor, params: SamplingParams, context: list[int], generated: int, end_id: int | None
) -> torch.Tensor:
    """A copy of a [vocab] logits row with the request's bias, penalties and bans applied."""
    if not params.adjusts(generated, end_id):
        return logits
    out = logits.clone()
    vocab = out.numel()
    if params.embedding_bias:
        bias = torch.tensor(params.embedding_bias[:vocab], dtype=out.dtype)
        out[: bias.numel()] += bias
    penalised = params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    if penalised and context:
        ids, counts = torch.unique(torch.tensor(context, dtype=torch.long), return_counts=True)
        keep = (ids >= 0) & (ids < vocab)
        ids, counts = ids[keep], counts[keep]
        values = out[ids]
        if params.repetition_penalty != 1.0:
            values = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
        values = values - params.presence_penalty - params.frequency_penalty * counts.to(out.dtype)
        out[ids] = values
    if params.bans_end_id(generated, end_id) and end_id is not None and 0 <= end_id < vocab:
        out[end_id] = float("-inf")
    for word in params.bad_words:
        head, last = word[:-1], word[-1]
        if 0 <= last < vocab and (not head or tuple(context[-len(head) :]) == head):
            out[last] = float("-inf")
    return out


def log_prob(logits: torch.Tensor, token: int, params: SamplingParams) -> float:
    """log p(token) under the distribution the choice was made from (temperature applied when sampling)."""
    scaled = logits if params.greedy else logits / params.temperature
    return float(torch.log_softmax(scaled.float(), dim=-1)[token])
