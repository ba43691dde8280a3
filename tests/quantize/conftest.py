"""Fixtures for the quantize tests: a tiny random Llama with an offline tokenizer, its FP8
export, and the prepared builtin SmolLM2 (shared by the slow tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Words for the tiny WordLevel vocabulary: enough that the shipped calibration set is
# mostly known words (the rest map to <unk>, which is fine for calibration).
_WORDS = """the a an of to and in is it you that he she was for on are with as i his they be at one
have this from or had by hot word but what some we can out other were all there when up use your how
said each which do their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find explain give me write short why sky blue light
list tips sleep minutes week code python def return print function class data model text question
answer paris france capital city train station bread recipe user assistant system""".split()


def build_tiny_llama(folder: Path, *, tie_word_embeddings: bool = False, seed: int = 0) -> Path:
    """A 2-layer GQA Llama (hidden 64, 4 heads / 2 KV heads) with a WordLevel tokenizer, saved offline."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(set(_WORDS)))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<s> assistant {% endif %}"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only tiny model folder (copy it before modifying)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_fp8(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real PTQ + export of the tiny model (FP8 weights and KV cache, shipped calibration set).

    Returns (summary, export folder); tests must not modify the folder.
    """
    from pipeline.quantize import quantize_fp8

    out = tmp_path_factory.mktemp("tiny-fp8") / "out"
    summary = quantize_fp8(tiny_llama_dir, out, kv_cache_fp8=True, calib_path=None, calib_size=512, calib_max_len=64)
    return summary, out
