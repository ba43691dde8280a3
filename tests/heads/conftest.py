"""Tiny random Llama models and fake self-distillation data for the head tests (no SmolLM2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.geometry import ModelGeometry
from pipeline.heads.data import SeqData

VOCAB, HIDDEN = 96, 64
TINY_DRAFTER = ModelGeometry(
    "tiny-drafter",
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    max_position_embeddings=256,
    rope_theta=10000.0,
)


def tiny_llama_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=0.1,
        architectures=["LlamaForCausalLM"],
        pad_token_id=2,
        eos_token_id=2,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A saved tiny Llama with tied embeddings (like SmolLM2): the model folder heads expand against."""
    path = tmp_path_factory.mktemp("tiny-base")
    tiny_llama_model().save_pretrained(path)
    return path


def fake_data(num_seqs: int = 6, seed: int = 0, prompt_len: int = 5, length: int = 24) -> SeqData:
    """Random tokens whose 'features' come from a tiny Llama (teacher forced, like the real cache)."""
    model = tiny_llama_model()
    gen = torch.Generator().manual_seed(seed)
    tokens, hidden = [], []
    for s in range(num_seqs):
        tk = torch.randint(3, VOCAB, (length - s,), generator=gen)
        with torch.no_grad():
            hidden.append(model.model(tk[None]).last_hidden_state[0])
        tokens.append(tk)
    return SeqData.from_sequences(tokens, hidden, [prompt_len] * num_seqs, [s % 2 for s in range(num_seqs)])


@pytest.fixture
def data() -> SeqData:
    return fake_data()
