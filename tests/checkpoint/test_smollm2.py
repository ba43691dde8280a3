"""The real embedded model (SmolLM2-135M-Instruct, 9 heads / 3 KV heads, tied embeddings)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.checkpoint import forward_logits

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


@pytest.fixture(scope="module")
def smollm2(smollm2_dir) -> Path:
    return smollm2_dir


@pytest.fixture(scope="module")
def reference(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    text = "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return ids, model(ids).logits


@pytest.mark.parametrize("tp", [1, 3])
def test_smollm2_logits_match(smollm2, reference, convert, tp):
    ids, want = reference
    out, summary = convert(smollm2, tp=tp)
    assert summary.files[1:] == tuple(f"rank{r}.safetensors" for r in range(tp))
    got = forward_logits(out, ids)
    assert (got - want).abs().max().item() < 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))
