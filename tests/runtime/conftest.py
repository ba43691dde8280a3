"""Tiny random Llama models converted with the project's converter, wrapped as reference engines.

The build stage that writes engine folders for real is someone else's; here config.json is the
engine layout ``{"version", "pretrained_config", "build_config"}`` written by hand around the
converter's checkpoint config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.checkpoint import convert_checkpoint

TINY = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=256, rms_norm_eps=1e-5)


def make_hf_model(folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random LlamaForCausalLM saved with save_pretrained; weights scaled up so that logits are
    peaked and greedy decoding has no near-ties (fp32 round-off must not flip a token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, "initializer_range": 0.15, "tie_word_embeddings": False, **overrides})
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return folder


def write_engine(checkpoint_src: Path, out: Path, *, tp: int = 1, pp: int = 1, **build: Any) -> Path:
    out.mkdir(parents=True)
    convert_checkpoint(checkpoint_src, out, tp=tp, pp=pp, dtype="float32")
    pretrained = json.loads((out / "config.json").read_text())
    build_config = {"max_batch_size": 8, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256,
                    "max_draft_len": 0, "speculative_decoding_mode": None, "max_beam_width": 1,
                    "plugin_config": {"tokens_per_block": 32, "paged_kv_cache": True}}
    build_config.update(build)
    (out / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": pretrained,
                                                 "build_config": build_config}))
    return out


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny matmuls lose to OpenMP start-up and to other processes on a 2-core runner (100x
    slower with 2 threads under load); restored after each module for the other test folders."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory, hf_model) -> Path:
    return write_engine(hf_model, tmp_path_factory.mktemp("eng") / "engine")


@pytest.fixture(scope="session")
def engine(engine_dir):
    from pipeline.runtime.model.engine import Engine

    return Engine.load(engine_dir)


# -- speculative decoding (tests/runtime/test_speculative*.py; builders in speculative_fixtures.py) ---------


def _spec_factory(root: Path, seed: int, vocab: int):
    from pipeline.runtime.model.engine import Engine
    from tests.runtime import speculative_fixtures as sf

    config = {**sf.MODEL, "vocab_size": vocab}
    hf = make_hf_model(root / "hf", seed=seed, **config)
    # Heads fitted on the test prompts' own continuations too: deliberately good drafts (still often wrong).
    corpus = sf.make_corpus(Engine.load(sf.write_engine(hf, root / "data-engine", None)),
                            sf.test_prompts(vocab) + sf.random_prompts(24, vocab, seed=seed + 10), 40)
    return sf.EngineFactory(root / "engines", hf, sf.write_fp8_export(hf, root / "fp8", corpus_prompts(corpus)),
                            sf.write_medusa_heads(root / "medusa", corpus),
                            sf.write_eagle_drafter(root / "eagle", {**TINY, **config}, corpus))


def corpus_prompts(corpus) -> list[list[int]]:
    return [s.tolist() for s in corpus.sequences]


@pytest.fixture(scope="session")
def spec_engines(tmp_path_factory):
    """EngineFactory over a vocab-96 model: engines(method, tp=1, fp8=False) -> Engine."""
    return _spec_factory(tmp_path_factory.mktemp("spec"), seed=1, vocab=96)


@pytest.fixture(scope="session")
def small_vocab_engines(tmp_path_factory):
    """The same over a vocab-16 model, for the sampling-distribution tests."""
    return _spec_factory(tmp_path_factory.mktemp("spec16"), seed=2, vocab=16)
