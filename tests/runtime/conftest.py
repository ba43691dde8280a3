"""Fixtures of the runtime tests: tiny random Llama engines, with and without heads (built by
``tests/runtime/fixtures.py``), shared for the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime import fixtures as sf
from tests.runtime.fixtures import (
    TINY,
    make_hf_model,
    one_torch_thread,  # noqa: F401  (autouse for this folder)
    write_engine,
)


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


# -- speculative decoding (tests/runtime/spec_decode/; builders in fixtures.py) --------------------------


def _spec_factory(root: Path, seed: int, vocab: int):
    from pipeline.runtime.model.engine import Engine

    config = {**sf.MODEL, "vocab_size": vocab}
    hf = make_hf_model(root / "hf", seed=seed, **config)
    # Heads fitted on the test prompts' own continuations too: deliberately good drafts (still often wrong).
    corpus = sf.make_corpus(
        Engine.load(write_engine(hf, root / "data-engine", **sf.SPEC_LIMITS)),
        sf.test_prompts(vocab) + sf.random_prompts(24, vocab, seed=seed + 10),
        40,
    )
    return sf.EngineFactory(
        root / "engines",
        hf,
        sf.write_fp8_export(hf, root / "fp8", corpus_prompts(corpus)),
        sf.write_medusa_heads(root / "medusa", corpus),
        sf.write_eagle_drafter(root / "eagle", {**TINY, **config}, corpus),
    )


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
