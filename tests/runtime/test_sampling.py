"""sampling.adjust_logits against Hugging Face's logits processors (the same published semantics)."""

from __future__ import annotations

import torch
from transformers import MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor, RepetitionPenaltyLogitsProcessor

from pipeline.runtime.request import SamplingParams
from pipeline.runtime.sampling import adjust_logits, log_prob


def test_repetition_penalty_bans_and_min_tokens_match_transformers():
    torch.manual_seed(0)
    logits = torch.randn(50)
    prompt, generated = [4, 9, 9, 17], [23, 4]
    context = prompt + generated
    ids = torch.tensor([context])
    hf = RepetitionPenaltyLogitsProcessor(1.7)(ids, logits[None].clone())
    hf = NoBadWordsLogitsProcessor([[31], [23, 4, 12], [9, 40]], eos_token_id=None)(ids, hf)
    hf = MinNewTokensLengthLogitsProcessor(len(prompt), 5, eos_token_id=2)(ids, hf)
    params = SamplingParams(repetition_penalty=1.7, bad_words=((31,), (23, 4, 12), (9, 40)), min_tokens=5)
    ours = adjust_logits(logits, params, context, len(generated), end_id=2)
    assert torch.equal(torch.isinf(ours), torch.isinf(hf[0]))
    finite = ~torch.isinf(ours)
    assert torch.allclose(ours[finite], hf[0][finite])
    assert torch.isinf(ours[31]) and torch.isinf(ours[12]) and not torch.isinf(ours[40])  # (9, 40): 9 not last
    assert torch.equal(logits, logits.clone())  # the input row is not modified


def test_presence_frequency_and_bias():
    logits = torch.zeros(8)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, embedding_bias=(1.0, 0.0, 2.0))
    out = adjust_logits(logits, params, [1, 1, 1, 6], 4, end_id=None)
    assert out.tolist() == [1.0, -0.5 - 0.75, 2.0, 0.0, 0.0, 0.0, -0.5 - 0.25, 0.0]
    assert adjust_logits(logits, SamplingParams(), [1], 1, end_id=0) is logits  # nothing to apply


def test_min_tokens_default_one_bans_nothing_as_tensorrt_llm():
    """TensorRT-LLM's penalty layer gives its kernel no min lengths while every request has the default 1:
    the end id may be the first token. Above 1 it is banned until that many tokens were generated."""
    logits = torch.zeros(8)
    for params in (SamplingParams(), SamplingParams(min_tokens=1), SamplingParams(min_tokens=0)):
        assert adjust_logits(logits, params, [1], 0, end_id=2) is logits
    two = SamplingParams(min_tokens=2)
    assert [bool(torch.isinf(adjust_logits(logits, two, [1], g, end_id=2)[2])) for g in range(3)] == [True, True, False]


def test_log_prob_is_the_choice_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0])
    assert log_prob(logits, 0, SamplingParams()) == float(torch.log_softmax(logits, -1)[0])
    hot = SamplingParams(temperature=2.0, top_k=3)
    assert log_prob(logits, 1, hot) == float(torch.log_softmax(logits / 2.0, -1)[1])
