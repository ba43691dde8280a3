"""A tiny random Llama with Medusa heads and an EAGLE drafter fitted to it (tests/runtime/fixtures.py
builds them), for the evaluate stage's tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runtime import fixtures as sf
from tests.runtime.fixtures import one_torch_thread  # noqa: F401  (autouse for this folder)
from tests.test_preflight import write_tokenizer


@dataclass(frozen=True)
class Tiny:
    root: Path
    hf: Path
    medusa: Path
    eagle: Path

    def engine(self, method: str | None, name: str | None = None, hf: Path | None = None):
        from pipeline.runtime.model.engine import Engine

        folder = self.root / (name or f"{method or 'plain'}-engine")
        if not folder.exists():
            sf.write_engine(
                hf or self.hf, folder, method, medusa_dir=self.medusa, eagle_dir=self.eagle, **sf.SPEC_LIMITS
            )
        return Engine.load(folder)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    from pipeline.runtime.model.engine import Engine

    root = tmp_path_factory.mktemp("evaluation")
    hf = sf.make_hf_model(root / "hf", seed=1, **sf.MODEL)
    write_tokenizer(hf)  # a word-level tokenizer of the model's 96 tokens, no chat template
    data = Engine.load(sf.write_engine(hf, root / "data-engine", **sf.SPEC_LIMITS))
    corpus = sf.make_corpus(data, sf.test_prompts(96) + sf.random_prompts(24, 96, seed=11), 40)
    return Tiny(
        root,
        hf,
        sf.write_medusa_heads(root / "medusa", corpus),
        sf.write_eagle_drafter(root / "eagle", {**sf.TINY, **sf.MODEL}, corpus),
    )
